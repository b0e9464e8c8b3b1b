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

/// `crproxy dev` with the README's default, relative `--dir`: the generated
/// configuration must still find its kubeconfigs.
#[test]
fn dev_starts_with_a_relative_directory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let free = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port().to_string())
            .expect("free port")
    };
    let child = Command::new(env!("CARGO_BIN_EXE_crproxy"))
        .current_dir(dir.path())
        .args(["dev", "--dir", "rel/dev"])
        .args(["--target-port", &free(), "--client-port", &free()])
        .args(["--proxy-port", &free(), "--metrics-port", &free()])
        .args(["--host-port", &free(), "--sync-metrics-port", &free()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut child = test_support::KillOnDrop(child);
    let dev_json = dir.path().join("rel/dev/dev.json");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    // The host entry is written last, once the sync has started too.
    let ready = || std::fs::read_to_string(&dev_json).is_ok_and(|t| t.contains("\"host\""));
    while !ready() {
        if let Ok(Some(status)) = child.try_wait() {
            let mut stderr = String::new();
            if let Some(mut pipe) = child.stderr.take() {
                use std::io::Read;
                let _ = pipe.read_to_string(&mut stderr);
            }
            panic!("crproxy dev exited early ({status}): {stderr}");
        }
        assert!(
            std::time::Instant::now() < deadline,
            "dev.json never appeared"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let _ = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status();
    let status = child.wait().expect("wait");
    assert!(status.success(), "clean shutdown on Ctrl-C: {status}");
}
