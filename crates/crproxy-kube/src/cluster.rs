//! Where a cluster is and how to authenticate to it, independent of any HTTP client, so
//! the proxy can dial a target's peers with the same TLS material the [`crate::Client`]
//! uses.

use crate::credentials::Credentials;
use crate::kubeconfig::Kubeconfig;
use crate::pem::{self, Origin, PairProblem};
use crate::Error;
use base64::Engine as _;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::{DigitallySignedStruct, SignatureScheme};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// How requests authenticate. The file and plugin variants are sources, read by
/// [`Credentials`] while crproxy runs so rotated credentials are picked up.
#[derive(Clone, PartialEq, Eq)]
pub enum Auth {
    /// Anonymous.
    None,
    /// `Authorization: Bearer <token>` with a fixed token.
    Token(String),
    /// `Authorization: Bearer <token>` with the token currently in this file (a
    /// kubeconfig `tokenFile`, the in-cluster service-account token).
    TokenFile(PathBuf),
    /// A TLS client certificate (PEM) and its private key (PEM).
    ClientCert { cert_pem: Vec<u8>, key_pem: Vec<u8> },
    /// The TLS client certificate and key currently in these PEM files.
    ClientCertFiles { cert: PathBuf, key: PathBuf },
    /// Whatever an exec credential plugin prints (a token, a client certificate or
    /// both), run again before its credential expires.
    Exec(ExecConfig),
}

// Hand-written so tokens and keys never end up in logs.
impl fmt::Debug for Auth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Auth::None => f.write_str("None"),
            Auth::Token(_) => f.write_str("Token(<redacted>)"),
            Auth::TokenFile(path) => write!(f, "TokenFile({})", path.display()),
            Auth::ClientCert { .. } => f.write_str("ClientCert { <redacted> }"),
            Auth::ClientCertFiles { cert, key } => {
                write!(f, "ClientCertFiles({}, {})", cert.display(), key.display())
            }
            Auth::Exec(exec) => write!(f, "Exec({})", exec.command.display()),
        }
    }
}

/// A kubeconfig `users[].user.exec` entry: the plugin to run for credentials.
#[derive(Clone, PartialEq, Eq)]
pub struct ExecConfig {
    /// The program; a relative path with a directory part resolves against the
    /// kubeconfig's directory, a bare name is looked up in `PATH`.
    pub command: PathBuf,
    pub args: Vec<String>,
    /// Extra environment variables for the plugin (values may be secrets).
    pub env: Vec<(String, String)>,
    /// The `client.authentication.k8s.io` version the plugin speaks.
    pub api_version: Option<String>,
    /// Whether `KUBERNETES_EXEC_INFO` carries the cluster's server and CA.
    pub provide_cluster_info: bool,
    /// Shown when the plugin cannot be started, to say how to install it.
    pub install_hint: Option<String>,
}

impl ExecConfig {
    /// The program, found as starting the plugin would find it: a path must be an
    /// executable file, a bare name is looked up in `PATH`. Or why it cannot be found,
    /// after the command (`"gke-gcloud-auth-plugin" is not on PATH`). `crproxy
    /// check-config` asks, so a missing plugin is reported before start; `crproxy
    /// run` does not, and keeps trying to run it (it may be installed later), as
    /// client-go fails the request and tries again on the next.
    pub fn locate(&self) -> Result<PathBuf, String> {
        self.locate_in(std::env::var_os("PATH").as_deref())
    }

    fn locate_in(&self, path_var: Option<&std::ffi::OsStr>) -> Result<PathBuf, String> {
        let hint = self
            .install_hint
            .as_deref()
            .map(|h| h.split_whitespace().collect::<Vec<_>>().join(" "))
            .filter(|h| !h.is_empty())
            .map(|h| format!(" ({h})"))
            .unwrap_or_default();
        let command = &self.command;
        let shown = command.display();
        if command.components().count() > 1 || command.is_absolute() {
            return match std::fs::metadata(command) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    Err(format!("\"{shown}\" does not exist{hint}"))
                }
                Err(e) => Err(format!("\"{shown}\" cannot be used: {e}")),
                Ok(meta) if is_executable(&meta) => Ok(command.clone()),
                Ok(_) => Err(format!("\"{shown}\" is not an executable file")),
            };
        }
        std::env::split_paths(path_var.unwrap_or_default())
            .map(|dir| dir.join(command))
            .find(|candidate| std::fs::metadata(candidate).is_ok_and(|m| is_executable(&m)))
            .ok_or_else(|| format!("\"{shown}\" is not on PATH{hint}"))
    }
}

fn is_executable(meta: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    meta.is_file() && meta.permissions().mode() & 0o111 != 0
}

/// One API server endpoint and the credentials for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterConfig {
    /// `https://host:port`, optionally with a path prefix.
    pub server: url::Url,
    /// PEM bundle of trusted CAs. `None` trusts nothing (every handshake fails) unless
    /// `insecure_skip_tls_verify` is set: there is deliberately no fallback to system
    /// roots, API servers use private CAs. [`ClusterConfig::from_kubeconfig`] refuses
    /// a cluster that would end up so.
    pub ca_pem: Option<Vec<u8>>,
    /// The name to verify the server certificate against instead of the URL host.
    pub tls_server_name: Option<String>,
    /// Accept any server certificate. For development only.
    pub insecure_skip_tls_verify: bool,
    pub auth: Auth,
}

const SA_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

impl ClusterConfig {
    /// A config with no CA and no credentials for `server`.
    pub fn new(server: url::Url) -> Self {
        ClusterConfig {
            server,
            ca_pem: None,
            tls_server_name: None,
            insecure_skip_tls_verify: false,
            auth: Auth::None,
        }
    }

    /// The cluster and user of `context` (or the current context) of a kubeconfig. File
    /// references are read now; relative ones resolve against the kubeconfig's
    /// directory. An `https` cluster with neither a CA nor
    /// `insecure-skip-tls-verify` is [`Error::NoCertificateAuthority`].
    pub fn from_kubeconfig(kc: &Kubeconfig, context: Option<&str>) -> Result<Self, Error> {
        let ctx = kc.context(context)?;
        let cluster = kc
            .clusters
            .iter()
            .find(|c| c.name == ctx.context.cluster)
            .ok_or_else(|| {
                Error::Kubeconfig(format!(
                    "context {:?} names cluster {:?}, which is not defined",
                    ctx.name, ctx.context.cluster
                ))
            })?
            .cluster
            .clone();
        let cluster_name = &ctx.context.cluster;
        let field = |name: &str| format!("clusters[{cluster_name}].cluster.{name}");
        // A context without a user (or naming an unknown one) is anonymous, as in
        // kubectl.
        let user = kc
            .users
            .iter()
            .find(|u| u.name == ctx.context.user)
            .map(|u| u.user.clone())
            .unwrap_or_default();
        // client-go's rule for a server without a scheme: https when the cluster or
        // user has TLS material, http otherwise.
        let tls_material = [
            &cluster.certificate_authority,
            &cluster.certificate_authority_data,
            &user.client_certificate,
            &user.client_certificate_data,
        ]
        .iter()
        .any(|v| v.as_deref().is_some_and(|v| !v.is_empty()))
            || cluster.insecure_skip_tls_verify == Some(true);
        let server = server_url(&field("server"), &cluster.server, tls_material)?;
        // Empty values count as absent, as in kubectl (a script that extracted no CA
        // writes `certificate-authority-data: ""`). The CA is parsed now, as the TLS
        // config will parse it, so a bundle that holds no certificate is reported
        // against its field here rather than when the first connection is made.
        let ca_pem = match (
            cluster
                .certificate_authority_data
                .as_deref()
                .filter(|d| !d.is_empty()),
            cluster
                .certificate_authority
                .as_deref()
                .filter(|p| !p.is_empty()),
        ) {
            (Some(data), _) => {
                let field = field("certificate-authority-data");
                let pem = decode_b64(&field, data)?;
                pem::root_store(&pem, Origin::Data).map_err(|p| at(&field, p))?;
                Some(pem)
            }
            (None, Some(path)) => {
                let (field, path) = (field("certificate-authority"), kc.resolve(path));
                let pem = read_file(&path).map_err(|p| at(&field, p))?;
                pem::root_store(&pem, Origin::File)
                    .map_err(|p| at(&field, format!("{} {p}", path.display())))?;
                Some(pem)
            }
            (None, None) => None,
        };
        let insecure_skip_tls_verify = cluster.insecure_skip_tls_verify.unwrap_or(false);
        // There are no system roots to fall back on (API servers use private CAs), so
        // without a CA every handshake would fail later with UnknownIssuer; say so now,
        // where `check-config` and startup see it. A plain `http://` server (a
        // `kubectl proxy`, say) has no handshake to verify.
        if ca_pem.is_none() && !insecure_skip_tls_verify && server.scheme() == "https" {
            return Err(Error::NoCertificateAuthority {
                cluster: ctx.context.cluster.clone(),
            });
        }
        let user_name = &ctx.context.user;
        let auth = user_auth(kc, user_name, &user)?;
        Ok(ClusterConfig {
            server,
            ca_pem,
            tls_server_name: cluster.tls_server_name.filter(|s| !s.is_empty()),
            insecure_skip_tls_verify,
            auth,
        })
    }

    /// The kubeconfig kubectl would use (see [`Kubeconfig::load_default`]) with its
    /// current context, else the in-cluster service account.
    pub fn infer() -> Result<Self, Error> {
        match Kubeconfig::load_default()? {
            Some(kc) => Self::from_kubeconfig(&kc, None),
            None => Self::in_cluster(),
        }
    }

    /// The pod's service account: `KUBERNETES_SERVICE_HOST`/`_PORT` and the mounted
    /// token and CA.
    pub fn in_cluster() -> Result<Self, Error> {
        Self::in_cluster_from(
            std::env::var("KUBERNETES_SERVICE_HOST").ok().as_deref(),
            std::env::var("KUBERNETES_SERVICE_PORT").ok().as_deref(),
            Path::new(SA_DIR),
        )
    }

    /// [`ClusterConfig::in_cluster`] with explicit inputs (tests).
    pub fn in_cluster_from(
        host: Option<&str>,
        port: Option<&str>,
        sa_dir: &Path,
    ) -> Result<Self, Error> {
        let (Some(host), Some(port)) = (host, port) else {
            return Err(Error::Kubeconfig(
                "not running in a cluster: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must be set".into(),
            ));
        };
        let host = if host.contains(':') && !host.starts_with('[') {
            format!("[{host}]")
        } else {
            host.to_owned()
        };
        let server = url::Url::parse(&format!("https://{host}:{port}")).map_err(|e| {
            Error::Kubeconfig(format!("invalid in-cluster address {host}:{port}: {e}"))
        })?;
        // The kubelet rotates the projected token in place: read it per refresh, but
        // check now that it is there so a misconfigured pod fails at startup.
        let token_path = sa_dir.join("token");
        read_token(&token_path).map_err(Error::Kubeconfig)?;
        let ca = read_file(&sa_dir.join("ca.crt")).map_err(Error::Kubeconfig)?;
        Ok(ClusterConfig {
            server,
            ca_pem: Some(ca),
            tls_server_name: None,
            insecure_skip_tls_verify: false,
            auth: Auth::TokenFile(token_path),
        })
    }

    /// The provider of this identity's current credentials, to share between every
    /// client and pool that talks to this cluster as this identity.
    pub fn credentials(&self) -> Result<Arc<Credentials>, Error> {
        let mut info = serde_json::json!({
            "server": self.server.as_str(),
            "insecure-skip-tls-verify": self.insecure_skip_tls_verify,
        });
        if let Some(ca) = &self.ca_pem {
            info["certificate-authority-data"] =
                base64::engine::general_purpose::STANDARD.encode(ca).into();
        }
        if let Some(name) = &self.tls_server_name {
            info["tls-server-name"] = name.clone().into();
        }
        Ok(Arc::new(Credentials::new(self.auth.clone(), info)?))
    }

    /// The fixed bearer token, when authenticating by an inline token.
    pub fn bearer_token(&self) -> Option<&str> {
        match &self.auth {
            Auth::Token(t) => Some(t),
            _ => None,
        }
    }

    /// The name the server certificate must carry: `tls_server_name`, else the URL host
    /// (an IP literal becomes an IP server name).
    pub fn server_name(&self) -> Result<ServerName<'static>, Error> {
        if let Some(name) = &self.tls_server_name {
            return ServerName::try_from(name.clone())
                .map_err(|e| Error::Tls(format!("invalid tls-server-name {name:?}: {e}")));
        }
        match self.server.host() {
            Some(url::Host::Domain(d)) => ServerName::try_from(d.to_owned())
                .map_err(|e| Error::Tls(format!("invalid server host {d:?}: {e}"))),
            Some(url::Host::Ipv4(ip)) => Ok(ServerName::IpAddress(std::net::IpAddr::V4(ip).into())),
            Some(url::Host::Ipv6(ip)) => Ok(ServerName::IpAddress(std::net::IpAddr::V6(ip).into())),
            None => Err(Error::Tls(format!(
                "server URL {} has no host",
                self.server
            ))),
        }
    }

    /// A rustls client config for this cluster with the given ALPN protocols, built on
    /// [`crate::crypto_provider`] explicitly so no process-wide default provider is needed. The
    /// client certificate, if any, comes from `credentials` at each handshake.
    pub fn rustls_config(
        &self,
        alpn: &[&[u8]],
        credentials: &Credentials,
    ) -> Result<rustls::ClientConfig, Error> {
        let provider = Arc::new(crate::crypto_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::Tls(e.to_string()))?;
        let builder = if self.insecure_skip_tls_verify {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(InsecureAcceptAnyServerCert {
                    provider,
                }))
        } else {
            let roots = match &self.ca_pem {
                Some(pem) => pem::root_store(pem, Origin::Other)
                    .map_err(|p| Error::Tls(format!("the CA bundle {p}")))?,
                None => rustls::RootCertStore::empty(),
            };
            builder.with_root_certificates(roots)
        };
        let mut config = builder.with_client_cert_resolver(credentials.client_cert_resolver());
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Ok(config)
    }
}

/// The identity of a kubeconfig user. Files are checked now, so a typo fails at
/// startup, and read again while running; certificates and keys are parsed now as
/// the credentials will parse them, so a problem is reported against its field.
fn user_auth(kc: &Kubeconfig, name: &str, user: &crate::KubeUser) -> Result<Auth, Error> {
    let field = |f: &str| format!("users[{name}].user.{f}");
    let cert_data = user.client_certificate_data.as_deref();
    let key_data = user.client_key_data.as_deref();
    let cert_file = user.client_certificate.as_deref();
    let key_file = user.client_key.as_deref();
    let has_cert = cert_data.is_some() || cert_file.is_some();
    let has_key = key_data.is_some() || key_file.is_some();
    if has_cert != has_key {
        return Err(Error::Kubeconfig(format!(
            "user {name:?} has a client certificate or key but not both"
        )));
    }
    if has_cert {
        return match (cert_data, key_data, cert_file, key_file) {
            (Some(cert), Some(key), _, _) => {
                let fields = (
                    field("client-certificate-data"),
                    field("client-key-data"),
                );
                let cert_pem = decode_b64(&fields.0, cert)?;
                let key_pem = decode_b64(&fields.1, key)?;
                check_pair(&fields, (&cert_pem, &key_pem), Origin::Data, None)?;
                Ok(Auth::ClientCert { cert_pem, key_pem })
            }
            (None, None, Some(cert), Some(key)) => {
                let fields = (field("client-certificate"), field("client-key"));
                let (cert, key) = (kc.resolve(cert), kc.resolve(key));
                let cert_pem = read_file(&cert).map_err(|p| at(&fields.0, p))?;
                let key_pem = read_file(&key).map_err(|p| at(&fields.1, p))?;
                check_pair(
                    &fields,
                    (&cert_pem, &key_pem),
                    Origin::File,
                    Some((&cert, &key)),
                )?;
                Ok(Auth::ClientCertFiles { cert, key })
            }
            _ => Err(Error::Kubeconfig(format!(
                "user {name:?} mixes inline and file client certificate and key; give both the same way"
            ))),
        };
    }
    if let Some(token) = user.token.as_deref().filter(|t| !t.is_empty()) {
        return Ok(Auth::Token(token.to_owned()));
    }
    if let Some(path) = &user.token_file {
        let path = kc.resolve(path);
        read_token(&path).map_err(|p| at(&field("tokenFile"), p))?;
        return Ok(Auth::TokenFile(path));
    }
    if let Some(exec) = &user.exec {
        return exec_config(kc, name, exec).map(Auth::Exec);
    }
    if user.auth_provider.is_some() {
        return Err(Error::Kubeconfig(format!(
            "user {name:?} authenticates with a legacy auth provider, which crproxy does not support; use an exec plugin, a token, tokenFile or client certificate"
        )));
    }
    Ok(Auth::None)
}

/// A client certificate and key as the credentials will load them; a problem is
/// reported against the field (and file, when `files` are given) it is in.
fn check_pair(
    (cert_field, key_field): &(String, String),
    (cert_pem, key_pem): (&[u8], &[u8]),
    origin: Origin,
    files: Option<(&Path, &Path)>,
) -> Result<(), Error> {
    let subject = |file: Option<&Path>| {
        file.map(|f| format!("{} ", f.display()))
            .unwrap_or_default()
    };
    pem::client_pair(cert_pem, key_pem, origin)
        .map(drop)
        .map_err(|problem| match problem {
            PairProblem::Certificate(p) => {
                at(cert_field, format!("{}{p}", subject(files.map(|f| f.0))))
            }
            PairProblem::Key(p) => at(key_field, format!("{}{p}", subject(files.map(|f| f.1)))),
            PairProblem::Mismatch => at(
                key_field,
                format!("is not the private key of the certificate in {cert_field}"),
            ),
        })
}

/// A problem with the kubeconfig value at `field` (`users[admin].user.client-key-data`).
fn at(field: &str, problem: String) -> Error {
    Error::Kubeconfig(format!("{field}: {problem}"))
}

/// The API server URL of a kubeconfig cluster, read as client-go reads it: a server
/// written without a scheme (`127.0.0.1:6443`) is https when the cluster or user has
/// TLS material (`tls_material`). client-go would fall back to plain http otherwise;
/// that is refused here instead, because it is far more often a forgotten CA than a
/// plain-HTTP server, and plain HTTP to a TLS port fails with nothing that says so.
fn server_url(field: &str, server: &str, tls_material: bool) -> Result<url::Url, Error> {
    let server = server.trim();
    if server.is_empty() {
        return Err(at(
            field,
            "is not set: write the API server's URL, for example https://127.0.0.1:6443".into(),
        ));
    }
    match url::Url::parse(server) {
        Ok(url) if url.has_host() && matches!(url.scheme(), "https" | "http") => return Ok(url),
        Ok(url) if url.has_host() => {
            return Err(at(
                field,
                format!(
                    "{server:?} has the scheme {:?}: the API server is reached over https",
                    url.scheme()
                ),
            ))
        }
        Err(e) if server.contains("://") => {
            return Err(at(field, format!("{server:?} is not a valid URL: {e}")))
        }
        // No scheme: `127.0.0.1:6443` and `api.example.com` do not parse, and
        // `localhost:6443` parses as the scheme `localhost` with no host.
        _ => {}
    }
    if !tls_material {
        return Err(at(
            field,
            format!(
                "{server:?} has no scheme and the cluster has no certificate-authority: write \
                 https://{server} and add the API server's CA, or http://{server} for a \
                 plain-HTTP server"
            ),
        ));
    }
    match url::Url::parse(&format!("https://{server}")) {
        Ok(url) if url.has_host() && matches!(url.path(), "" | "/") && url.query().is_none() => {
            Ok(url)
        }
        _ => Err(at(
            field,
            format!("{server:?} is neither a URL nor a host:port: write it as https://HOST:PORT"),
        )),
    }
}

fn exec_config(kc: &Kubeconfig, name: &str, exec: &serde_json::Value) -> Result<ExecConfig, Error> {
    let bad = |what: &str| Error::Kubeconfig(format!("user {name:?}: exec {what}"));
    let text = |key: &str| exec.get(key).and_then(serde_json::Value::as_str);
    let command = text("command")
        .filter(|c| !c.is_empty())
        .ok_or_else(|| bad("has no command"))?;
    // As kubectl: a bare name is looked up in PATH, a relative path with a directory
    // is relative to the kubeconfig.
    let command = if command.contains('/') {
        kc.resolve(command)
    } else {
        PathBuf::from(command)
    };
    let args = match exec.get("args") {
        None | Some(serde_json::Value::Null) => Vec::new(),
        Some(serde_json::Value::Array(items)) => items
            .iter()
            .map(|a| a.as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| bad("args must be strings"))?,
        Some(_) => return Err(bad("args must be a list")),
    };
    let env = match exec.get("env") {
        None | Some(serde_json::Value::Null) => Vec::new(),
        Some(serde_json::Value::Array(items)) => items
            .iter()
            .map(|e| {
                let name = e.get("name")?.as_str()?.to_owned();
                let value = e.get("value")?.as_str()?.to_owned();
                Some((name, value))
            })
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| bad("env entries need a name and a value"))?,
        Some(_) => return Err(bad("env must be a list")),
    };
    if text("interactiveMode") == Some("Always") {
        return Err(bad(
            "has interactiveMode Always, but crproxy runs without a terminal",
        ));
    }
    Ok(ExecConfig {
        command,
        args,
        env,
        api_version: text("apiVersion").map(str::to_owned),
        provide_cluster_info: exec
            .get("provideClusterInfo")
            .and_then(serde_json::Value::as_bool)
            .unwrap_or(false),
        install_hint: text("installHint").map(str::to_owned),
    })
}

/// The bytes of a kubeconfig `*-data` field at `field`.
fn decode_b64(field: &str, data: &str) -> Result<Vec<u8>, Error> {
    // kubectl tolerates embedded whitespace/newlines in *-data fields.
    let compact: String = data.chars().filter(|c| !c.is_whitespace()).collect();
    base64::engine::general_purpose::STANDARD
        .decode(compact)
        .map_err(|e| at(field, format!("is not valid base64: {e}")))
}

fn read_file(path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

fn read_token(path: &Path) -> Result<String, String> {
    let bytes = read_file(path)?;
    let token = String::from_utf8(bytes)
        .map_err(|_| format!("token file {} is not UTF-8", path.display()))?;
    Ok(token.trim().to_owned())
}

/// Certificate verifier for `insecure-skip-tls-verify`: accepts any server certificate
/// (but still checks the handshake signatures, so the peer holds the key of whatever it
/// presented). Offers no protection against an active attacker.
#[derive(Debug)]
pub struct InsecureAcceptAnyServerCert {
    provider: Arc<CryptoProvider>,
}

impl InsecureAcceptAnyServerCert {
    /// A verifier that checks handshake signatures with `provider`'s algorithms.
    pub fn new(provider: Arc<CryptoProvider>) -> Self {
        Self { provider }
    }
}

impl ServerCertVerifier for InsecureAcceptAnyServerCert {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests;
