//! The properties crproxy's fuzz targets check, one module per target in
//! `fuzz/fuzz_targets/` and named after it. Each module's `check` takes the raw
//! input libFuzzer generates and panics when a property fails.
//!
//! They live here rather than in the targets so that the stable toolchain can run
//! them too: `tests/corpus.rs` feeds every committed seed in `fuzz/corpus/<target>/`
//! through its target's check, so an input that once found a defect keeps being
//! tested by CI, which never builds the nightly-only fuzz crate.

pub mod cbor_counter;
pub mod config;
pub mod deep_objects;
pub mod exposition;
pub mod not_found;
pub mod ownership_watch;
pub mod peer_file;
pub mod request_path;
pub mod responses;
pub mod selectors;
pub mod served_documents;
pub mod skim;
pub mod sync_objects;
pub mod watch_lines;
pub mod write_answer;
pub mod write_body;

/// A target's check: panics when the input breaks a property.
pub type Check = fn(&[u8]);

/// Every fuzz target by name, with its check.
pub const TARGETS: [(&str, Check); 16] = [
    ("cbor_counter", cbor_counter::check),
    ("config", config::check),
    ("deep_objects", deep_objects::check),
    ("exposition", exposition::check),
    ("not_found", not_found::check),
    ("ownership_watch", ownership_watch::check),
    ("peer_file", peer_file::check),
    ("request_path", request_path::check),
    ("responses", responses::check),
    ("selectors", selectors::check),
    ("served_documents", served_documents::check),
    ("skim", skim::check),
    ("sync_objects", sync_objects::check),
    ("watch_lines", watch_lines::check),
    ("write_answer", write_answer::check),
    ("write_body", write_body::check),
];
