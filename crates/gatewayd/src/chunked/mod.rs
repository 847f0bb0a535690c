//! An incremental validator and decoder of `Transfer-Encoding: chunked` bodies, for relaying a
//! worker's response without handing every chunk through a body channel of its own.
//!
//! Pure: it sees bytes, never a socket. The caller reads whatever the socket has into a buffer and
//! calls [`ChunkedDecoder::decode_in_place`]; the chunk data of everything in that buffer moves to
//! its front, so one read makes one frame however many chunks (SSE events) it held, and the
//! framing (size lines, extensions, the CRLF after each chunk, the last chunk, trailers) is
//! checked as it passes, wherever the reads split it. The rules and limits are hyper's (a size
//! line of hex digits, optional spaces or tabs, extensions ignored up to 16 KiB a body and never
//! holding a bare LF; trailers up to 16 KiB and 100 fields), so a body hyper refused is refused
//! here with the same words.
//!
//! [`ChunkedDecoder::relay`] validates the same way but keeps the framing: whole chunks with a
//! plain size line (hex digits, CRLF) pass as they came, for a client that takes the body chunked
//! too; any other chunk is framed anew.

use bytes::BytesMut;
use http::HeaderMap;
use http::header::{HeaderName, HeaderValue};

/// Most bytes of chunk extensions one body may carry (hyper's limit): they are skipped, but a
/// worker must not make the gateway skip forever.
pub const EXTENSIONS_LIMIT: u64 = 16 * 1024;
/// Most bytes of trailer section (hyper's limit); trailers are kept until the body ends.
pub const TRAILERS_LIMIT: usize = 16 * 1024;
/// Most trailer fields (hyper's default header count).
pub const TRAILER_FIELDS_LIMIT: usize = 100;

/// What is wrong with a chunked body. The messages are hyper's, so logs read as before.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ChunkedError {
    /// A chunk size line starts with something other than a hex digit.
    #[error("Invalid chunk size line: missing size digit")]
    MissingSizeDigit,
    /// A chunk size line holds something other than hex digits before its end or extensions.
    #[error("Invalid chunk size line: Invalid Size")]
    InvalidSize,
    /// Something other than spaces, `;` or CR after the white space behind a chunk size.
    #[error("Invalid chunk size linear white space")]
    InvalidSizeWhiteSpace,
    /// A chunk size that does not fit 64 bits.
    #[error("invalid chunk size: overflow")]
    SizeOverflow,
    /// A bare LF in a chunk extension.
    #[error("invalid chunk extension contains newline")]
    ExtensionNewline,
    /// More than [`EXTENSIONS_LIMIT`] bytes of chunk extensions.
    #[error("chunk extensions over limit")]
    ExtensionsOverLimit,
    /// A size line's CR not followed by LF.
    #[error("Invalid chunk size LF")]
    SizeLf,
    /// A chunk's data not followed by CR (the data was longer than its size said).
    #[error("Invalid chunk body CR")]
    BodyCr,
    /// A chunk's data not followed by CRLF.
    #[error("Invalid chunk body LF")]
    BodyLf,
    /// A trailer field's CR not followed by LF.
    #[error("Invalid trailer end LF")]
    TrailerLf,
    /// More than [`TRAILER_FIELDS_LIMIT`] trailer fields.
    #[error("chunk trailers count overflow")]
    TrailerCount,
    /// More than [`TRAILERS_LIMIT`] bytes of trailers.
    #[error("chunk trailers bytes over limit")]
    TrailersOverLimit,
    /// The final CR not followed by LF.
    #[error("Invalid chunk end LF")]
    EndLf,
    /// The trailers are not header fields.
    #[error("invalid chunk trailers")]
    InvalidTrailers,
    /// The body ended (the worker closed the connection) before its last chunk.
    #[error("end of file before message length reached")]
    Truncated,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Start,
    Size,
    SizeWhiteSpace,
    Extension,
    SizeLf,
    Data,
    DataCr,
    DataLf,
    Trailer,
    TrailerLf,
    EndCr,
    EndLf,
    End,
}

/// What one [`ChunkedDecoder::decode_in_place`] call did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decoded {
    /// The buffer's first `data` bytes are now chunk data, in order.
    pub data: usize,
    /// Bytes of the input that belonged to the body. Less than the input only when the body
    /// ended inside it; the rest is whatever the worker sent after the body.
    pub consumed: usize,
}

/// A malformation found by [`ChunkedDecoder::decode_in_place`], and the data decoded before it
/// (at the buffer's front), which is as valid as it was before the bad byte arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Malformed {
    /// What is wrong.
    pub error: ChunkedError,
    /// The buffer's first `data` bytes are the chunk data before the malformation.
    pub data: usize,
}

/// The state of one chunked body between reads.
#[derive(Debug, Clone)]
pub struct ChunkedDecoder {
    state: State,
    /// The size being read, then the data bytes left of the current chunk.
    size: u64,
    extension_bytes: u64,
    /// The trailer section's bytes, once one started.
    trailers: Option<Vec<u8>>,
    trailer_fields: usize,
}

impl Default for ChunkedDecoder {
    fn default() -> Self {
        Self::new()
    }
}

impl ChunkedDecoder {
    /// A decoder at the start of a body.
    pub fn new() -> Self {
        Self {
            state: State::Start,
            size: 0,
            extension_bytes: 0,
            trailers: None,
            trailer_fields: 0,
        }
    }

    /// Whether the last chunk and the trailer section (if any) have passed.
    pub fn is_done(&self) -> bool {
        self.state == State::End
    }

    /// The error for the connection ending now: `None` once the body is done.
    pub fn at_end_of_input(&self) -> Option<ChunkedError> {
        (!self.is_done()).then_some(ChunkedError::Truncated)
    }

    /// Decodes the next bytes of the body, in place: the chunk data among `buffer`'s bytes moves
    /// to its front (see [`Decoded`]). Stops at the body's end; an error means the body is
    /// malformed and nothing after the data before it may be relayed.
    pub fn decode_in_place(&mut self, buffer: &mut [u8]) -> Result<Decoded, Malformed> {
        let mut read = 0;
        let mut written = 0;
        while read < buffer.len() && self.state != State::End {
            if self.state == State::Data {
                let available = buffer.len() - read;
                let take = usize::try_from(self.size).map_or(available, |left| left.min(available));
                buffer.copy_within(read..read + take, written);
                read += take;
                written += take;
                self.size -= take as u64;
                if self.size == 0 {
                    self.state = State::DataCr;
                }
                continue;
            }
            self.state = self.step(buffer[read]).map_err(|error| Malformed {
                error,
                data: written,
            })?;
            read += 1;
        }
        Ok(Decoded {
            data: written,
            consumed: read,
        })
    }

    /// Validates the next bytes of the body and appends them to `out` as whole chunks, for a
    /// client that takes the body chunked too: a chunk that lies entirely within `input` and has a
    /// plain size line (hex digits, CRLF) is copied as it came; one whose size line holds white
    /// space or extensions, and the part of a chunk that began in an earlier input or ends in a
    /// later one, get a plain size line of their own (extensions dropped), so whatever `out` is
    /// given is whole chunks a writer can put its own between. The last chunk and the trailers
    /// are checked, never copied: the writer ends the body itself. Returns the bytes of `input`
    /// that belonged to the body (fewer only when it ended inside it). On a malformation,
    /// [`Malformed::data`] counts the bytes appended before it, which are as good as ever.
    pub fn relay(&mut self, input: &[u8], out: &mut BytesMut) -> Result<usize, Malformed> {
        let appended_before = out.len();
        let mut read = 0;
        // Where the current chunk's size line began, when it began in this input.
        let mut line_start = None;
        // The current chunk's data within this input, not yet appended.
        let mut data: Option<(usize, usize)> = None;
        while read < input.len() && self.state != State::End {
            if self.state == State::Data {
                let available = input.len() - read;
                let take = usize::try_from(self.size).map_or(available, |left| left.min(available));
                let from = data.map_or(read, |(from, _)| from);
                data = Some((from, read + take));
                read += take;
                self.size -= take as u64;
                if self.size == 0 {
                    self.state = State::DataCr;
                }
                continue;
            }
            if self.state == State::Start {
                // The usual case, a run of whole plain chunks (an SSE burst), checked a chunk at
                // a time and copied at once; anything else goes byte by byte below.
                let from = read;
                while let Some(length) = whole_plain_chunk(&input[read..]) {
                    read += length;
                }
                if read > from {
                    out.extend_from_slice(&input[from..read]);
                    continue;
                }
                line_start = Some(read);
            }
            let before = self.state;
            match self.step(input[read]) {
                Ok(state) => self.state = state,
                Err(error) => {
                    if let Some((from, to)) = data {
                        frame_chunk(out, &input[from..to]);
                    }
                    return Err(Malformed {
                        error,
                        data: out.len() - appended_before,
                    });
                }
            }
            read += 1;
            if before == State::DataLf {
                // A chunk ended: as it came when all of it was in this input and its size line
                // is plain, else framed anew.
                match (line_start.take(), data.take()) {
                    (Some(start), Some((from, _))) if is_plain_size_line(&input[start..from]) => {
                        out.extend_from_slice(&input[start..read]);
                    }
                    (_, Some((from, to))) => frame_chunk(out, &input[from..to]),
                    (_, None) => {}
                }
            }
        }
        if let Some((from, to)) = data {
            frame_chunk(out, &input[from..to]);
        }
        Ok(read)
    }

    /// The trailer fields of a finished body that had any.
    pub fn take_trailers(&mut self) -> Result<Option<HeaderMap>, ChunkedError> {
        match self.trailers.take() {
            Some(bytes) if self.is_done() => parse_trailers(&bytes, self.trailer_fields).map(Some),
            _ => Ok(None),
        }
    }

    /// One framing byte.
    fn step(&mut self, byte: u8) -> Result<State, ChunkedError> {
        use State::*;
        Ok(match self.state {
            Start => {
                self.size = 0;
                self.add_digit(byte)
                    .ok_or(ChunkedError::MissingSizeDigit)??;
                Size
            }
            Size => match byte {
                b'\t' | b' ' => SizeWhiteSpace,
                b';' => Extension,
                b'\r' => SizeLf,
                _ => {
                    self.add_digit(byte).ok_or(ChunkedError::InvalidSize)??;
                    Size
                }
            },
            SizeWhiteSpace => match byte {
                b'\t' | b' ' => SizeWhiteSpace,
                b';' => Extension,
                b'\r' => SizeLf,
                _ => return Err(ChunkedError::InvalidSizeWhiteSpace),
            },
            Extension => match byte {
                b'\r' => SizeLf,
                b'\n' => return Err(ChunkedError::ExtensionNewline),
                _ => {
                    self.extension_bytes += 1;
                    if self.extension_bytes >= EXTENSIONS_LIMIT {
                        return Err(ChunkedError::ExtensionsOverLimit);
                    }
                    Extension
                }
            },
            SizeLf => match byte {
                b'\n' if self.size == 0 => EndCr,
                b'\n' => Data,
                _ => return Err(ChunkedError::SizeLf),
            },
            DataCr => match byte {
                b'\r' => DataLf,
                _ => return Err(ChunkedError::BodyCr),
            },
            DataLf => match byte {
                b'\n' => Start,
                _ => return Err(ChunkedError::BodyLf),
            },
            Trailer => {
                self.keep_trailer_byte(byte)?;
                if byte == b'\r' { TrailerLf } else { Trailer }
            }
            TrailerLf => match byte {
                b'\n' => {
                    if self.trailer_fields >= TRAILER_FIELDS_LIMIT {
                        return Err(ChunkedError::TrailerCount);
                    }
                    self.trailer_fields += 1;
                    self.keep_trailer_byte(byte)?;
                    EndCr
                }
                _ => return Err(ChunkedError::TrailerLf),
            },
            EndCr => match byte {
                b'\r' => {
                    if self.trailers.is_some() {
                        self.keep_trailer_byte(byte)?;
                    }
                    EndLf
                }
                _ => {
                    self.trailers.get_or_insert_with(Vec::new);
                    self.keep_trailer_byte(byte)?;
                    Trailer
                }
            },
            EndLf => match byte {
                b'\n' => {
                    if self.trailers.is_some() {
                        self.keep_trailer_byte(byte)?;
                    }
                    End
                }
                _ => return Err(ChunkedError::EndLf),
            },
            // `decode_in_place` handles data in bulk and stops at the end.
            Data | End => unreachable!("no single-byte step in {:?}", self.state),
        })
    }

    /// Adds a hex digit to the size: `None` when `byte` is none, an error on overflow.
    fn add_digit(&mut self, byte: u8) -> Option<Result<(), ChunkedError>> {
        let digit = match byte {
            b'0'..=b'9' => byte - b'0',
            b'a'..=b'f' => byte - b'a' + 10,
            b'A'..=b'F' => byte - b'A' + 10,
            _ => return None,
        };
        Some(
            self.size
                .checked_mul(16)
                .and_then(|size| size.checked_add(u64::from(digit)))
                .map(|size| self.size = size)
                .ok_or(ChunkedError::SizeOverflow),
        )
    }

    fn keep_trailer_byte(&mut self, byte: u8) -> Result<(), ChunkedError> {
        let trailers = self.trailers.as_mut().expect("a trailer section started");
        trailers.push(byte);
        if trailers.len() >= TRAILERS_LIMIT {
            return Err(ChunkedError::TrailersOverLimit);
        }
        Ok(())
    }
}

/// The length of the whole chunk at the start of `input` when it is a plain one — a size line of
/// at most 15 hex digits and nothing else, its data, CRLF — all within `input`; `None` for
/// anything else (the last chunk, extensions, white space, a chunk cut by the input's end, bad
/// framing), which the byte-by-byte path takes.
fn whole_plain_chunk(input: &[u8]) -> Option<usize> {
    let mut size: usize = 0;
    let mut digits = 0;
    for &byte in input.iter().take(15) {
        let digit = match byte {
            b'0'..=b'9' => byte - b'0',
            b'a'..=b'f' => byte - b'a' + 10,
            b'A'..=b'F' => byte - b'A' + 10,
            _ => break,
        };
        size = size.checked_mul(16)?.checked_add(usize::from(digit))?;
        digits += 1;
    }
    if digits == 0 || size == 0 || input.get(digits..digits + 2) != Some(b"\r\n") {
        return None;
    }
    let end = digits.checked_add(2)?.checked_add(size)?.checked_add(2)?;
    (input.get(end - 2..end) == Some(b"\r\n")).then_some(end)
}

/// Whether a chunk's validated size line (its CRLF included) is hex digits then CRLF and
/// nothing else. Only such a line is relayed as it came: white space after the size, and chunk
/// extensions (which have no meaning the gateway or an SSE client knows), are valid but strict
/// clients refuse some of them (Node's llhttp: `HPE_INVALID_CHUNK_SIZE` for white space,
/// `HPE_STRICT` for a control byte in an extension), so such a chunk is framed anew without them.
fn is_plain_size_line(line: &[u8]) -> bool {
    line.iter().find(|byte| !byte.is_ascii_hexdigit()) == Some(&b'\r')
}

/// `length` in lower-case hex without leading zeros, as a chunk size line writes it: the digits
/// are the end of `digits` (at most 16, a `usize`), returned as a slice of it.
pub fn chunk_size_digits(length: usize, digits: &mut [u8; 16]) -> &[u8] {
    let mut rest = length;
    let mut start = digits.len();
    loop {
        start -= 1;
        digits[start] = b"0123456789abcdef"[rest & 15];
        rest >>= 4;
        if rest == 0 {
            break;
        }
    }
    &digits[start..]
}

/// Appends `data` as one chunk: its size in hex, CRLF, the data, CRLF.
pub fn frame_chunk(out: &mut BytesMut, data: &[u8]) {
    if data.is_empty() {
        return;
    }
    let mut digits = [0u8; 16];
    let size = chunk_size_digits(data.len(), &mut digits);
    out.reserve(size.len() + data.len() + 4);
    out.extend_from_slice(size);
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

/// The trailer section `bytes` (fields, each ending in CRLF, then the final CRLF), as headers.
fn parse_trailers(bytes: &[u8], fields: usize) -> Result<HeaderMap, ChunkedError> {
    let mut parsed = vec![httparse::EMPTY_HEADER; fields];
    let Ok(httparse::Status::Complete((_, parsed))) = httparse::parse_headers(bytes, &mut parsed)
    else {
        return Err(ChunkedError::InvalidTrailers);
    };
    let mut trailers = HeaderMap::with_capacity(parsed.len());
    for field in parsed {
        let name = HeaderName::from_bytes(field.name.as_bytes())
            .map_err(|_| ChunkedError::InvalidTrailers)?;
        let value =
            HeaderValue::from_bytes(field.value).map_err(|_| ChunkedError::InvalidTrailers)?;
        trailers.append(name, value);
    }
    Ok(trailers)
}

#[cfg(test)]
mod tests;
