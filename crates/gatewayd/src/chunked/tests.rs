use proptest::prelude::*;

use super::*;

/// A whole-body decoder written the obvious way (find each line's CRLF, parse it, take the data),
/// to check the incremental one against: the decoded data, the trailer bytes and the body's
/// length, or `None` for a body that is malformed or incomplete.
fn reference_decode(body: &[u8]) -> Option<(Vec<u8>, Option<Vec<u8>>, usize)> {
    let line_end = |from: usize| -> Option<usize> {
        let cr = from + body[from..].iter().position(|&b| b == b'\r')?;
        (body.get(cr + 1) == Some(&b'\n')).then_some(cr)
    };
    let mut data = Vec::new();
    let mut at = 0;
    let mut extension_bytes = 0u64;
    loop {
        let end = line_end(at)?;
        let line = &body[at..end];
        let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
        if digits == 0 {
            return None;
        }
        let size = u64::from_str_radix(std::str::from_utf8(&line[..digits]).ok()?, 16).ok()?;
        let rest = &line[digits..];
        let spaces = rest
            .iter()
            .take_while(|b| matches!(b, b' ' | b'\t'))
            .count();
        let rest = &rest[spaces..];
        if !rest.is_empty() {
            if rest[0] != b';' || rest.contains(&b'\n') {
                return None;
            }
            extension_bytes += (rest.len() - 1) as u64;
            if extension_bytes >= EXTENSIONS_LIMIT {
                return None;
            }
        }
        at = end + 2;
        if size == 0 {
            break;
        }
        let size = usize::try_from(size).ok()?;
        data.extend_from_slice(body.get(at..at.checked_add(size)?)?);
        at += size;
        if body.get(at..at + 2)? != b"\r\n" {
            return None;
        }
        at += 2;
    }
    let trailers_start = at;
    let mut fields = 0;
    while body.get(at..at + 2)? != b"\r\n" {
        at = line_end(at)? + 2;
        fields += 1;
    }
    at += 2;
    let trailers = (at > trailers_start + 2).then(|| body[trailers_start..at].to_vec());
    // Trailer fields are httparse's to judge, here as in the decoder.
    if let Some(trailers) = &trailers {
        parse_trailers(trailers, fields).ok()?;
    }
    Some((data, trailers, at))
}

/// Feeds `input` to a new decoder in pieces cut at `cuts` (offsets, any order), the way reads
/// would split it: the data, the trailers, the bytes consumed, or the first error.
fn decode_in_pieces(
    input: &[u8],
    cuts: &[usize],
) -> Result<(Vec<u8>, Option<HeaderMap>, usize, bool), ChunkedError> {
    let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (input.len() + 1)).collect();
    cuts.push(input.len());
    cuts.sort_unstable();
    let mut decoder = ChunkedDecoder::new();
    let (mut data, mut consumed, mut from) = (Vec::new(), 0, 0);
    for cut in cuts {
        let mut piece = input[from..cut].to_vec();
        from = cut;
        let decoded = decoder
            .decode_in_place(&mut piece)
            .map_err(|malformed| malformed.error)?;
        data.extend_from_slice(&piece[..decoded.data]);
        consumed += decoded.consumed;
        if decoder.is_done() {
            break;
        }
        assert_eq!(
            decoded.consumed,
            piece.len(),
            "an unfinished body takes every byte"
        );
    }
    let done = decoder.is_done();
    Ok((data, decoder.take_trailers()?, consumed, done))
}

/// How a chunk's size line is written.
#[derive(Debug, Clone)]
struct SizeLine {
    upper: bool,
    zeros: usize,
    white_space: &'static str,
    extension: Option<String>,
}

fn size_line() -> impl Strategy<Value = SizeLine> {
    (
        any::<bool>(),
        0usize..3,
        prop::sample::select(vec!["", " ", "\t ", "  "]),
        prop::option::of("[a-z0-9=\"; ]{0,20}"),
    )
        .prop_map(|(upper, zeros, white_space, extension)| SizeLine {
            upper,
            zeros,
            white_space,
            extension,
        })
}

fn write_size(out: &mut Vec<u8>, size: usize, line: &SizeLine) {
    let hex = if line.upper {
        format!("{size:X}")
    } else {
        format!("{size:x}")
    };
    out.extend_from_slice("0".repeat(line.zeros).as_bytes());
    out.extend_from_slice(hex.as_bytes());
    out.extend_from_slice(line.white_space.as_bytes());
    if let Some(extension) = &line.extension {
        out.push(b';');
        out.extend_from_slice(extension.as_bytes());
    }
    out.extend_from_slice(b"\r\n");
}

/// A chunked body of `chunks` (each with its size line's style), the last chunk, `trailers`.
fn encode(
    chunks: &[(Vec<u8>, SizeLine)],
    last: &SizeLine,
    trailers: &[(String, String)],
) -> Vec<u8> {
    let mut out = Vec::new();
    for (data, line) in chunks {
        write_size(&mut out, data.len(), line);
        out.extend_from_slice(data);
        out.extend_from_slice(b"\r\n");
    }
    write_size(&mut out, 0, last);
    for (name, value) in trailers {
        out.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// Chunks (data and size line), the last chunk's size line, trailer fields.
type Body = (Vec<(Vec<u8>, SizeLine)>, SizeLine, Vec<(String, String)>);

fn body() -> impl Strategy<Value = Body> {
    (
        prop::collection::vec(
            (prop::collection::vec(any::<u8>(), 1..300), size_line()),
            0..12,
        ),
        size_line(),
        prop::collection::vec(("x-[a-z]{1,8}", "[a-z0-9 ]{0,12}[a-z0-9]"), 0..3),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Any valid body, split at any read boundaries, decodes to its chunks' data and trailers
    /// (as the reference decoder reads it), ends exactly at its last byte and leaves what follows.
    #[test]
    fn split_anywhere_a_valid_body_decodes_like_the_reference(
        (chunks, last, trailers) in body(),
        cuts in prop::collection::vec(any::<usize>(), 0..20),
        after in prop::collection::vec(any::<u8>(), 0..10),
    ) {
        let encoded = encode(&chunks, &last, &trailers);
        let mut input = encoded.clone();
        input.extend_from_slice(&after);
        let (data, trailer_bytes, length) = reference_decode(&input).expect("valid");
        prop_assert_eq!(length, encoded.len());
        let expected: Vec<u8> = chunks.iter().flat_map(|(data, _)| data.clone()).collect();
        prop_assert_eq!(&data, &expected);
        let (decoded, decoded_trailers, consumed, done) = decode_in_pieces(&input, &cuts).unwrap();
        prop_assert!(done);
        prop_assert_eq!(decoded, expected);
        prop_assert_eq!(consumed, encoded.len());
        prop_assert_eq!(decoded_trailers.is_some(), trailer_bytes.is_some());
        let decoded_trailers = decoded_trailers.unwrap_or_default();
        prop_assert_eq!(decoded_trailers.len(), trailers.len());
        let decoded_fields: Vec<(String, Vec<u8>)> = decoded_trailers
            .iter()
            .map(|(name, value)| (name.to_string(), value.as_bytes().to_vec()))
            .collect();
        for (name, value) in &trailers {
            let field = (name.clone(), value.trim().as_bytes().to_vec());
            prop_assert!(decoded_fields.contains(&field), "{:?}", field);
        }
    }

    /// Every strict prefix of a valid body is an unfinished body, never an error: the end of the
    /// input there is a truncation.
    #[test]
    fn a_body_cut_anywhere_is_truncated((chunks, last, trailers) in body(), cut in any::<usize>()) {
        let encoded = encode(&chunks, &last, &trailers);
        let prefix = &encoded[..cut % encoded.len()];
        let mut decoder = ChunkedDecoder::new();
        let mut piece = prefix.to_vec();
        let decoded = decoder.decode_in_place(&mut piece).unwrap();
        prop_assert_eq!(decoded.consumed, prefix.len());
        prop_assert!(!decoder.is_done());
        prop_assert_eq!(decoder.at_end_of_input(), Some(ChunkedError::Truncated));
    }

    /// One byte of a body's framing replaced by another: the decoder accepts exactly what the
    /// reference accepts (with the same data) and rejects the rest, however the reads split it.
    #[test]
    fn a_damaged_framing_byte_is_found(
        (chunks, last, _) in body(),
        which in any::<prop::sample::Index>(),
        replacement in prop::sample::select(b"\r\n;; \t0aGz\x00-".to_vec()),
        cuts in prop::collection::vec(any::<usize>(), 0..6),
    ) {
        let mut encoded = encode(&chunks, &last, &[]);
        // The framing bytes: everything that is not a chunk's data.
        let mut framing = Vec::new();
        let mut at = 0;
        for (data, line) in &chunks {
            let mut size = Vec::new();
            write_size(&mut size, data.len(), line);
            framing.extend(at..at + size.len());
            at += size.len() + data.len();
            framing.extend(at..at + 2);
            at += 2;
        }
        framing.extend(at..encoded.len());
        let position = framing[which.index(framing.len())];
        encoded[position] = replacement;
        let reference = reference_decode(&encoded);
        match decode_in_pieces(&encoded, &cuts) {
            Ok((data, _, consumed, true)) => {
                let (expected, _, length) = reference.expect("the reference accepts it too");
                prop_assert_eq!(data, expected);
                prop_assert_eq!(consumed, length);
            }
            Ok((_, _, _, false)) | Err(_) => prop_assert!(reference.is_none(), "{:?}", reference),
        }
    }
}

/// Each malformation hyper refuses, with hyper's words, found whether the body arrives at once or
/// a byte per read.
#[test]
fn every_malformation_is_found_wherever_the_reads_split() {
    let cases: [(&[u8], ChunkedError); 14] = [
        (b"\r\n", ChunkedError::MissingSizeDigit),
        (b"x\r\n", ChunkedError::MissingSizeDigit),
        (b"5x\r\nhello\r\n0\r\n\r\n", ChunkedError::InvalidSize),
        (
            b"5 x\r\nhello\r\n0\r\n\r\n",
            ChunkedError::InvalidSizeWhiteSpace,
        ),
        (b"10000000000000000\r\n", ChunkedError::SizeOverflow),
        (
            b"5;a\nb\r\nhello\r\n0\r\n\r\n",
            ChunkedError::ExtensionNewline,
        ),
        (b"5\rxhello\r\n0\r\n\r\n", ChunkedError::SizeLf),
        (b"3\r\nhello\r\n0\r\n\r\n", ChunkedError::BodyCr),
        (b"5\r\nhello\rx0\r\n\r\n", ChunkedError::BodyLf),
        (b"0\r\nx-a: 1\rx", ChunkedError::TrailerLf),
        (b"0\r\n\rx", ChunkedError::EndLf),
        (b"0\r\nnot a field\r\n\r\n", ChunkedError::InvalidTrailers),
        (b"5\n\r\nhello\r\n0\r\n\r\n", ChunkedError::InvalidSize),
        (b"-5\r\nhello\r\n0\r\n\r\n", ChunkedError::MissingSizeDigit),
    ];
    for (body, error) in cases {
        let every_byte: Vec<usize> = (0..body.len()).collect();
        for cuts in [&[][..], &every_byte[..]] {
            assert_eq!(
                decode_in_pieces(body, cuts).map(|(_, _, _, done)| done),
                Err(error),
                "{:?}",
                String::from_utf8_lossy(body)
            );
        }
        assert!(reference_decode(body).is_none());
    }
}

#[test]
fn limits_are_hyper_s() {
    let mut long_extension = b"1;".to_vec();
    long_extension.extend(std::iter::repeat_n(b'a', EXTENSIONS_LIMIT as usize));
    long_extension.extend_from_slice(b"\r\nx\r\n0\r\n\r\n");
    assert_eq!(
        decode_in_pieces(&long_extension, &[]).map(|_| ()),
        Err(ChunkedError::ExtensionsOverLimit)
    );

    let mut many_trailers = b"0\r\n".to_vec();
    for i in 0..=TRAILER_FIELDS_LIMIT {
        many_trailers.extend_from_slice(format!("x-{i}: v\r\n").as_bytes());
    }
    many_trailers.extend_from_slice(b"\r\n");
    assert_eq!(
        decode_in_pieces(&many_trailers, &[]).map(|_| ()),
        Err(ChunkedError::TrailerCount)
    );

    let mut big_trailer = b"0\r\nx-big: ".to_vec();
    big_trailer.extend(std::iter::repeat_n(b'a', TRAILERS_LIMIT));
    big_trailer.extend_from_slice(b"\r\n\r\n");
    assert_eq!(
        decode_in_pieces(&big_trailer, &[]).map(|_| ()),
        Err(ChunkedError::TrailersOverLimit)
    );
}

/// A burst of SSE events, one chunk each, read at once: one run of data at the buffer's front.
#[test]
fn a_burst_of_chunks_becomes_one_run_of_data() {
    let mut buffer = b"9\r\ndata: 1\n\n\r\n9\r\ndata: 2\n\n\r\n9\r\ndata: 3\n\n\r\n".to_vec();
    let mut decoder = ChunkedDecoder::new();
    let decoded = decoder.decode_in_place(&mut buffer).unwrap();
    assert_eq!(
        &buffer[..decoded.data],
        b"data: 1\n\ndata: 2\n\ndata: 3\n\n"
    );
    assert_eq!(decoded.consumed, buffer.len());
    assert!(!decoder.is_done());
    let mut end = b"0\r\n\r\nHTTP/1.1".to_vec();
    let decoded = decoder.decode_in_place(&mut end).unwrap();
    assert_eq!(
        decoded,
        Decoded {
            data: 0,
            consumed: 5
        }
    );
    assert!(decoder.is_done());
    assert_eq!(decoder.at_end_of_input(), None);
    assert_eq!(decoder.take_trailers(), Ok(None));

    // A malformation behind good chunks: their data is reported with the error.
    let mut buffer = b"5\r\nhello\r\n5\r\nworld\r\nzz".to_vec();
    let malformed = ChunkedDecoder::new()
        .decode_in_place(&mut buffer)
        .unwrap_err();
    assert_eq!(malformed.error, ChunkedError::MissingSizeDigit);
    assert_eq!(&buffer[..malformed.data], b"helloworld");
}

/// Relays `input` through a new decoder in pieces cut at `cuts`, as reads would split it: the
/// bytes handed on (whole chunks), the bytes consumed, whether the body ended, or the first error
/// with what was handed on before it.
fn relay_in_pieces(input: &[u8], cuts: &[usize]) -> (Vec<u8>, usize, Result<bool, ChunkedError>) {
    let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (input.len() + 1)).collect();
    cuts.push(input.len());
    cuts.sort_unstable();
    let mut decoder = ChunkedDecoder::new();
    let (mut out, mut consumed, mut from) = (Vec::new(), 0, 0);
    for cut in cuts {
        let mut piece = BytesMut::new();
        match decoder.relay(&input[from..cut], &mut piece) {
            Ok(took) => consumed += took,
            Err(malformed) => {
                assert_eq!(malformed.data, piece.len(), "what went on before the error");
                out.extend_from_slice(&piece);
                return (out, consumed, Err(malformed.error));
            }
        }
        out.extend_from_slice(&piece);
        from = cut;
        if decoder.is_done() {
            break;
        }
    }
    let done = decoder.is_done();
    (out, consumed, decoder.take_trailers().map(|_| done))
}

/// Decodes relayed output, which must be whole chunks and nothing else (no last chunk).
fn whole_chunks(relayed: &[u8]) -> Vec<u8> {
    let mut terminated = relayed.to_vec();
    terminated.extend_from_slice(b"0\r\n\r\n");
    let (data, trailers, length) = reference_decode(&terminated).expect("whole chunks");
    assert_eq!(length, terminated.len(), "nothing but whole chunks");
    assert!(trailers.is_none());
    data
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Any valid body relayed in one piece comes out as it came, byte for byte, up to its last
    /// chunk, but for size lines with white space or extensions, which are made plain; split at
    /// any read boundaries it comes out as whole chunks of the same data (a chunk split by a read
    /// framed anew), and it ends exactly where decoding ends it.
    #[test]
    fn a_relayed_body_keeps_its_framing_and_its_data(
        (chunks, last, trailers) in body(),
        cuts in prop::collection::vec(any::<usize>(), 0..20),
        after in prop::collection::vec(any::<u8>(), 0..10),
    ) {
        let encoded = encode(&chunks, &last, &trailers);
        let mut input = encoded.clone();
        input.extend_from_slice(&after);
        let expected: Vec<u8> = chunks.iter().flat_map(|(data, _)| data.clone()).collect();
        let last_chunk = encode(&[], &last, &trailers).len();
        let (whole, consumed, done) = relay_in_pieces(&input, &[]);
        prop_assert_eq!(done, Ok(true));
        prop_assert_eq!(consumed, encoded.len());
        let plain_chunks: Vec<(Vec<u8>, SizeLine)> = chunks
            .iter()
            .map(|(data, line)| {
                let plain = line.white_space.is_empty() && line.extension.is_none();
                let framed_anew = SizeLine {
                    upper: false,
                    zeros: 0,
                    white_space: "",
                    extension: None,
                };
                (data.clone(), if plain { line.clone() } else { framed_anew })
            })
            .collect();
        let plain = encode(&plain_chunks, &last, &trailers);
        prop_assert_eq!(&whole[..], &plain[..plain.len() - last_chunk]);
        let (split, consumed, done) = relay_in_pieces(&input, &cuts);
        prop_assert_eq!(done, Ok(true));
        prop_assert_eq!(consumed, encoded.len());
        prop_assert_eq!(whole_chunks(&split), expected);
    }

    /// One damaged framing byte: relaying refuses exactly what decoding refuses, with the same
    /// words, and what it handed on before is whole chunks of the data decoding handed on.
    #[test]
    fn a_relayed_body_with_a_damaged_framing_byte_fails_like_a_decoded_one(
        (chunks, last, _) in body(),
        position in any::<prop::sample::Index>(),
        replacement in prop::sample::select(b"\r\n;; \t0aGz\x00-".to_vec()),
        cuts in prop::collection::vec(any::<usize>(), 0..6),
    ) {
        let mut encoded = encode(&chunks, &last, &[]);
        let at = position.index(encoded.len());
        encoded[at] = replacement;
        let decoded = decode_in_pieces(&encoded, &cuts);
        let (relayed, consumed, outcome) = relay_in_pieces(&encoded, &cuts);
        match decoded {
            Ok((data, _, decoded_consumed, done)) => {
                prop_assert_eq!(outcome, Ok(done));
                prop_assert_eq!(consumed, decoded_consumed);
                prop_assert_eq!(whole_chunks(&relayed), data);
            }
            Err(error) => prop_assert_eq!(outcome, Err(error)),
        }
    }
}

/// Three events written at once pass as the worker framed them, but for an extension, which is
/// dropped (see [`only_plain_size_lines_are_relayed_as_they_came`]); a chunk cut by the read
/// passes as two chunks of its halves; the last chunk and trailers never pass.
#[test]
fn whole_chunks_pass_as_they_came_and_split_ones_are_framed_anew() {
    let mut decoder = ChunkedDecoder::new();
    let mut out = BytesMut::new();
    let burst = b"9\r\ndata: 1\n\n\r\n9;x=y\r\ndata: 2\n\n\r\n9\r\ndata";
    assert_eq!(decoder.relay(burst, &mut out), Ok(burst.len()));
    assert_eq!(
        &out[..],
        b"9\r\ndata: 1\n\n\r\n9\r\ndata: 2\n\n\r\n4\r\ndata\r\n"
    );
    let mut out = BytesMut::new();
    let rest = b": 3\n\n\r\n0\r\nx-t: 1\r\n\r\nGET";
    assert_eq!(decoder.relay(rest, &mut out), Ok(rest.len() - 3));
    assert_eq!(&out[..], b"5\r\n: 3\n\n\r\n");
    assert!(decoder.is_done());
    assert_eq!(decoder.take_trailers().unwrap().unwrap()["x-t"], "1");
}

/// Size lines that are valid but not `HEX CRLF` (white space after the size, extensions, a
/// control byte in one) are never relayed as they came: strict clients (Node's llhttp, the
/// OpenAI Node SDK's) refuse them, so the chunk is framed anew, without its extensions. A plain
/// line (upper-case digits and leading zeros included) passes as it came, whole or alone.
#[test]
fn only_plain_size_lines_are_relayed_as_they_came() {
    let canonical: &[u8] = b"b\r\ndata: one\n\n\r\n";
    for line in [
        &b"b \t\r\n"[..],
        b"b \r\n",
        b"b ;x\r\n",
        b"b;x=\x01\r\n",
        b"b;name=value\r\n",
        b"b\t;a=\"q\"\r\n",
    ] {
        let mut body = line.to_vec();
        body.extend_from_slice(b"data: one\n\n\r\n0\r\n\r\n");
        let (relayed, consumed, done) = relay_in_pieces(&body, &[]);
        assert_eq!(done, Ok(true));
        assert_eq!(consumed, body.len());
        assert_eq!(
            String::from_utf8_lossy(&relayed),
            String::from_utf8_lossy(canonical),
            "{:?}",
            String::from_utf8_lossy(line)
        );
        // Behind a plain chunk of the same read, and ahead of one.
        let mut burst = b"5\r\nhello\r\n".to_vec();
        burst.extend_from_slice(&body[..body.len() - 5]);
        burst.extend_from_slice(b"5\r\nworld\r\n0\r\n\r\n");
        let (relayed, _, done) = relay_in_pieces(&burst, &[]);
        assert_eq!(done, Ok(true));
        let mut expected = b"5\r\nhello\r\n".to_vec();
        expected.extend_from_slice(canonical);
        expected.extend_from_slice(b"5\r\nworld\r\n");
        assert_eq!(
            String::from_utf8_lossy(&relayed),
            String::from_utf8_lossy(&expected)
        );
    }
    for plain in [&b"B\r\ndata: one\n\n\r\n"[..], b"000b\r\ndata: one\n\n\r\n"] {
        let mut body = plain.to_vec();
        body.extend_from_slice(b"0\r\n\r\n");
        let (relayed, _, done) = relay_in_pieces(&body, &[]);
        assert_eq!(done, Ok(true));
        assert_eq!(&relayed[..], plain);
    }
    // Longer than the fast path looks (16 digits): still plain, still as it came.
    let mut long = b"000000000000000b\r\ndata: one\n\n\r\n".to_vec();
    let plain_length = long.len();
    long.extend_from_slice(b"0\r\n\r\n");
    assert_eq!(relay_in_pieces(&long, &[]).0, &long[..plain_length]);
}

#[test]
fn chunk_sizes_are_lower_case_hex_without_leading_zeros() {
    let mut digits = [0u8; 16];
    for (length, expected) in [
        (0, "0"),
        (1, "1"),
        (10, "a"),
        (255, "ff"),
        (4096, "1000"),
        (usize::MAX, "ffffffffffffffff"),
    ] {
        assert_eq!(
            chunk_size_digits(length, &mut digits),
            expected.as_bytes(),
            "{length}"
        );
    }
}
