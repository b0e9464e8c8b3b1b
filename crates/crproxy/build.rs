//! Tells `crproxy --version` how the binary was optimised (src/build_kind.rs).

include!("src/build_kind.rs");

fn main() {
    // Only these two files decide the answer. Cargo gives each set of compiler
    // flags a build-script run of its own, so a change of flags is seen too
    // (`rerun-if-env-changed` cannot watch CARGO_ENCODED_RUSTFLAGS, which Cargo
    // sets only for the script).
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=src/build_kind.rs");
    let flags = std::env::var("CARGO_ENCODED_RUSTFLAGS").unwrap_or_default();
    println!(
        "cargo:rustc-env=CRPROXY_OPTIMISATION={}",
        optimisation(&flags)
    );
}
