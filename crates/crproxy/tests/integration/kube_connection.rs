//! crproxy-kube's connection to an API server, through `kube_client` against a
//! devcluster on 127.0.0.1: kubeconfig forms, TLS verification, every kind of
//! credential and how it rotates, and errors typed by their cause.
//!
//! These live here rather than in crproxy-kube because devcluster depends on
//! crproxy-kube (a dev-dependency back would build it twice). Which identity a
//! request carried is read back from the server with a SelfSubjectReview.

use anyhow::{Context as _, Result};
use base64::Engine as _;
use crproxy_core::pki::CertificateAuthority;
use crproxy_kube::{Auth, ClusterConfig, Credentials, Error, Kubeconfig};
use futures_util::StreamExt as _;
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams, WatchParams};
use kube::core::WatchEvent;
use serde_json::{json, Value};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use test_support::TestCluster;
use tokio::net::TcpListener;

/// No single request in these tests may take longer.
const TIMEOUT: Duration = Duration::from_secs(10);

async fn timed<T>(f: impl std::future::Future<Output = T>) -> Result<T> {
    tokio::time::timeout(TIMEOUT, f).await.context("timed out")
}

/// The admin kubeconfig's cluster with `auth` instead of the admin token.
fn config(cluster: &TestCluster, auth: Auth) -> Result<ClusterConfig> {
    let kubeconfig = Kubeconfig::load(&cluster.kubeconfig)?;
    let config = ClusterConfig::from_kubeconfig(&kubeconfig, None)?;
    Ok(ClusterConfig { auth, ..config })
}

fn client(config: &ClusterConfig) -> Result<kube::Client> {
    Ok(crproxy_kube::kube_client(
        config,
        config.credentials()?,
        "default",
    )?)
}

fn client_with(config: &ClusterConfig, credentials: Credentials) -> Result<kube::Client> {
    Ok(crproxy_kube::kube_client(
        config,
        Arc::new(credentials),
        "default",
    )?)
}

/// The user name the API server authenticated the request as, or the error as
/// crproxy sees it.
async fn whoami(client: &kube::Client) -> Result<std::result::Result<String, Error>> {
    let reviews = Api::<SelfSubjectReview>::all(client.clone());
    let review = timed(reviews.create(&PostParams::default(), &SelfSubjectReview::default()))
        .await?
        .map_err(Error::from);
    Ok(review.map(|r| {
        r.status
            .and_then(|s| s.user_info)
            .and_then(|u| u.username)
            .unwrap_or_default()
    }))
}

/// A GET of a ConfigMap, as crproxy sees its outcome.
async fn get_configmap(
    client: &kube::Client,
    name: &str,
) -> Result<std::result::Result<(), Error>> {
    let configmaps = Api::<ConfigMap>::namespaced(client.clone(), "default");
    Ok(timed(configmaps.get(name))
        .await?
        .map(drop)
        .map_err(Error::from))
}

/// Replaces `path` the way the kubelet and cert managers do: a new file renamed over
/// the old, so a reader sees either whole version.
fn replace_file(path: &Path, contents: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, contents)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

#[tokio::test]
async fn token_and_client_certificate_identities() -> Result<()> {
    let cluster = test_support::devcluster("identities").await;
    let admin = client(&config(
        &cluster,
        Auth::Token(cluster.cluster.admin_token()),
    )?)?;
    assert_eq!(whoami(&admin).await??, "admin");

    let alice = cluster.cluster.client_cert("alice", &["devs"])?;
    let certs = config(
        &cluster,
        Auth::ClientCert {
            cert_pem: alice.cert.into_bytes(),
            key_pem: alice.key.into_bytes(),
        },
    )?;
    assert_eq!(whoami(&client(&certs)?).await??, "alice");

    // Without credentials the server sees system:anonymous, who may read nothing.
    let anonymous = client(&config(&cluster, Auth::None)?)?;
    let err = get_configmap(&anonymous, "any")
        .await?
        .expect_err("anonymous is refused");
    assert_eq!(err.status(), Some(403), "{err}");
    Ok(())
}

#[tokio::test]
async fn not_found_is_a_typed_api_error() -> Result<()> {
    let cluster = test_support::devcluster("notfound").await;
    let admin = client(&config(
        &cluster,
        Auth::Token(cluster.cluster.admin_token()),
    )?)?;
    let err = get_configmap(&admin, "missing").await?.expect_err("404");
    assert!(err.is_not_found(), "{err}");
    match &err {
        Error::Api {
            status,
            reason,
            message,
            body,
        } => {
            assert_eq!((*status, reason.as_str()), (404, "NotFound"));
            assert_eq!(message, "configmaps \"missing\" not found");
            // The whole Status as kube-rs read it, for callers that want its details.
            assert_eq!(
                (body["code"].clone(), body["reason"].clone()),
                (json!(404), json!("NotFound"))
            );
        }
        other => panic!("expected Api, got {other:?}"),
    }
    Ok(())
}

#[tokio::test]
async fn the_server_certificate_is_verified_unless_insecure() -> Result<()> {
    let cluster = test_support::devcluster("tls").await;
    let token = Auth::Token(cluster.cluster.admin_token());
    let mut cfg = config(&cluster, token.clone())?;
    // A CA that did not sign the serving certificate.
    let stranger = CertificateAuthority::generate("stranger")?;
    cfg.ca_pem = Some(stranger.pem().cert.clone().into_bytes());
    let err = whoami(&client(&cfg)?).await?.expect_err("untrusted server");
    assert!(matches!(err, Error::TlsHandshake(_)), "{err:?}");
    // The cause chain reaches the log line, not just hyper's "client error (Connect)".
    assert!(err.to_string().contains("UnknownIssuer"), "{err}");

    cfg.ca_pem = None;
    cfg.insecure_skip_tls_verify = true;
    assert_eq!(whoami(&client(&cfg)?).await??, "admin");

    // Verification against a configured name instead of the URL host (127.0.0.1).
    let mut cfg = config(&cluster, token)?;
    cfg.tls_server_name = Some("kubernetes.default".into());
    whoami(&client(&cfg)?).await??;
    cfg.tls_server_name = Some("elsewhere.example".into());
    let err = whoami(&client(&cfg)?).await?.expect_err("name mismatch");
    assert!(matches!(err, Error::TlsHandshake(_)), "{err:?}");
    Ok(())
}

/// A connection to an API server agrees the hybrid post-quantum key exchange
/// (X25519MLKEM768) when the server offers it too, as kube-apiservers built with
/// Go 1.24 or later do, and devcluster does: traffic recorded today cannot be
/// decrypted later with a quantum computer.
#[tokio::test]
async fn connections_agree_a_post_quantum_key_exchange() -> Result<()> {
    let cluster = test_support::devcluster("pq").await;
    let cfg = config(&cluster, Auth::Token(cluster.cluster.admin_token()))?;
    let tls = cfg.rustls_config(&[b"h2"], cfg.credentials()?.as_ref())?;
    let host = cfg.server.host_str().context("server host")?.to_string();
    let port = cfg.server.port().context("server port")?;
    let tcp = timed(tokio::net::TcpStream::connect((host.as_str(), port))).await??;
    let name = rustls_pki_types::ServerName::try_from(host)?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(tls));
    let stream = timed(connector.connect(name, tcp)).await??;
    let agreed = stream.get_ref().1.negotiated_key_exchange_group();
    assert_eq!(
        agreed.map(|group| group.name()),
        Some(rustls::NamedGroup::X25519MLKEM768)
    );
    Ok(())
}

#[tokio::test]
async fn kubeconfig_with_relative_files_connects() -> Result<()> {
    let cluster = test_support::devcluster("files").await;
    let alice = cluster.cluster.client_cert("alice", &["devs"])?;
    let dir = tempfile::tempdir()?;
    std::fs::create_dir(dir.path().join("pki"))?;
    std::fs::write(dir.path().join("pki/ca.crt"), cluster.cluster.ca_pem())?;
    std::fs::write(dir.path().join("pki/alice.crt"), &alice.cert)?;
    std::fs::write(dir.path().join("pki/alice.key"), &alice.key)?;
    let yaml = format!(
        "apiVersion: v1\nkind: Config\npreferences: {{}}\nclusters:\n- name: c\n  cluster:\n    server: {url}\n    certificate-authority: pki/ca.crt\nusers:\n- name: alice\n  user:\n    client-certificate: pki/alice.crt\n    client-key: pki/alice.key\ncontexts:\n- name: ctx\n  context:\n    cluster: c\n    user: alice\ncurrent-context: ctx\n",
        url = cluster.cluster.url(),
    );
    let path = dir.path().join("kubeconfig.yaml");
    std::fs::write(&path, yaml)?;
    let cfg = ClusterConfig::from_kubeconfig(&Kubeconfig::load(&path)?, None)?;
    assert_eq!(
        cfg.auth,
        Auth::ClientCertFiles {
            cert: dir.path().join("pki/alice.crt"),
            key: dir.path().join("pki/alice.key"),
        }
    );
    assert_eq!(whoami(&client(&cfg)?).await??, "alice");
    Ok(())
}

#[tokio::test]
async fn a_rotated_token_file_is_sent_without_a_failed_request() -> Result<()> {
    let cluster = test_support::devcluster("rotation").await;
    let old_token = cluster.cluster.issue_token("token-old", &[])?;
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("token");
    replace_file(&path, format!("{old_token}\n").as_bytes())?;
    let cfg = config(&cluster, Auth::TokenFile(path.clone()))?;
    let credentials = Credentials::new(cfg.auth.clone(), Value::Null)?
        .with_file_recheck(Duration::from_millis(200));
    let client = client_with(&cfg, credentials)?;
    // 60 requests 20 ms apart: the token rotates at the 10th, the old one is revoked
    // at the 30th (400 ms later, two rechecks), as a projected token outlives its
    // replacement's issue.
    let mut last = String::new();
    for i in 0..60 {
        if i == 10 {
            let new_token = cluster.cluster.issue_token("token-new", &[])?;
            replace_file(&path, format!("{new_token}\n").as_bytes())?;
        }
        if i == 30 {
            cluster.cluster.revoke_token(&old_token)?;
        }
        last = whoami(&client)
            .await?
            .with_context(|| format!("request {i}"))?;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(last, "token-new");
    Ok(())
}

#[tokio::test]
async fn renewed_client_certificate_files_are_presented_by_new_connections() -> Result<()> {
    let cluster = test_support::devcluster("renewal").await;
    let first_cert = cluster.cluster.client_cert("alice", &[])?;
    let renewed = cluster.cluster.client_cert("alice-renewed", &[])?;
    let dir = tempfile::tempdir()?;
    let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    replace_file(&cert, first_cert.cert.as_bytes())?;
    replace_file(&key, first_cert.key.as_bytes())?;
    let cfg = config(
        &cluster,
        Auth::ClientCertFiles {
            cert: cert.clone(),
            key: key.clone(),
        },
    )?;
    let credentials = Arc::new(
        Credentials::new(cfg.auth.clone(), Value::Null)?
            .with_file_recheck(Duration::from_millis(100)),
    );
    let first = crproxy_kube::kube_client(&cfg, credentials.clone(), "default")?;
    assert_eq!(whoami(&first).await??, "alice");

    replace_file(&cert, renewed.cert.as_bytes())?;
    replace_file(&key, renewed.key.as_bytes())?;
    tokio::time::sleep(Duration::from_millis(150)).await;
    // A new connection (a second client) presents the renewed certificate; the open
    // connection keeps working.
    let second = crproxy_kube::kube_client(&cfg, credentials, "default")?;
    assert_eq!(whoami(&second).await??, "alice-renewed");
    whoami(&first).await??;
    Ok(())
}

/// A kubeconfig for `cluster` whose user runs `./plugin.sh` (relative to the
/// kubeconfig) with the given script body; the plugin gets the directory as `$2`.
fn exec_config(cluster: &TestCluster, dir: &Path, script: &str) -> Result<ClusterConfig> {
    use std::os::unix::fs::PermissionsExt as _;
    let plugin = dir.join("plugin.sh");
    std::fs::write(&plugin, script)?;
    std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755))?;
    let yaml = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {url}\n    certificate-authority-data: {ca}\nusers:\n- name: u\n  user:\n    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: ./plugin.sh\n      args: [--state, {state}]\n      env: [{{name: PLUGIN_PREFIX, value: token}}]\n      provideClusterInfo: true\n      installHint: install the plugin\n      interactiveMode: Never\ncontexts:\n- name: ctx\n  context: {{cluster: c, user: u}}\ncurrent-context: ctx\n",
        url = cluster.cluster.url(),
        ca = base64::engine::general_purpose::STANDARD.encode(cluster.cluster.ca_pem()),
        state = dir.display(),
    );
    let path = dir.join("kubeconfig");
    std::fs::write(&path, yaml)?;
    Ok(ClusterConfig::from_kubeconfig(
        &Kubeconfig::load(&path)?,
        None,
    )?)
}

/// Counts its runs in `$2/count`, keeps `KUBERNETES_EXEC_INFO` in `$2/info`, and
/// prints the token in `$2/$PLUGIN_PREFIX-<run>`, valid for `lifetime` (`none`: no
/// expiry).
fn counting_plugin(lifetime: &str) -> String {
    let expiry = if lifetime == "none" {
        String::new()
    } else {
        format!(
            ",\\\"expirationTimestamp\\\":\\\"$(date -u -d '{lifetime}' +%Y-%m-%dT%H:%M:%SZ)\\\""
        )
    };
    format!(
        "#!/bin/sh\nset -e\nn=$(cat \"$2/count\" 2>/dev/null || echo 0)\nn=$((n+1))\necho $n > \"$2/count\"\nprintf '%s' \"$KUBERNETES_EXEC_INFO\" > \"$2/info\"\ntoken=$(cat \"$2/$PLUGIN_PREFIX-$n\")\necho \"{{\\\"apiVersion\\\":\\\"client.authentication.k8s.io/v1\\\",\\\"kind\\\":\\\"ExecCredential\\\",\\\"status\\\":{{\\\"token\\\":\\\"$token\\\"{expiry}}}}}\"\n"
    )
}

/// Issues the tokens the counting plugin hands out on its runs 1..=runs: run `n`
/// authenticates as user `exec-<n>`.
fn plugin_tokens(cluster: &TestCluster, dir: &Path, runs: u32) -> Result<Vec<String>> {
    (1..=runs)
        .map(|n| {
            let token = cluster.cluster.issue_token(&format!("exec-{n}"), &[])?;
            std::fs::write(dir.join(format!("token-{n}")), &token)?;
            Ok(token)
        })
        .collect()
}

#[tokio::test]
async fn exec_plugin_tokens_are_renewed_before_they_expire() -> Result<()> {
    let cluster = test_support::devcluster("exec-renew").await;
    let dir = tempfile::tempdir()?;
    plugin_tokens(&cluster, dir.path(), 2)?;
    // Expiring in 5 s, within the renewal margin: every request runs the plugin again.
    let cfg = exec_config(&cluster, dir.path(), &counting_plugin("+5 seconds"))?;
    let client = client(&cfg)?;
    for want in ["exec-1", "exec-2"] {
        assert_eq!(whoami(&client).await??, want);
    }
    let info: Value = serde_json::from_str(&std::fs::read_to_string(dir.path().join("info"))?)?;
    assert_eq!(info["kind"], "ExecCredential");
    assert_eq!(info["apiVersion"], "client.authentication.k8s.io/v1");
    assert_eq!(info["spec"]["interactive"], false);
    assert_eq!(info["spec"]["cluster"]["server"], cfg.server.as_str());
    Ok(())
}

#[tokio::test]
async fn exec_plugin_tokens_without_expiry_are_kept_until_refused() -> Result<()> {
    let cluster = test_support::devcluster("exec-keep").await;
    let dir = tempfile::tempdir()?;
    let tokens = plugin_tokens(&cluster, dir.path(), 2)?;
    let cfg = exec_config(&cluster, dir.path(), &counting_plugin("none"))?;
    let client = client(&cfg)?;
    for _ in 0..3 {
        assert_eq!(whoami(&client).await??, "exec-1");
    }
    assert_eq!(
        std::fs::read_to_string(dir.path().join("count"))?.trim(),
        "1"
    );
    // The server revokes the token: one request is refused, the next runs the
    // plugin again and succeeds.
    cluster.cluster.revoke_token(&tokens[0])?;
    let err = whoami(&client).await?.expect_err("revoked");
    assert_eq!(err.status(), Some(401), "{err}");
    assert_eq!(whoami(&client).await??, "exec-2");
    Ok(())
}

#[tokio::test]
async fn a_failing_exec_plugin_is_a_credentials_error_with_its_output() -> Result<()> {
    let cluster = test_support::devcluster("exec-fail").await;
    let dir = tempfile::tempdir()?;
    let cfg = exec_config(
        &cluster,
        dir.path(),
        "#!/bin/sh\necho 'please log in first' >&2\nexit 3\n",
    )?;
    let err = whoami(&client(&cfg)?).await?.expect_err("plugin fails");
    assert!(matches!(err, Error::Credentials(_)), "{err:?}");
    assert!(err.to_string().contains("please log in first"), "{err}");

    let Auth::Exec(mut exec) = cfg.auth.clone() else {
        panic!("exec user");
    };
    exec.command = dir.path().join("not-installed");
    let missing = ClusterConfig {
        auth: Auth::Exec(exec),
        ..cfg
    };
    let err = whoami(&client(&missing)?)
        .await?
        .expect_err("plugin missing");
    assert!(err.to_string().contains("install the plugin"), "{err}");
    Ok(())
}

#[tokio::test]
async fn failures_are_typed_by_cause() -> Result<()> {
    let cluster = test_support::devcluster("failures").await;
    let admin = config(&cluster, Auth::Token(cluster.cluster.admin_token()))?;
    // Nothing listens: refused.
    let refused = test_support::RefusedPort::bind();
    let closed_port = refused.addr.port();
    let mut cfg = admin.clone();
    cfg.server = format!("https://127.0.0.1:{closed_port}").parse()?;
    let err = whoami(&client(&cfg)?).await?.expect_err("refused");
    assert!(matches!(err, Error::Connect(_)), "{err:?}");

    // A peer that accepts TCP and never speaks TLS: the read timeout, not a hang.
    let silent = TcpListener::bind("127.0.0.1:0").await?;
    let silent_port = silent.local_addr()?.port();
    let hold = tokio::spawn(async move {
        let mut held = Vec::new();
        // Bounded by the abort below.
        while let Ok((tcp, _)) = silent.accept().await {
            held.push(tcp);
        }
    });
    let mut cfg = admin;
    cfg.server = format!("https://127.0.0.1:{silent_port}").parse()?;
    let client = crproxy_kube::kube_client_with_read_timeout(
        &cfg,
        cfg.credentials()?,
        "default",
        Duration::from_millis(300),
    )?;
    let err = whoami(&client).await?.expect_err("silent");
    assert!(matches!(err, Error::Timeout(_)), "{err:?}");
    hold.abort();
    Ok(())
}

#[tokio::test]
async fn a_watch_that_goes_quiet_fails_under_the_read_timeout() -> Result<()> {
    let cluster = test_support::devcluster("quiet").await;
    let cfg = config(&cluster, Auth::Token(cluster.cluster.admin_token()))?;
    let client = crproxy_kube::kube_client_with_read_timeout(
        &cfg,
        cfg.credentials()?,
        "default",
        Duration::from_secs(1),
    )?;
    let configmaps = Api::<ConfigMap>::namespaced(client, "default");
    let writer = Api::<ConfigMap>::namespaced(
        crproxy_kube::kube_client(&cfg, cfg.credentials()?, "default")?,
        "default",
    );
    let params = WatchParams::default().disable_bookmarks().timeout(60);
    let events = timed(configmaps.watch(&params, "0")).await??;
    let mut events = std::pin::pin!(events);
    // Events 300 ms apart keep the watch alive past the 1 s limit.
    for i in 0..5 {
        let cm: ConfigMap =
            serde_json::from_value(json!({"metadata": {"name": format!("cm-{i}")}}))?;
        timed(writer.create(&PostParams::default(), &cm)).await??;
        let event = timed(events.next()).await?.context("watch ended")??;
        let WatchEvent::Added(added) = event else {
            panic!("expected ADDED cm-{i}, got {event:?}")
        };
        assert_eq!(
            added.metadata.name.as_deref(),
            Some(format!("cm-{i}").as_str())
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // Then silence: an error after the limit rather than a watch open for ever.
    let err = timed(events.next())
        .await?
        .context("watch ended")?
        .expect_err("silence is an error");
    let err = Error::from(err);
    assert!(matches!(err, Error::Timeout(_)), "{err:?}");
    Ok(())
}
