//! The configuration loader: never a panic on any YAML text, and every error
//! names something.

/// Checks one input against the properties above; a panic is a finding.
pub fn check(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(errors) = crproxy_core::config::load(text) {
        for error in errors {
            assert!(!error.to_string().is_empty());
        }
    }
}
