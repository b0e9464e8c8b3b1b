//! Fuzz target `ownership_watch`: see `crproxy_fuzz_oracles::ownership_watch` for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| crproxy_fuzz_oracles::ownership_watch::check(data));
