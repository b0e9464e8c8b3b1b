//! Text as Go writes it, where kube-apiserver's messages embed it and a caller
//! may compare them byte for byte.

use std::fmt::Write;

/// `s` as Go's `%q` (`strconv.Quote`) writes it: in double quotes, `"` and `\`
/// escaped, control characters as Go's escapes (`\n`, `\x01`, `\u0085`), and
/// anything else printable as is. A `U+FFFD` is written `\ufffd`: in a Rust
/// string it stands where Go would have held bytes that are not UTF-8, which
/// Go escapes too.
pub fn quoted(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\u{b}' => out.push_str("\\v"),
            c if c.is_ascii_control() => {
                let _ = write!(out, "\\x{:02x}", u32::from(c));
            }
            c if c.is_control() || c == '\u{fffd}' => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests;
