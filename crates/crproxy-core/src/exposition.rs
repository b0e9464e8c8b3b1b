//! Reading a Prometheus or OpenMetrics text exposition, as `crproxy doctor` and
//! the benchmark read a proxy's `/metrics`. The text comes from whatever answers
//! at the URL it was given, so nothing in it is trusted: a line this reader
//! cannot make sense of is skipped, never a panic (fuzz target `exposition`).

use std::collections::BTreeMap;

/// One sample of a text exposition.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// Parses the sample lines of a Prometheus or OpenMetrics text exposition;
/// lines it cannot read are skipped, and so are lines whose metric or label
/// names are not names the format allows: what is left of a garbled line would
/// otherwise pass for a sample.
pub fn parse(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(parse_sample)
        .collect()
}

fn parse_sample(line: &str) -> Option<Sample> {
    // Only the series' own brace: an OpenMetrics exemplar (`# {trace_id="a"} 1`)
    // may follow an unlabelled sample's value.
    let name_end = line.find(|c: char| c == '{' || c.is_whitespace());
    let (name, labels, after) = match name_end.filter(|&end| line[end..].starts_with('{')) {
        Some(open) => {
            let (labels, after) = parse_labels(&line[open + 1..])?;
            (&line[..open], labels, after)
        }
        None => {
            let name = line.split_whitespace().next()?;
            let after = line.trim_start().strip_prefix(name)?;
            (name, BTreeMap::new(), after)
        }
    };
    is_name(name, true).then_some(())?;
    Some(Sample {
        name: name.to_owned(),
        labels,
        value: after.split_whitespace().next()?.parse().ok()?,
    })
}

/// Whether `name` is a metric name (`[a-zA-Z_:][a-zA-Z0-9_:]*`) or, without
/// `colons`, a label name (the same without `:`).
fn is_name(name: &str, colons: bool) -> bool {
    let allowed = |c: u8| c.is_ascii_alphabetic() || c == b'_' || (colons && c == b':');
    let mut bytes = name.bytes();
    bytes.next().is_some_and(allowed) && bytes.all(|c| allowed(c) || c.is_ascii_digit())
}

/// Reads `k="v",...}` and returns the labels and what follows the `}`.
fn parse_labels(mut rest: &str) -> Option<(BTreeMap<String, String>, &str)> {
    let mut labels = BTreeMap::new();
    loop {
        rest = rest.trim_start_matches([',', ' ']);
        if let Some(after) = rest.strip_prefix('}') {
            return Some((labels, after));
        }
        let (key, tail) = rest.split_once("=\"")?;
        let mut value = String::new();
        let mut escaped = false;
        let mut consumed = None;
        for (i, c) in tail.char_indices() {
            match (escaped, c) {
                (true, 'n') => value.push('\n'),
                (true, c) => value.push(c),
                (false, '\\') => {
                    escaped = true;
                    continue;
                }
                (false, '"') => {
                    consumed = Some(i + 1);
                    break;
                }
                (false, c) => value.push(c),
            }
            escaped = false;
        }
        let key = key.trim();
        is_name(key, false).then_some(())?;
        labels.insert(key.to_owned(), value);
        rest = &tail[consumed?..];
    }
}

#[cfg(test)]
mod tests;
