//! Fuzz target `cbor_counter`: see `crproxy_fuzz_oracles::cbor_counter` for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| crproxy_fuzz_oracles::cbor_counter::check(data));
