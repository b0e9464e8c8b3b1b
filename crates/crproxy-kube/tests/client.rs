//! The client against a small in-process HTTPS API server on 127.0.0.1.

use anyhow::{anyhow, Context as _, Result};
use base64::Engine as _;
use bytes::Bytes;
use crproxy_core::pki::{CertPem, CertificateAuthority};
use crproxy_kube::{Auth, Client, ClusterConfig, Credentials, Error, Kubeconfig, PatchType};
use futures_util::StreamExt;
use http::{Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{json, Value};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::mpsc;

const TOKEN: &str = "secret-token";
const TIMEOUT: Duration = Duration::from_secs(10);

type Body = BoxBody<Bytes, Infallible>;

/// What the server saw of one request.
#[derive(Clone, Debug)]
struct Seen {
    method: String,
    path_and_query: String,
    content_type: Option<String>,
    body: Value,
    version: http::Version,
    user_agent: Option<String>,
    authorization: Option<String>,
    /// DER of the client certificate the connection presented.
    client_cert: Option<Vec<u8>>,
}

struct Pki {
    server_ca: CertificateAuthority,
    client_ca: CertificateAuthority,
    client: CertPem,
}

struct Server {
    addr: std::net::SocketAddr,
    pki: Pki,
    seen: Arc<Mutex<Vec<Seen>>>,
    /// Lines the watch handler streams out, one chunk per message.
    watch_tx: mpsc::UnboundedSender<String>,
    /// The bearer tokens the server accepts; tests rotate them.
    tokens: Arc<Mutex<Vec<String>>>,
}

fn pki() -> Result<Pki> {
    let server_ca = CertificateAuthority::generate("server-ca")?;
    let client_ca = CertificateAuthority::generate("client-ca")?;
    let client = client_ca.issue_client("alice", &["devs"])?;
    Ok(Pki {
        server_ca,
        client_ca,
        client,
    })
}

/// Answers like a tiny kube-apiserver: only the caller authenticated by token or by a
/// client certificate from the client CA gets anything but 401.
async fn handle(
    req: Request<Incoming>,
    client_cert: Option<Vec<u8>>,
    seen: Arc<Mutex<Vec<Seen>>>,
    tokens: Arc<Mutex<Vec<String>>>,
    watch_rx: Arc<Mutex<Option<mpsc::UnboundedReceiver<String>>>>,
) -> Response<Body> {
    let (parts, body) = req.into_parts();
    let bytes = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let pq = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_default();
    seen.lock().expect("lock").push(Seen {
        method: parts.method.to_string(),
        path_and_query: pq.clone(),
        content_type: parts
            .headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
        body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        version: parts.version,
        user_agent: parts
            .headers
            .get("user-agent")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
        authorization: parts
            .headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
        client_cert: client_cert.clone(),
    });
    let presented = parts
        .headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let token_ok = presented.is_some_and(|t| tokens.lock().expect("lock").iter().any(|k| k == t));
    if !token_ok && client_cert.is_none() {
        return status(401, "Unauthorized", "Unauthorized");
    }
    let path = parts.uri.path();
    match (parts.method.as_str(), path) {
        ("GET", "/api/v1/namespaces/default/configmaps") if pq.contains("watch=true") => {
            let rx = watch_rx.lock().expect("lock").take();
            let Some(rx) = rx else {
                return status(500, "InternalError", "one watch per test");
            };
            let stream = futures_util::stream::unfold(rx, |mut rx| async move {
                let line = rx.recv().await?;
                Some((Ok::<_, Infallible>(Frame::data(Bytes::from(line))), rx))
            });
            Response::builder()
                .header("content-type", "application/json")
                .body(BodyExt::boxed(StreamBody::new(stream)))
                .expect("response")
        }
        ("GET", "/api/v1/namespaces/default/configmaps/cm") => ok(
            200,
            json!({"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"cm","namespace":"default"},"data":{"k":"v"}}),
        ),
        ("GET", _) => status(
            404,
            "NotFound",
            &format!(
                "configmaps \"{}\" not found",
                path.rsplit('/').next().unwrap_or("")
            ),
        ),
        ("POST", _) => {
            let mut obj: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            obj["metadata"]["resourceVersion"] = json!("1");
            ok(201, obj)
        }
        ("PUT", _) => status(409, "Conflict", "the object has been modified"),
        ("PATCH", _) => ok(200, json!({"patched": true})),
        ("DELETE", _) => ok(200, json!({"kind":"Status","status":"Success"})),
        _ => status(405, "MethodNotAllowed", "no"),
    }
}

fn ok(code: u16, v: Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(v.to_string())).boxed())
        .expect("response")
}

fn status(code: u16, reason: &str, message: &str) -> Response<Body> {
    ok(
        code,
        json!({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":message,"reason":reason,"code":code}),
    )
}

async fn start(alpn: &[&[u8]]) -> Result<Server> {
    let pki = pki()?;
    let serving = pki
        .server_ca
        .issue_server(&["localhost"], &["127.0.0.1".parse()?])?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_slice(
        pki.client_ca.pem().cert.as_bytes(),
    )?)?;
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .allow_unauthenticated()
    .build()?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            vec![CertificateDer::from_pem_slice(serving.cert.as_bytes())?],
            PrivateKeyDer::from_pem_slice(serving.key.as_bytes())?,
        )?;
    cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (watch_tx, watch_rx) = mpsc::unbounded_channel();
    let watch_rx = Arc::new(Mutex::new(Some(watch_rx)));
    let seen2 = seen.clone();
    let tokens = Arc::new(Mutex::new(vec![TOKEN.to_owned()]));
    let tokens2 = tokens.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            let seen = seen2.clone();
            let tokens = tokens2.clone();
            let watch_rx = watch_rx.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let client_cert = tls
                    .get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|chain| chain.first())
                    .map(|cert| cert.to_vec());
                let svc = hyper::service::service_fn(move |req| {
                    let seen = seen.clone();
                    let tokens = tokens.clone();
                    let watch_rx = watch_rx.clone();
                    let client_cert = client_cert.clone();
                    async move {
                        Ok::<_, Infallible>(handle(req, client_cert, seen, tokens, watch_rx).await)
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
    Ok(Server {
        addr,
        pki,
        seen,
        watch_tx,
        tokens,
    })
}

impl Server {
    fn config(&self, auth: Auth) -> Result<ClusterConfig> {
        Ok(ClusterConfig {
            server: format!("https://127.0.0.1:{}", self.addr.port()).parse()?,
            ca_pem: Some(self.pki.server_ca.pem().cert.clone().into_bytes()),
            tls_server_name: None,
            insecure_skip_tls_verify: false,
            auth,
        })
    }

    fn last(&self) -> Result<Seen> {
        self.seen
            .lock()
            .map_err(|_| anyhow!("poisoned"))?
            .last()
            .cloned()
            .context("no request seen")
    }
}

async fn timed<T>(f: impl std::future::Future<Output = T>) -> Result<T> {
    tokio::time::timeout(TIMEOUT, f).await.context("timed out")
}

#[tokio::test]
async fn token_auth_and_crud() -> Result<()> {
    let srv = start(&[b"h2", b"http/1.1"]).await?;
    let client = Client::new(srv.config(Auth::Token(TOKEN.into()))?)?;
    let cm = timed(client.get("/api/v1/namespaces/default/configmaps/cm")).await??;
    assert_eq!(cm["data"]["k"], "v");
    // ALPN offered h2 and the server took it.
    assert_eq!(srv.last()?.version, http::Version::HTTP_2);
    assert!(srv
        .last()?
        .user_agent
        .is_some_and(|ua| ua.starts_with("crproxy/")));
    assert!(
        timed(client.get_opt("/api/v1/namespaces/default/configmaps/gone"))
            .await??
            .is_none()
    );
    assert!(
        timed(client.get_opt("/api/v1/namespaces/default/configmaps/cm"))
            .await??
            .is_some()
    );

    let created = timed(client.create(
        "/api/v1/namespaces/default/configmaps",
        &json!({"metadata": {"name": "new"}}),
    ))
    .await??;
    assert_eq!(created["metadata"]["resourceVersion"], "1");
    let seen = srv.last()?;
    assert_eq!(seen.method, "POST");
    assert_eq!(seen.content_type.as_deref(), Some("application/json"));
    assert_eq!(seen.body["metadata"]["name"], "new");

    let err = timed(client.replace(
        "/api/v1/namespaces/default/configmaps/new",
        &json!({"metadata": {"name": "new", "resourceVersion": "7"}}),
    ))
    .await?
    .expect_err("PUT conflicts");
    assert!(err.is_conflict() && !err.is_already_exists(), "{err}");

    timed(client.patch(
        "/api/v1/namespaces/default/configmaps/new",
        PatchType::Apply {
            field_manager: "crproxy wiring".into(),
            force: true,
        },
        &json!({"data": {}}),
    ))
    .await??;
    let seen = srv.last()?;
    assert_eq!(
        seen.path_and_query,
        "/api/v1/namespaces/default/configmaps/new?fieldManager=crproxy%20wiring&force=true"
    );
    assert_eq!(
        seen.content_type.as_deref(),
        Some("application/apply-patch+yaml")
    );
    timed(client.patch("/x", PatchType::Merge, &json!({}))).await??;
    assert_eq!(
        srv.last()?.content_type.as_deref(),
        Some("application/merge-patch+json")
    );

    let deleted = timed(client.delete("/api/v1/namespaces/default/configmaps/new")).await??;
    assert_eq!(deleted["status"], "Success");
    Ok(())
}

#[tokio::test]
async fn not_found_is_an_api_error() -> Result<()> {
    let srv = start(&[b"http/1.1"]).await?;
    let client = Client::new(srv.config(Auth::Token(TOKEN.into()))?)?;
    let err = timed(client.get("/api/v1/namespaces/default/configmaps/missing"))
        .await?
        .expect_err("404");
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
            assert_eq!(body["kind"], "Status");
        }
        other => panic!("expected Api, got {other:?}"),
    }
    assert_eq!(srv.last()?.version, http::Version::HTTP_11);
    Ok(())
}

#[tokio::test]
async fn client_certificate_auth() -> Result<()> {
    let srv = start(&[b"h2", b"http/1.1"]).await?;
    let anonymous = Client::new(srv.config(Auth::None)?)?;
    let err = timed(anonymous.get("/api/v1/namespaces/default/configmaps/cm"))
        .await?
        .expect_err("anonymous is refused");
    assert_eq!(err.status(), Some(401));

    let client = Client::new(srv.config(Auth::ClientCert {
        cert_pem: srv.pki.client.cert.clone().into_bytes(),
        key_pem: srv.pki.client.key.clone().into_bytes(),
    })?)?;
    let cm = timed(client.get("/api/v1/namespaces/default/configmaps/cm")).await??;
    assert_eq!(cm["metadata"]["name"], "cm");
    Ok(())
}

#[tokio::test]
async fn server_certificate_is_verified_unless_insecure() -> Result<()> {
    let srv = start(&[b"http/1.1"]).await?;
    let mut cfg = srv.config(Auth::Token(TOKEN.into()))?;
    // A CA that did not sign the serving certificate.
    cfg.ca_pem = Some(srv.pki.client_ca.pem().cert.clone().into_bytes());
    let err = timed(Client::new(cfg.clone())?.get("/api/v1/namespaces/default/configmaps/cm"))
        .await?
        .expect_err("untrusted server");
    assert!(matches!(err, Error::TlsHandshake(_)), "{err:?}");
    // The cause chain reaches the log line, not just hyper's "client error (Connect)".
    assert!(err.to_string().contains("UnknownIssuer"), "{err}");

    cfg.ca_pem = None;
    cfg.insecure_skip_tls_verify = true;
    let cm = timed(Client::new(cfg)?.get("/api/v1/namespaces/default/configmaps/cm")).await??;
    assert_eq!(cm["metadata"]["name"], "cm");

    // Verification against a configured name instead of the URL host.
    let mut cfg = srv.config(Auth::Token(TOKEN.into()))?;
    cfg.tls_server_name = Some("localhost".into());
    timed(Client::new(cfg.clone())?.get("/api/v1/namespaces/default/configmaps/cm")).await??;
    cfg.tls_server_name = Some("elsewhere.example".into());
    let err = timed(Client::new(cfg)?.get("/api/v1/namespaces/default/configmaps/cm"))
        .await?
        .expect_err("name mismatch");
    assert!(matches!(err, Error::TlsHandshake(_)), "{err:?}");
    Ok(())
}

#[tokio::test]
async fn raw_request_returns_any_status() -> Result<()> {
    let srv = start(&[b"h2", b"http/1.1"]).await?;
    let client = Client::new(srv.config(Auth::Token(TOKEN.into()))?)?;
    let resp = timed(client.request(
        Request::get("/api/v1/namespaces/default/configmaps/nope?x=1").body(Bytes::new())?,
    ))
    .await??;
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    let v: Value = serde_json::from_slice(resp.body())?;
    assert_eq!(v["reason"], "NotFound");
    assert_eq!(
        srv.last()?.path_and_query,
        "/api/v1/namespaces/default/configmaps/nope?x=1"
    );
    Ok(())
}

#[tokio::test]
async fn watch_yields_events_as_they_are_written() -> Result<()> {
    let srv = start(&[b"h2", b"http/1.1"]).await?;
    let client = Client::new(srv.config(Auth::Token(TOKEN.into()))?)?;
    let stream =
        timed(client.watch("/api/v1/namespaces/default/configmaps?resourceVersion=0")).await??;
    let mut stream = Box::pin(stream);
    assert_eq!(
        srv.last()?.path_and_query,
        "/api/v1/namespaces/default/configmaps?resourceVersion=0&watch=true"
    );
    let ev = |t: &str, n: &str| json!({"type": t, "object": {"metadata": {"name": n}}}).to_string();

    // One event per write, and nothing is held back waiting for more data.
    srv.watch_tx.send(format!("{}\n", ev("ADDED", "a")))?;
    let got = timed(stream.next()).await?.context("ended")??;
    assert_eq!(
        (got.event_type.as_str(), &got.object["metadata"]["name"]),
        ("ADDED", &json!("a"))
    );

    // An event split over two writes arrives once complete.
    let line = format!("{}\n", ev("MODIFIED", "b"));
    let (head, tail) = line.split_at(10);
    srv.watch_tx.send(head.to_owned())?;
    assert!(
        tokio::time::timeout(Duration::from_millis(200), stream.next())
            .await
            .is_err(),
        "half an event must not be yielded"
    );
    srv.watch_tx.send(tail.to_owned())?;
    let got = timed(stream.next()).await?.context("ended")??;
    assert_eq!(got.event_type, "MODIFIED");

    srv.watch_tx.send(
        "{\"type\":\"ERROR\",\"object\":{\"kind\":\"Status\",\"status\":\"Failure\",\"message\":\"too old resource version: 1 (5)\",\"reason\":\"Expired\",\"code\":410}}\n".into(),
    )?;
    let err = timed(stream.next())
        .await?
        .context("ended")?
        .expect_err("ERROR event");
    assert_eq!((err.status(), err.reason()), (Some(410), Some("Expired")));
    Ok(())
}

#[tokio::test]
async fn kubeconfig_with_relative_files_connects() -> Result<()> {
    let srv = start(&[b"h2", b"http/1.1"]).await?;
    let dir = tempfile::tempdir()?;
    std::fs::create_dir(dir.path().join("pki"))?;
    std::fs::write(dir.path().join("pki/ca.crt"), &srv.pki.server_ca.pem().cert)?;
    std::fs::write(dir.path().join("pki/alice.crt"), &srv.pki.client.cert)?;
    std::fs::write(dir.path().join("pki/alice.key"), &srv.pki.client.key)?;
    let yaml = format!(
        "apiVersion: v1\nkind: Config\npreferences: {{}}\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:{}\n    certificate-authority: pki/ca.crt\nusers:\n- name: alice\n  user:\n    client-certificate: pki/alice.crt\n    client-key: pki/alice.key\ncontexts:\n- name: ctx\n  context:\n    cluster: c\n    user: alice\ncurrent-context: ctx\n",
        srv.addr.port()
    );
    let path = dir.path().join("kubeconfig.yaml");
    std::fs::write(&path, yaml)?;
    let kc = Kubeconfig::load(&path)?;
    let cfg = ClusterConfig::from_kubeconfig(&kc, None)?;
    assert_eq!(
        cfg.auth,
        Auth::ClientCertFiles {
            cert: dir.path().join("pki/alice.crt"),
            key: dir.path().join("pki/alice.key"),
        }
    );
    let cm = timed(Client::new(cfg)?.get("/api/v1/namespaces/default/configmaps/cm")).await??;
    assert_eq!(cm["metadata"]["name"], "cm");
    Ok(())
}

#[test]
fn kubeconfig_data_and_file_forms() -> Result<()> {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
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
        ca = b64("CA PEM"),
        cert = b64("CERT PEM"),
        key = b64("KEY PEM"),
    );
    let mut kc = Kubeconfig::from_yaml(&yaml)?;
    kc.base_dir = Some(dir.path().to_path_buf());

    let a = ClusterConfig::from_kubeconfig(&kc, Some("a"))?;
    assert_eq!(a.server.as_str(), "https://10.0.0.1:6443/");
    assert_eq!(a.ca_pem.as_deref(), Some(&b"CA PEM"[..]));
    assert_eq!(a.tls_server_name.as_deref(), Some("kubernetes.default"));
    assert_eq!(
        a.auth,
        Auth::ClientCert {
            cert_pem: b"CERT PEM".to_vec(),
            key_pem: b"KEY PEM".to_vec()
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
    assert!(matches!(err, Error::Kubeconfig(_)), "{err:?}");
    assert!(Kubeconfig::from_yaml("clusters: [").is_err());
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

/// Replaces `path` the way the kubelet and cert managers do: a new file renamed over
/// the old, so a reader sees either whole version.
fn replace_file(path: &std::path::Path, contents: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, contents)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

#[tokio::test]
async fn a_rotated_token_file_is_sent_without_a_failed_request() -> Result<()> {
    let srv = start(&[b"h2", b"http/1.1"]).await?;
    *srv.tokens.lock().map_err(|_| anyhow!("poisoned"))? = vec!["old-token".into()];
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("token");
    replace_file(&path, b"old-token\n")?;
    let cfg = srv.config(Auth::TokenFile(path.clone()))?;
    let recheck = Duration::from_millis(200);
    let credentials = Credentials::new(cfg.auth.clone(), Value::Null)?.with_file_recheck(recheck);
    let client = Client::with_credentials(cfg, Arc::new(credentials))?;
    // 60 requests 20 ms apart: the token rotates at the 10th, the old one is revoked
    // at the 30th (400 ms later, two rechecks), as a projected token outlives its
    // replacement's issue.
    for i in 0..60 {
        if i == 10 {
            srv.tokens
                .lock()
                .map_err(|_| anyhow!("poisoned"))?
                .push("new-token".into());
            replace_file(&path, b"new-token\n")?;
        }
        if i == 30 {
            srv.tokens
                .lock()
                .map_err(|_| anyhow!("poisoned"))?
                .retain(|t| t != "old-token");
        }
        timed(client.get("/api/v1/namespaces/default/configmaps/cm"))
            .await?
            .with_context(|| format!("request {i}"))?;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        srv.last()?.authorization.as_deref(),
        Some("Bearer new-token")
    );
    Ok(())
}

#[tokio::test]
async fn renewed_client_certificate_files_are_presented_by_new_connections() -> Result<()> {
    let srv = start(&[b"h2", b"http/1.1"]).await?;
    let renewed = srv.pki.client_ca.issue_client("alice", &["devs"])?;
    let dir = tempfile::tempdir()?;
    let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    replace_file(&cert, srv.pki.client.cert.as_bytes())?;
    replace_file(&key, srv.pki.client.key.as_bytes())?;
    let der = |pem: &str| -> Result<Vec<u8>> {
        Ok(CertificateDer::from_pem_slice(pem.as_bytes())?.to_vec())
    };
    let cfg = srv.config(Auth::ClientCertFiles {
        cert: cert.clone(),
        key: key.clone(),
    })?;
    let credentials = Arc::new(
        Credentials::new(cfg.auth.clone(), Value::Null)?
            .with_file_recheck(Duration::from_millis(100)),
    );
    let first = Client::with_credentials(cfg.clone(), credentials.clone())?;
    timed(first.get("/api/v1/namespaces/default/configmaps/cm")).await??;
    assert_eq!(srv.last()?.client_cert, Some(der(&srv.pki.client.cert)?));

    replace_file(&cert, renewed.cert.as_bytes())?;
    replace_file(&key, renewed.key.as_bytes())?;
    tokio::time::sleep(Duration::from_millis(150)).await;
    // A new connection (a second client) presents the renewed certificate; the open
    // connection keeps working.
    let second = Client::with_credentials(cfg, credentials)?;
    timed(second.get("/api/v1/namespaces/default/configmaps/cm")).await??;
    assert_eq!(srv.last()?.client_cert, Some(der(&renewed.cert)?));
    timed(first.get("/api/v1/namespaces/default/configmaps/cm")).await??;
    Ok(())
}

/// A kubeconfig whose user runs `./plugin.sh` (relative to the kubeconfig) with the
/// given script body.
fn exec_kubeconfig(srv: &Server, dir: &std::path::Path, script: &str) -> Result<ClusterConfig> {
    use std::os::unix::fs::PermissionsExt as _;
    let plugin = dir.join("plugin.sh");
    std::fs::write(&plugin, script)?;
    std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755))?;
    let yaml = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:{port}\n    certificate-authority-data: {ca}\nusers:\n- name: u\n  user:\n    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: ./plugin.sh\n      args: [--state, {state}]\n      env: [{{name: PLUGIN_PREFIX, value: exec}}]\n      provideClusterInfo: true\n      installHint: install the plugin\n      interactiveMode: Never\ncontexts:\n- name: ctx\n  context: {{cluster: c, user: u}}\ncurrent-context: ctx\n",
        port = srv.addr.port(),
        ca = base64::engine::general_purpose::STANDARD.encode(srv.pki.server_ca.pem().cert.as_bytes()),
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
/// prints token `$PLUGIN_PREFIX-<run>` valid for `lifetime` (`none`: no expiry).
fn counting_plugin(lifetime: &str) -> String {
    let expiry = if lifetime == "none" {
        String::new()
    } else {
        format!(
            ",\\\"expirationTimestamp\\\":\\\"$(date -u -d '{lifetime}' +%Y-%m-%dT%H:%M:%SZ)\\\""
        )
    };
    format!(
        "#!/bin/sh\nset -e\nn=$(cat \"$2/count\" 2>/dev/null || echo 0)\nn=$((n+1))\necho $n > \"$2/count\"\nprintf '%s' \"$KUBERNETES_EXEC_INFO\" > \"$2/info\"\necho \"{{\\\"apiVersion\\\":\\\"client.authentication.k8s.io/v1\\\",\\\"kind\\\":\\\"ExecCredential\\\",\\\"status\\\":{{\\\"token\\\":\\\"$PLUGIN_PREFIX-$n\\\"{expiry}}}}}\"\n"
    )
}

#[tokio::test]
async fn exec_plugin_tokens_are_renewed_before_they_expire() -> Result<()> {
    let srv = start(&[b"h2", b"http/1.1"]).await?;
    *srv.tokens.lock().map_err(|_| anyhow!("poisoned"))? = vec!["exec-1".into(), "exec-2".into()];
    let dir = tempfile::tempdir()?;
    // Expiring in 5 s, within the renewal margin: every request runs the plugin again.
    let cfg = exec_kubeconfig(&srv, dir.path(), &counting_plugin("+5 seconds"))?;
    let client = Client::new(cfg.clone())?;
    for want in ["Bearer exec-1", "Bearer exec-2"] {
        timed(client.get("/api/v1/namespaces/default/configmaps/cm")).await??;
        assert_eq!(srv.last()?.authorization.as_deref(), Some(want));
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
    let srv = start(&[b"h2", b"http/1.1"]).await?;
    *srv.tokens.lock().map_err(|_| anyhow!("poisoned"))? = vec!["exec-1".into()];
    let dir = tempfile::tempdir()?;
    let cfg = exec_kubeconfig(&srv, dir.path(), &counting_plugin("none"))?;
    let client = Client::new(cfg)?;
    for _ in 0..3 {
        timed(client.get("/api/v1/namespaces/default/configmaps/cm")).await??;
    }
    assert_eq!(
        std::fs::read_to_string(dir.path().join("count"))?.trim(),
        "1"
    );
    // The server revokes the token: one request is refused, the next runs the
    // plugin again and succeeds.
    *srv.tokens.lock().map_err(|_| anyhow!("poisoned"))? = vec!["exec-2".into()];
    let err = timed(client.get("/api/v1/namespaces/default/configmaps/cm"))
        .await?
        .expect_err("revoked");
    assert_eq!(err.status(), Some(401));
    timed(client.get("/api/v1/namespaces/default/configmaps/cm")).await??;
    assert_eq!(srv.last()?.authorization.as_deref(), Some("Bearer exec-2"));
    Ok(())
}

#[tokio::test]
async fn a_failing_exec_plugin_is_a_credentials_error_with_its_output() -> Result<()> {
    let srv = start(&[b"h2", b"http/1.1"]).await?;
    let dir = tempfile::tempdir()?;
    let cfg = exec_kubeconfig(
        &srv,
        dir.path(),
        "#!/bin/sh\necho 'please log in first' >&2\nexit 3\n",
    )?;
    let err = timed(Client::new(cfg)?.get("/api/v1/namespaces/default/configmaps/cm"))
        .await?
        .expect_err("plugin fails");
    assert!(matches!(err, Error::Credentials(_)), "{err:?}");
    assert!(err.to_string().contains("please log in first"), "{err}");

    let missing = exec_kubeconfig(&srv, dir.path(), "")?;
    let Auth::Exec(mut exec) = missing.auth.clone() else {
        panic!("exec user");
    };
    exec.command = dir.path().join("not-installed");
    let missing = ClusterConfig {
        auth: Auth::Exec(exec),
        ..missing
    };
    let err = timed(Client::new(missing)?.get("/api/v1/namespaces/default/configmaps/cm"))
        .await?
        .expect_err("plugin missing");
    assert!(err.to_string().contains("install the plugin"), "{err}");
    Ok(())
}

#[tokio::test]
async fn failures_are_typed_by_cause() -> Result<()> {
    let srv = start(&[b"http/1.1"]).await?;
    // Nothing listens: refused.
    let closed = TcpListener::bind("127.0.0.1:0").await?;
    let closed_port = closed.local_addr()?.port();
    drop(closed);
    let mut cfg = srv.config(Auth::None)?;
    cfg.server = format!("https://127.0.0.1:{closed_port}").parse()?;
    let err = timed(Client::new(cfg)?.get("/api"))
        .await?
        .expect_err("refused");
    assert!(matches!(err, Error::Connect(_)), "{err:?}");

    // A peer that accepts TCP and never speaks TLS: the request timeout, not a hang.
    let silent = TcpListener::bind("127.0.0.1:0").await?;
    let silent_port = silent.local_addr()?.port();
    let hold = tokio::spawn(async move {
        let mut held = Vec::new();
        // Bounded by the abort below.
        while let Ok((tcp, _)) = silent.accept().await {
            held.push(tcp);
        }
    });
    let mut cfg = srv.config(Auth::None)?;
    cfg.server = format!("https://127.0.0.1:{silent_port}").parse()?;
    let client = Client::new(cfg)?.with_request_timeout(Some(Duration::from_millis(300)));
    let err = timed(client.get("/api")).await?.expect_err("silent");
    assert!(matches!(err, Error::Timeout(_)), "{err:?}");
    hold.abort();
    Ok(())
}
