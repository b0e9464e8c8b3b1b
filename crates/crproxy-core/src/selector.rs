//! Kubernetes label and field selectors: one parser for the proxy (which rewrites the
//! caller's `labelSelector` before forwarding it) and for devcluster (which evaluates
//! selectors on lists and watches).
//!
//! The grammar, the validation rules and the error texts follow
//! `k8s.io/apimachinery/pkg/labels` and `pkg/fields` as shipped with kube-apiserver
//! 1.32, because devcluster answers kubectl with the same 400 bodies a real API server
//! sends, and the proxy must never accept a selector the target would read differently.
//!
//! # Error messages
//!
//! [`SelectorError`]'s `Display` is the *whole* `message` of the kube-apiserver `Status`
//! (reason `BadRequest`, code 400): kube-apiserver adds no prefix of its own to selector
//! errors. The `unable to parse requirement: ` and `invalid selector: ` prefixes seen in
//! recorded responses belong to the parser and are therefore part of our message.
//! Callers build the 400 with `status::bad_request(err.to_string())` and add nothing.

use std::collections::BTreeMap;
use std::fmt;

#[cfg(test)]
mod tests;

/// A selector that could not be parsed. The text is exactly what kube-apiserver puts
/// into the `message` of its 400 `Status`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// A label selector (`labelSelector=`) is malformed or names an invalid key/value.
    #[error("{0}")]
    Label(String),
    /// A field selector (`fieldSelector=`) is malformed or badly escaped.
    #[error("{0}")]
    Field(String),
}

impl SelectorError {
    /// The message without the variant, as placed into a `Status`.
    pub fn message(&self) -> &str {
        match self {
            SelectorError::Label(m) | SelectorError::Field(m) => m,
        }
    }
}

/// The relation between a label key and its values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Operator {
    /// `key=value`
    Equals,
    /// `key==value` (same meaning as `=`, kept so the canonical text round-trips)
    DoubleEquals,
    /// `key!=value` (also true when the key is absent)
    NotEquals,
    /// `key in (a,b)`
    In,
    /// `key notin (a,b)` (also true when the key is absent)
    NotIn,
    /// `key`
    Exists,
    /// `!key`
    DoesNotExist,
    /// `key>5` (integer comparison; kube accepts it in label selectors)
    GreaterThan,
    /// `key<5`
    LessThan,
}

/// One clause of a label selector. Values are kept sorted. A parsed selector's are
/// also de-duplicated (kube's parser reads them into a set), so two equal selectors
/// compare equal; a LabelSelector object's keep any repeats, as kube's
/// `LabelSelectorAsSelector` does ([`LabelSelector::from_object`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Requirement {
    pub key: String,
    pub operator: Operator,
    pub values: Vec<String>,
}

impl Requirement {
    /// Builds a validated requirement the way kube's selector *parser* does, not
    /// the way a bare `labels.NewRequirement` call does.
    ///
    /// apimachinery's `Parser.parseRequirement` (`pkg/labels/selector.go`) reads
    /// the values of `in (..)`, `notin (..)` and of an exact or `<`/`>` match into
    /// a string set and hands `NewRequirement` that set's sorted list. So here the
    /// values are sorted and de-duplicated *first*, and kube's checks and messages
    /// then run on that list: a bad value is reported at its index in the sorted,
    /// de-duplicated list (`values[0][key]`), as the parser reports it.
    /// `NewRequirement` itself keeps its values as given, repeats and order
    /// included; a LabelSelector object's requirements take that path
    /// ([`LabelSelector::from_object`]), not this one.
    ///
    /// The caller decides whether the parser's `unable to parse requirement: `
    /// prefix applies; this does not add it.
    pub fn new(
        key: impl Into<String>,
        operator: Operator,
        values: Vec<String>,
    ) -> Result<Requirement, SelectorError> {
        let key = key.into();
        let mut values = values;
        values.sort();
        values.dedup();
        let errs = requirement_errors(&key, operator, &values);
        if !errs.is_empty() {
            return Err(SelectorError::Label(aggregate(errs)));
        }
        Ok(Requirement {
            key,
            operator,
            values,
        })
    }

    /// A requirement of a LabelSelector object, as `LabelSelectorAsSelector` hands it
    /// to `labels.NewRequirement`: checked on the values in the order given, then
    /// kept sorted (kube sorts them when it prints them) with any repeats.
    fn from_object(
        key: String,
        operator: Operator,
        mut values: Vec<String>,
    ) -> Result<Requirement, SelectorError> {
        let errs = requirement_errors(&key, operator, &values);
        if !errs.is_empty() {
            return Err(SelectorError::Label(aggregate(errs)));
        }
        values.sort();
        Ok(Requirement {
            key,
            operator,
            values,
        })
    }

    /// Whether this requirement holds for a label set, given a lookup function.
    pub fn matches_with<'a>(&self, get: impl Fn(&str) -> Option<&'a str>) -> bool {
        let has_value = |v: &str| self.values.iter().any(|x| x == v);
        match self.operator {
            Operator::In | Operator::Equals | Operator::DoubleEquals => {
                get(&self.key).is_some_and(has_value)
            }
            Operator::NotIn | Operator::NotEquals => !get(&self.key).is_some_and(has_value),
            Operator::Exists => get(&self.key).is_some(),
            Operator::DoesNotExist => get(&self.key).is_none(),
            Operator::GreaterThan | Operator::LessThan => {
                let Some(actual) = get(&self.key).and_then(|v| v.parse::<i64>().ok()) else {
                    return false;
                };
                let [wanted] = self.values.as_slice() else {
                    return false;
                };
                let Ok(wanted) = wanted.parse::<i64>() else {
                    return false;
                };
                if self.operator == Operator::GreaterThan {
                    actual > wanted
                } else {
                    actual < wanted
                }
            }
        }
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.operator == Operator::DoesNotExist {
            f.write_str("!")?;
        }
        f.write_str(&self.key)?;
        let op = match self.operator {
            Operator::Exists | Operator::DoesNotExist => return Ok(()),
            Operator::Equals => "=",
            Operator::DoubleEquals => "==",
            Operator::NotEquals => "!=",
            Operator::In => " in (",
            Operator::NotIn => " notin (",
            Operator::GreaterThan => ">",
            Operator::LessThan => "<",
        };
        f.write_str(op)?;
        f.write_str(&self.values.join(","))?;
        if matches!(self.operator, Operator::In | Operator::NotIn) {
            f.write_str(")")?;
        }
        Ok(())
    }
}

/// A parsed label selector: the AND of its requirements, sorted by key.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
}

impl LabelSelector {
    /// Parses kube's label selector syntax. An empty (or all-blank) string selects
    /// everything.
    pub fn parse(s: &str) -> Result<LabelSelector, SelectorError> {
        let mut requirements = Parser::new(s).parse().map_err(SelectorError::Label)?;
        // Stable, so requirements on the same key keep their written order and the
        // canonical text re-parses to an identical selector.
        requirements.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(LabelSelector { requirements })
    }

    /// kube's `metav1.LabelSelectorAsSelector`: the selector a LabelSelector object
    /// (`{"matchLabels": {..}, "matchExpressions": [..]}`) stands for. `None` for a
    /// null one, kube's `Nothing()`: it matches nothing, yet prints as "" as
    /// [`LabelSelector::everything`] (an object with no requirements) does.
    ///
    /// An error is the first requirement `labels.NewRequirement` refuses, in its
    /// text, or an operator other than In, NotIn, Exists and DoesNotExist. kube
    /// visits matchLabels in Go's map order (random: of several bad labels it may
    /// name any), this in key order, both before matchExpressions. Members of
    /// another JSON type are read as Go's zero value (kube's decoder refuses them
    /// before any selector is made).
    pub fn from_object(
        selector: &serde_json::Value,
    ) -> Result<Option<LabelSelector>, SelectorError> {
        use serde_json::Value;
        if selector.is_null() {
            return Ok(None);
        }
        let text = |v: Option<&Value>| v.and_then(Value::as_str).unwrap_or_default().to_owned();
        let mut requirements = Vec::new();
        if let Some(labels) = selector.get("matchLabels").and_then(Value::as_object) {
            for (key, value) in labels {
                requirements.push(Requirement::from_object(
                    key.clone(),
                    Operator::Equals,
                    vec![text(Some(value))],
                )?);
            }
        }
        let expressions = selector.get("matchExpressions").and_then(Value::as_array);
        for expression in expressions.into_iter().flatten() {
            let operator = match text(expression.get("operator")).as_str() {
                "In" => Operator::In,
                "NotIn" => Operator::NotIn,
                "Exists" => Operator::Exists,
                "DoesNotExist" => Operator::DoesNotExist,
                other => {
                    return Err(SelectorError::Label(format!(
                        "{} is not a valid label selector operator",
                        crate::go_text::quoted(other)
                    )))
                }
            };
            let values = expression.get("values").and_then(Value::as_array);
            let values = values
                .into_iter()
                .flatten()
                .map(|v| text(Some(v)))
                .collect();
            requirements.push(Requirement::from_object(
                text(expression.get("key")),
                operator,
                values,
            )?);
        }
        // kube's `Selector.Add` sorts by key with `sort.Sort`, which keeps the order
        // of equal keys for the few requirements a selector has (insertion sort up
        // to 12), as this stable sort does.
        Ok(Some(LabelSelector::from_requirements(requirements)))
    }

    /// The selector that matches every label set.
    pub fn everything() -> Self {
        LabelSelector::default()
    }

    /// Builds a selector from already validated requirements.
    pub fn from_requirements(mut requirements: Vec<Requirement>) -> Self {
        requirements.sort_by(|a, b| a.key.cmp(&b.key));
        LabelSelector { requirements }
    }

    /// True when the selector does not restrict anything.
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// Whether every requirement holds for `labels`.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.matches_with(|k| labels.get(k).map(String::as_str))
    }

    /// Whether every requirement holds for an object's `metadata.labels` JSON value.
    /// `None`, `null` or a non-object counts as "no labels"; a label whose value is not
    /// a string counts as absent (a real API server never stores one).
    pub fn matches_json(&self, labels: Option<&serde_json::Value>) -> bool {
        let map = labels.and_then(serde_json::Value::as_object);
        self.matches_with(|k| map.and_then(|m| m.get(k)).and_then(|v| v.as_str()))
    }

    /// Whether every requirement holds, given a label lookup function.
    pub fn matches_with<'a>(&self, get: impl Fn(&str) -> Option<&'a str>) -> bool {
        self.requirements.iter().all(|r| r.matches_with(&get))
    }

    /// The conjunction of both selectors: matches exactly what both match.
    pub fn and(mut self, other: LabelSelector) -> LabelSelector {
        self.requirements.extend(other.requirements);
        self.requirements.sort_by(|a, b| a.key.cmp(&b.key));
        self
    }

    /// The requirements, sorted by key.
    pub fn requirements(&self) -> &[Requirement] {
        &self.requirements
    }
}

/// Canonical text: kube's `String()` form, which re-parses to an equal selector.
impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

impl std::str::FromStr for LabelSelector {
    type Err = SelectorError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        LabelSelector::parse(s)
    }
}

// ---------------------------------------------------------------------------------
// Lexer and parser. The token boundaries, the contexts in which `in`/`notin` are plain
// words, and each error text mirror apimachinery's hand-written parser, including its
// quirks (`(a,,)` is an error, a NUL byte reads as end of input), because a selector
// we accept must mean the same to the target API server.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tok {
    EndOfString,
    ClosedPar,
    Comma,
    DoesNotExist,
    DoubleEquals,
    Equals,
    GreaterThan,
    Identifier,
    In,
    LessThan,
    NotEquals,
    NotIn,
    OpenPar,
}

fn keyword(s: &[u8]) -> Option<Tok> {
    Some(match s {
        b")" => Tok::ClosedPar,
        b"," => Tok::Comma,
        b"!" => Tok::DoesNotExist,
        b"==" => Tok::DoubleEquals,
        b"=" => Tok::Equals,
        b">" => Tok::GreaterThan,
        b"in" => Tok::In,
        b"<" => Tok::LessThan,
        b"!=" => Tok::NotEquals,
        b"notin" => Tok::NotIn,
        b"(" => Tok::OpenPar,
        _ => return None,
    })
}

fn is_whitespace(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\r' | b'\n')
}

fn is_special(c: u8) -> bool {
    matches!(c, b'=' | b'!' | b'(' | b')' | b',' | b'>' | b'<')
}

struct Lexer<'a> {
    s: &'a [u8],
    pos: usize,
}

impl Lexer<'_> {
    /// Next byte, 0 at the end (like the Go lexer, a literal NUL also reads as 0).
    fn read(&mut self) -> u8 {
        match self.s.get(self.pos) {
            Some(&b) => {
                self.pos += 1;
                b
            }
            None => 0,
        }
    }

    fn unread(&mut self) {
        self.pos = self.pos.saturating_sub(1);
    }

    fn lex(&mut self) -> (Tok, String) {
        let mut ch = self.read();
        while is_whitespace(ch) {
            ch = self.read();
        }
        if ch == 0 {
            return (Tok::EndOfString, String::new());
        }
        self.unread();
        if is_special(ch) {
            self.special()
        } else {
            self.identifier()
        }
    }

    fn identifier(&mut self) -> (Tok, String) {
        let start = self.pos;
        let mut end;
        loop {
            end = self.pos;
            let ch = self.read();
            if ch == 0 {
                break;
            }
            if is_special(ch) || is_whitespace(ch) {
                self.unread();
                break;
            }
        }
        let bytes = &self.s[start..end];
        let lit = String::from_utf8_lossy(bytes).into_owned();
        match keyword(bytes) {
            Some(tok) => (tok, lit),
            None => (Tok::Identifier, lit),
        }
    }

    fn special(&mut self) -> (Tok, String) {
        let start = self.pos;
        let mut last: Option<(Tok, usize)> = None;
        loop {
            let ch = self.read();
            if ch == 0 {
                break;
            }
            if !is_special(ch) {
                self.unread();
                break;
            }
            match keyword(&self.s[start..self.pos]) {
                Some(tok) => last = Some((tok, self.pos)),
                None if last.is_some() => {
                    self.unread();
                    break;
                }
                None => {}
            }
        }
        match last {
            Some((tok, end)) => (
                tok,
                String::from_utf8_lossy(&self.s[start..end]).into_owned(),
            ),
            // Unreachable with the current symbol set (every single special byte is a
            // token); kept so a future symbol cannot turn into a panic.
            None => (Tok::EndOfString, String::new()),
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Ctx {
    KeyAndOperator,
    Values,
}

struct Parser {
    items: Vec<(Tok, String)>,
    position: usize,
}

const BINARY_OPERATORS: &str = "in, notin, =, ==, !=, gt, lt";

impl Parser {
    fn new(s: &str) -> Parser {
        let mut lexer = Lexer {
            s: s.as_bytes(),
            pos: 0,
        };
        let mut items = Vec::new();
        loop {
            let item = lexer.lex();
            let end = item.0 == Tok::EndOfString;
            items.push(item);
            if end {
                break;
            }
        }
        Parser { items, position: 0 }
    }

    fn at(&self, pos: usize, ctx: Ctx) -> (Tok, String) {
        let (tok, lit) = self
            .items
            .get(pos)
            .cloned()
            .unwrap_or((Tok::EndOfString, String::new()));
        let tok = match (ctx, tok) {
            (Ctx::Values, Tok::In | Tok::NotIn) => Tok::Identifier,
            (_, t) => t,
        };
        (tok, lit)
    }

    fn lookahead(&self, ctx: Ctx) -> (Tok, String) {
        self.at(self.position, ctx)
    }

    fn consume(&mut self, ctx: Ctx) -> (Tok, String) {
        let item = self.at(self.position, ctx);
        // Never run past the end-of-string token, so a malformed input cannot index
        // out of range.
        if self.position + 1 < self.items.len() {
            self.position += 1;
        }
        item
    }

    fn parse(&mut self) -> Result<Vec<Requirement>, String> {
        let mut requirements = Vec::new();
        loop {
            let (tok, lit) = self.lookahead(Ctx::Values);
            match tok {
                Tok::Identifier | Tok::DoesNotExist => {
                    let r = self
                        .requirement()
                        .map_err(|e| format!("unable to parse requirement: {e}"))?;
                    requirements.push(r);
                    let (t, l) = self.consume(Ctx::Values);
                    match t {
                        Tok::EndOfString => return Ok(requirements),
                        Tok::Comma => {
                            let (t2, l2) = self.lookahead(Ctx::Values);
                            if t2 != Tok::Identifier && t2 != Tok::DoesNotExist {
                                return Err(format!(
                                    "found '{l2}', expected: identifier after ','"
                                ));
                            }
                        }
                        _ => return Err(format!("found '{l}', expected: ',' or 'end of string'")),
                    }
                }
                Tok::EndOfString => return Ok(requirements),
                _ => {
                    return Err(format!(
                        "found '{lit}', expected: !, identifier, or 'end of string'"
                    ))
                }
            }
        }
    }

    fn requirement(&mut self) -> Result<Requirement, String> {
        let (key, inferred) = self.key_and_inferred_operator()?;
        if let Some(op) = inferred {
            return Requirement::new(key, op, Vec::new()).map_err(|e| e.message().to_owned());
        }
        let op = self.operator()?;
        let values = match op {
            Operator::In | Operator::NotIn => self.values()?,
            _ => self.exact_value()?,
        };
        Requirement::new(key, op, values).map_err(|e| e.message().to_owned())
    }

    fn key_and_inferred_operator(&mut self) -> Result<(String, Option<Operator>), String> {
        let mut op = None;
        let (mut tok, mut lit) = self.consume(Ctx::Values);
        if tok == Tok::DoesNotExist {
            op = Some(Operator::DoesNotExist);
            (tok, lit) = self.consume(Ctx::Values);
        }
        if tok != Tok::Identifier {
            return Err(format!("found '{lit}', expected: identifier"));
        }
        let errs = qualified_name_errors(&lit);
        if !errs.is_empty() {
            return Err(field_invalid("<nil>", &lit, &errs.join("; ")));
        }
        let (next, _) = self.lookahead(Ctx::Values);
        if (next == Tok::EndOfString || next == Tok::Comma) && op.is_none() {
            op = Some(Operator::Exists);
        }
        Ok((lit, op))
    }

    fn operator(&mut self) -> Result<Operator, String> {
        let (tok, lit) = self.consume(Ctx::KeyAndOperator);
        Ok(match tok {
            Tok::In => Operator::In,
            Tok::Equals => Operator::Equals,
            Tok::DoubleEquals => Operator::DoubleEquals,
            Tok::GreaterThan => Operator::GreaterThan,
            Tok::LessThan => Operator::LessThan,
            Tok::NotIn => Operator::NotIn,
            Tok::NotEquals => Operator::NotEquals,
            _ => return Err(format!("found '{lit}', expected: {BINARY_OPERATORS}")),
        })
    }

    fn values(&mut self) -> Result<Vec<String>, String> {
        let (tok, lit) = self.consume(Ctx::Values);
        if tok != Tok::OpenPar {
            return Err(format!("found '{lit}' expected: '('"));
        }
        let (tok, lit) = self.lookahead(Ctx::Values);
        match tok {
            Tok::Identifier | Tok::Comma => {
                let s = self.identifiers_list()?;
                let (tok, _) = self.consume(Ctx::Values);
                if tok != Tok::ClosedPar {
                    return Err(format!("found '{lit}', expected: ')'"));
                }
                Ok(s)
            }
            Tok::ClosedPar => {
                self.consume(Ctx::Values);
                Ok(vec![String::new()])
            }
            _ => Err(format!("found '{lit}', expected: ',', ')' or identifier")),
        }
    }

    fn identifiers_list(&mut self) -> Result<Vec<String>, String> {
        let mut s: Vec<String> = Vec::new();
        // Bounded by the token count: every iteration consumes at least one token, and
        // consuming at the end-of-string token ends in the error arm.
        loop {
            let (tok, lit) = self.consume(Ctx::Values);
            match tok {
                Tok::Identifier => {
                    s.push(lit);
                    let (tok2, lit2) = self.lookahead(Ctx::Values);
                    match tok2 {
                        Tok::Comma => continue,
                        Tok::ClosedPar => return Ok(s),
                        _ => return Err(format!("found '{lit2}', expected: ',' or ')'")),
                    }
                }
                Tok::Comma => {
                    if s.is_empty() {
                        s.push(String::new());
                    }
                    let (tok2, _) = self.lookahead(Ctx::Values);
                    if tok2 == Tok::ClosedPar {
                        s.push(String::new());
                        return Ok(s);
                    }
                    if tok2 == Tok::Comma {
                        self.consume(Ctx::Values);
                        s.push(String::new());
                    }
                }
                _ => return Err(format!("found '{lit}', expected: ',', or identifier")),
            }
        }
    }

    fn exact_value(&mut self) -> Result<Vec<String>, String> {
        let (tok, _) = self.lookahead(Ctx::Values);
        if tok == Tok::EndOfString || tok == Tok::Comma {
            return Ok(vec![String::new()]);
        }
        let (tok, lit) = self.consume(Ctx::Values);
        if tok == Tok::Identifier {
            return Ok(vec![lit]);
        }
        Err(format!("found '{lit}', expected: identifier"))
    }
}

// ---------------------------------------------------------------------------------
// Validation with apimachinery's messages.

const QUALIFIED_NAME_FMT: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
const QUALIFIED_NAME_MSG: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const LABEL_VALUE_FMT: &str = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?";
const LABEL_VALUE_MSG: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const DNS1123_SUBDOMAIN_FMT: &str =
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";
const DNS1123_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character";
/// Longest label value and longest name part of a label key.
pub const LABEL_VALUE_MAX_LEN: usize = 63;
const DNS1123_SUBDOMAIN_MAX_LEN: usize = 253;

fn regex_error(msg: &str, fmt: &str, examples: &[&str]) -> String {
    let mut out = String::from(msg);
    out.push_str(" (e.g. ");
    for (i, e) in examples.iter().enumerate() {
        if i > 0 {
            out.push_str(" or ");
        }
        out.push('\'');
        out.push_str(e);
        out.push_str("', ");
    }
    out.push_str("regex used for validation is '");
    out.push_str(fmt);
    out.push_str("')");
    out
}

fn max_len_error(n: usize) -> String {
    format!("must be no more than {n} characters")
}

/// `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`
fn is_qualified_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    let (Some(first), Some(last)) = (b.first(), b.last()) else {
        return false;
    };
    first.is_ascii_alphanumeric()
        && last.is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

fn is_dns1123_label(s: &str) -> bool {
    let b = s.as_bytes();
    let (Some(first), Some(last)) = (b.first(), b.last()) else {
        return false;
    };
    let ok = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    ok(first) && ok(last) && b.iter().all(|c| ok(c) || *c == b'-')
}

fn dns1123_subdomain_errors(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > DNS1123_SUBDOMAIN_MAX_LEN {
        errs.push(max_len_error(DNS1123_SUBDOMAIN_MAX_LEN));
    }
    if !s.split('.').all(is_dns1123_label) {
        errs.push(regex_error(
            DNS1123_SUBDOMAIN_MSG,
            DNS1123_SUBDOMAIN_FMT,
            &["example.com"],
        ));
    }
    errs
}

/// apimachinery's `IsQualifiedName`: an optional DNS subdomain prefix and `/`, then a
/// name part of at most 63 characters.
pub fn qualified_name_errors(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    let parts: Vec<&str> = value.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errs.push("prefix part must be non-empty".to_owned());
            } else {
                for m in dns1123_subdomain_errors(prefix) {
                    errs.push(format!("prefix part {m}"));
                }
            }
            *name
        }
        _ => {
            errs.push(format!(
                "a qualified name {} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
                regex_error(QUALIFIED_NAME_MSG, QUALIFIED_NAME_FMT, &["MyName", "my.name", "123-abc"])
            ));
            return errs;
        }
    };
    if name.is_empty() {
        errs.push("name part must be non-empty".to_owned());
    } else if name.len() > LABEL_VALUE_MAX_LEN {
        errs.push(format!("name part {}", max_len_error(LABEL_VALUE_MAX_LEN)));
    }
    if !is_qualified_name_part(name) {
        errs.push(format!(
            "name part {}",
            regex_error(
                QUALIFIED_NAME_MSG,
                QUALIFIED_NAME_FMT,
                &["MyName", "my.name", "123-abc"]
            )
        ));
    }
    errs
}

/// apimachinery's `IsValidLabelValue`.
pub fn label_value_errors(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > LABEL_VALUE_MAX_LEN {
        errs.push(max_len_error(LABEL_VALUE_MAX_LEN));
    }
    if !value.is_empty() && !is_qualified_name_part(value) {
        errs.push(regex_error(
            LABEL_VALUE_MSG,
            LABEL_VALUE_FMT,
            &["MyValue", "my_value", "12345"],
        ));
    }
    errs
}

/// `field.Invalid(path, value, detail).Error()`.
fn field_invalid(path: &str, value: &str, detail: &str) -> String {
    format!(
        "{path}: Invalid value: {}: {detail}",
        crate::go_text::quoted(value)
    )
}

/// `utilerrors.NewAggregate(errs).Error()`: one message as is, several de-duplicated
/// inside brackets.
fn aggregate(errs: Vec<String>) -> String {
    if errs.len() == 1 {
        return errs.into_iter().next().unwrap_or_default();
    }
    let mut seen: Vec<String> = Vec::new();
    for e in errs {
        if !seen.contains(&e) {
            seen.push(e);
        }
    }
    if seen.len() == 1 {
        return seen.pop().unwrap_or_default();
    }
    format!("[{}]", seen.join(", "))
}

/// Go's `%#v` of a `[]string`, as `field.Invalid` prints a requirement's values:
/// `[]string{"a", "b"}`, and `[]string(nil)` for none (only a LabelSelector
/// object's requirement can have none: the parser reads `in ()` as one empty value).
fn go_string_slice(values: &[String]) -> String {
    if values.is_empty() {
        return "[]string(nil)".to_owned();
    }
    let quoted: Vec<String> = values.iter().map(|v| crate::go_text::quoted(v)).collect();
    format!("[]string{{{}}}", quoted.join(", "))
}

/// `labels.NewRequirement`'s checks, with the field paths it reports when the parser
/// calls it (no root path).
fn requirement_errors(key: &str, op: Operator, values: &[String]) -> Vec<String> {
    let mut errs = Vec::new();
    let key_errs = qualified_name_errors(key);
    if !key_errs.is_empty() {
        errs.push(field_invalid("key", key, &key_errs.join("; ")));
    }
    let values_text = || go_string_slice(values);
    match op {
        Operator::In | Operator::NotIn => {
            if values.is_empty() {
                errs.push(format!(
                    "values: Invalid value: {}: for 'in', 'notin' operators, values set can't be empty",
                    values_text()
                ));
            }
        }
        Operator::Equals | Operator::DoubleEquals | Operator::NotEquals => {
            if values.len() != 1 {
                errs.push(format!(
                    "values: Invalid value: {}: exact-match compatibility requires one single value",
                    values_text()
                ));
            }
        }
        Operator::Exists | Operator::DoesNotExist => {
            if !values.is_empty() {
                errs.push(format!(
                    "values: Invalid value: {}: values set must be empty for exists and does not exist",
                    values_text()
                ));
            }
        }
        Operator::GreaterThan | Operator::LessThan => {
            if values.len() != 1 {
                errs.push(format!(
                    "values: Invalid value: {}: for 'Gt', 'Lt' operators, exactly one value is required",
                    values_text()
                ));
            }
            for (i, v) in values.iter().enumerate() {
                if v.parse::<i64>().is_err() {
                    errs.push(field_invalid(
                        &format!("values[{i}]"),
                        v,
                        "for 'Gt', 'Lt' operators, the value must be an integer",
                    ));
                }
            }
        }
    }
    for (i, v) in values.iter().enumerate() {
        let value_errs = label_value_errors(v);
        if !value_errs.is_empty() {
            errs.push(field_invalid(
                &format!("values[{i}][{key}]"),
                v,
                &value_errs.join("; "),
            ));
        }
    }
    errs
}

// ---------------------------------------------------------------------------------
// Field selectors.

/// One `field=value` (or `field!=value`) clause. `value` is unescaped.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FieldRequirement {
    pub field: String,
    pub negated: bool,
    pub value: String,
}

impl fmt::Display for FieldRequirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let op = if self.negated { "!=" } else { "=" };
        write!(f, "{}{op}{}", self.field, escape_field_value(&self.value))
    }
}

/// A parsed field selector: the AND of its clauses, in kube's (sorted) order.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct FieldSelector {
    requirements: Vec<FieldRequirement>,
}

impl FieldSelector {
    /// Parses `a=b,c!=d,e==f`; `\,`, `\=` and `\\` escape those characters in values.
    pub fn parse(s: &str) -> Result<FieldSelector, SelectorError> {
        let mut parts = split_field_terms(s);
        parts.sort();
        let mut requirements = Vec::new();
        for part in parts {
            if part.is_empty() {
                continue;
            }
            let Some((field, op, rhs)) = split_field_term(part) else {
                return Err(SelectorError::Field(format!(
                    "invalid selector: '{s}'; can't understand '{part}'"
                )));
            };
            let value = unescape_field_value(rhs).map_err(SelectorError::Field)?;
            requirements.push(FieldRequirement {
                field: field.to_owned(),
                negated: op == "!=",
                value,
            });
        }
        Ok(FieldSelector { requirements })
    }

    /// The selector that matches everything.
    pub fn everything() -> Self {
        FieldSelector::default()
    }

    /// True when nothing is restricted.
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// The clauses.
    pub fn requirements(&self) -> &[FieldRequirement] {
        &self.requirements
    }

    /// The value a clause requires for `field` with `=`, if any (kube's
    /// `RequiresExactMatch`, used to turn `metadata.name=x` into a point lookup).
    pub fn requires_exact_match(&self, field: &str) -> Option<&str> {
        self.requirements
            .iter()
            .find(|r| !r.negated && r.field == field)
            .map(|r| r.value.as_str())
    }

    /// Whether every clause holds. `get` returns a field's value; like kube, an absent
    /// field compares as the empty string.
    pub fn matches(&self, get: impl Fn(&str) -> Option<String>) -> bool {
        self.requirements.iter().all(|r| {
            let actual = get(&r.field).unwrap_or_default();
            (actual == r.value) != r.negated
        })
    }
}

impl fmt::Display for FieldSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

/// Escapes `\`, `,` and `=` so a value can be placed in a field selector.
pub fn escape_field_value(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '\\' | ',' | '=') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

fn split_field_terms(s: &str) -> Vec<&str> {
    if s.is_empty() {
        return Vec::new();
    }
    let mut terms = Vec::new();
    let mut start = 0;
    let mut in_slash = false;
    for (i, c) in s.char_indices() {
        if in_slash {
            in_slash = false;
        } else if c == '\\' {
            in_slash = true;
        } else if c == ',' {
            terms.push(&s[start..i]);
            start = i + 1;
        }
    }
    terms.push(&s[start..]);
    terms
}

fn split_field_term(term: &str) -> Option<(&str, &'static str, &str)> {
    for (i, _) in term.char_indices() {
        let rest = &term[i..];
        for op in ["!=", "==", "="] {
            if let Some(rhs) = rest.strip_prefix(op) {
                return Some((&term[..i], op, rhs));
            }
        }
    }
    None
}

fn unescape_field_value(s: &str) -> Result<String, String> {
    let mut out = String::with_capacity(s.len());
    let mut in_slash = false;
    for c in s.chars() {
        if in_slash {
            if !matches!(c, '\\' | ',' | '=') {
                return Err(format!(
                    "invalid field selector: invalid escape sequence: \\{c}"
                ));
            }
            out.push(c);
            in_slash = false;
            continue;
        }
        match c {
            '\\' => in_slash = true,
            // Go prints the rune with %v, i.e. as its code point number.
            ',' | '=' => {
                return Err(format!(
                    "invalid field selector: unescaped character in value: {}",
                    c as u32
                ))
            }
            c => out.push(c),
        }
    }
    if in_slash {
        return Err("invalid field selector: invalid escape sequence: \\".to_owned());
    }
    Ok(out)
}
