//! Configuration errors that `check-config` and `run` must agree on: what one
//! refuses the other refuses, in one line naming the configuration key, the file
//! and the field; and `run` writes nothing before it has checked.

use std::path::{Path, PathBuf};
use std::process::Command;

use base64::Engine as _;
use crproxy_core::pki::CertificateAuthority;

/// What a crproxy command did: success, stdout, stderr.
struct Outcome {
    ok: bool,
    stdout: String,
    stderr: String,
}

fn crproxy(args: &[&str]) -> Outcome {
    let output = Command::new(env!("CARGO_BIN_EXE_crproxy"))
        .args(args)
        .output()
        .expect("run crproxy");
    Outcome {
        ok: output.status.success(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// A directory with `crproxy.yaml` (a proxy of one group/version, whose client and
/// target kubeconfigs are `client.kubeconfig` and `target.kubeconfig`) and `files`.
fn setup(files: &[(&str, &str)]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("crproxy.yaml");
    std::fs::write(
        &config,
        "client: {name: client, project: default, kubeconfig: client.kubeconfig}\n\
         targets:\n  - name: target\n    kubeconfig: target.kubeconfig\n\
         \x20   peers: {static: [\"127.0.0.1:6443\"]}\n\
         experimental:\n  proxy:\n    customResources:\n      widgets.example.com/v1:\n\
         \x20       enabled: true\n        targetVirtualCluster: {name: target}\n",
    )
    .expect("write the configuration");
    for (name, contents) in files {
        std::fs::write(dir.path().join(name), contents).expect("write a file");
    }
    (dir, config)
}

fn kubeconfig(cluster: &str, user: &str) -> String {
    format!(
        "clusters: [{{name: c, cluster: {cluster}}}]\n\
         users: [{{name: admin, user: {user}}}]\n\
         contexts: [{{name: x, context: {{cluster: c, user: admin}}}}]\n\
         current-context: x\n"
    )
}

/// A kubeconfig nothing connects to in these tests, but that loads.
fn usable() -> String {
    kubeconfig(
        "{server: 'https://127.0.0.1:6443', insecure-skip-tls-verify: true}",
        "{token: t}",
    )
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn path(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// A client certificate base64-encoded twice (a Secret's `.data` value pasted into
/// `client-certificate-data`): `check-config` refuses it as `run` does, both naming
/// the key, the kubeconfig file and its field; `run` writes no serving CA first.
#[test]
fn tls_material_that_is_not_pem_fails_check_config_and_run_alike() {
    let ca = CertificateAuthority::generate("ca").expect("ca");
    let client = ca.issue_client("admin", &[]).expect("client");
    let broken = kubeconfig(
        &format!(
            "{{server: 'https://127.0.0.1:6443', certificate-authority-data: {}}}",
            b64(ca.pem().cert.as_bytes())
        ),
        &format!(
            "{{client-certificate-data: {}, client-key-data: {}}}",
            b64(b64(client.cert.as_bytes()).as_bytes()),
            b64(client.key.as_bytes())
        ),
    );
    let (dir, config) = setup(&[
        ("client.kubeconfig", &broken),
        ("target.kubeconfig", &usable()),
    ]);
    let file = dir.path().join("client.kubeconfig");
    let problem = format!(
        "client.kubeconfig: kubeconfig {} is unusable: users[admin].user.client-certificate-data: \
         holds no PEM certificate (base64-encoded twice?)",
        file.display()
    );

    let checked = crproxy(&["check-config", path(&config)]);
    assert!(!checked.ok, "{}", checked.stdout);
    assert_eq!(
        checked.stdout.trim(),
        format!("{}:1:42: {problem}", config.display())
    );

    let run = crproxy(&["run", "--config", path(&config)]);
    assert!(!run.ok);
    assert_eq!(
        run.stderr.trim(),
        format!(
            "crproxy: {}: invalid configuration: {problem}",
            config.display()
        )
    );
    assert!(
        !dir.path().join("serving-ca").exists(),
        "run wrote the serving CA before refusing the configuration"
    );
}

/// A serving CA certificate without its key is refused in one line naming both,
/// and stays as it was: a new CA would break every client trusting the old one.
#[test]
fn run_refuses_half_a_serving_ca_and_keeps_it() {
    let ca = CertificateAuthority::generate("kept").expect("ca");
    let (dir, config) = setup(&[
        ("client.kubeconfig", &usable()),
        ("target.kubeconfig", &usable()),
    ]);
    let serving = dir.path().join("serving-ca");
    std::fs::create_dir(&serving).expect("mkdir");
    std::fs::write(serving.join("ca.crt"), &ca.pem().cert).expect("write");

    let run = crproxy(&["run", "--config", path(&config)]);
    assert!(!run.ok);
    let shown = serving.display();
    assert_eq!(
        run.stderr.trim(),
        format!(
            "crproxy: serving CA: {shown}/ca.crt exists but {shown}/ca.key does not: restore \
             the key or remove both to generate a new CA"
        )
    );
    assert_eq!(
        std::fs::read_to_string(serving.join("ca.crt")).expect("read"),
        ca.pem().cert
    );
    assert!(!serving.join("ca.key").exists());
}

/// `check-config` reports an exec plugin it cannot find, naming the user and the
/// command; it accepts a server written without a scheme, as kubectl does.
#[test]
fn check_config_finds_missing_exec_plugins_and_reads_servers_as_kubectl() {
    let exec = kubeconfig(
        "{server: '127.0.0.1:6443', insecure-skip-tls-verify: true}",
        "{exec: {apiVersion: client.authentication.k8s.io/v1, command: crproxy-no-such-plugin, \
         installHint: 'install it from example.com'}}",
    );
    let (_dir, config) = setup(&[
        ("client.kubeconfig", &usable()),
        ("target.kubeconfig", &exec),
    ]);
    let checked = crproxy(&["check-config", path(&config)]);
    assert!(!checked.ok, "{}", checked.stdout);
    assert!(
        checked.stdout.trim().ends_with(
            "target.kubeconfig is unusable: users[admin].user.exec.command: \
             \"crproxy-no-such-plugin\" is not on PATH (install it from example.com)"
        ),
        "{}",
        checked.stdout
    );

    let (_dir, config) = setup(&[
        ("client.kubeconfig", &usable()),
        (
            "target.kubeconfig",
            &usable().replace("https://127.0.0.1:6443", "127.0.0.1:6443"),
        ),
    ]);
    let checked = crproxy(&["check-config", path(&config)]);
    assert!(checked.ok, "{}{}", checked.stdout, checked.stderr);
}
