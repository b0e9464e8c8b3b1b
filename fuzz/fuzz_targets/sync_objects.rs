//! Fuzz target `sync_objects`: see `crproxy_fuzz_oracles::sync_objects` for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| crproxy_fuzz_oracles::sync_objects::check(data));
