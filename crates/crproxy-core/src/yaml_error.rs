//! YAML parser errors as one line for the people who wrote the YAML.
//!
//! serde-saphyr's default rendering is for developers: a multi-line source
//! snippet, and for some errors advice about its own `Options`. A Status message
//! or a line of `crproxy check-config` needs the problem and where it is; so
//! does devcluster's answer to a body it cannot read.

/// The parser's message for users, with its line and column, on one line.
pub fn one_line(error: &serde_saphyr::Error) -> String {
    let options = serde_saphyr::render_options! {
        formatter: &serde_saphyr::UserMessageFormatter,
        snippets: serde_saphyr::SnippetMode::Off,
    };
    error.render_with_options(options)
}
