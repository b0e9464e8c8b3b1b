//! Fuzz target `config`: see `crproxy_fuzz_oracles::config` for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| crproxy_fuzz_oracles::config::check(data));
