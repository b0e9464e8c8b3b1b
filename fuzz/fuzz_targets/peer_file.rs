//! Fuzz target `peer_file`: see `crproxy_fuzz_oracles::peer_file` for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| crproxy_fuzz_oracles::peer_file::check(data));
