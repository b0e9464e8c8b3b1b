//! Fuzz target `not_found`: see `crproxy_fuzz_oracles::not_found` for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| crproxy_fuzz_oracles::not_found::check(data));
