//! The CBOR-sequence watch counter: never a panic; splitting the stream into
//! three chunks at any two points counts the same items as feeding it whole; and
//! what an independent codec (ciborium) reads and writes again is counted item by
//! item.

use ciborium::Value;
use crproxy_proxy::cbor::ItemCounter;

/// Nesting the counter follows; deeper is malformed to it, not to ciborium.
const COUNTER_DEPTH: usize = 64;

fn depth(value: &Value) -> usize {
    1 + match value {
        Value::Array(items) => items.iter().map(depth).max().unwrap_or(0),
        Value::Map(entries) => entries
            .iter()
            .map(|(k, v)| depth(k).max(depth(v)))
            .max()
            .unwrap_or(0),
        Value::Tag(_, inner) => depth(inner),
        _ => 0,
    }
}

/// Checks one input against the properties above; a panic is a finding.
pub fn check(data: &[u8]) {
    let [first, second, stream @ ..] = data else {
        return;
    };
    let mut whole = ItemCounter::default();
    let expected = whole.push(stream);
    let a = usize::from(*first).min(stream.len());
    let b = (a + usize::from(*second) * 4).min(stream.len());
    let mut chunked = ItemCounter::default();
    let counted: u64 = [&stream[..a], &stream[a..b], &stream[b..]]
        .iter()
        .map(|chunk| chunked.push(chunk))
        .sum();
    assert_eq!(counted, expected);

    // Against an independent codec: the items ciborium reads one after another
    // from the start, written out again by ciborium (well-formed, definite
    // lengths), are counted one each. ciborium reads some input RFC 8949 calls
    // malformed (an indefinite string inside another), so the raw bytes are not
    // compared.
    let mut rest = stream;
    let mut written = Vec::new();
    let mut items = 0u64;
    while !rest.is_empty() {
        let mut reader = rest;
        match ciborium::from_reader::<Value, _>(&mut reader) {
            Ok(value) if depth(&value) <= COUNTER_DEPTH => {
                ciborium::into_writer(&value, &mut written).expect("writes to memory");
                items += 1;
                rest = reader;
            }
            _ => break,
        }
    }
    assert_eq!(ItemCounter::default().push(&written), items);
}
