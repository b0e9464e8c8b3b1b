//! Fuzz target `exposition`: see `crproxy_fuzz_oracles::exposition` for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| crproxy_fuzz_oracles::exposition::check(data));
