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
