//! Fuzz target `served_documents`: see `crproxy_fuzz_oracles::served_documents` for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| crproxy_fuzz_oracles::served_documents::check(data));
