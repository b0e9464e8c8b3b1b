//! Fuzz target `write_answer`: see `crproxy_fuzz_oracles::write_answer` for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| crproxy_fuzz_oracles::write_answer::check(data));
