//! Label and field selector parsers: never a panic, and a parsed selector's
//! printed form parses back to the same selector.

use crproxy_core::selector::{FieldSelector, LabelSelector};

/// Checks one input against the properties above; a panic is a finding.
pub fn check(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(selector) = LabelSelector::parse(text) {
        let printed = selector.to_string();
        let again = LabelSelector::parse(&printed).expect("a printed label selector parses");
        assert_eq!(again.to_string(), printed);
    }
    let _ = FieldSelector::parse(text);
}
