//! The command line as a user meets it: exit codes and messages.

use std::process::Command;

fn crproxy(args: &[&str]) -> (bool, String, String) {
    let output = crproxy_with_env(args, &[]);
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// The command run with `args` and these environment variables set.
fn crproxy_with_env(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_crproxy"))
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("run crproxy")
}

/// What `crproxy check-config` said of one configuration file.
struct Checked {
    ok: bool,
    stdout: String,
    stderr: String,
    /// The configuration file's path, as the output names it.
    file: String,
}

/// `crproxy check-config` of `crproxy.yaml` holding `config`, in a fresh directory
/// that also holds `files` (name and contents), which relative paths in `config`
/// name.
fn check_config(config: &str, files: &[(&str, &[u8])]) -> Checked {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("crproxy.yaml");
    std::fs::write(&path, config).expect("write the configuration");
    for (name, contents) in files {
        std::fs::write(dir.path().join(name), contents).expect("write a file it names");
    }
    let file = path.to_str().expect("utf8").to_string();
    let (ok, stdout, stderr) = crproxy(&["check-config", &file]);
    Checked {
        ok,
        stdout,
        stderr,
        file,
    }
}

#[test]
fn check_config_lists_every_problem_with_its_key_and_fails() {
    let Checked {
        ok, stdout, stderr, ..
    } = check_config(
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
        &[],
    );
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
    let Checked {
        ok, stdout, stderr, ..
    } = check_config(
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
        &[("target.kubeconfig", KUBECONFIG.as_bytes())],
    );
    assert!(ok, "{stdout}{stderr}");
    assert!(stdout.contains("example.com/v1"), "{stdout}");
    assert!(stdout.contains("9100"), "{stdout}");
    assert!(
        stdout.contains(
            "ok: names the RBAC allows by name: Lease kube-system/crproxy-client, \
             Lease kube-system/crproxy-sync-client, \
             ValidatingWebhookConfiguration crproxy-writethrough-client\n"
        ),
        "{stdout}"
    );
}

/// The names the RBAC must allow follow client.name, and the sync's Lease is
/// shortened with a hash past 63 characters: check-config prints them as the code
/// makes them, so a long name need not be worked out by hand.
#[test]
fn check_config_prints_the_names_the_rbac_allows_for_a_long_client_name() {
    let name = "c".repeat(60);
    let Checked {
        ok, stdout, stderr, ..
    } = check_config(
        &format!(
            r#"
client: {{name: {name}, project: default}}
targets:
  - name: target
    kubeconfig: target.kubeconfig
    peers: {{static: ["127.0.0.1:6443"]}}
experimental:
  proxy:
    customResources:
      widgets.example.com/v1:
        enabled: true
        targetVirtualCluster: {{name: target}}
"#
        ),
        &[("target.kubeconfig", KUBECONFIG.as_bytes())],
    );
    assert!(ok, "{stdout}{stderr}");
    let sync_lease = crproxy_core::names::sync_lease_name(&name);
    assert_ne!(sync_lease, format!("crproxy-sync-{name}"), "shortened");
    assert!(
        stdout.contains(&format!(
            "Lease kube-system/crproxy-{name}, Lease kube-system/{sync_lease}, \
             ValidatingWebhookConfiguration crproxy-writethrough-{name}\n"
        )),
        "{stdout}"
    );
}

/// A kubeconfig `check-config` can use (nothing connects to it).
const KUBECONFIG: &str = r#"
apiVersion: v1
kind: Config
clusters: [{name: t, cluster: {server: "https://127.0.0.1:7443", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: abc}}]
contexts: [{name: t, context: {cluster: t, user: u}}]
current-context: t
"#;

/// The issue's broken file: several mistakes of different kinds, all reported in
/// one run, each as `FILE:LINE:COLUMN: key: message`, in file order.
#[test]
fn check_config_reports_every_problem_with_its_line() {
    let Checked {
        ok,
        stdout,
        stderr,
        file,
    } = check_config(
        r#"client:
  name: Client
  project: default
  kubeconfig: missing.kubeconfig
proxy:
  basePort: 9100
  basePort: 9200
  metricsAdress: 127.0.0.1:9090
targets:
  - name: target
    kubeconfig: broken.kubeconfig
    peers:
      static: ["127.0.0.1:7443"]
experimental:
  proxy:
    customResources:
      widgets.example.com/v1:
        enabled: true
        targetVirtualCluster: {name: other}
"#,
        &[("broken.kubeconfig", b"clusters: [oops\n")],
    );
    assert!(!ok);
    let lines: Vec<&str> = stdout.lines().collect();
    let expected = [
        ("2:3", "client.name", "\"Client\" is not a valid name"),
        (
            "4:3",
            "client.kubeconfig",
            "missing.kubeconfig does not exist",
        ),
        (
            "7:3",
            "proxy.basePort",
            "written twice in the same mapping (also on line 6)",
        ),
        ("8:3", "proxy.metricsAdress", "unknown key"),
        (
            "11:5",
            "targets[0].kubeconfig",
            "broken.kubeconfig is not a kubeconfig: bad YAML: unclosed bracket '[' at line 1, column 11",
        ),
        (
            "19:9",
            "experimental.proxy.customResources[\"widgets.example.com/v1\"].targetVirtualCluster",
            "no entry in targets has name \"other\"",
        ),
    ];
    assert_eq!(lines.len(), expected.len(), "{stdout}");
    for (line, (position, key, fragment)) in lines.iter().zip(expected) {
        let prefix = format!("{file}:{position}: {key}: ");
        assert!(
            line.starts_with(&prefix),
            "{line:?} should start with {prefix:?}"
        );
        assert!(line.contains(fragment), "{line:?} lacks {fragment:?}");
    }
    assert_eq!(
        stderr.trim(),
        format!("crproxy: {file}: 6 configuration error(s)")
    );
}

/// A syntax error: where the mistake is, in crproxy's words, with no empty key
/// and no parser advice; a duplicate key is a configuration error like any other.
#[test]
fn check_config_reports_yaml_mistakes_in_its_own_words() {
    let Checked {
        ok,
        stdout,
        stderr,
        file,
    } = check_config("client: {name: client, project: default\nproxy: {}\n", &[]);
    assert!(!ok);
    assert_eq!(
        stdout.trim_end(),
        format!("{file}:1:9: invalid YAML: this '{{' is never closed; add the '}}'")
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr}");

    let Checked {
        ok, stdout, file, ..
    } = check_config("client:\n  name: a\n  name: b\n", &[]);
    assert!(!ok);
    assert!(
        stdout.contains(&format!("\n{file}:3:3: client.name: is written twice")),
        "{stdout}"
    );
    assert!(!stdout.contains("DuplicateKeyPolicy"), "{stdout}");
    assert!(!stdout.contains(": : "), "no empty key: {stdout}");

    let Checked {
        ok, stdout, file, ..
    } = check_config("- a\n- b\n", &[]);
    assert!(!ok);
    assert!(
        stdout.contains(&format!(
            "{file}:1:1: the file must be a mapping of the configuration's top-level keys \
             (client, proxy, targets, experimental, sync), found a list"
        )),
        "{stdout}"
    );

    // A value its tag refuses is found by the parser, not the source map's walk:
    // still one line, at its key.
    let Checked {
        ok, stdout, file, ..
    } = check_config("client:\n  name: !!int abc\n", &[]);
    assert!(!ok);
    assert_eq!(
        stdout.trim_end(),
        format!("{file}:2:3: client.name: invalid YAML: invalid u64 at line 2, column 15"),
    );
}

/// A peer file that is not a list: its line names the file once and says where
/// the YAML reader stopped.
#[test]
fn check_config_names_a_broken_peer_file_once() {
    let Checked { ok, stdout, .. } = check_config(
        "client: {name: client, project: default, kubeconfig: target.kubeconfig}\n\
         targets:\n  - name: target\n    kubeconfig: target.kubeconfig\n    peers: {file: peers.yaml}\n",
        &[
            ("target.kubeconfig", KUBECONFIG.as_bytes()),
            ("peers.yaml", b"- a:1\n- [b:2\n"),
        ],
    );
    assert!(!ok);
    let line = stdout
        .lines()
        .find(|line| line.contains("targets[0].peers.file"))
        .unwrap_or_else(|| panic!("no peers.file line in {stdout}"));
    assert_eq!(line.matches("peers.yaml").count(), 1, "{line}");
    assert!(
        line.ends_with("unclosed bracket '[' at line 2, column 3"),
        "{line}"
    );
}

/// `check-config` with kubeconfigs it cannot use, each for another reason: one
/// line each that names its file once and says why.
#[test]
fn check_config_names_each_unusable_kubeconfig_once() {
    let contextless = KUBECONFIG.replace("current-context: t", "");
    let Checked { ok, stdout, .. } = check_config(
        "client: {name: client, project: default, kubeconfig: tenant.kubeconfig}\n\
         targets:\n  - name: target\n    kubeconfig: contextless.kubeconfig\n\
         \x20 - name: second\n    kubeconfig: absent.kubeconfig\n",
        &[
            ("tenant.kubeconfig", b"apiVersion: \xff\n"),
            ("contextless.kubeconfig", contextless.as_bytes()),
        ],
    );
    assert!(!ok);
    for (key, kubeconfig, ending) in [
        (
            "client.kubeconfig",
            "tenant.kubeconfig",
            "tenant.kubeconfig cannot be read: stream did not contain valid UTF-8",
        ),
        (
            "targets[0].kubeconfig",
            "contextless.kubeconfig",
            "contextless.kubeconfig is unusable: no context given and current-context is not set",
        ),
        (
            "targets[1].kubeconfig",
            "absent.kubeconfig",
            "absent.kubeconfig does not exist (relative paths are read from the configuration file's directory)",
        ),
    ] {
        let line = stdout
            .lines()
            .find(|line| line.contains(&format!(": {key}: ")))
            .unwrap_or_else(|| panic!("no {key} line in {stdout}"));
        assert_eq!(line.matches(kubeconfig).count(), 1, "{line}");
        assert!(line.ends_with(ending), "{line}");
    }
}

/// A kubeconfig whose cluster names no CA (and does not skip verification) would
/// fail every TLS handshake at run time: `check-config` says so at its key, in one
/// line naming the file and the cluster, and fails.
#[test]
fn check_config_refuses_a_kubeconfig_without_a_ca() {
    let no_ca = KUBECONFIG.replace(", insecure-skip-tls-verify: true", "");
    assert_ne!(no_ca, KUBECONFIG);
    let Checked {
        ok,
        stdout,
        stderr,
        file,
    } = check_config(
        "client: {name: client, project: default}\n\
         targets:\n  - name: target\n    kubeconfig: no-ca.kubeconfig\n\
         \x20   peers: {static: [\"127.0.0.1:6443\"]}\n\
         experimental:\n  proxy:\n    customResources:\n      widgets.example.com/v1:\n\
         \x20       enabled: true\n        targetVirtualCluster: {name: target}\n",
        &[("no-ca.kubeconfig", no_ca.as_bytes())],
    );
    assert!(!ok, "{stdout}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "{stdout}");
    let prefix = format!("{file}:4:5: targets[0].kubeconfig: kubeconfig ");
    assert!(lines[0].starts_with(&prefix), "{stdout}");
    assert_eq!(lines[0].matches("no-ca.kubeconfig").count(), 1, "{stdout}");
    assert!(
        lines[0].ends_with(
            "no-ca.kubeconfig is unusable: cluster \"t\" names no certificate-authority: \
             crproxy trusts only the CAs its kubeconfigs give; add the API server's CA as \
             certificate-authority-data (or certificate-authority), or set \
             insecure-skip-tls-verify: true for development only"
        ),
        "{stdout}"
    );
    assert_eq!(
        stderr.trim(),
        format!("crproxy: {file}: 1 configuration error(s)")
    );
}

/// `doctor` with a kubeconfig that is not YAML: one line naming the file once.
#[test]
fn doctor_reports_a_broken_kubeconfig_in_one_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("broken.kubeconfig");
    std::fs::write(&path, "apiVersion: v1\nclusters: [oops\n").expect("write");
    let file = path.to_str().expect("utf8");
    let (ok, _, stderr) = crproxy(&[
        "doctor",
        "--kubeconfig",
        file,
        "--metrics-url",
        "http://127.0.0.1:1/metrics",
    ]);
    assert!(!ok);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert_eq!(stderr.matches(file).count(), 1, "{stderr}");
    assert!(
        stderr
            .trim_end()
            .ends_with("bad YAML: unclosed bracket '[' at line 2, column 11"),
        "{stderr}"
    );
}

#[test]
fn a_missing_file_is_one_readable_line() {
    let (ok, _, stderr) = crproxy(&["check-config", "/nonexistent/crproxy.yaml"]);
    assert!(!ok);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("/nonexistent/crproxy.yaml"), "{stderr}");
}

/// tokio reads `TOKIO_WORKER_THREADS` too, and panics on a value it cannot use;
/// the command must refuse it first, in one line, and honour a good one.
#[test]
fn a_bad_worker_thread_count_is_one_readable_line() {
    let run = |threads: &str| {
        let output = crproxy_with_env(
            &["check-config", "/nonexistent/crproxy.yaml"],
            &[("TOKIO_WORKER_THREADS", threads), ("RUST_BACKTRACE", "1")],
        );
        (
            output.status,
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    for bad in ["0", "two", " 2"] {
        let (status, stderr) = run(bad);
        assert_eq!(status.code(), Some(1), "{bad:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{bad:?}: {stderr}");
        assert!(
            stderr.starts_with("crproxy: TOKIO_WORKER_THREADS must be"),
            "{bad:?}: {stderr}"
        );
        assert!(stderr.contains(&format!("{bad:?}")), "{bad:?}: {stderr}");
    }
    // A good count gets as far as the command's own error.
    let (status, stderr) = run("1");
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("/nonexistent/crproxy.yaml"), "{stderr}");
}

/// `crproxy dev` with the README's default, relative `--dir`: the generated
/// configuration must still find its kubeconfigs.
#[test]
fn dev_starts_with_a_relative_directory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let free = || {
        crproxy::devenv::free_port()
            .map(|port| port.to_string())
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

/// `--human-logs` into a pipe or a file: plain text, no colour codes.
#[test]
fn human_logs_have_no_colour_codes_off_a_terminal() {
    let dir = tempfile::tempdir().expect("tempdir");
    let child = Command::new(env!("CARGO_BIN_EXE_crproxy"))
        .args(["--human-logs", "devcluster", "--port", "0", "--data-dir"])
        .arg(dir.path().join("cluster"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut child = test_support::KillOnDrop(child);
    let stderr = child.stderr.take().expect("stderr");
    let (lines, first_line) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        let mut first = String::new();
        let _ = std::io::BufReader::new(stderr).read_line(&mut first);
        let _ = lines.send(first);
    });
    // The first line is the "devcluster started" record.
    let first = first_line
        .recv_timeout(std::time::Duration::from_secs(30))
        .expect("a log line within 30s");
    let _ = child.kill();
    assert!(first.contains("devcluster started"), "{first:?}");
    assert!(
        !first.contains('\u{1b}'),
        "colour codes in a pipe: {first:?}"
    );
}

/// The README's documentation list links every document in docs/.
#[test]
fn readme_links_every_document() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let mut documents: Vec<String> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .filter_map(|entry| entry.ok())
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".md"))
        .collect();
    documents.sort();
    assert!(!documents.is_empty());
    for name in documents {
        assert!(
            readme.contains(&format!("](docs/{name})")),
            "README.md does not link docs/{name}"
        );
    }
}

/// A failure whose cause the message already quotes names the cause once.
#[test]
fn a_busy_port_is_named_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = taken.local_addr().expect("addr").port().to_string();
    let data_dir = dir.path().join("cluster");
    let (ok, _, stderr) = crproxy(&[
        "devcluster",
        "--port",
        &port,
        "--data-dir",
        data_dir.to_str().expect("utf8"),
    ]);
    assert!(!ok);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert_eq!(
        stderr.matches("Address already in use").count(),
        1,
        "{stderr}"
    );
    assert!(stderr.contains(&format!("127.0.0.1:{port}")), "{stderr}");
}

/// The command run with `args` in `dir`, killed if it has not exited within
/// `limit`: a refusal that should come before anything starts must not leave
/// the test waiting on clusters.
fn crproxy_within(dir: &std::path::Path, args: &[&str], limit: std::time::Duration) -> Refused {
    let child = Command::new(env!("CARGO_BIN_EXE_crproxy"))
        .current_dir(dir)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn crproxy");
    let mut child = test_support::KillOnDrop(child);
    // Read as it comes, so a chatty child never blocks on a full pipe.
    let drain = |pipe: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            use std::io::Read as _;
            let mut text = String::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_string(&mut text);
            }
            text
        })
    };
    let stdout = drain(child.stdout.take().map(|p| Box::new(p) as _));
    let stderr = drain(child.stderr.take().map(|p| Box::new(p) as _));
    let deadline = std::time::Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for crproxy") {
            break status;
        }
        if std::time::Instant::now() >= deadline {
            let _ = child.kill();
            panic!("{args:?} still ran after {limit:?}: nothing should have started");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    Refused {
        code: status.code(),
        stdout: stdout.join().expect("stdout reader"),
        stderr: stderr.join().expect("stderr reader"),
    }
}

/// How a command line that must be refused ended.
struct Refused {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Refused {
    /// Refused with exit code `code` and one `crproxy: ` line on stderr
    /// holding every one of `fragments`; nothing on stdout.
    fn assert_one_line(&self, what: &str, code: i32, fragments: &[&str]) {
        let Refused {
            code: actual,
            stdout,
            stderr,
        } = self;
        assert_eq!(*actual, Some(code), "{what}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{what}: one line: {stderr}");
        assert!(stderr.starts_with("crproxy: "), "{what}: {stderr}");
        assert!(stdout.is_empty(), "{what}: stdout: {stdout}");
        for fragment in fragments {
            assert!(
                stderr.contains(fragment),
                "{what}: {fragment:?} in {stderr}"
            );
        }
    }
}

const QUICK: std::time::Duration = std::time::Duration::from_secs(30);

/// A command line clap refuses: one `crproxy: ` line with clap's message (and
/// its tip), where the help is, exit code 2; `--help` and `--version` still
/// print to stdout and succeed.
#[test]
fn usage_errors_are_one_line_with_exit_code_2() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (args, line) in [
        (
            &["run", "--confg", "x"][..],
            "crproxy: unexpected argument '--confg' found; a similar argument exists: \
             '--config' (see crproxy run --help)",
        ),
        (
            &["run"],
            "crproxy: the following required arguments were not provided: --config <CONFIG> \
             (see crproxy run --help)",
        ),
        (
            &["doctor"],
            "crproxy: the following required arguments were not provided: \
             --kubeconfig <KUBECONFIG> (see crproxy doctor --help)",
        ),
        (
            &["--human-logs", "dev", "--clients", "abc"],
            "crproxy: invalid value 'abc' for '--clients <CLIENTS>': invalid digit found in \
             string (see crproxy dev --help)",
        ),
        (
            &["bogus"],
            "crproxy: unrecognized subcommand 'bogus' (see crproxy --help)",
        ),
        (
            &[],
            "crproxy: no command given: use one of dev, run, doctor, check-config, devcluster \
             (see crproxy --help)",
        ),
        (
            &["--human-logs"],
            "crproxy: no command given: use one of dev, run, doctor, check-config, devcluster \
             (see crproxy --help)",
        ),
    ] {
        let refused = crproxy_within(dir.path(), args, QUICK);
        refused.assert_one_line(&format!("{args:?}"), 2, &[]);
        assert_eq!(refused.stderr.trim_end(), line, "{args:?}");
    }
    for args in [
        &["--help"][..],
        &["--version"],
        &["dev", "--help"],
        &["help", "run"],
    ] {
        let output = crproxy_with_env(args, &[]);
        assert_eq!(output.status.code(), Some(0), "{args:?}");
        assert!(!output.stdout.is_empty(), "{args:?}");
        assert!(output.stderr.is_empty(), "{args:?}");
    }
}

/// `--version` says how the binary was optimised, as the build script read it
/// from the compiler's flags; the benchmark's report repeats it.
#[test]
fn version_names_the_build() {
    let output = crproxy_with_env(&["--version"], &[]);
    assert_eq!(output.status.code(), Some(0));
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        format!(
            "crproxy {} ({} build)\n",
            env!("CARGO_PKG_VERSION"),
            env!("CRPROXY_OPTIMISATION")
        )
    );
    // Tests are built without profile flags.
    assert_eq!(env!("CRPROXY_OPTIMISATION"), crproxy::build_kind::PLAIN);
}

/// `dev` options it cannot run with are refused in one line naming the flag,
/// before any cluster starts or anything is written to `--dir`.
#[test]
fn dev_refuses_impossible_options_before_starting_anything() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cases: [(&[&str], i32, &[&str]); 8] = [
        // Counts: clap refuses them, a usage error.
        (
            &["--clients", "0"],
            2,
            &["'--clients <CLIENTS>'", "1 or more"],
        ),
        (
            &["--target-replicas", "0"],
            2,
            &["'--target-replicas <TARGET_REPLICAS>'", "1 or more"],
        ),
        // Ports past 65535 for the second client or replica.
        (
            &["--proxy-port", "65530", "--clients", "2"],
            1,
            &[
                "--proxy-port 65530 with --clients 2 needs ports 65530 to 65540",
                "past the last port 65535",
                "give --proxy-port 65525 or lower",
            ],
        ),
        (
            &["--client-port", "65535", "--clients", "2"],
            1,
            &["--client-port 65535 with --clients 2 needs ports 65535 to 65536"],
        ),
        (
            &["--metrics-port", "65535", "--clients", "2"],
            1,
            &["--metrics-port 65535 with --clients 2 needs ports 65535 to 65536"],
        ),
        (
            &["--target-port", "65535", "--target-replicas", "2"],
            1,
            &["--target-port 65535 with --target-replicas 2 needs ports 65535 to 65536"],
        ),
        // Two flags taking the same port: named both, not "in use".
        (
            &["--proxy-port", "17100", "--metrics-port", "17100"],
            1,
            &["--proxy-port and --metrics-port both take port 17100"],
        ),
        // With the default ports, an eleventh client's metrics port is the first
        // client's proxy port.
        (
            &["--clients", "11"],
            1,
            &[
                "--proxy-port and --metrics-port both take port 9100",
                "--metrics-port 9090 takes 9090 to 9100",
            ],
        ),
    ];
    for (flags, code, fragments) in cases {
        let mut args = vec!["dev", "--dir", "dev"];
        args.extend_from_slice(flags);
        let refused = crproxy_within(dir.path(), &args, QUICK);
        refused.assert_one_line(&format!("{flags:?}"), code, fragments);
        if code == 1 {
            assert!(
                refused.stderr.contains("nothing was started or written"),
                "{flags:?}: {}",
                refused.stderr
            );
        }
        assert!(
            !dir.path().join("dev").exists(),
            "{flags:?}: --dir was created"
        );
    }
}

/// `dev --dir` naming a file (or a path under one): said so, naming `--dir`,
/// and the file is left as it was.
#[test]
fn dev_refuses_a_file_as_its_directory() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("afile"), "keep me").expect("write");
    for (path, fragment) in [
        ("afile", "--dir afile is a file, not a directory"),
        (
            "afile/dev",
            "--dir afile/dev: afile is a file, not a directory",
        ),
    ] {
        let refused = crproxy_within(dir.path(), &["dev", "--dir", path], QUICK);
        refused.assert_one_line(path, 1, &[fragment]);
        assert_eq!(
            std::fs::read_to_string(dir.path().join("afile")).expect("read"),
            "keep me"
        );
    }
}

/// `doctor` flags it cannot use are usage errors naming the flag, found before
/// any kubeconfig is read or any check runs (the kubeconfig here does not exist).
#[test]
fn doctor_refuses_unusable_flags_before_any_check() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (flags, fragments) in [
        (
            &["--metrics-url", "notaurl"][..],
            &[
                "'--metrics-url <METRICS_URL>'",
                "only http:// metrics URLs are supported",
            ][..],
        ),
        (
            &["--metrics-url", "https://10.0.0.7:9090/metrics"],
            &["'--metrics-url <METRICS_URL>'", "only http://"],
        ),
        (
            &["--metrics-url", "http://10.0.0.7/metrics"],
            &["'--metrics-url <METRICS_URL>'", "not a host and port"],
        ),
        (
            &["--client-name", "Bad Name!"],
            &[
                "'--client-name <CLIENT_NAME>'",
                "is not a valid client name",
            ],
        ),
        (
            &["--client-name", ""],
            &["'--client-name <CLIENT_NAME>'", "must not be empty"],
        ),
    ] {
        let mut args = vec!["doctor", "--kubeconfig", "missing.kubeconfig"];
        args.extend_from_slice(flags);
        let refused = crproxy_within(dir.path(), &args, QUICK);
        refused.assert_one_line(&format!("{flags:?}"), 2, fragments);
        assert!(
            !refused.stderr.contains("missing.kubeconfig"),
            "{flags:?}: read the kubeconfig first: {}",
            refused.stderr
        );
    }
}
