//! Every committed fuzz seed, replayed through its target's check on the stable
//! toolchain: an input that once found a defect fails CI if the defect returns.

use std::collections::BTreeSet;
use std::fs;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use crproxy_fuzz_oracles::TARGETS;

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}

/// The files of one directory, sorted so that a failure names the same seed on
/// every run.
fn files(dir: &Path) -> Vec<PathBuf> {
    let entries = fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let mut files: Vec<PathBuf> = entries
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.is_file())
        .collect();
    files.sort();
    files
}

#[test]
fn every_committed_seed_passes_its_targets_check() {
    let mut failures = Vec::new();
    let mut replayed = 0;
    for (target, check) in TARGETS {
        let seeds = files(&fuzz_dir().join("corpus").join(target));
        assert!(!seeds.is_empty(), "fuzz/corpus/{target} has no seeds");
        for seed in seeds {
            let data = fs::read(&seed).expect("a readable seed");
            if let Err(panic) = panic::catch_unwind(AssertUnwindSafe(|| check(&data))) {
                let message = panic
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| panic.downcast_ref::<&str>().copied())
                    .unwrap_or("(no message)");
                let name = seed.file_name().unwrap_or_default().to_string_lossy();
                failures.push(format!("fuzz/corpus/{target}/{name}: {message}"));
            }
            replayed += 1;
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // A floor, so that a corpus emptied by mistake does not pass quietly.
    assert!(replayed >= 50, "only {replayed} seeds replayed");
}

/// The target list here, the fuzz crate's binaries, scripts/fuzz's list and the
/// corpus directories name the same targets, so a new target cannot miss its
/// replay or its fuzzing.
#[test]
fn every_fuzz_target_is_replayed() {
    let listed: BTreeSet<&str> = TARGETS.iter().map(|(name, _)| *name).collect();
    let manifest: toml_edit::DocumentMut = fs::read_to_string(fuzz_dir().join("Cargo.toml"))
        .expect("fuzz/Cargo.toml")
        .parse()
        .expect("fuzz/Cargo.toml is TOML");
    let bins = manifest
        .get("bin")
        .and_then(|bins| bins.as_array_of_tables())
        .expect("fuzz/Cargo.toml's [[bin]] targets");
    let mut binaries = BTreeSet::new();
    for bin in bins {
        let field = |key: &str| bin.get(key).and_then(|value| value.as_str());
        let name = field("name").expect("a [[bin]] without a name");
        // Each [[bin]] builds its own file, and that file runs its own check.
        assert_eq!(
            field("path"),
            Some(format!("fuzz_targets/{name}.rs").as_str()),
            "fuzz/Cargo.toml's [[bin]] {name}"
        );
        let path = fuzz_dir().join("fuzz_targets").join(format!("{name}.rs"));
        let source =
            fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let call = format!("crproxy_fuzz_oracles::{name}::check(");
        assert!(
            source.contains(&call),
            "fuzz/fuzz_targets/{name}.rs does not call {call}"
        );
        binaries.insert(name);
    }
    assert_eq!(listed, binaries, "fuzz/Cargo.toml's [[bin]] targets");
    let script = fs::read_to_string(fuzz_dir().join("../scripts/fuzz")).expect("scripts/fuzz");
    let fuzzed: BTreeSet<&str> = script
        .lines()
        .find_map(|line| line.strip_prefix("all=("))
        .and_then(|rest| rest.strip_suffix(')'))
        .expect("scripts/fuzz's all=(...) line")
        .split_whitespace()
        .collect();
    assert_eq!(listed, fuzzed, "scripts/fuzz's all=(...)");
    let corpora: BTreeSet<String> = files_and_dirs(&fuzz_dir().join("corpus"));
    let listed_owned: BTreeSet<String> = listed.iter().map(|s| s.to_string()).collect();
    assert_eq!(listed_owned, corpora, "fuzz/corpus's directories");
}

fn files_and_dirs(dir: &Path) -> BTreeSet<String> {
    fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").file_name())
        .map(|name| name.to_string_lossy().into_owned())
        .collect()
}

/// Each `[[package]]` of a lockfile: its name and version, once for each
/// version it is locked at.
fn locked_packages(path: &Path) -> BTreeSet<(String, String)> {
    let lock: toml_edit::DocumentMut = fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .parse()
        .unwrap_or_else(|e| panic!("{} is not TOML: {e}", path.display()));
    let packages = lock
        .get("package")
        .and_then(|packages| packages.as_array_of_tables())
        .unwrap_or_else(|| panic!("{} has no [[package]]", path.display()));
    packages
        .iter()
        .map(|package| {
            let field = |key: &str| {
                package
                    .get(key)
                    .and_then(|value| value.as_str())
                    .unwrap_or_else(|| panic!("{}: a package without {key}", path.display()))
                    .to_owned()
            };
            (field("name"), field("version"))
        })
        .collect()
}

/// The fuzz workspace locks every crate it shares with the main workspace at
/// the main workspace's version, so that a fuzz run exercises the parsers with
/// the dependencies the tests and the shipped binary are built with. After a
/// dependency update: `cp Cargo.lock fuzz/ && cd fuzz && cargo +nightly
/// metadata --format-version 1 >/dev/null`, which prunes what fuzz does not use.
#[test]
fn the_fuzz_lockfile_agrees_with_the_workspaces() {
    let main = locked_packages(&fuzz_dir().join("../Cargo.lock"));
    let fuzz = locked_packages(&fuzz_dir().join("Cargo.lock"));
    let main_names: BTreeSet<&str> = main.iter().map(|(name, _)| name.as_str()).collect();
    let differing: Vec<String> = fuzz
        .difference(&main)
        .filter(|(name, _)| main_names.contains(name.as_str()))
        .map(|(name, version)| format!("{name} {version}"))
        .collect();
    assert!(
        differing.is_empty(),
        "fuzz/Cargo.lock locks these at other versions than Cargo.lock: {}",
        differing.join(", ")
    );
    // A floor, so that an empty or unreadable lockfile does not pass quietly.
    assert!(
        fuzz.len() >= 100,
        "fuzz/Cargo.lock has {} packages",
        fuzz.len()
    );
}
