use super::*;

const DEV_CONFIG: &str = "# Written by `crproxy dev`.
client:
  name: client
proxy:
  bindAddress: 127.0.0.1
  basePort: 9100
  metricsAddress: 127.0.0.1:9090
  registration:
    serviceType: ExternalName
targets:
  - name: target
";

#[test]
fn only_the_ports_change() {
    let metrics: SocketAddr = "127.0.0.1:40001".parse().expect("addr");
    let out = rewrite_ports(DEV_CONFIG, 40000, metrics).expect("rewrite");
    let expected = DEV_CONFIG
        .replace("basePort: 9100", "basePort: 40000")
        .replace(
            "metricsAddress: 127.0.0.1:9090",
            "metricsAddress: 127.0.0.1:40001",
        );
    assert_eq!(out, expected);
}

#[test]
fn a_config_without_ports_is_refused() {
    let metrics: SocketAddr = "127.0.0.1:1".parse().expect("addr");
    assert!(matches!(
        rewrite_ports("proxy:\n  metricsAddress: x\n", 1, metrics),
        Err(ChildError::Config("basePort"))
    ));
    assert!(matches!(
        rewrite_ports("proxy:\n  basePort: 1\n", 1, metrics),
        Err(ChildError::Config("metricsAddress"))
    ));
}

#[test]
fn the_child_gets_the_worker_threads_it_is_asked_for() {
    let threads = |command: &tokio::process::Command| {
        command
            .as_std()
            .get_envs()
            .find(|(name, _)| *name == WORKER_THREADS_VAR)
            .and_then(|(_, value)| value)
            .map(|value| value.to_string_lossy().into_owned())
    };
    let binary = Path::new("/bin/crproxy");
    let config = Path::new("crproxy.yaml");
    let asked = run_command(binary, config, NonZeroUsize::new(1));
    assert_eq!(threads(&asked).as_deref(), Some("1"));
    let args: Vec<_> = asked.as_std().get_args().collect();
    assert_eq!(args, ["run", "--config", "crproxy.yaml"]);
    // Not asked: nothing set, so the child keeps its default (or what this
    // process inherited).
    assert_eq!(threads(&run_command(binary, config, None)), None);
}

#[test]
fn the_report_names_the_worker_threads_it_set() {
    assert_eq!(worker_threads_setting(NonZeroUsize::new(3)), "3");
}

#[test]
fn the_build_is_read_from_the_version_line() {
    let build = |line| build_in_version(line);
    assert_eq!(
        build("crproxy 0.1.0 (profile-guided build)\n"),
        Some(crproxy::build_kind::PROFILE_GUIDED)
    );
    assert_eq!(build("crproxy 0.1.0 (plain build)"), Some("plain"));
    // A binary from before the build was named.
    assert_eq!(build("crproxy 0.1.0\n"), None);
}

/// A stand-in executable printing `stdout` and exiting with `code`.
fn stand_in(dir: &Path, stdout: &str, code: i32) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(format!("crproxy-{code}-{}", stdout.len()));
    std::fs::write(
        &path,
        format!("#!/bin/sh\nprintf '{stdout}'\nexit {code}\n"),
    )
    .expect("write");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    path
}

/// [`build_of`] a stand-in. A file just written cannot be run while a process
/// another test forked meanwhile still holds it open for writing (ETXTBSY, until
/// that process runs its own program), so that refusal is retried, a bounded
/// number of times.
async fn build_of_stand_in(path: &Path) -> String {
    for _ in 0..50 {
        let build = build_of(path).await;
        if !build.contains("Text file busy") {
            return build;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{} stayed busy for a second", path.display());
}

#[tokio::test]
async fn the_report_names_the_build_the_binary_states() {
    let dir = tempfile::tempdir().expect("tempdir");
    let said = stand_in(dir.path(), "crproxy 0.1.0 (profile-guided build)\\n", 0);
    let silent = stand_in(dir.path(), "", 0);
    let failing = stand_in(dir.path(), "x", 3);
    assert_eq!(build_of_stand_in(&said).await, "profile-guided");
    assert_eq!(
        build_of_stand_in(&silent).await,
        "unknown (--version said \"\")"
    );
    assert_eq!(
        build_of_stand_in(&failing).await,
        "unknown (--version exited exit status: 3)"
    );
    let missing = dir.path().join("missing");
    let build = build_of(&missing).await;
    assert!(
        build.starts_with("unknown (--version did not run: "),
        "{build}"
    );
}
