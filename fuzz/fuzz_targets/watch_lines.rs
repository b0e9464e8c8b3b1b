//! Fuzz target `watch_lines`: see `crproxy_fuzz_oracles::watch_lines` for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| crproxy_fuzz_oracles::watch_lines::check(data));
