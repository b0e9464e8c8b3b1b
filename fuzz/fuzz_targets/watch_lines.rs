//! The JSON watch line decoder reads a stream a peer controls. However the bytes
//! are split into chunks, it must never panic and must decode the same events as
//! when the whole stream arrives at once (a watch's TCP segments fall anywhere).
#![no_main]

use crproxy_kube::LineDecoder;
use libfuzzer_sys::fuzz_target;

fn decode(chunks: &[&[u8]]) -> Vec<String> {
    let mut decoder = LineDecoder::default();
    let mut events: Vec<String> = chunks
        .iter()
        .flat_map(|chunk| decoder.push(chunk))
        .map(|event| format!("{event:?}"))
        .collect();
    events.extend(decoder.finish().map(|event| format!("{event:?}")));
    events
}

fuzz_target!(|data: &[u8]| {
    // The first byte picks the chunk size, the rest is the stream.
    let Some((&size, stream)) = data.split_first() else {
        return;
    };
    let size = usize::from(size).max(1);
    let chunked: Vec<&[u8]> = stream.chunks(size).collect();
    assert_eq!(decode(&[stream]), decode(&chunked));
});
