//! Stand-ins for objects nested too deeply to be decoded.
//!
//! kube-apiserver stores a custom resource nested thousands of levels deep (a
//! schema that preserves unknown fields lets it), but serde_json refuses to
//! decode past 127 levels, and kube-rs decodes a whole list page or watch event
//! at once: one such object fails the list, and a reflector that cannot list
//! never syncs. One tenant's object would stop the sync of its type.
//!
//! Answers are therefore rewritten before kube-rs reads them: an object nested
//! deeper than [`MAX_OBJECT_NESTING`] is replaced by a stand-in that keeps its
//! `apiVersion`, `kind` and `metadata` (less `managedFields`, which mirror the
//! object's nesting) and carries [`TOO_DEEP_ANNOTATION`]. Readers see the object
//! exists, with its name, uid, resourceVersion and labels, and know its content
//! is missing: the sync leaves it and its counterpart alone and reports it.

use serde_json::{Map, Value};

use crate::skim::{Skim, SkimError};

/// The deepest nesting of an object that is passed on as it is: serde_json
/// decodes at most 127 levels, and kube-rs reads a list's items two levels
/// down (the list, its `items`). An event's object (one level down) and a GET's
/// are held to the same limit, so an object reads the same every way.
pub const MAX_OBJECT_NESTING: usize = 125;

/// On a stand-in: why the object's content is missing.
pub const TOO_DEEP_ANNOTATION: &str = "crproxy.dev/nested-too-deep";

/// The value of [`TOO_DEEP_ANNOTATION`].
pub const TOO_DEEP_REASON: &str =
    "the object nests deeper than 125 levels; only its metadata is read";

/// Whether `object` is a stand-in: its content was left out (see the module).
pub fn is_stand_in(object: &Value) -> bool {
    object
        .pointer("/metadata/annotations")
        .and_then(Value::as_object)
        .is_some_and(|annotations| annotations.contains_key(TOO_DEEP_ANNOTATION))
}

/// A GET answer (one object, or a list of them) with every object nested
/// deeper than [`MAX_OBJECT_NESTING`] replaced by its stand-in. `None` when
/// nothing needs replacing, or when the text is not JSON this can read (it is
/// passed on as it came, for the reader to refuse).
pub fn rewrite_answer(text: &str) -> Option<String> {
    // The common case: nothing in the whole text nests that deep.
    if Skim::new(text).skip_nesting().ok()? <= MAX_OBJECT_NESTING {
        return None;
    }
    let answer = read_answer(text).ok()?;
    let is_list = answer.kind.as_deref().is_some_and(|k| k.ends_with("List"));
    match answer.items {
        Some(items) if is_list => replace(text, &items),
        // One object: it is the deep one.
        _ => stand_in(text).ok(),
    }
}

/// One watch event (`{"type":...,"object":{...}}`) with its object replaced by
/// its stand-in when it nests deeper than [`MAX_OBJECT_NESTING`]; `None` when
/// it does not, or when the event is not JSON this can read.
pub fn rewrite_event(line: &str) -> Option<String> {
    if Skim::new(line).skip_nesting().ok()? <= MAX_OBJECT_NESTING {
        return None;
    }
    let mut skim = Skim::new(line);
    let mut entries = skim.object().ok()?;
    let mut object = None;
    while let Some(key) = entries.next_key(&mut skim).ok()? {
        skim.peek().ok()?;
        let start = skim.position();
        let nesting = skim.skip_nesting().ok()?;
        if key == "object" && nesting > MAX_OBJECT_NESTING {
            object = Some(Span {
                start,
                end: skim.position(),
            });
        }
    }
    // Text after the event: not an event, left for the reader to refuse.
    skim.end().ok()?;
    replace(line, &[object?])
}

/// Where a value sits in a text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Span {
    start: usize,
    end: usize,
}

/// What [`rewrite_answer`] needs of an answer's top level.
struct Answer {
    kind: Option<String>,
    /// The items nested too deeply, when there is an `items` array.
    items: Option<Vec<Span>>,
}

fn read_answer(text: &str) -> Result<Answer, SkimError> {
    let mut skim = Skim::new(text);
    let mut entries = skim.object()?;
    let mut answer = Answer {
        kind: None,
        items: None,
    };
    while let Some(key) = entries.next_key(&mut skim)? {
        match key.as_ref() {
            "kind" => answer.kind = skim.string_or_skip()?.map(String::from),
            "items" => {
                let Some(mut elements) = skim.array_or_skip()? else {
                    continue;
                };
                let mut deep = Vec::new();
                while elements.next(&mut skim)? {
                    skim.peek()?;
                    let start = skim.position();
                    if skim.skip_nesting()? > MAX_OBJECT_NESTING {
                        deep.push(Span {
                            start,
                            end: skim.position(),
                        });
                    }
                }
                answer.items = Some(deep);
            }
            _ => skim.skip()?,
        }
    }
    skim.end()?;
    Ok(answer)
}

/// `text` with each span replaced by the stand-in of the object there; `None`
/// when there is none, or one cannot be read.
fn replace(text: &str, spans: &[Span]) -> Option<String> {
    if spans.is_empty() {
        return None;
    }
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    for span in spans {
        out.push_str(&text[copied..span.start]);
        out.push_str(&stand_in(&text[span.start..span.end]).ok()?);
        copied = span.end;
    }
    out.push_str(&text[copied..]);
    Some(out)
}

/// The stand-in of one object's text: its `apiVersion`, `kind` and `metadata`
/// as they are, but for `managedFields` (left out) and the annotations (with
/// [`TOO_DEEP_ANNOTATION`] added).
fn stand_in(object: &str) -> Result<String, SkimError> {
    let mut skim = Skim::new(object);
    let mut entries = skim.object()?;
    let mut members: Vec<&str> = Vec::new();
    let mut metadata = String::from("{");
    let mut annotations = Map::new();
    while let Some((start, key)) = entries.next_key_at(&mut skim)? {
        match key.as_ref() {
            "apiVersion" | "kind" => {
                skim.skip()?;
                members.push(&object[start..skim.position()]);
            }
            "metadata" => {
                let Some(mut fields) = skim.object_or_skip()? else {
                    continue;
                };
                while let Some((start, field)) = fields.next_key_at(&mut skim)? {
                    skim.peek()?;
                    let value_start = skim.position();
                    skim.skip()?;
                    match field.as_ref() {
                        "managedFields" => {}
                        // kube keeps annotations a map of strings; anything else
                        // is left out rather than guessed at.
                        "annotations" => {
                            annotations =
                                serde_json::from_str(&object[value_start..skim.position()])
                                    .unwrap_or_default();
                        }
                        _ => {
                            if metadata.len() > 1 {
                                metadata.push(',');
                            }
                            metadata.push_str(&object[start..skim.position()]);
                        }
                    }
                }
            }
            _ => skim.skip()?,
        }
    }
    annotations.insert(
        TOO_DEEP_ANNOTATION.into(),
        Value::String(TOO_DEEP_REASON.into()),
    );
    if metadata.len() > 1 {
        metadata.push(',');
    }
    metadata.push_str(r#""annotations":"#);
    metadata.push_str(&Value::Object(annotations).to_string());
    metadata.push('}');
    let mut out = String::from("{");
    for member in members {
        out.push_str(member);
        out.push(',');
    }
    out.push_str(r#""metadata":"#);
    out.push_str(&metadata);
    out.push('}');
    Ok(out)
}

#[cfg(test)]
mod tests;
