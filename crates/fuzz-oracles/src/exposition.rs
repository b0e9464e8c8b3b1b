//! What `crproxy doctor` and the benchmark read from a metrics endpoint
//! (`crproxy_core::exposition`). Whatever the text, reading it never panics, and
//! every sample read is what it says: written back out in the text format, with
//! its label values escaped, it reads back as the same sample, so no sample is
//! made up from the pieces of a line the reader misunderstood.

use std::fmt::Write;

use crproxy_core::exposition::{parse, Sample};

/// Checks one input against the properties above; a panic is a finding.
pub fn check(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        // A metrics body is read as text before it is parsed (doctor's fetch).
        return;
    };
    for sample in parse(text) {
        let line = written(&sample);
        let again = parse(&line);
        assert_eq!(again.len(), 1, "{line:?} read as {again:?}, from {text:?}");
        let again = &again[0];
        assert_eq!(again.name, sample.name, "{line:?}, from {text:?}");
        assert_eq!(again.labels, sample.labels, "{line:?}, from {text:?}");
        assert!(
            again.value == sample.value || (again.value.is_nan() && sample.value.is_nan()),
            "{line:?} read as {again:?}, from {text:?}"
        );
    }
}

/// `sample` as one line of the text format, braces even without labels.
fn written(sample: &Sample) -> String {
    let mut line = format!("{}{{", sample.name);
    for (key, value) in &sample.labels {
        let escaped = value
            .replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('\n', "\\n");
        let _ = write!(line, "{key}=\"{escaped}\",");
    }
    let _ = write!(line, "}} {}", sample.value);
    line
}
