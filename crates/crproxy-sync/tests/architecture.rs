//! Architecture invariants of docs/ARCHITECTURE.md, checked on the manifests: the sync
//! never depends on devcluster or the proxy, and the proxy crates never depend on the
//! sync.

use std::path::Path;

/// Dependency names of the `[dependencies]` table of a crate's Cargo.toml.
fn dependencies(krate: &str) -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(krate)
        .join("Cargo.toml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut in_dependencies = false;
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_dependencies = line == "[dependencies]";
            continue;
        }
        if in_dependencies && !line.is_empty() && !line.starts_with('#') {
            let name = line.split(['=', '.', ' ']).next().unwrap_or_default();
            out.push(name.to_owned());
        }
    }
    assert!(!out.is_empty(), "no [dependencies] in {}", path.display());
    out
}

#[test]
fn the_sync_depends_on_neither_devcluster_nor_the_proxy() {
    let deps = dependencies("crproxy-sync");
    for forbidden in ["devcluster", "test-support", "crproxy-proxy", "crproxy"] {
        assert!(
            !deps.iter().any(|d| d == forbidden),
            "crproxy-sync depends on {forbidden}: {deps:?}"
        );
    }
    assert!(deps.iter().any(|d| d == "kube"), "{deps:?}");
}

#[test]
fn the_proxy_crates_do_not_depend_on_the_sync() {
    for krate in [
        "crproxy-proxy",
        "crproxy-core",
        "crproxy-kube",
        "crproxy-wiring",
    ] {
        let deps = dependencies(krate);
        assert!(
            !deps.iter().any(|d| d == "crproxy-sync"),
            "{krate} depends on crproxy-sync"
        );
        assert!(
            !deps.iter().any(|d| d == "devcluster"),
            "{krate} depends on devcluster"
        );
    }
}
