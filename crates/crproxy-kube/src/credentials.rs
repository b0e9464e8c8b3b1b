//! The credentials a connection presents *now*, for sources that change while crproxy
//! runs: a token file the kubelet rotates, client certificate files a cert manager
//! renews, and `exec` plugins whose tokens expire.
//!
//! One [`Credentials`] serves both the control-plane [`crate::Client`] and the data
//! path's peer pool. Callers ask for [`Credentials::authorization`] before each request;
//! that call refreshes whatever is stale (asynchronously, so no file read or plugin run
//! blocks the runtime) and returns the `Authorization` header. A client certificate is
//! not a header: it is presented by the TLS handshake of each new connection through
//! [`Credentials::client_cert_resolver`], which always hands out the latest certificate
//! the last refresh loaded.

use crate::cluster::{Auth, ExecConfig};
use crate::pem::PairProblem;
use crate::Error;
use crproxy_core::locks;
use http::HeaderValue;
use rustls::client::ResolvesClientCert;
use rustls::sign::CertifiedKey;
use rustls::SignatureScheme;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::time::Instant;

/// How often file-backed credentials (token file, client certificate files) are looked
/// at again. The kubelet replaces a projected token when 80% of its lifetime has
/// passed, so the previous token stays valid far longer than this.
pub const DEFAULT_FILE_RECHECK: Duration = Duration::from_secs(10);
/// How long before an exec credential's `expirationTimestamp` the plugin is run again,
/// so a request never leaves with a token about to expire.
const EXEC_EXPIRY_MARGIN: Duration = Duration::from_secs(30);
/// How long a failed refresh is answered from memory before it is tried again, so a
/// broken plugin or a missing file is not retried by every request.
const REFRESH_RETRY: Duration = Duration::from_secs(1);
/// How long an exec plugin may run before it counts as failed.
const EXEC_TIMEOUT: Duration = Duration::from_secs(60);
/// What crproxy sends as `KUBERNETES_EXEC_INFO` when the kubeconfig names no
/// apiVersion (client-go requires one; this is the current version).
const EXEC_DEFAULT_API_VERSION: &str = "client.authentication.k8s.io/v1";

/// The current credentials of one cluster identity. Cheap to share behind an [`Arc`];
/// concurrent callers of [`Credentials::authorization`] wait for one refresh instead of
/// each running it.
pub struct Credentials {
    auth: Auth,
    /// The cluster's server and CA, for exec plugins with `provideClusterInfo`.
    cluster_info: Value,
    file_recheck: Duration,
    cert: Arc<CurrentClientCert>,
    /// What requests read: the header and until when it is good. Behind a plain
    /// read lock so the data path's requests never queue behind each other.
    current: RwLock<Current>,
    /// Held while refreshing, so concurrent callers wait for one refresh.
    state: tokio::sync::Mutex<State>,
}

#[derive(Clone, Default)]
struct Current {
    header: Option<HeaderValue>,
    fresh_until: Option<Instant>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("auth", &self.auth)
            .finish_non_exhaustive()
    }
}

#[derive(Default)]
struct State {
    header: Option<HeaderValue>,
    /// When the header (and certificate) stop being good; `None` means a refresh is
    /// due now.
    fresh_until: Option<Instant>,
    /// The PEM bytes last loaded into the certificate slot, to parse again only when
    /// the files actually changed.
    cert_pems: Option<(Vec<u8>, Vec<u8>)>,
    /// The last refresh failed: its message, and until when it is answered as is.
    failed: Option<(String, Instant)>,
}

impl Credentials {
    /// Credentials for `auth`. Static material (an inline token, certificate data) is
    /// checked now; files and plugins are read on the first
    /// [`Credentials::authorization`].
    pub fn new(auth: Auth, cluster_info: Value) -> Result<Self, Error> {
        let cert = Arc::new(CurrentClientCert::default());
        let mut state = State::default();
        match &auth {
            Auth::Token(token) => {
                state.header = Some(bearer(token)?);
                state.fresh_until = Some(far_future());
            }
            Auth::ClientCert { cert_pem, key_pem } => {
                cert.set(certified_key(cert_pem, key_pem)?);
                state.fresh_until = Some(far_future());
            }
            Auth::None => state.fresh_until = Some(far_future()),
            Auth::TokenFile(_) | Auth::ClientCertFiles { .. } | Auth::Exec(_) => {}
        }
        Ok(Credentials {
            auth,
            cluster_info,
            file_recheck: DEFAULT_FILE_RECHECK,
            cert,
            current: RwLock::new(Current {
                header: state.header.clone(),
                fresh_until: state.fresh_until,
            }),
            state: tokio::sync::Mutex::new(state),
        })
    }

    /// The same credentials, looking at their files again every `recheck` instead of
    /// [`DEFAULT_FILE_RECHECK`].
    pub fn with_file_recheck(mut self, recheck: Duration) -> Self {
        self.file_recheck = recheck;
        self
    }

    /// The TLS client-certificate resolver to put in a rustls config: it presents the
    /// certificate most recently loaded, or none.
    pub fn client_cert_resolver(&self) -> Arc<dyn ResolvesClientCert> {
        self.cert.clone()
    }

    /// The `Authorization` header to send now (`None` for certificate or anonymous
    /// identities), refreshing stale sources first. Also loads renewed client
    /// certificates, so call it before a request that may open a connection.
    pub async fn authorization(&self) -> Result<Option<HeaderValue>, Error> {
        {
            let current = locks::read(&self.current);
            if current.fresh_until.is_some_and(|t| Instant::now() < t) {
                return Ok(current.header.clone());
            }
        }
        let mut state = self.state.lock().await;
        // Another caller may have refreshed while this one waited.
        if state.fresh_until.is_some_and(|t| Instant::now() < t) {
            return Ok(state.header.clone());
        }
        if let Some((message, until)) = &state.failed {
            if Instant::now() < *until {
                return Err(Error::Credentials(message.clone()));
            }
        }
        match self.refresh(&mut state).await {
            Ok(()) => state.failed = None,
            Err(error) => {
                state.failed = Some((error.to_string(), Instant::now() + REFRESH_RETRY));
                return Err(error);
            }
        }
        *locks::write(&self.current) = Current {
            header: state.header.clone(),
            fresh_until: state.fresh_until,
        };
        Ok(state.header.clone())
    }

    /// Reads the source again into `state`.
    async fn refresh(&self, state: &mut State) -> Result<(), Error> {
        match &self.auth {
            Auth::None | Auth::Token(_) | Auth::ClientCert { .. } => {}
            Auth::TokenFile(path) => {
                state.header = Some(bearer(&read_token_file(path).await?)?);
                state.fresh_until = Some(Instant::now() + self.file_recheck);
            }
            Auth::ClientCertFiles { cert, key } => {
                let pems = (read(cert).await?, read(key).await?);
                if state.cert_pems.as_ref() != Some(&pems) {
                    self.cert.set(certified_key(&pems.0, &pems.1)?);
                    state.cert_pems = Some(pems);
                }
                state.fresh_until = Some(Instant::now() + self.file_recheck);
            }
            Auth::Exec(exec) => {
                let credential = run_exec(exec, &self.cluster_info).await?;
                if let Some((cert_pem, key_pem)) = &credential.client_cert {
                    self.cert.set(certified_key(cert_pem, key_pem)?);
                }
                state.header = credential.token.as_deref().map(bearer).transpose()?;
                state.fresh_until = Some(credential.fresh_until);
            }
        }
        Ok(())
    }

    /// Forgets cached file and plugin credentials, so the next
    /// [`Credentials::authorization`] reads them again: what to do when the server
    /// answers 401 to a credential that should still be valid (a plugin token revoked
    /// early, a file replaced between two rechecks). `rejected` is the header the
    /// refused request carried: when it is no longer the current one, a refresh
    /// already happened and nothing is forgotten, so a burst of 401s for one old
    /// token causes one refresh, not one each.
    pub async fn invalidate(&self, rejected: Option<&HeaderValue>) {
        if matches!(
            self.auth,
            Auth::TokenFile(_) | Auth::ClientCertFiles { .. } | Auth::Exec(_)
        ) {
            let mut state = self.state.lock().await;
            if rejected.is_some() && state.header.as_ref() != rejected {
                return;
            }
            state.fresh_until = None;
            drop(state);
            locks::write(&self.current).fresh_until = None;
        }
    }
}

/// A time no process reaches, for credentials that never change.
fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(100 * 365 * 24 * 3600)
}

fn bearer(token: &str) -> Result<HeaderValue, Error> {
    let mut value = HeaderValue::from_str(&format!("Bearer {token}"))
        .map_err(|_| Error::Credentials("the bearer token is not a valid header value".into()))?;
    value.set_sensitive(true);
    Ok(value)
}

async fn read(path: &PathBuf) -> Result<Vec<u8>, Error> {
    tokio::fs::read(path)
        .await
        .map_err(|e| Error::Credentials(format!("cannot read {}: {e}", path.display())))
}

async fn read_token_file(path: &PathBuf) -> Result<String, Error> {
    let bytes = read(path).await?;
    let token = String::from_utf8(bytes)
        .map_err(|_| Error::Credentials(format!("token file {} is not UTF-8", path.display())))?;
    let token = token.trim();
    if token.is_empty() {
        return Err(Error::Credentials(format!(
            "token file {} is empty",
            path.display()
        )));
    }
    Ok(token.to_owned())
}

/// Parses a PEM certificate chain and key into what rustls presents.
fn certified_key(cert_pem: &[u8], key_pem: &[u8]) -> Result<Arc<CertifiedKey>, Error> {
    crate::pem::client_pair(cert_pem, key_pem, crate::pem::Origin::Other).map_err(|problem| {
        Error::Tls(match problem {
            PairProblem::Certificate(p) => format!("the client certificate {p}"),
            PairProblem::Key(p) => format!("the client key {p}"),
            PairProblem::Mismatch => {
                "the client key is not the key of the client certificate".into()
            }
        })
    })
}

/// The client certificate new TLS connections present. rustls asks during each
/// handshake, so replacing the certificate here takes effect on the next connection
/// without rebuilding any TLS config or pool.
#[derive(Debug, Default)]
struct CurrentClientCert {
    key: RwLock<Option<Arc<CertifiedKey>>>,
}

impl CurrentClientCert {
    fn set(&self, key: Arc<CertifiedKey>) {
        *locks::write(&self.key) = Some(key);
    }

    fn get(&self) -> Option<Arc<CertifiedKey>> {
        locks::read(&self.key).clone()
    }
}

impl ResolvesClientCert for CurrentClientCert {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        self.get()
    }

    fn has_certs(&self) -> bool {
        self.get().is_some()
    }
}

/// What one run of an exec plugin produced.
struct ExecCredential {
    token: Option<String>,
    client_cert: Option<(Vec<u8>, Vec<u8>)>,
    fresh_until: Instant,
}

/// Runs the plugin as client-go does: `KUBERNETES_EXEC_INFO` describes the request,
/// stdout carries an `ExecCredential` whose `status` holds a token and/or a client
/// certificate, and `expirationTimestamp` says when to run it again (never, when
/// absent, until the server answers 401).
async fn run_exec(exec: &ExecConfig, cluster_info: &Value) -> Result<ExecCredential, Error> {
    let api_version = exec
        .api_version
        .as_deref()
        .unwrap_or(EXEC_DEFAULT_API_VERSION);
    let mut spec = json!({"interactive": false});
    if exec.provide_cluster_info {
        spec["cluster"] = cluster_info.clone();
    }
    let info = json!({"apiVersion": api_version, "kind": "ExecCredential", "spec": spec});
    let mut command = tokio::process::Command::new(&exec.command);
    command
        .args(&exec.args)
        .envs(exec.env.iter().map(|(k, v)| (k, v)))
        .env("KUBERNETES_EXEC_INFO", info.to_string())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let plugin = exec.command.display();
    let hint = exec
        .install_hint
        .as_deref()
        .map(|h| format!(" ({})", h.trim()))
        .unwrap_or_default();
    let child = command
        .spawn()
        .map_err(|e| Error::Credentials(format!("cannot run exec plugin {plugin}: {e}{hint}")))?;
    let output = tokio::time::timeout(EXEC_TIMEOUT, child.wait_with_output())
        .await
        .map_err(|_| {
            Error::Credentials(format!(
                "exec plugin {plugin} did not finish within {EXEC_TIMEOUT:?}"
            ))
        })?
        .map_err(|e| Error::Credentials(format!("exec plugin {plugin}: {e}")))?;
    if !output.status.success() {
        return Err(Error::Credentials(format!(
            "exec plugin {plugin} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    parse_exec_output(&output.stdout, api_version)
        .map_err(|e| Error::Credentials(format!("exec plugin {plugin}: {e}")))
}

fn parse_exec_output(stdout: &[u8], api_version: &str) -> Result<ExecCredential, String> {
    let value: Value =
        serde_json::from_slice(stdout).map_err(|e| format!("output is not JSON: {e}"))?;
    if value.get("kind").and_then(Value::as_str) != Some("ExecCredential") {
        return Err("output is not an ExecCredential".into());
    }
    let got_version = value.get("apiVersion").and_then(Value::as_str);
    if got_version != Some(api_version) {
        return Err(format!(
            "output has apiVersion {got_version:?}, the kubeconfig asked for {api_version:?}"
        ));
    }
    let status = value.get("status").ok_or("output has no status")?;
    let text = |key: &str| {
        status
            .get(key)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
    };
    let token = text("token").map(str::to_owned);
    let client_cert = match (text("clientCertificateData"), text("clientKeyData")) {
        (Some(cert), Some(key)) => Some((cert.as_bytes().to_vec(), key.as_bytes().to_vec())),
        (None, None) => None,
        _ => return Err("status has a client certificate or key but not both".into()),
    };
    if token.is_none() && client_cert.is_none() {
        return Err("status has neither a token nor a client certificate".into());
    }
    let fresh_until = match text("expirationTimestamp") {
        None => far_future(),
        Some(ts) => {
            let expiry = chrono::DateTime::parse_from_rfc3339(ts)
                .map_err(|e| format!("expirationTimestamp {ts:?}: {e}"))?;
            let left = (expiry.with_timezone(&chrono::Utc) - chrono::Utc::now())
                .to_std()
                .unwrap_or_default();
            Instant::now() + left.saturating_sub(EXEC_EXPIRY_MARGIN)
        }
    };
    Ok(ExecCredential {
        token,
        client_cert,
        fresh_until,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const V1: &str = "client.authentication.k8s.io/v1";

    fn header(value: &str) -> HeaderValue {
        HeaderValue::from_str(value).expect("header")
    }

    #[tokio::test]
    async fn a_failed_refresh_is_not_retried_by_every_request() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("token");
        let credentials =
            Credentials::new(Auth::TokenFile(path.clone()), Value::Null).expect("credentials");
        let err = credentials.authorization().await.expect_err("no file");
        assert!(matches!(err, Error::Credentials(_)), "{err:?}");
        std::fs::write(&path, "t1").expect("write");
        // Within the retry pause the failure is answered from memory.
        assert!(credentials.authorization().await.is_err());
        tokio::time::sleep(REFRESH_RETRY + Duration::from_millis(100)).await;
        assert_eq!(
            credentials.authorization().await.expect("read"),
            Some(header("Bearer t1"))
        );
    }

    #[tokio::test]
    async fn only_a_401_for_the_current_token_forces_a_refresh() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("token");
        std::fs::write(&path, "t1").expect("write");
        let credentials =
            Credentials::new(Auth::TokenFile(path.clone()), Value::Null).expect("credentials");
        let first = credentials.authorization().await.expect("read");
        assert_eq!(first, Some(header("Bearer t1")));
        std::fs::write(&path, "t2").expect("write");
        // A late 401 for a token already replaced changes nothing.
        credentials.invalidate(Some(&header("Bearer t0"))).await;
        assert_eq!(credentials.authorization().await.expect("read"), first);
        // A 401 for the current token reads the file again.
        credentials.invalidate(first.as_ref()).await;
        assert_eq!(
            credentials.authorization().await.expect("read"),
            Some(header("Bearer t2"))
        );
    }

    #[test]
    fn exec_output_with_a_token_and_no_expiry_is_kept() {
        let out = br#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"t1"}}"#;
        let c = parse_exec_output(out, V1).expect("valid");
        assert_eq!(c.token.as_deref(), Some("t1"));
        assert!(c.fresh_until > Instant::now() + Duration::from_secs(3600 * 24 * 365));
    }

    #[test]
    fn exec_output_expiring_soon_is_refreshed_before_expiry() {
        let soon = (chrono::Utc::now() + chrono::Duration::seconds(10)).to_rfc3339();
        let out = json!({"apiVersion": V1, "kind": "ExecCredential",
            "status": {"token": "t", "expirationTimestamp": soon}});
        let c = parse_exec_output(out.to_string().as_bytes(), V1).expect("valid");
        // Less than the margin left: refresh at once.
        assert!(c.fresh_until <= Instant::now());
    }

    #[test]
    fn exec_output_errors_name_the_problem() {
        let cases: [(&[u8], &str); 5] = [
            (b"not json", "not JSON"),
            (br#"{"kind":"Status"}"#, "not an ExecCredential"),
            (
                br#"{"apiVersion":"client.authentication.k8s.io/v1beta1","kind":"ExecCredential","status":{"token":"t"}}"#,
                "asked for",
            ),
            (
                br#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{}}"#,
                "neither a token nor",
            ),
            (
                br#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"clientKeyData":"k"}}"#,
                "not both",
            ),
        ];
        for (out, want) in cases {
            let err = parse_exec_output(out, V1).err().unwrap_or_default();
            assert!(err.contains(want), "{err:?} should mention {want:?}");
        }
    }
}
