//! Fuzz target `selectors`: see `crproxy_fuzz_oracles::selectors` for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| crproxy_fuzz_oracles::selectors::check(data));
