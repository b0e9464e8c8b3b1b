//! Where the parts of a JSON write body the proxy edits sit in its text, found
//! by one walk that checks the whole text as strictly as parsing it did, and
//! the text written out again with those parts replaced.
//!
//! Only the objects that get labels or preconditions are rebuilt (`metadata`,
//! `metadata.labels` and, for a JSON patch, the operations around the caller's);
//! every other byte goes to the target as the caller sent it. Parsing the whole
//! body into a tree and serializing it again cost about a tenth of an owned PUT's
//! instructions (callgrind), most of it allocating strings and maps the proxy
//! never looked at.

use std::borrow::Cow;
use std::ops::Range;

use serde_json::Value;

use crate::skim::{Kind, Skim, SkimError};

/// serde_json's nesting limit: a body the strict parse refused as too deep is
/// refused here too.
pub const MAX_DEPTH: usize = 128;

/// Why a body's text is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("{0}")]
    Syntax(#[from] SkimError),
    #[error("duplicate key {0:?}")]
    DuplicateKey(String),
    #[error("nested deeper than {MAX_DEPTH} levels")]
    TooDeep,
    /// Beyond f64, which is how the target (and serde_json) reads a number.
    #[error("number out of range at byte {0}")]
    NumberOutOfRange(usize),
}

/// A value the proxy may edit, and where it is.
#[derive(Debug, Clone, Default)]
pub enum Field<T> {
    #[default]
    Absent,
    Null(Range<usize>),
    Object(Range<usize>, T),
    /// Present, of another type: it cannot be edited.
    Other,
}

/// One `"key": value` of an object the proxy rebuilds.
#[derive(Debug, Clone)]
pub struct Entry {
    key: Key,
    /// From the key's opening quote to the value's end: what is copied when the
    /// entry is kept.
    text: Range<usize>,
}

/// An entry's key: where it is in the text, or decoded when it holds escapes.
#[derive(Debug, Clone)]
enum Key {
    Plain(Range<usize>),
    Escaped(Box<str>),
}

impl Entry {
    fn new(start: usize, key: Cow<'_, str>, end: usize) -> Entry {
        let key = match key {
            // An unescaped key is its text, just past the opening quote.
            Cow::Borrowed(plain) => Key::Plain(start + 1..start + 1 + plain.len()),
            Cow::Owned(decoded) => Key::Escaped(decoded.into()),
        };
        Entry {
            key,
            text: start..end,
        }
    }

    fn key<'t>(&'t self, text: &'t str) -> &'t str {
        match &self.key {
            Key::Plain(range) => text.get(range.clone()).unwrap_or_default(),
            Key::Escaped(decoded) => decoded,
        }
    }
}

/// An object's `metadata`, as far as the proxy edits it.
#[derive(Debug, Clone, Default)]
pub struct Metadata {
    entries: Vec<Entry>,
    pub labels: Field<Vec<Entry>>,
    /// The value of `resourceVersion`, when present.
    pub resource_version: Option<Range<usize>>,
    /// The value of `uid`, when present.
    pub uid: Option<Range<usize>>,
}

/// An object that can carry metadata: the body itself or an item of a list.
#[derive(Debug, Clone)]
pub struct Site {
    /// Just past the object's `{`.
    open: usize,
    empty: bool,
    pub metadata: Field<Box<Metadata>>,
}

/// The top-level value of a body.
#[derive(Debug, Clone)]
pub enum Shape {
    /// An object: the object a write creates or changes.
    Object {
        body: Site,
    },
    /// An array, such as a JSON patch's operations.
    Array {
        /// Just past the `[`.
        open: usize,
        /// At the `]`.
        close: usize,
        empty: bool,
    },
    Other,
}

/// What the proxy changes in a body, applied when it is written out.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Edits {
    /// Labels set in the body's own `metadata.labels`.
    pub labels: Vec<(String, String)>,
    /// Fields of the body's own `metadata`, set (`Some`) or removed (`None`).
    pub fields: Vec<(&'static str, Option<String>)>,
    /// Operations put before and after the caller's, in a JSON patch.
    pub operations_before: Vec<Value>,
    pub operations_after: Vec<Value>,
}

/// Reads a body's JSON text: where its editable parts are, or why it is refused.
/// Refused are texts serde_json would not parse into a value (bad grammar, a
/// number beyond f64, nesting past its limit), and texts the target could read
/// differently from the proxy: a repeated key in any object (Go keeps the last
/// copy), a lone surrogate escape in any string (Go replaces it). The text is
/// UTF-8 by its type.
pub fn read(text: &str) -> Result<Shape, Refusal> {
    let mut walk = Walk {
        text,
        skim: Skim::new(text),
        keys: Vec::new(),
    };
    let shape = walk.root()?;
    walk.skim.end()?;
    Ok(shape)
}

struct Walk<'a> {
    text: &'a str,
    skim: Skim<'a>,
    /// The keys of the objects being walked, innermost last, to find repeats.
    keys: Vec<Cow<'a, str>>,
}

/// A container walked: where its members start (just past the bracket) and how
/// many it has.
struct Opened {
    open: usize,
    entries: usize,
}

impl<'a> Walk<'a> {
    fn root(&mut self) -> Result<Shape, Refusal> {
        match self.skim.peek()? {
            Kind::Object => Ok(Shape::Object {
                body: self.site(0)?,
            }),
            Kind::Array => {
                let opened = self.array(0, |walk| walk.value(1))?;
                Ok(Shape::Array {
                    open: opened.open,
                    close: self.skim.position() - 1,
                    empty: opened.entries == 0,
                })
            }
            _ => {
                self.value(0)?;
                Ok(Shape::Other)
            }
        }
    }

    /// The body's object and where its `metadata` is.
    fn site(&mut self, depth: usize) -> Result<Site, Refusal> {
        let mut metadata = Field::Absent;
        let opened = self.object(depth, |walk, key, _| {
            match key.as_ref() {
                "metadata" => metadata = walk.metadata(depth + 1)?,
                _ => walk.value(depth + 1)?,
            }
            Ok(())
        })?;
        Ok(Site {
            open: opened.open,
            empty: opened.entries == 0,
            metadata,
        })
    }

    fn metadata(&mut self, depth: usize) -> Result<Field<Box<Metadata>>, Refusal> {
        self.field(depth, |walk| {
            let mut metadata = Box::<Metadata>::default();
            walk.object(depth, |walk, key, start| {
                match key.as_ref() {
                    "labels" => metadata.labels = walk.labels(depth + 1)?,
                    "resourceVersion" => metadata.resource_version = Some(walk.located(depth + 1)?),
                    "uid" => metadata.uid = Some(walk.located(depth + 1)?),
                    _ => walk.value(depth + 1)?,
                }
                metadata
                    .entries
                    .push(Entry::new(start, key.clone(), walk.skim.position()));
                Ok(())
            })?;
            Ok(metadata)
        })
    }

    /// Walks the value that comes next, telling where its text is.
    fn located(&mut self, depth: usize) -> Result<Range<usize>, Refusal> {
        self.skim.peek()?;
        let start = self.skim.position();
        self.value(depth)?;
        Ok(start..self.skim.position())
    }

    fn labels(&mut self, depth: usize) -> Result<Field<Vec<Entry>>, Refusal> {
        self.field(depth, |walk| {
            let mut entries = Vec::new();
            walk.object(depth, |walk, key, start| {
                walk.value(depth + 1)?;
                entries.push(Entry::new(start, key.clone(), walk.skim.position()));
                Ok(())
            })?;
            Ok(entries)
        })
    }

    /// A value that is edited when it is an object or null.
    fn field<T>(
        &mut self,
        depth: usize,
        object: impl FnOnce(&mut Self) -> Result<T, Refusal>,
    ) -> Result<Field<T>, Refusal> {
        let kind = self.skim.peek()?;
        let start = self.skim.position();
        match kind {
            Kind::Object => {
                let read = object(self)?;
                Ok(Field::Object(start..self.skim.position(), read))
            }
            Kind::Null => {
                self.skim.skip()?;
                Ok(Field::Null(start..self.skim.position()))
            }
            _ => {
                self.value(depth)?;
                Ok(Field::Other)
            }
        }
    }

    /// Any value, checked all through.
    fn value(&mut self, depth: usize) -> Result<(), Refusal> {
        match self.skim.peek()? {
            Kind::Object => self
                .object(depth, |walk, _, _| walk.value(depth + 1))
                .map(drop),
            Kind::Array => self.array(depth, |walk| walk.value(depth + 1)).map(drop),
            // Reading a string checks its escapes' code points; skipping does not.
            Kind::String => self.skim.string().map(drop).map_err(Refusal::from),
            Kind::Number => self.number(),
            Kind::Bool | Kind::Null => self.skim.skip().map_err(Refusal::from),
        }
    }

    /// Walks the object that comes next, calling `entry` with each key and the
    /// offset of its opening quote to read the value; refuses a repeated key.
    fn object(
        &mut self,
        depth: usize,
        mut entry: impl FnMut(&mut Self, &Cow<'a, str>, usize) -> Result<(), Refusal>,
    ) -> Result<Opened, Refusal> {
        if depth + 1 >= MAX_DEPTH {
            return Err(Refusal::TooDeep);
        }
        let mut entries = self.skim.object()?;
        let open = self.skim.position();
        let first = self.keys.len();
        while let Some((start, key)) = entries.next_key_at(&mut self.skim)? {
            entry(self, &key, start)?;
            self.keys.push(key);
        }
        let keys = &mut self.keys[first..];
        let count = keys.len();
        keys.sort_unstable();
        let repeated = keys
            .windows(2)
            .find(|pair| pair[0] == pair[1])
            .map(|pair| pair[0].to_string());
        self.keys.truncate(first);
        match repeated {
            Some(key) => Err(Refusal::DuplicateKey(key)),
            None => Ok(Opened {
                open,
                entries: count,
            }),
        }
    }

    /// Walks the array that comes next, calling `element` to read each element.
    fn array(
        &mut self,
        depth: usize,
        mut element: impl FnMut(&mut Self) -> Result<(), Refusal>,
    ) -> Result<Opened, Refusal> {
        if depth + 1 >= MAX_DEPTH {
            return Err(Refusal::TooDeep);
        }
        let mut elements = self.skim.array()?;
        let open = self.skim.position();
        let mut count = 0;
        while elements.next(&mut self.skim)? {
            element(self)?;
            count += 1;
        }
        Ok(Opened {
            open,
            entries: count,
        })
    }

    fn number(&mut self) -> Result<(), Refusal> {
        let start = self.skim.position();
        self.skim.skip()?;
        let number = self.text.get(start..self.skim.position()).unwrap_or("0");
        // Only an exponent or some 309 digits can take a number past f64.
        let may_overflow = number.len() > 300 || number.contains(['e', 'E']);
        if may_overflow && !number.parse::<f64>().is_ok_and(f64::is_finite) {
            return Err(Refusal::NumberOutOfRange(start));
        }
        Ok(())
    }
}

/// The text with `edits` applied to the parts `shape` located in it.
pub fn render(text: &str, shape: &Shape, edits: &Edits) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len() + 256);
    match shape {
        Shape::Array { open, close, empty } => {
            out.extend_from_slice(text.get(..*open).unwrap_or("[").as_bytes());
            let mut list = Separated::new(&mut out);
            for operation in &edits.operations_before {
                push_json(list.item(), operation);
            }
            if !empty {
                list.item()
                    .extend_from_slice(text.get(*open..*close).unwrap_or_default().as_bytes());
            }
            for operation in &edits.operations_after {
                push_json(list.item(), operation);
            }
            out.extend_from_slice(text.get(*close..).unwrap_or("]").as_bytes());
        }
        Shape::Object { body } => match Replacement::of(body, &edits.labels, &edits.fields) {
            // The body's `metadata` member, or the object's start where it has none.
            Some(replacement) => {
                let start = replacement.at.start;
                out.extend_from_slice(text.get(..start).unwrap_or_default().as_bytes());
                replacement.write(&mut out, text);
                let end = replacement.at.end;
                out.extend_from_slice(text.get(end..).unwrap_or_default().as_bytes());
            }
            None => out.extend_from_slice(text.as_bytes()),
        },
        Shape::Other => out.extend_from_slice(text.as_bytes()),
    }
    out
}

/// A site's `metadata` rebuilt with what is set on it, over the text at `at`
/// (or inserted there as the site's first entry).
struct Replacement<'e> {
    at: Range<usize>,
    site: &'e Site,
    labels: &'e [(String, String)],
    fields: &'e [(&'static str, Option<String>)],
}

impl<'e> Replacement<'e> {
    /// `None` when nothing is set on the site.
    fn of(
        site: &'e Site,
        labels: &'e [(String, String)],
        fields: &'e [(&'static str, Option<String>)],
    ) -> Option<Self> {
        if labels.is_empty() && fields.is_empty() {
            return None;
        }
        let at = match &site.metadata {
            Field::Absent => site.open..site.open,
            Field::Null(range) | Field::Object(range, _) => range.clone(),
            // Refused when the edit was made.
            Field::Other => return None,
        };
        Some(Replacement {
            at,
            site,
            labels,
            fields,
        })
    }

    fn write(&self, out: &mut Vec<u8>, text: &str) {
        let inserted = matches!(self.site.metadata, Field::Absent);
        if inserted {
            out.extend_from_slice(b"\"metadata\":");
        }
        self.write_metadata(out, text);
        if inserted && !self.site.empty {
            out.push(b',');
        }
    }

    /// The `metadata` object: the caller's other entries as they came, then
    /// the set ones.
    fn write_metadata(&self, out: &mut Vec<u8>, text: &str) {
        let (labels, fields) = (self.labels, self.fields);
        let read = match &self.site.metadata {
            Field::Object(_, read) => Some(read),
            _ => None,
        };
        out.push(b'{');
        let mut list = Separated::new(out);
        for entry in read.iter().flat_map(|read| &read.entries) {
            let key = entry.key(text);
            let replaced = (!labels.is_empty() && key == "labels")
                || fields.iter().any(|(name, _)| key == *name);
            if !replaced {
                list.item()
                    .extend_from_slice(text.get(entry.text.clone()).unwrap_or_default().as_bytes());
            }
        }
        if !labels.is_empty() {
            let item = list.item();
            item.extend_from_slice(b"\"labels\":{");
            let mut label_list = Separated::new(item);
            if let Some(Field::Object(_, entries)) = read.map(|read| &read.labels) {
                for entry in entries {
                    let key = entry.key(text);
                    if !labels.iter().any(|(set, _)| key == set) {
                        label_list.item().extend_from_slice(
                            text.get(entry.text.clone()).unwrap_or_default().as_bytes(),
                        );
                    }
                }
            }
            for (key, value) in labels {
                push_entry(label_list.item(), key, value);
            }
            item.push(b'}');
        }
        for (name, value) in fields {
            if let Some(value) = value {
                push_entry(list.item(), name, value);
            }
        }
        out.push(b'}');
    }
}

fn push_entry(out: &mut Vec<u8>, key: &str, value: &str) {
    push_json(out, key);
    out.push(b':');
    push_json(out, value);
}

/// Appends `value` as JSON, escaped by serde_json. Writing into a `Vec` and
/// serializing a string or a `Value` cannot fail.
fn push_json<T: serde::Serialize + ?Sized>(out: &mut Vec<u8>, value: &T) {
    let _ = serde_json::to_writer(out, value);
}

/// Writes comma-separated items.
struct Separated<'o> {
    out: &'o mut Vec<u8>,
    first: bool,
}

impl<'o> Separated<'o> {
    fn new(out: &'o mut Vec<u8>) -> Self {
        Separated { out, first: true }
    }

    /// The output, after a comma unless this is the first item.
    fn item(&mut self) -> &mut Vec<u8> {
        if !self.first {
            self.out.push(b',');
        }
        self.first = false;
        self.out
    }
}
