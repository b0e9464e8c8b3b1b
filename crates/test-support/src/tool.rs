//! Tests that need an external tool (promtool, …): they run wherever the tool is
//! on `PATH`, are reported as *ignored* where it is missing, and fail under
//! `CI=true` when it is missing, since CI installs every tool. A test that quietly
//! passes without its tool could never fail.
//!
//! Whether a test is ignored is decided at compile time, so it is a build-script
//! matter. This file uses only `std`, so a build script can include it without a
//! build-dependency on this crate:
//!
//! ```ignore
//! // build.rs
//! #[path = "../test-support/src/tool.rs"]
//! mod tool;
//! fn main() {
//!     tool::emit_missing_cfg("promtool", "promtool_missing");
//! }
//! ```
//!
//! and the test:
//!
//! ```ignore
//! #[test]
//! #[cfg_attr(promtool_missing, ignore = "promtool is not on PATH")]
//! fn promtool_likes_it() {
//!     let promtool = test_support::tool::require("promtool", "Debian package `prometheus`");
//!     // ...
//! }
//! ```

#![allow(dead_code)] // Build scripts include this file and use part of it.

use std::path::PathBuf;

/// The environment variable CI sets to `true`.
pub const CI_VAR: &str = "CI";

/// Whether this is a CI run (`CI=true`), where every tool must be present.
pub fn is_ci() -> bool {
    std::env::var(CI_VAR).is_ok_and(|v| v == "true")
}

/// The executable `tool` in a `PATH` directory, as a shell would find it.
pub fn find_on_path(tool: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(tool))
        .find(|candidate| {
            std::fs::metadata(candidate)
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// Whether a test needing `tool` should be ignored: the tool is missing and this
/// is not CI.
pub fn ignore_without(tool: &str) -> bool {
    find_on_path(tool).is_none() && !is_ci()
}

/// For build scripts: declares the cfg `cfg_name`, sets it when tests needing
/// `tool` are to be ignored, and asks Cargo to decide again when `PATH` or `CI`
/// change, when the tool found goes away, or (while it is missing) when a `PATH`
/// directory changes, e.g. because the tool was installed.
pub fn emit_missing_cfg(tool: &str, cfg_name: &str) {
    println!("cargo::rustc-check-cfg=cfg({cfg_name})");
    println!("cargo::rerun-if-env-changed=PATH");
    println!("cargo::rerun-if-env-changed={CI_VAR}");
    match find_on_path(tool) {
        Some(found) => println!("cargo::rerun-if-changed={}", found.display()),
        None => {
            if let Some(path) = std::env::var_os("PATH") {
                for dir in std::env::split_paths(&path).filter(|d| d.is_absolute() && d.is_dir()) {
                    println!("cargo::rerun-if-changed={}", dir.display());
                }
            }
        }
    }
    if ignore_without(tool) {
        println!("cargo::rustc-cfg={cfg_name}");
    }
}

/// For the test itself: the tool's path, or a failure that says how to install
/// it. A test only gets here without the tool under `CI=true`.
pub fn require(tool: &str, install_hint: &str) -> PathBuf {
    match find_on_path(tool) {
        Some(path) => path,
        None => panic!(
            "{tool} is not on PATH and {CI_VAR}=true requires it: install it ({install_hint})"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_a_tool_every_machine_has() {
        let sh = find_on_path("sh").expect("sh on PATH");
        assert!(sh.ends_with("sh"));
        assert!(find_on_path("no-such-tool-crproxy").is_none());
    }

    #[test]
    #[should_panic(expected = "no-such-tool-crproxy is not on PATH and CI=true requires it")]
    fn a_missing_required_tool_fails_with_how_to_install_it() {
        require("no-such-tool-crproxy", "nowhere");
    }
}
