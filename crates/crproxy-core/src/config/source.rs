//! Where each key of a configuration file is written, so any [`ConfigError`] can be
//! printed as `FILE:LINE:COLUMN: key: message` without the validation rules
//! knowing about source positions: [`SourceMap::build`] walks the YAML once and
//! records the position of every key path, spelled the way errors spell them
//! (`targets[0].peers.static[1]`,
//! `experimental.proxy.customResources["widgets.example.com/v1"].enabled`).
//!
//! The same walk finds what the YAML parser would only reject — syntax errors
//! ([`YamlSyntaxError`], reported in crproxy's own words at the place of the
//! mistake) and keys written twice in one mapping (reported as [`ConfigError`]s so
//! checking can go on).

use std::collections::HashMap;
use std::fmt;

use serde_saphyr::granit_parser::{Event, Parser, ScanError};

use super::ConfigError;

/// A place in the file: 1-based line and column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Position {
    pub line: usize,
    pub column: usize,
}

impl Position {
    /// The start of the file: where problems of the document as a whole point.
    pub const START: Position = Position { line: 1, column: 1 };
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.column)
    }
}

/// The file is not YAML: where and why, in words an operator can act on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid YAML at line {}, column {}: {message}", position.line, position.column)]
pub struct YamlSyntaxError {
    pub position: Position,
    pub message: String,
}

/// Key paths and where they are written.
#[derive(Debug, Clone, Default)]
pub struct SourceMap {
    positions: HashMap<Vec<Segment>, Position>,
    duplicates: Vec<ConfigError>,
}

/// One step of a key path: a mapping key or a list index. Paths are compared as
/// steps, so `a.b` and `a["b"]` are the same key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Segment {
    Key(String),
    Index(usize),
}

/// The steps of a key path as errors spell it: `name`, `.name`, `["any text"]`
/// (Rust string syntax) and `[0]`.
fn segments(path: &str) -> Vec<Segment> {
    let mut out = Vec::new();
    let mut chars = path.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '.' => {}
            '[' if chars.peek() == Some(&'"') => {
                chars.next();
                let mut key = String::new();
                while let Some(c) = chars.next() {
                    match c {
                        '\\' => {
                            if let Some(escaped) = chars.next() {
                                key.push(escaped);
                            }
                        }
                        '"' => break,
                        other => key.push(other),
                    }
                }
                if chars.peek() == Some(&']') {
                    chars.next();
                }
                out.push(Segment::Key(key));
            }
            '[' => {
                let mut digits = String::new();
                for c in chars.by_ref() {
                    if c == ']' {
                        break;
                    }
                    digits.push(c);
                }
                match digits.parse() {
                    Ok(index) => out.push(Segment::Index(index)),
                    Err(_) => out.push(Segment::Key(digits)),
                }
            }
            first => {
                let mut key = String::from(first);
                while let Some(&c) = chars.peek() {
                    if c == '.' || c == '[' {
                        break;
                    }
                    key.push(c);
                    chars.next();
                }
                out.push(Segment::Key(key));
            }
        }
    }
    out
}

impl SourceMap {
    /// Walks `yaml` once. Fails only when the text is not YAML.
    pub fn build(yaml: &str) -> Result<SourceMap, YamlSyntaxError> {
        let mut map = SourceMap::default();
        let mut stack: Vec<Frame> = Vec::new();
        let mut documents = 0;
        for item in Parser::new_from_str(yaml) {
            let (event, span) = item.map_err(|e| syntax_error(yaml, &e))?;
            let here = Position {
                line: span.start.line(),
                column: span.start.col() + 1,
            };
            match event {
                Event::DocumentStart(..) => {
                    documents += 1;
                    if documents > 1 {
                        return Err(YamlSyntaxError {
                            position: here,
                            message: "a second YAML document starts here; the configuration is one document, remove the extra '---'".into(),
                        });
                    }
                }
                Event::Scalar(text, ..) => {
                    map.node(&mut stack, here, Some(&text), None);
                }
                Event::Alias(_) => map.node(&mut stack, here, Some(""), None),
                Event::MappingStart(..) => map.node(&mut stack, here, None, Some(true)),
                Event::SequenceStart(..) => map.node(&mut stack, here, None, Some(false)),
                Event::MappingEnd | Event::SequenceEnd => {
                    stack.pop();
                }
                _ => {}
            }
        }
        Ok(map)
    }

    /// Where `key` is written, or else where the nearest enclosing key is (a
    /// missing key is reported at its parent); the file's start for the rest.
    pub fn locate(&self, key: &str) -> Position {
        let mut path = segments(key);
        loop {
            if let Some(position) = self.positions.get(&path) {
                return *position;
            }
            if path.pop().is_none() {
                return Position::START;
            }
        }
    }

    /// The key written last at or before `position`, spelled as errors spell
    /// it: the key whose value holds a mistake the parser found there (empty
    /// before the first key).
    pub fn key_before(&self, position: Position) -> String {
        self.positions
            .iter()
            .filter(|(_, at)| **at <= position)
            .max_by_key(|(path, at)| (**at, path.len()))
            .map(|(path, _)| spell(path))
            .unwrap_or_default()
    }

    /// Keys written twice in one mapping (the later value is the one used).
    pub fn duplicates(&self) -> &[ConfigError] {
        &self.duplicates
    }

    /// One node at `here`: a key, a value, or a list item, depending on where the
    /// walk is. `scalar` is the text of a scalar node; `collection` says whether
    /// a mapping (`Some(true)`) or a list (`Some(false)`) starts.
    fn node(
        &mut self,
        stack: &mut Vec<Frame>,
        here: Position,
        scalar: Option<&str>,
        collection: Option<bool>,
    ) {
        let path = match stack.last_mut() {
            None => Vec::new(),
            Some(Frame::Mapping { path, key, seen }) => match key.take() {
                None => {
                    // A key. Keys that are not plain text (a mapping as a key) get
                    // a path no error uses; their contents are skipped.
                    let text = scalar.unwrap_or("?");
                    let mut entry = path.clone();
                    entry.push(Segment::Key(text.to_string()));
                    if let Some(first) = seen.insert(text.to_string(), here.line) {
                        self.duplicates.push(ConfigError::new(
                            spell(&entry),
                            format!(
                                "is written twice in the same mapping (also on line {first}); keep one, this later one is the one used"
                            ),
                        ));
                    }
                    // The later of two duplicates is the value used: point there.
                    self.positions.insert(entry.clone(), here);
                    *key = Some(entry);
                    if collection.is_some() {
                        stack.push(Frame::Skipped);
                    }
                    return;
                }
                // A value: it is where its key is.
                Some(value_path) => value_path,
            },
            Some(Frame::Sequence { path, next }) => {
                let mut item = path.clone();
                item.push(Segment::Index(*next));
                *next += 1;
                self.positions.entry(item.clone()).or_insert(here);
                item
            }
            Some(Frame::Skipped) => vec![Segment::Key("?".into())],
        };
        match collection {
            Some(true) => stack.push(Frame::Mapping {
                path,
                key: None,
                seen: HashMap::new(),
            }),
            Some(false) => stack.push(Frame::Sequence { path, next: 0 }),
            None => {}
        }
    }
}

/// A path as errors spell it: keys that are not plain names in brackets.
fn spell(path: &[Segment]) -> String {
    let mut out = String::new();
    for segment in path {
        match segment {
            Segment::Index(i) => out.push_str(&format!("[{i}]")),
            Segment::Key(k)
                if !k.is_empty()
                    && k.chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') =>
            {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(k);
            }
            Segment::Key(k) => out.push_str(&format!("[{k:?}]")),
        }
    }
    out
}

/// Where the walk is.
enum Frame {
    /// In a mapping at `path`; `key` is the path of the entry whose value comes
    /// next (`None`: a key comes next).
    Mapping {
        path: Vec<Segment>,
        key: Option<Vec<Segment>>,
        seen: HashMap<String, usize>,
    },
    Sequence {
        path: Vec<Segment>,
        next: usize,
    },
    /// Inside a complex key: nothing to record.
    Skipped,
}

/// The parser's complaint as crproxy words it, pointing at the mistake rather than
/// where the parser noticed it.
fn syntax_error(yaml: &str, error: &ScanError) -> YamlSyntaxError {
    let mark = error.marker();
    let noticed = Position {
        line: mark.line(),
        column: mark.col() + 1,
    };
    let info = error.info();
    // A '{' or '[' left open is noticed on a later line, where the parser runs
    // into the next key: the mistake is the bracket.
    if let Some((bracket, at)) = unclosed_bracket_before(yaml, noticed) {
        if at.line < noticed.line {
            let closing = if bracket == '{' { '}' } else { ']' };
            return YamlSyntaxError {
                position: at,
                message: format!("this '{bracket}' is never closed; add the '{closing}'"),
            };
        }
    }
    let message = if info.contains("expected ':'") {
        "a key must be followed by ':'".to_string()
    } else if info.contains("unclosed quote") {
        "this quoted string is never closed".to_string()
    } else if info.contains("mapping values are not allowed") {
        "unexpected ':'; quote a value that contains ': ', and line a key up with the keys above it"
            .to_string()
    } else if info.contains("expected '-' indicator") {
        "this line is not indented like the list items above it".to_string()
    } else if info.contains("did not find expected key") {
        "this line is not indented like the other keys of its mapping".to_string()
    } else if info.contains("tabs disallowed") {
        "a tab indents this line; YAML indentation must be spaces".to_string()
    } else if info.contains("mismatched bracket") || info.contains("misplaced bracket") {
        "this bracket does not match the one it closes".to_string()
    } else if info.contains("unknown anchor") {
        "this alias names an anchor that is not defined above it".to_string()
    } else {
        format!("the YAML parser stopped here ({info})")
    };
    YamlSyntaxError {
        position: noticed,
        message,
    }
}

/// The innermost flow bracket still open at `until`, ignoring quoted text and
/// comments.
fn unclosed_bracket_before(yaml: &str, until: Position) -> Option<(char, Position)> {
    let mut open: Vec<(char, Position)> = Vec::new();
    for (index, line) in yaml.lines().enumerate() {
        let line_number = index + 1;
        if line_number > until.line {
            break;
        }
        let mut quote: Option<char> = None;
        let mut previous = ' ';
        for (column, c) in line.chars().enumerate() {
            let here = Position {
                line: line_number,
                column: column + 1,
            };
            if here >= until {
                break;
            }
            match quote {
                Some(q) if c == q => quote = None,
                Some(_) => {}
                None => match c {
                    '"' | '\'' => quote = Some(c),
                    '#' if previous.is_whitespace() => break,
                    '{' | '[' => open.push((c, here)),
                    '}' | ']' => {
                        open.pop();
                    }
                    _ => {}
                },
            }
            previous = c;
        }
    }
    open.pop()
}
