//! Cluster configuration from kubeconfigs and the in-cluster service account: pure
//! parsing and resolution, no server. Connecting with each form, rotation of
//! credentials and TLS are tested against a devcluster in
//! crates/crproxy/tests/integration/kube_connection.rs (devcluster depends on this crate).

use anyhow::Result;
use base64::Engine as _;
use crproxy_core::pki::{CertPem, CertificateAuthority};
use crproxy_kube::{Auth, ClusterConfig, Error, Kubeconfig, KubeconfigFileProblem};

/// A CA certificate and a client certificate it issued, as PEM: loading a
/// kubeconfig parses them, as connecting will.
fn pems() -> Result<(String, CertPem)> {
    let ca = CertificateAuthority::generate("test-ca")?;
    let client = ca.issue_client("admin", &[])?;
    Ok((ca.pem().cert.clone(), client))
}

#[test]
fn kubeconfig_data_and_file_forms() -> Result<()> {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let (ca_pem, client) = pems()?;
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("token"), "file-token\n")?;
    let yaml = format!(
        r#"
apiVersion: v1
kind: Config
clusters:
- name: data
  cluster:
    server: https://10.0.0.1:6443
    certificate-authority-data: {ca}
    tls-server-name: kubernetes.default
- name: insecure
  cluster:
    server: https://[::1]:8443/prefix
    insecure-skip-tls-verify: true
users:
- name: certs
  user:
    client-certificate-data: {cert}
    client-key-data: {key}
- name: tok
  user:
    token: inline-token
- name: tokfile
  user:
    tokenFile: token
- name: half
  user:
    client-certificate-data: {cert}
- name: plugin
  user:
    exec:
      apiVersion: client.authentication.k8s.io/v1
      command: aws
      args: [eks, get-token]
      env: [{{name: AWS_PROFILE, value: dev}}]
- name: provider
  user:
    auth-provider: {{name: gcp}}
- name: gonefile
  user:
    tokenFile: absent-token
contexts:
- {{name: a, context: {{cluster: data, user: certs}}}}
- {{name: b, context: {{cluster: insecure, user: tok}}}}
- {{name: c, context: {{cluster: insecure, user: tokfile}}}}
- {{name: d, context: {{cluster: data, user: nobody}}}}
- {{name: e, context: {{cluster: data, user: half}}}}
- {{name: f, context: {{cluster: missing, user: tok}}}}
- {{name: g, context: {{cluster: data, user: plugin}}}}
- {{name: h, context: {{cluster: data, user: provider}}}}
- {{name: i, context: {{cluster: data, user: gonefile}}}}
current-context: b
users2: null
"#,
        ca = b64(&ca_pem),
        cert = b64(&client.cert),
        key = b64(&client.key),
    );
    let mut kc = Kubeconfig::from_yaml(&yaml)?;
    kc.base_dir = Some(dir.path().to_path_buf());

    let a = ClusterConfig::from_kubeconfig(&kc, Some("a"))?;
    assert_eq!(a.server.as_str(), "https://10.0.0.1:6443/");
    assert_eq!(a.ca_pem.as_deref(), Some(ca_pem.as_bytes()));
    assert_eq!(a.tls_server_name.as_deref(), Some("kubernetes.default"));
    assert_eq!(
        a.auth,
        Auth::ClientCert {
            cert_pem: client.cert.as_bytes().to_vec(),
            key_pem: client.key.as_bytes().to_vec()
        }
    );
    assert_eq!(
        format!("{:?}", a.server_name()?),
        format!(
            "{:?}",
            rustls_pki_types::ServerName::try_from("kubernetes.default")?
        )
    );
    assert_eq!(a.bearer_token(), None);

    let b = ClusterConfig::from_kubeconfig(&kc, None)?;
    assert!(b.insecure_skip_tls_verify && b.ca_pem.is_none());
    assert_eq!(b.bearer_token(), Some("inline-token"));
    assert_eq!(
        format!("{:?}", b.server_name()?),
        format!("{:?}", rustls_pki_types::ServerName::try_from("::1")?)
    );
    assert!(
        !format!("{b:?}").contains("inline-token"),
        "tokens are redacted"
    );

    let c = ClusterConfig::from_kubeconfig(&kc, Some("c"))?;
    assert_eq!(c.auth, Auth::TokenFile(dir.path().join("token")));
    let g = ClusterConfig::from_kubeconfig(&kc, Some("g"))?;
    let Auth::Exec(exec) = &g.auth else {
        panic!("an exec user: {:?}", g.auth)
    };
    assert_eq!(exec.command, std::path::PathBuf::from("aws"));
    assert_eq!(exec.args, ["eks", "get-token"]);
    assert_eq!(exec.env, [("AWS_PROFILE".to_owned(), "dev".to_owned())]);
    assert_eq!(
        exec.api_version.as_deref(),
        Some("client.authentication.k8s.io/v1")
    );
    let d = ClusterConfig::from_kubeconfig(&kc, Some("d"))?;
    assert_eq!(d.auth, Auth::None);

    for (ctx, needle) in [
        ("e", "not both"),
        ("f", "\"missing\""),
        ("zzz", "context \"zzz\" not found"),
        ("h", "legacy auth provider"),
        ("i", "absent-token"),
    ] {
        let err = ClusterConfig::from_kubeconfig(&kc, Some(ctx)).expect_err(ctx);
        assert!(err.to_string().contains(needle), "{ctx}: {err}");
    }
    let err = Kubeconfig::load(&dir.path().join("absent")).expect_err("missing file");
    assert!(
        matches!(err.problem, KubeconfigFileProblem::Unreadable(_)),
        "{err:?}"
    );
    assert!(Kubeconfig::from_yaml("clusters: [").is_err());
    Ok(())
}

/// A cluster with no CA would fail every handshake with UnknownIssuer (there are no
/// system roots to fall back on): loading it fails, naming the cluster, unless it
/// skips verification. Empty values are absent, as in kubectl.
#[test]
fn a_cluster_without_a_ca_is_refused_unless_insecure() -> Result<()> {
    let (ca_pem, _) = pems()?;
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("ca.crt"), &ca_pem)?;
    let ca = base64::engine::general_purpose::STANDARD.encode(&ca_pem);
    for (cluster, refused) in [
        ("{server: https://10.0.0.1:6443}".to_owned(), true),
        (
            "{server: https://10.0.0.1:6443, certificate-authority-data: \"\"}".to_owned(),
            true,
        ),
        (
            "{server: https://10.0.0.1:6443, certificate-authority: \"\"}".to_owned(),
            true,
        ),
        (
            "{server: https://10.0.0.1:6443, insecure-skip-tls-verify: false}".to_owned(),
            true,
        ),
        (
            "{server: https://10.0.0.1:6443, insecure-skip-tls-verify: true}".to_owned(),
            false,
        ),
        (
            format!("{{server: https://10.0.0.1:6443, certificate-authority-data: {ca}}}"),
            false,
        ),
        (
            "{server: https://10.0.0.1:6443, certificate-authority: ca.crt}".to_owned(),
            false,
        ),
        // Plain HTTP (a `kubectl proxy`) has no certificate to verify.
        ("{server: http://127.0.0.1:8001}".to_owned(), false),
    ] {
        let yaml = format!(
            "clusters: [{{name: prod, cluster: {cluster}}}]\n\
             users: [{{name: u, user: {{token: t}}}}]\n\
             contexts: [{{name: c, context: {{cluster: prod, user: u}}}}]\n\
             current-context: c\n"
        );
        let mut kc = Kubeconfig::from_yaml(&yaml)?;
        kc.base_dir = Some(dir.path().to_path_buf());
        match ClusterConfig::from_kubeconfig(&kc, None) {
            Err(err) => {
                assert!(refused, "{cluster}: {err}");
                assert!(
                    matches!(&err, Error::NoCertificateAuthority { cluster } if cluster == "prod"),
                    "{cluster}: {err:?}"
                );
                assert_eq!(
                    err.to_string(),
                    "cluster \"prod\" names no certificate-authority: crproxy trusts only the \
                     CAs its kubeconfigs give; add the API server's CA as \
                     certificate-authority-data (or certificate-authority), or set \
                     insecure-skip-tls-verify: true for development only"
                );
            }
            Ok(config) => {
                assert!(!refused, "{cluster} loaded: {config:?}");
                assert!(
                    config.insecure_skip_tls_verify
                        || config.server.scheme() == "http"
                        || config.ca_pem.as_deref() == Some(ca_pem.as_bytes()),
                    "{cluster}: {config:?}"
                );
            }
        }
    }
    Ok(())
}

#[test]
fn in_cluster_reads_the_service_account() -> Result<()> {
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("token"), "sa-token\n")?;
    std::fs::write(dir.path().join("ca.crt"), "CA")?;
    let cfg = ClusterConfig::in_cluster_from(Some("fd00::1"), Some("443"), dir.path())?;
    assert_eq!(cfg.server.as_str(), "https://[fd00::1]/");
    // The kubelet rotates the projected token: it is read again while running.
    assert_eq!(cfg.auth, Auth::TokenFile(dir.path().join("token")));
    let cfg = ClusterConfig::in_cluster_from(Some("10.96.0.1"), Some("6443"), dir.path())?;
    assert_eq!(cfg.server.as_str(), "https://10.96.0.1:6443/");
    assert!(ClusterConfig::in_cluster_from(None, Some("443"), dir.path()).is_err());
    std::fs::remove_file(dir.path().join("token"))?;
    let err = ClusterConfig::in_cluster_from(Some("10.96.0.1"), Some("443"), dir.path())
        .expect_err("no token");
    assert!(err.to_string().contains("token"), "{err}");
    Ok(())
}

/// A kubeconfig that is not YAML: one line, the file named once, and where in it
/// the parser stopped (not the parser's multi-line snippet).
#[test]
fn a_broken_kubeconfig_is_one_line_naming_the_file_once() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("broken.kubeconfig");
    std::fs::write(&path, "apiVersion: v1\nclusters: [oops\n")?;
    let message = match Kubeconfig::load(&path) {
        Ok(_) => panic!("a broken kubeconfig loaded"),
        Err(e) => e.to_string(),
    };
    let shown = path.display().to_string();
    assert!(!message.contains('\n'), "{message}");
    assert_eq!(message.matches(&shown).count(), 1, "{message}");
    assert_eq!(
        message.matches("invalid kubeconfig").count(),
        1,
        "{message}"
    );
    assert!(message.ends_with("at line 2, column 11"), "{message}");
    Ok(())
}
