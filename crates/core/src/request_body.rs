//! An incremental scanner of a JSON request body's top-level `model` and `rid` fields.
//!
//! The gateway routes an OpenAI request by the model its body names, and (opt-in) by SGLang's
//! request id `rid`. Bodies arrive in chunks and may be long: openai-python writes `messages`
//! before `model`, so a long chat puts the model late. [`BodyScanner`] is fed the body chunk by
//! chunk, keeps no copy of it, and answers as soon as every wanted field was found or the
//! top-level object ended; a body that is not JSON, or whose top-level value is not an object, is
//! refused at the first byte that shows it.
//!
//! What it reads, for a body that is valid JSON, is what `serde_json` reads: the string value of
//! the top-level key (escapes decoded, keys compared after decoding), nested objects and arrays
//! skipped whole, strings holding braces or quotes skipped as strings. Where it differs:
//! - a key that appears twice counts at its first appearance (the scanner stops early, so a later
//!   duplicate is never seen);
//! - after the answer the rest of the body is not checked (the worker reads the whole body);
//! - inside skipped nested values only strings and brackets are checked, not every token.
//!
//! Cost: one pass over the bytes up to the answer, strings skipped with `memchr` and nested values
//! walked in one call per run of structure rather than one step per byte; memory is the
//! bracket stack of the nested value being skipped plus the decoded key and wanted values.

use std::fmt;

mod lineage;

pub use lineage::rid_lineage_root;

/// Which top-level fields a scan looks for; the scan answers once all of them were found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WantedFields {
    /// Look for `model` (the model a request names).
    pub model: bool,
    /// Look for `rid` (SGLang's request id, a routing key).
    pub rid: bool,
}

/// The wanted fields a scan found. A field that is absent, or was not wanted, is `None`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BodyFields {
    /// The top-level `model`, decoded.
    pub model: Option<String>,
    /// The top-level `rid` when it is a string (SGLang also accepts a list of ids for a batch,
    /// which is no single routing key and reads as absent).
    pub rid: Option<String>,
}

/// Why a body gives no fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BodyProblem {
    /// The body was empty (or only whitespace).
    Empty,
    /// The body is not JSON: the first offending byte's offset from the body's start.
    NotJson {
        /// Offset of the byte that shows it, or the body's length when it ended too early.
        offset: u64,
    },
    /// The body is JSON but its top-level value is not an object.
    NotAnObject,
    /// The top-level `model` is not a string.
    ModelNotAString,
}

impl fmt::Display for BodyProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BodyProblem::Empty => f.write_str("the request body is empty"),
            BodyProblem::NotJson { offset } => {
                write!(f, "the request body is not JSON (at byte {offset})")
            }
            BodyProblem::NotAnObject => f.write_str("the request body is not a JSON object"),
            BodyProblem::ModelNotAString => f.write_str("the body's `model` is not a string"),
        }
    }
}

/// Whether a fed chunk settled the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// More of the body is needed.
    NeedMore,
    /// The answer is known; [`BodyScanner::finish`] gives it and further chunks are ignored.
    Answered,
}

/// Which top-level value is being read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    Model,
    Rid,
    Skip,
}

/// Where the scanner stands in the top-level object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Before the top-level value.
    BeforeObject,
    /// After `{`: a key or `}`.
    FirstKeyOrEnd,
    /// After `,`: a key.
    Key,
    /// In a key's string.
    InKey,
    /// After a key: `:`.
    Colon,
    /// After `:`: the value.
    Value(Target),
    /// In a top-level string value.
    InString(Target),
    /// In a top-level number or literal.
    InScalar,
    /// In a nested object or array (the bracket stack is not empty).
    InNested,
    /// In a string inside a nested value.
    InNestedString,
    /// After a value: `,` or `}`.
    AfterValue,
    /// Answered (the answer is in `answer`).
    Answered,
}

/// Escape state of the string being read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Escape {
    None,
    Backslash,
    Unicode { digits: u8, value: u16 },
}

/// Longest key worth keeping: a longer key is neither `model` nor `rid`.
const LONGEST_WANTED_KEY: usize = 5;

/// The incremental scanner; see the module documentation.
#[derive(Debug, Clone)]
pub struct BodyScanner {
    state: State,
    /// Bytes consumed so far (offsets in problems).
    offset: u64,
    escape: Escape,
    /// A `\uD800`–`\uDBFF` escape waiting for its low half.
    high_surrogate: Option<u16>,
    /// Whether the current string's decoded bytes are kept in `text`.
    keeping: bool,
    /// Whether the current string is a key that grew longer than any wanted key.
    key_too_long: bool,
    text: Vec<u8>,
    /// Open brackets of the nested value being skipped (`{` or `[`).
    brackets: Vec<u8>,
    /// Scalar bytes of a top-level number or literal (checked when it ends).
    scalar: Vec<u8>,
    fields: BodyFields,
    model_seen: bool,
    rid_seen: bool,
    answer: Option<Result<(), BodyProblem>>,
}

impl BodyScanner {
    /// A scanner looking for `wanted`.
    pub fn new(wanted: WantedFields) -> Self {
        Self {
            state: State::BeforeObject,
            offset: 0,
            escape: Escape::None,
            high_surrogate: None,
            keeping: false,
            key_too_long: false,
            text: Vec::new(),
            brackets: Vec::new(),
            scalar: Vec::new(),
            fields: BodyFields::default(),
            model_seen: !wanted.model,
            rid_seen: !wanted.rid,
            answer: None,
        }
    }

    /// Reads the next chunk of the body. Once [`Progress::Answered`], later chunks are ignored.
    pub fn feed(&mut self, chunk: &[u8]) -> Progress {
        let mut at = 0;
        while at < chunk.len() && self.state != State::Answered {
            match self.step(&chunk[at..]) {
                Ok(used) => at += used,
                Err(()) => {
                    self.fail(BodyProblem::NotJson {
                        offset: self.offset + at as u64,
                    });
                    break;
                }
            }
        }
        self.offset += at as u64;
        self.progress()
    }

    /// Whether the answer is known.
    pub fn progress(&self) -> Progress {
        if self.state == State::Answered {
            Progress::Answered
        } else {
            Progress::NeedMore
        }
    }

    /// The answer, at the end of the body (or once answered): the wanted fields found, or why
    /// the body gives none.
    pub fn finish(mut self) -> Result<BodyFields, BodyProblem> {
        if self.state != State::Answered {
            // A top-level value that is not an object is refused at its first byte, so a body
            // that ends unanswered either never began or ended inside the object.
            let problem = match self.state {
                State::BeforeObject => BodyProblem::Empty,
                _ => BodyProblem::NotJson {
                    offset: self.offset,
                },
            };
            self.fail(problem);
        }
        match self.answer {
            Some(Ok(())) => Ok(self.fields),
            Some(Err(problem)) => Err(problem),
            None => unreachable!("an answered scan holds its answer"),
        }
    }

    fn fail(&mut self, problem: BodyProblem) {
        self.state = State::Answered;
        self.answer = Some(Err(problem));
    }

    fn answer_found(&mut self) {
        self.state = State::Answered;
        self.answer = Some(Ok(()));
    }

    fn scalar_is_valid(&self) -> bool {
        matches!(self.scalar.as_slice(), b"true" | b"false" | b"null") || is_number(&self.scalar)
    }

    /// One step over the start of `rest`: returns how many bytes it used (none only when the
    /// state changed, so the loop moves on), or `Err` at a byte that is not JSON.
    fn step(&mut self, rest: &[u8]) -> Result<usize, ()> {
        let byte = rest[0];
        match self.state {
            State::BeforeObject => match byte {
                _ if is_space(byte) => Ok(1),
                b'{' => {
                    self.state = State::FirstKeyOrEnd;
                    Ok(1)
                }
                b'[' | b'"' | b'-' | b'0'..=b'9' | b't' | b'f' | b'n' => {
                    // A JSON value, but not an object: known at its first byte.
                    self.fail(BodyProblem::NotAnObject);
                    Ok(1)
                }
                _ => Err(()),
            },
            State::FirstKeyOrEnd | State::Key => match byte {
                _ if is_space(byte) => Ok(1),
                b'"' => {
                    self.start_string(true);
                    self.key_too_long = false;
                    self.state = State::InKey;
                    Ok(1)
                }
                b'}' if self.state == State::FirstKeyOrEnd => {
                    self.answer_found();
                    Ok(1)
                }
                _ => Err(()),
            },
            State::InKey => {
                let (used, closed) = self.string_bytes(rest)?;
                if closed {
                    self.state = State::Colon;
                }
                Ok(used)
            }
            State::Colon => match byte {
                _ if is_space(byte) => Ok(1),
                b':' => {
                    let target = self.target_of_key();
                    self.state = State::Value(target);
                    Ok(1)
                }
                _ => Err(()),
            },
            State::Value(target) => self.value_start(byte, target),
            State::InString(target) => {
                let (used, closed) = self.string_bytes(rest)?;
                if closed {
                    self.string_value_ended(target)?;
                }
                Ok(used)
            }
            State::InScalar => {
                if is_scalar_byte(byte) {
                    self.scalar.push(byte);
                    Ok(1)
                } else if self.scalar_is_valid() {
                    // The byte after the scalar is read in the next state.
                    self.state = State::AfterValue;
                    Ok(0)
                } else {
                    Err(())
                }
            }
            State::InNested => self.nested_bytes(rest),
            State::InNestedString => {
                let (used, closed) = self.string_bytes(rest)?;
                if closed {
                    self.state = State::InNested;
                }
                Ok(used)
            }
            State::AfterValue => match byte {
                _ if is_space(byte) => Ok(1),
                b',' => {
                    self.state = State::Key;
                    Ok(1)
                }
                b'}' => {
                    self.answer_found();
                    Ok(1)
                }
                _ => Err(()),
            },
            State::Answered => Ok(rest.len()),
        }
    }

    /// Which value follows the key just read.
    fn target_of_key(&self) -> Target {
        if self.key_too_long {
            return Target::Skip;
        }
        match self.text.as_slice() {
            b"model" if !self.model_seen => Target::Model,
            b"rid" if !self.rid_seen => Target::Rid,
            _ => Target::Skip,
        }
    }

    fn value_start(&mut self, byte: u8, target: Target) -> Result<usize, ()> {
        match byte {
            _ if is_space(byte) => return Ok(1),
            b'"' => {
                self.start_string(target != Target::Skip);
                self.state = State::InString(target);
                return Ok(1);
            }
            b'{' | b'[' => {
                self.brackets.clear();
                self.brackets.push(byte);
                self.state = State::InNested;
            }
            b'-' | b'0'..=b'9' | b't' | b'f' | b'n' => {
                self.scalar.clear();
                self.scalar.push(byte);
                self.state = State::InScalar;
            }
            _ => return Err(()),
        }
        // A wanted field whose value is not a string.
        match target {
            Target::Model => {
                self.fail(BodyProblem::ModelNotAString);
            }
            Target::Rid => {
                self.rid_seen = true;
                self.answer_if_complete();
            }
            Target::Skip => {}
        }
        Ok(1)
    }

    fn string_value_ended(&mut self, target: Target) -> Result<(), ()> {
        match target {
            Target::Model => {
                self.fields.model = Some(self.take_text()?);
                self.model_seen = true;
            }
            Target::Rid => {
                self.fields.rid = Some(self.take_text()?);
                self.rid_seen = true;
            }
            Target::Skip => {}
        }
        self.state = State::AfterValue;
        self.answer_if_complete();
        Ok(())
    }

    fn answer_if_complete(&mut self) {
        if self.model_seen && self.rid_seen {
            self.answer_found();
        }
    }

    fn take_text(&mut self) -> Result<String, ()> {
        String::from_utf8(std::mem::take(&mut self.text)).map_err(|_| ())
    }

    /// Skips through a nested value as far as `rest` allows, in one call rather than one `step`
    /// per byte: a long `messages` list is mostly structure between strings, and the per-byte
    /// dispatch was most of a scan's cost. A string with no escape that ends within `rest` is
    /// jumped over with `memchr2`; one that has an escape or runs past `rest` goes to the
    /// string state machine. At a byte that is not JSON the bytes before it are returned as
    /// used, so the next step refuses it at its own offset.
    fn nested_bytes(&mut self, rest: &[u8]) -> Result<usize, ()> {
        let mut at = 0;
        while at < rest.len() {
            let byte = rest[at];
            match byte {
                b'"' => {
                    let body = &rest[at + 1..];
                    match memchr::memchr2(b'"', b'\\', body) {
                        Some(end) if body[end] == b'"' => {
                            at += end + 2;
                            continue;
                        }
                        _ => {
                            self.start_string(false);
                            self.state = State::InNestedString;
                            return Ok(at + 1);
                        }
                    }
                }
                b'{' | b'[' => self.brackets.push(byte),
                b'}' | b']' => {
                    let open = if byte == b'}' { b'{' } else { b'[' };
                    if self.brackets.last() != Some(&open) {
                        return if at > 0 { Ok(at) } else { Err(()) };
                    }
                    self.brackets.pop();
                    if self.brackets.is_empty() {
                        self.state = State::AfterValue;
                        return Ok(at + 1);
                    }
                }
                _ if is_space(byte) || is_scalar_byte(byte) || byte == b',' || byte == b':' => {}
                _ => return if at > 0 { Ok(at) } else { Err(()) },
            }
            at += 1;
        }
        Ok(at)
    }

    fn start_string(&mut self, keep: bool) {
        self.keeping = keep;
        self.text.clear();
        self.escape = Escape::None;
        self.high_surrogate = None;
    }

    /// Reads string bytes from `rest`: how many were used and whether the closing quote was.
    fn string_bytes(&mut self, rest: &[u8]) -> Result<(usize, bool), ()> {
        if self.escape == Escape::None && self.high_surrogate.is_none() {
            // The fast path: plain bytes up to the next quote or backslash.
            let plain = memchr::memchr2(b'"', b'\\', rest).unwrap_or(rest.len());
            if plain > 0 {
                if self.keeping {
                    let run = &rest[..plain];
                    if run.iter().any(|&b| b < 0x20) {
                        return Err(());
                    }
                    self.keep(run);
                }
                return Ok((plain, false));
            }
        }
        let byte = rest[0];
        match self.escape {
            Escape::None => match byte {
                _ if self.high_surrogate.is_some() && byte != b'\\' => return Err(()),
                b'"' => return Ok((1, true)),
                b'\\' => self.escape = Escape::Backslash,
                _ => unreachable!("plain bytes take the fast path"),
            },
            Escape::Backslash => {
                if self.high_surrogate.is_some() && byte != b'u' {
                    return Err(());
                }
                let decoded = match byte {
                    b'"' => b'"',
                    b'\\' => b'\\',
                    b'/' => b'/',
                    b'b' => 0x08,
                    b'f' => 0x0c,
                    b'n' => b'\n',
                    b'r' => b'\r',
                    b't' => b'\t',
                    b'u' => {
                        self.escape = Escape::Unicode {
                            digits: 0,
                            value: 0,
                        };
                        return Ok((1, false));
                    }
                    _ => return Err(()),
                };
                self.escape = Escape::None;
                self.keep(&[decoded]);
            }
            Escape::Unicode { digits, value } => {
                let digit = (byte as char).to_digit(16).ok_or(())? as u16;
                let value = value << 4 | digit;
                if digits < 3 {
                    self.escape = Escape::Unicode {
                        digits: digits + 1,
                        value,
                    };
                } else {
                    self.escape = Escape::None;
                    self.code_unit(value)?;
                }
            }
        }
        Ok((1, false))
    }

    /// One `\uXXXX` code unit, joined with a pending high surrogate.
    fn code_unit(&mut self, unit: u16) -> Result<(), ()> {
        let code = match (self.high_surrogate.take(), unit) {
            (None, 0xD800..=0xDBFF) => {
                self.high_surrogate = Some(unit);
                return Ok(());
            }
            (None, 0xDC00..=0xDFFF) => return Err(()),
            (None, _) => u32::from(unit),
            (Some(high), 0xDC00..=0xDFFF) => {
                0x10000 + ((u32::from(high) - 0xD800) << 10) + (u32::from(unit) - 0xDC00)
            }
            (Some(_), _) => return Err(()),
        };
        let character = char::from_u32(code).ok_or(())?;
        let mut encoded = [0; 4];
        self.keep(character.encode_utf8(&mut encoded).as_bytes());
        Ok(())
    }

    fn keep(&mut self, bytes: &[u8]) {
        if !self.keeping {
            return;
        }
        if self.state == State::InKey && self.text.len() + bytes.len() > LONGEST_WANTED_KEY {
            self.key_too_long = true;
            self.keeping = false;
            return;
        }
        self.text.extend_from_slice(bytes);
    }
}

fn is_space(byte: u8) -> bool {
    matches!(byte, b' ' | b'\t' | b'\n' | b'\r')
}

/// Bytes a number or a literal is made of.
fn is_scalar_byte(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'+' | b'.')
}

/// JSON's number grammar: `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`.
fn is_number(text: &[u8]) -> bool {
    let digits = |at: usize| text[at..].iter().take_while(|b| b.is_ascii_digit()).count();
    let mut at = usize::from(text.first() == Some(&b'-'));
    let whole = digits(at);
    if whole == 0 || (whole > 1 && text[at] == b'0') {
        return false;
    }
    at += whole;
    if text.get(at) == Some(&b'.') {
        let fraction = digits(at + 1);
        if fraction == 0 {
            return false;
        }
        at += 1 + fraction;
    }
    if matches!(text.get(at), Some(b'e' | b'E')) {
        at += 1;
        if matches!(text.get(at), Some(b'+' | b'-')) {
            at += 1;
        }
        let exponent = digits(at);
        if exponent == 0 {
            return false;
        }
        at += exponent;
    }
    at == text.len()
}

#[cfg(test)]
mod tests;
