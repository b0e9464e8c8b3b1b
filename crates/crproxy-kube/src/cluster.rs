//! Where a cluster is and how to authenticate to it, independent of any HTTP client, so
//! the proxy can dial a target's peers with the same TLS material the [`crate::Client`]
//! uses.

use crate::kubeconfig::Kubeconfig;
use crate::Error;
use base64::Engine as _;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::{DigitallySignedStruct, SignatureScheme};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use std::fmt;
use std::path::Path;
use std::sync::Arc;

/// How requests authenticate.
#[derive(Clone, PartialEq, Eq)]
pub enum Auth {
    /// Anonymous.
    None,
    /// `Authorization: Bearer <token>`.
    Token(String),
    /// A TLS client certificate (PEM) and its private key (PEM).
    ClientCert { cert_pem: Vec<u8>, key_pem: Vec<u8> },
}

// Hand-written so tokens and keys never end up in logs.
impl fmt::Debug for Auth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Auth::None => f.write_str("None"),
            Auth::Token(_) => f.write_str("Token(<redacted>)"),
            Auth::ClientCert { .. } => f.write_str("ClientCert { <redacted> }"),
        }
    }
}

/// One API server endpoint and the credentials for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterConfig {
    /// `https://host:port`, optionally with a path prefix.
    pub server: url::Url,
    /// PEM bundle of trusted CAs. `None` trusts nothing (every handshake fails) unless
    /// `insecure_skip_tls_verify` is set: there is deliberately no fallback to system
    /// roots, API servers use private CAs.
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
    /// directory.
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
        let server = url::Url::parse(&cluster.server).map_err(|e| {
            Error::Kubeconfig(format!(
                "cluster {:?} has an invalid server URL {:?}: {e}",
                ctx.context.cluster, cluster.server
            ))
        })?;
        let ca_pem = match (
            &cluster.certificate_authority_data,
            &cluster.certificate_authority,
        ) {
            (Some(data), _) => Some(decode_b64("certificate-authority-data", data)?),
            (None, Some(path)) => Some(read_file(&kc.resolve(path))?),
            (None, None) => None,
        };
        // A context without a user (or naming an unknown one) is anonymous, as in
        // kubectl.
        let user = kc
            .users
            .iter()
            .find(|u| u.name == ctx.context.user)
            .map(|u| u.user.clone())
            .unwrap_or_default();
        let cert = match (&user.client_certificate_data, &user.client_certificate) {
            (Some(data), _) => Some(decode_b64("client-certificate-data", data)?),
            (None, Some(path)) => Some(read_file(&kc.resolve(path))?),
            (None, None) => None,
        };
        let key = match (&user.client_key_data, &user.client_key) {
            (Some(data), _) => Some(decode_b64("client-key-data", data)?),
            (None, Some(path)) => Some(read_file(&kc.resolve(path))?),
            (None, None) => None,
        };
        let token = match (&user.token, &user.token_file) {
            (Some(t), _) if !t.is_empty() => Some(t.clone()),
            (_, Some(path)) => Some(read_token(&kc.resolve(path))?),
            _ => None,
        };
        let auth = match (cert, key, token) {
            (Some(cert_pem), Some(key_pem), _) => Auth::ClientCert { cert_pem, key_pem },
            (Some(_), None, _) | (None, Some(_), _) => {
                return Err(Error::Kubeconfig(format!(
                    "user {:?} has a client certificate or key but not both",
                    ctx.context.user
                )))
            }
            (None, None, Some(t)) => Auth::Token(t),
            (None, None, None) if user.exec.is_some() || user.auth_provider.is_some() => {
                return Err(Error::Kubeconfig(format!(
                    "user {:?} authenticates with an exec plugin or auth provider, which crproxy does not support; use a token, tokenFile or client certificate",
                    ctx.context.user
                )))
            }
            (None, None, None) => Auth::None,
        };
        Ok(ClusterConfig {
            server,
            ca_pem,
            tls_server_name: cluster.tls_server_name.filter(|s| !s.is_empty()),
            insecure_skip_tls_verify: cluster.insecure_skip_tls_verify.unwrap_or(false),
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
        let token = read_token(&sa_dir.join("token"))?;
        let ca = read_file(&sa_dir.join("ca.crt"))?;
        Ok(ClusterConfig {
            server,
            ca_pem: Some(ca),
            tls_server_name: None,
            insecure_skip_tls_verify: false,
            auth: Auth::Token(token),
        })
    }

    /// The bearer token, when authenticating by token.
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
    /// the ring provider explicitly so no process-wide default provider is needed.
    pub fn rustls_config(&self, alpn: &[&[u8]]) -> Result<rustls::ClientConfig, Error> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
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
            let mut roots = rustls::RootCertStore::empty();
            if let Some(pem) = &self.ca_pem {
                let certs = parse_certs(pem, "CA bundle")?;
                for cert in certs {
                    roots
                        .add(cert)
                        .map_err(|e| Error::Tls(format!("CA certificate rejected: {e}")))?;
                }
            }
            builder.with_root_certificates(roots)
        };
        let mut config = match &self.auth {
            Auth::ClientCert { cert_pem, key_pem } => {
                let certs = parse_certs(cert_pem, "client certificate")?;
                let key = PrivateKeyDer::from_pem_slice(key_pem)
                    .map_err(|e| Error::Tls(format!("cannot parse the client key PEM: {e}")))?;
                builder
                    .with_client_auth_cert(certs, key)
                    .map_err(|e| Error::Tls(format!("client certificate rejected: {e}")))?
            }
            Auth::None | Auth::Token(_) => builder.with_no_client_auth(),
        };
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Ok(config)
    }
}

fn parse_certs(pem: &[u8], what: &str) -> Result<Vec<CertificateDer<'static>>, Error> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Error::Tls(format!("cannot parse the {what} PEM: {e}")))?;
    if certs.is_empty() {
        return Err(Error::Tls(format!("the {what} PEM holds no certificate")));
    }
    Ok(certs)
}

fn decode_b64(field: &str, data: &str) -> Result<Vec<u8>, Error> {
    // kubectl tolerates embedded whitespace/newlines in *-data fields.
    let compact: String = data.chars().filter(|c| !c.is_whitespace()).collect();
    base64::engine::general_purpose::STANDARD
        .decode(compact)
        .map_err(|e| Error::Kubeconfig(format!("{field} is not valid base64: {e}")))
}

fn read_file(path: &Path) -> Result<Vec<u8>, Error> {
    std::fs::read(path)
        .map_err(|e| Error::Kubeconfig(format!("cannot read {}: {e}", path.display())))
}

fn read_token(path: &Path) -> Result<String, Error> {
    let bytes = read_file(path)?;
    let token = String::from_utf8(bytes)
        .map_err(|_| Error::Kubeconfig(format!("token file {} is not UTF-8", path.display())))?;
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
