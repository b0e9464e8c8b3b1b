//! Fuzz target `request_path`: see `crproxy_fuzz_oracles::request_path` for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| crproxy_fuzz_oracles::request_path::check(data));
