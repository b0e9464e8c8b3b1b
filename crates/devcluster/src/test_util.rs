//! Helpers shared by the unit tests of several modules.

use http::HeaderMap;

/// The values of header `name` in `headers`, as text.
pub(crate) fn values(headers: &HeaderMap, name: &str) -> Vec<String> {
    headers
        .get_all(name)
        .iter()
        .map(|v| v.to_str().expect("text header").to_string())
        .collect()
}
