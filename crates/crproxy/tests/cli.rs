//! The command line as a user meets it: exit codes and messages.

use std::process::Command;

fn crproxy(args: &[&str]) -> (bool, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_crproxy"))
        .args(args)
        .output()
        .expect("run crproxy");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn check_config_lists_every_problem_with_its_key_and_fails() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("bad.yaml");
    std::fs::write(
        &path,
        r#"
client: {name: client, project: default}
targets:
  - name: target
    kubeconfig: target.kubeconfig
    peers: {static: ["127.0.0.1:6443"]}
experimental:
  proxy:
    customResources:
      widgets/v1:
        enabled: true
        targetVirtualCluster: {name: target}
      gadgets.example.com/v1:
        enabled: false
        targetVirtualCluster: {}
"#,
    )
    .expect("write");
    let (ok, stdout, stderr) = crproxy(&["check-config", path.to_str().expect("utf8")]);
    assert!(!ok, "invalid configuration must fail");
    assert!(
        stdout.contains("customResources[\"widgets/v1\"]"),
        "{stdout}"
    );
    assert!(
        stdout.contains("customResources[\"gadgets.example.com/v1\"].targetVirtualCluster.name"),
        "disabled entries are validated too: {stdout}"
    );
    assert_eq!(stderr.lines().count(), 1, "one readable line: {stderr}");
    assert!(stderr.starts_with("crproxy: "), "{stderr}");
}

#[test]
fn check_config_accepts_a_valid_file_and_prints_the_plan() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("good.yaml");
    std::fs::write(
        &path,
        r#"
client: {name: client, project: default}
targets:
  - name: target
    kubeconfig: target.kubeconfig
    peers: {static: ["127.0.0.1:6443"]}
experimental:
  proxy:
    customResources:
      widgets.example.com/v1:
        enabled: true
        targetVirtualCluster: {name: target}
"#,
    )
    .expect("write");
    let (ok, stdout, stderr) = crproxy(&["check-config", path.to_str().expect("utf8")]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("example.com/v1"), "{stdout}");
    assert!(stdout.contains("9100"), "{stdout}");
}

#[test]
fn a_missing_file_is_one_readable_line() {
    let (ok, _, stderr) = crproxy(&["check-config", "/nonexistent/crproxy.yaml"]);
    assert!(!ok);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("/nonexistent/crproxy.yaml"), "{stderr}");
}
