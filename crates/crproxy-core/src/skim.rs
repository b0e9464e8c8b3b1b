//! A forward-only JSON reader for texts the proxy reads a few fields of and
//! passes on (or drops) whole: named GET answers, write answers, the ownership
//! cache's watch events and list pages.
//!
//! The caller walks the objects it cares about ([`Skim::object`],
//! [`Entries::next_key`]), reads the strings it wants ([`Skim::string`]) and
//! [`skip`](Skim::skip)s every other value. Skipping still checks the value is
//! JSON by the rules serde_json applies when it ignores a value: the same
//! grammar, escapes and control characters checked in strings, and no limit on
//! nesting (the walk is a loop, not a recursion). Unlike serde_json's, this skip
//! is one loop over the bytes instead of a visitor call per token, which is where
//! a skipped `managedFields` used to cost most of an event's decoding.
//!
//! The text is a `&str`: the caller checks the whole of it for UTF-8 once (a fast
//! pass), so a string read is a slice of it, where checking each string on its
//! own cost about a hundred instructions a string.

use std::borrow::Cow;

/// Why a text could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{problem} at byte {at}")]
pub struct SkimError {
    /// Offset of the byte the problem was found at.
    pub at: usize,
    pub problem: Problem,
}

/// What was wrong with the text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    #[error("the text ended inside a value")]
    End,
    #[error("unexpected byte")]
    Unexpected,
    #[error("expected an object")]
    ExpectedObject,
    #[error("expected an array")]
    ExpectedArray,
    #[error("expected a string")]
    ExpectedString,
    #[error("expected a string or null")]
    ExpectedStringOrNull,
    #[error("expected a string key")]
    ExpectedKey,
    #[error("expected `:`")]
    ExpectedColon,
    #[error("expected `,` or the container's end")]
    ExpectedCommaOrEnd,
    #[error("invalid escape in a string")]
    Escape,
    #[error("control character in a string")]
    ControlCharacter,
    #[error("lone surrogate in a \\u escape")]
    LoneSurrogate,
    #[error("invalid number")]
    Number,
    #[error("more text after the value")]
    Trailing,
}

/// The type of the next value, as its first byte tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Object,
    Array,
    String,
    Number,
    Bool,
    Null,
}

/// A reader positioned somewhere in one JSON text.
#[derive(Debug)]
pub struct Skim<'a> {
    source: &'a str,
    at: usize,
}

/// The entries of an object entered with [`Skim::object`].
#[derive(Debug)]
pub struct Entries {
    first: bool,
}

/// The elements of an array entered with [`Skim::array`].
#[derive(Debug)]
pub struct Elements {
    first: bool,
}

impl<'a> Skim<'a> {
    /// A reader at the start of `source`.
    pub fn new(source: &'a str) -> Self {
        Skim { source, at: 0 }
    }

    /// The source's bytes, which the reader scans.
    #[inline(always)]
    fn text(&self) -> &'a [u8] {
        self.source.as_bytes()
    }

    /// The reader's offset in the source: just past what it has read.
    pub fn position(&self) -> usize {
        self.at
    }

    /// The type of the next value, after any whitespace.
    pub fn peek(&mut self) -> Result<Kind, SkimError> {
        match self.next_token()? {
            b'{' => Ok(Kind::Object),
            b'[' => Ok(Kind::Array),
            b'"' => Ok(Kind::String),
            b'-' | b'0'..=b'9' => Ok(Kind::Number),
            b't' | b'f' => Ok(Kind::Bool),
            b'n' => Ok(Kind::Null),
            _ => Err(self.error(Problem::Unexpected)),
        }
    }

    /// Enters the object that comes next.
    pub fn object(&mut self) -> Result<Entries, SkimError> {
        self.expect(b'{', Problem::ExpectedObject)?;
        Ok(Entries { first: true })
    }

    /// Enters the array that comes next.
    pub fn array(&mut self) -> Result<Elements, SkimError> {
        self.expect(b'[', Problem::ExpectedArray)?;
        Ok(Elements { first: true })
    }

    /// Reads the string that comes next, borrowed unless it holds escapes.
    pub fn string(&mut self) -> Result<Cow<'a, str>, SkimError> {
        self.expect(b'"', Problem::ExpectedString)?;
        self.read_string()
    }

    /// Enters the next value if it is an object; any other value is skipped.
    pub fn object_or_skip(&mut self) -> Result<Option<Entries>, SkimError> {
        match self.peek()? {
            Kind::Object => self.object().map(Some),
            _ => self.skip().map(|()| None),
        }
    }

    /// Enters the next value if it is an array; any other value is skipped.
    pub fn array_or_skip(&mut self) -> Result<Option<Elements>, SkimError> {
        match self.peek()? {
            Kind::Array => self.array().map(Some),
            _ => self.skip().map(|()| None),
        }
    }

    /// The next value if it is a string; any other value is skipped.
    pub fn string_or_skip(&mut self) -> Result<Option<Cow<'a, str>>, SkimError> {
        match self.peek()? {
            Kind::String => self.string().map(Some),
            _ => self.skip().map(|()| None),
        }
    }

    /// The next value if it is a string, `None` if it is `null`; any other value
    /// is an error (a field that must be text when present).
    pub fn optional_string(&mut self) -> Result<Option<Cow<'a, str>>, SkimError> {
        match self.peek()? {
            Kind::String => self.string().map(Some),
            Kind::Null => self.skip().map(|()| None),
            _ => Err(self.error(Problem::ExpectedStringOrNull)),
        }
    }

    /// Checks that nothing but whitespace follows.
    pub fn end(mut self) -> Result<(), SkimError> {
        self.skip_whitespace();
        if self.at < self.text().len() {
            return Err(self.error(Problem::Trailing));
        }
        Ok(())
    }

    /// Skips the value that comes next, checking it is JSON. The helpers this
    /// loop calls per token are `#[inline(always)]`: as calls they were about a
    /// sixth of a skipped event's instructions (callgrind).
    pub fn skip(&mut self) -> Result<(), SkimError> {
        self.skip_nesting().map(|_| ())
    }

    /// [`Skim::skip`], telling how deeply the skipped value nests: 0 for a
    /// scalar, 1 for an object or array of scalars, one more per container
    /// inside (serde_json refuses to decode past 127).
    pub fn skip_nesting(&mut self) -> Result<usize, SkimError> {
        let mut open = Nesting::default();
        loop {
            // A value is expected here.
            match self.next_token()? {
                token @ (b'{' | b'[') => {
                    let is_object = token == b'{';
                    self.at += 1;
                    let close = if is_object { b'}' } else { b']' };
                    if self.next_token()? == close {
                        self.at += 1;
                        open.deepest = open.deepest.max(open.levels + 1);
                    } else if is_object {
                        open.push(true);
                        self.skip_key()?;
                        continue;
                    } else {
                        open.push(false);
                        continue;
                    }
                }
                b'"' => {
                    self.at += 1;
                    self.skip_string()?;
                }
                b'-' | b'0'..=b'9' => self.skip_number()?,
                b't' => self.literal(b"true")?,
                b'f' => self.literal(b"false")?,
                b'n' => self.literal(b"null")?,
                _ => return Err(self.error(Problem::Unexpected)),
            }
            // A value has ended: close containers until one has more to come.
            loop {
                let Some(in_object) = open.innermost() else {
                    return Ok(open.deepest);
                };
                match (self.next_token()?, in_object) {
                    (b',', true) => {
                        self.at += 1;
                        self.skip_key()?;
                        break;
                    }
                    (b',', false) => {
                        self.at += 1;
                        break;
                    }
                    (b'}', true) | (b']', false) => {
                        self.at += 1;
                        open.pop();
                    }
                    _ => return Err(self.error(Problem::ExpectedCommaOrEnd)),
                }
            }
        }
    }

    /// In a walked container: whether a member follows (reading the comma before
    /// it) or the container ends at `close` (reading it).
    fn next_member(&mut self, first: &mut bool, close: u8) -> Result<bool, SkimError> {
        let token = self.next_token()?;
        if token == close {
            self.at += 1;
            return Ok(false);
        }
        if !*first {
            if token != b',' {
                return Err(self.error(Problem::ExpectedCommaOrEnd));
            }
            self.at += 1;
        }
        *first = false;
        Ok(true)
    }

    /// After `{` or `,` in a skipped object: a key and its colon.
    #[inline(always)]
    fn skip_key(&mut self) -> Result<(), SkimError> {
        self.expect(b'"', Problem::ExpectedKey)?;
        self.skip_string()?;
        self.expect(b':', Problem::ExpectedColon)
    }

    /// After `{` or `,` in a walked object: a key, read, and its colon.
    fn key(&mut self) -> Result<Cow<'a, str>, SkimError> {
        self.expect(b'"', Problem::ExpectedKey)?;
        let key = self.read_string()?;
        self.expect(b':', Problem::ExpectedColon)?;
        Ok(key)
    }

    /// Reads one byte, after whitespace, that must be `byte`.
    fn expect(&mut self, byte: u8, problem: Problem) -> Result<(), SkimError> {
        if self.next_token()? != byte {
            return Err(self.error(problem));
        }
        self.at += 1;
        Ok(())
    }

    /// The first byte of the next token, after whitespace.
    #[inline(always)]
    fn next_token(&mut self) -> Result<u8, SkimError> {
        self.skip_whitespace();
        match self.text().get(self.at) {
            Some(byte) => Ok(*byte),
            None => Err(self.error(Problem::End)),
        }
    }

    #[inline(always)]
    fn skip_whitespace(&mut self) {
        while let Some(b' ' | b'\n' | b'\t' | b'\r') = self.text().get(self.at) {
            self.at += 1;
        }
    }

    /// Moves to the next byte that ends the fast scan of a string.
    #[inline(always)]
    fn advance_to_string_stop(&mut self) -> Result<u8, SkimError> {
        // Eight bytes at a time, as serde_json does. The last few are padded with
        // spaces, which never stop a string, and tested the same way.
        loop {
            let rest = self.text().get(self.at..).unwrap_or_default();
            let word = match rest.first_chunk::<8>() {
                Some(chunk) => u64::from_le_bytes(*chunk),
                None if rest.is_empty() => return Err(self.error(Problem::End)),
                None => {
                    let mut padded = [b' '; 8];
                    padded[..rest.len()].copy_from_slice(rest);
                    u64::from_le_bytes(padded)
                }
            };
            let stops = string_stops(word);
            if stops != 0 {
                // The lowest flagged byte is exact: the first stop in the text.
                let offset = (stops.trailing_zeros() / 8) as usize;
                self.at += offset;
                return Ok(rest[offset]);
            }
            self.at += rest.len().min(8);
        }
    }

    /// Skips the rest of a string whose opening quote was read.
    #[inline(always)]
    fn skip_string(&mut self) -> Result<(), SkimError> {
        loop {
            match self.advance_to_string_stop()? {
                b'"' => {
                    self.at += 1;
                    return Ok(());
                }
                b'\\' => {
                    self.at += 1;
                    self.escape()?;
                }
                _ => return Err(self.error(Problem::ControlCharacter)),
            }
        }
    }

    /// Reads the rest of a string whose opening quote was read.
    fn read_string(&mut self) -> Result<Cow<'a, str>, SkimError> {
        let mut owned: Option<String> = None;
        let mut segment = self.at;
        loop {
            match self.advance_to_string_stop()? {
                b'"' => {
                    let tail = self.slice(segment)?;
                    self.at += 1;
                    return Ok(match owned {
                        None => Cow::Borrowed(tail),
                        Some(mut text) => {
                            text.push_str(tail);
                            Cow::Owned(text)
                        }
                    });
                }
                b'\\' => {
                    let before = self.slice(segment)?;
                    let text = owned.get_or_insert_with(String::new);
                    text.push_str(before);
                    self.at += 1;
                    self.read_escape(text)?;
                    segment = self.at;
                }
                _ => return Err(self.error(Problem::ControlCharacter)),
            }
        }
    }

    /// The source from `start` to the reader's position. Both are next to ASCII
    /// bytes (quotes, backslashes, escapes), so the slice cannot cut a character.
    fn slice(&self, start: usize) -> Result<&'a str, SkimError> {
        let source: &'a str = self.source;
        source
            .get(start..self.at)
            .ok_or_else(|| self.error_at(start, Problem::Unexpected))
    }

    /// After a backslash: the escape, which must be well formed. Skipping a
    /// string stops here: like serde_json, it does not check the code point of a
    /// `\u` escape.
    fn escape(&mut self) -> Result<Escape, SkimError> {
        let ch = match self.next_byte()? {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => return self.hex4().map(Escape::Unit),
            _ => return Err(self.error_at(self.at - 1, Problem::Escape)),
        };
        Ok(Escape::Char(ch))
    }

    /// After a backslash in a string being read: appends what it stands for.
    fn read_escape(&mut self, out: &mut String) -> Result<(), SkimError> {
        match self.escape()? {
            Escape::Char(ch) => out.push(ch),
            Escape::Unit(unit) => out.push(self.code_point(unit)?),
        }
        Ok(())
    }

    /// The character a `\u` escape of `first` stands for, reading the second
    /// half of a surrogate pair when it takes two.
    fn code_point(&mut self, first: u16) -> Result<char, SkimError> {
        let first = u32::from(first);
        let code = match first {
            0xD800..=0xDBFF => {
                if self.text().get(self.at..self.at + 2) != Some(b"\\u") {
                    return Err(self.error(Problem::LoneSurrogate));
                }
                self.at += 2;
                let second = u32::from(self.hex4()?);
                if !(0xDC00..=0xDFFF).contains(&second) {
                    return Err(self.error(Problem::LoneSurrogate));
                }
                0x1_0000 + ((first - 0xD800) << 10) + (second - 0xDC00)
            }
            0xDC00..=0xDFFF => return Err(self.error(Problem::LoneSurrogate)),
            _ => first,
        };
        char::from_u32(code).ok_or_else(|| self.error(Problem::LoneSurrogate))
    }

    fn hex4(&mut self) -> Result<u16, SkimError> {
        let mut value = 0u16;
        for _ in 0..4 {
            let digit = match self.next_byte()? {
                byte @ b'0'..=b'9' => byte - b'0',
                byte @ b'a'..=b'f' => byte - b'a' + 10,
                byte @ b'A'..=b'F' => byte - b'A' + 10,
                _ => return Err(self.error_at(self.at - 1, Problem::Escape)),
            };
            value = (value << 4) | u16::from(digit);
        }
        Ok(value)
    }

    fn next_byte(&mut self) -> Result<u8, SkimError> {
        let byte = self
            .text()
            .get(self.at)
            .copied()
            .ok_or_else(|| self.error(Problem::End))?;
        self.at += 1;
        Ok(byte)
    }

    /// `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`
    fn skip_number(&mut self) -> Result<(), SkimError> {
        if self.text().get(self.at) == Some(&b'-') {
            self.at += 1;
        }
        match self.text().get(self.at) {
            Some(b'0') => {
                self.at += 1;
                // A leading zero may not be followed by more digits.
                if self.text().get(self.at).is_some_and(u8::is_ascii_digit) {
                    return Err(self.error(Problem::Number));
                }
            }
            Some(b'1'..=b'9') => self.digits(),
            Some(_) => return Err(self.error(Problem::Number)),
            None => return Err(self.error(Problem::End)),
        }
        if self.text().get(self.at) == Some(&b'.') {
            self.at += 1;
            self.one_or_more_digits()?;
        }
        if let Some(b'e' | b'E') = self.text().get(self.at) {
            self.at += 1;
            if let Some(b'+' | b'-') = self.text().get(self.at) {
                self.at += 1;
            }
            self.one_or_more_digits()?;
        }
        Ok(())
    }

    fn digits(&mut self) {
        while self.text().get(self.at).is_some_and(u8::is_ascii_digit) {
            self.at += 1;
        }
    }

    fn one_or_more_digits(&mut self) -> Result<(), SkimError> {
        match self.text().get(self.at) {
            Some(byte) if byte.is_ascii_digit() => {
                self.digits();
                Ok(())
            }
            Some(_) => Err(self.error(Problem::Number)),
            None => Err(self.error(Problem::End)),
        }
    }

    fn literal(&mut self, word: &[u8]) -> Result<(), SkimError> {
        let end = self.at + word.len();
        match self.text().get(self.at..end) {
            Some(found) if found == word => {
                self.at = end;
                Ok(())
            }
            _ => {
                // Point at the first byte that differs, or at the end.
                let same = self.text()[self.at..]
                    .iter()
                    .zip(word)
                    .take_while(|(a, b)| a == b)
                    .count();
                self.at += same;
                let problem = if self.at == self.text().len() {
                    Problem::End
                } else {
                    Problem::Unexpected
                };
                Err(self.error(problem))
            }
        }
    }

    #[cold]
    fn error(&self, problem: Problem) -> SkimError {
        self.error_at(self.at, problem)
    }

    #[cold]
    fn error_at(&self, at: usize, problem: Problem) -> SkimError {
        SkimError { at, problem }
    }
}

/// The high bit of each byte of `word` that is a quote, a backslash or below
/// 0x20 (bits above the first such byte may be set spuriously).
#[inline(always)]
fn string_stops(word: u64) -> u64 {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let zero_bytes = |x: u64| x.wrapping_sub(ONES) & !x & HIGHS;
    let below_space = word.wrapping_sub(ONES * 0x20) & !word & HIGHS;
    below_space
        | zero_bytes(word ^ (ONES * u64::from(b'"')))
        | zero_bytes(word ^ (ONES * u64::from(b'\\')))
}

impl Entries {
    /// The next key of the object, its colon read; `None` once the object has
    /// ended (the reader is then past its `}`). The key's value must be read or
    /// skipped before the next call.
    pub fn next_key<'a>(&mut self, skim: &mut Skim<'a>) -> Result<Option<Cow<'a, str>>, SkimError> {
        Ok(self.next_key_at(skim)?.map(|(_, key)| key))
    }

    /// As [`next_key`](Entries::next_key), with the offset of the key's opening
    /// quote: where the entry's text starts.
    pub fn next_key_at<'a>(
        &mut self,
        skim: &mut Skim<'a>,
    ) -> Result<Option<(usize, Cow<'a, str>)>, SkimError> {
        if !skim.next_member(&mut self.first, b'}')? {
            return Ok(None);
        }
        skim.skip_whitespace();
        let start = skim.at;
        skim.key().map(|key| Some((start, key)))
    }
}

impl Elements {
    /// Whether another element follows; when it does, it must be read or skipped
    /// before the next call. `false` once the array has ended (the reader is then
    /// past its `]`).
    pub fn next(&mut self, skim: &mut Skim) -> Result<bool, SkimError> {
        skim.next_member(&mut self.first, b']')
    }
}

/// What a backslash escape stands for.
enum Escape {
    Char(char),
    /// A `\u` escape's UTF-16 code unit, perhaps half of a surrogate pair.
    Unit(u16),
}

/// Which containers a skip is inside, innermost last: whether each is an object.
/// The first 128 levels are bits, so only a text nested deeper allocates.
#[derive(Default)]
struct Nesting {
    levels: usize,
    /// The most containers open at once so far.
    deepest: usize,
    low: u128,
    high: Vec<bool>,
}

impl Nesting {
    fn push(&mut self, is_object: bool) {
        if self.levels < 128 {
            let bit = 1u128 << self.levels;
            if is_object {
                self.low |= bit;
            } else {
                self.low &= !bit;
            }
        } else {
            self.high.push(is_object);
        }
        self.levels += 1;
        self.deepest = self.deepest.max(self.levels);
    }

    fn pop(&mut self) {
        if self.levels > 128 {
            self.high.pop();
        }
        self.levels = self.levels.saturating_sub(1);
    }

    /// Whether the innermost container is an object; `None` outside any.
    fn innermost(&self) -> Option<bool> {
        match self.levels {
            0 => None,
            1..=128 => Some(self.low & (1u128 << (self.levels - 1)) != 0),
            _ => self.high.last().copied(),
        }
    }
}

#[cfg(test)]
mod tests;
