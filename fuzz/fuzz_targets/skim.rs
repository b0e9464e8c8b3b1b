//! Fuzz target `skim`: see `crproxy_fuzz_oracles::skim` for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| crproxy_fuzz_oracles::skim::check(data));
