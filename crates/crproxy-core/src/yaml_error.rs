//! YAML parser errors as one line for the people who wrote the YAML.
//!
//! serde-saphyr's default rendering is for developers: a multi-line source
//! snippet, and for some errors advice about its own `Options`. A Status message
//! or a line of `crproxy check-config` needs the problem and where it is; so
//! does devcluster's answer to a body it cannot read.

use std::borrow::Cow;

use serde_saphyr::{MessageFormatter, UserMessageFormatter};

/// What a [`duplicate_key`] error says it expected; [`Plain`] knows its errors
/// by it.
const EACH_KEY_ONCE: &str = "each key once in a mapping";

/// The parser's message for users, with its line and column, on one line.
pub fn one_line(error: &serde_saphyr::Error) -> String {
    let options = serde_saphyr::render_options! {
        formatter: &Plain,
        snippets: serde_saphyr::SnippetMode::Off,
    };
    error.render_with_options(options)
}

/// The error for a second `key` in one mapping that the parser let through
/// because YAML tells the two apart and JSON does not (`!a k` and `!b k`, or
/// `1` and `"1"`). Raised as one of serde's own kinds of error, because
/// serde-saphyr adds the line and column to those and not to a custom message;
/// [`one_line`] words it without that kind's "invalid value" framing.
pub fn duplicate_key<E: serde::de::Error>(key: &str) -> E {
    E::invalid_value(
        serde::de::Unexpected::Other(&format!("{key:?}")),
        &EACH_KEY_ONCE,
    )
}

/// serde-saphyr's message for users, but for [`duplicate_key`] errors.
struct Plain;

impl MessageFormatter for Plain {
    fn format_message<'a>(&self, error: &'a serde_saphyr::Error) -> Cow<'a, str> {
        match error {
            serde_saphyr::Error::SerdeInvalidValue {
                unexpected,
                expected,
                ..
            } if expected == EACH_KEY_ONCE => Cow::Owned(format!(
                "duplicate key {unexpected} (another key of this mapping is the same key in JSON)"
            )),
            _ => UserMessageFormatter.format_message(error),
        }
    }
}
