//! The CBOR-sequence watch counter: never a panic, and splitting the stream into
//! chunks at any point counts the same items as feeding it whole.
#![no_main]

use crproxy_proxy::cbor::ItemCounter;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&split, stream)) = data.split_first() else {
        return;
    };
    let mut whole = ItemCounter::default();
    let expected = whole.push(stream);
    let at = usize::from(split).min(stream.len());
    let mut chunked = ItemCounter::default();
    let mut counted = chunked.push(&stream[..at]);
    counted += chunked.push(&stream[at..]);
    assert_eq!(counted, expected);
});
