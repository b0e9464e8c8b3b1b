//! Fuzz target `write_body`: see `crproxy_fuzz_oracles::write_body` for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| crproxy_fuzz_oracles::write_body::check(data));
