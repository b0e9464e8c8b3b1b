//! The CBOR-sequence watch counter: never a panic, and splitting the stream into
//! three chunks at any two points counts the same items as feeding it whole.
#![no_main]

use crproxy_proxy::cbor::ItemCounter;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
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
});
