//! Tells `crproxy --version` how the binary was optimised (src/build_kind.rs).

include!("src/build_kind.rs");

fn main() {
    // Cargo reruns build scripts when the flags change; this says so explicitly.
    println!("cargo:rerun-if-env-changed=CARGO_ENCODED_RUSTFLAGS");
    let flags = std::env::var("CARGO_ENCODED_RUSTFLAGS").unwrap_or_default();
    println!(
        "cargo:rustc-env=CRPROXY_OPTIMISATION={}",
        optimisation(&flags)
    );
}
