//! Fuzz target `responses`: see `crproxy_fuzz_oracles::responses` for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| crproxy_fuzz_oracles::responses::check(data));
