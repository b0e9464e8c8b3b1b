//! PEM certificates and keys as kubeconfigs and exec plugins give them, parsed the one
//! way both loading a kubeconfig (which reports a problem against the field it came
//! from) and building TLS configs and client identities (which report it at run time)
//! use.
//!
//! Problems are predicates ("holds no PEM certificate"), so each caller puts its own
//! subject in front: a kubeconfig field, a file, "the CA bundle".

use base64::Engine as _;
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::sync::Arc;

/// Where PEM bytes came from, which decides the hint for bytes that are base64 of PEM
/// rather than PEM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Origin {
    /// A kubeconfig `*-data` field, already base64-decoded once.
    Data,
    /// A file a kubeconfig names, read as is.
    File,
    /// Anything else (exec plugin output, a config built in code).
    Other,
}

/// The certificates in `pem`, at least one.
pub(crate) fn certificates(
    pem: &[u8],
    origin: Origin,
) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("is not valid PEM: {}", pem_error(&e)))?;
    if certs.is_empty() {
        return Err(format!("holds no PEM certificate{}", hint(pem, origin)));
    }
    Ok(certs)
}

/// The private key in `pem`.
pub(crate) fn private_key(pem: &[u8], origin: Origin) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| match e {
        rustls_pki_types::pem::Error::NoItemsFound => {
            format!("holds no PEM private key{}", hint(pem, origin))
        }
        e => format!("is not a valid PEM private key: {}", pem_error(&e)),
    })
}

/// The trust anchors of a CA bundle.
pub(crate) fn root_store(pem: &[u8], origin: Origin) -> Result<rustls::RootCertStore, String> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in certificates(pem, origin)? {
        roots
            .add(cert)
            .map_err(|e| format!("holds a certificate that cannot be a CA: {e}"))?;
    }
    Ok(roots)
}

/// What is wrong with a client certificate and key, and with which of the two.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum PairProblem {
    Certificate(String),
    Key(String),
    /// Both parse, but the key is not the certificate's.
    Mismatch,
}

/// A client certificate chain and its key, as rustls presents them.
pub(crate) fn client_pair(
    cert_pem: &[u8],
    key_pem: &[u8],
    origin: Origin,
) -> Result<Arc<CertifiedKey>, PairProblem> {
    let certs = certificates(cert_pem, origin).map_err(PairProblem::Certificate)?;
    let key = private_key(key_pem, origin).map_err(PairProblem::Key)?;
    let provider = crate::crypto_provider();
    let key = provider
        .key_provider
        .load_private_key(key)
        .map_err(|e| PairProblem::Key(format!("holds a key crproxy cannot use: {e}")))?;
    let pair = CertifiedKey::new(certs, key);
    match pair.keys_match() {
        // A key whose public half rustls cannot tell is taken on trust, as rustls's own
        // `CertifiedKey::from_der` does.
        Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {
            Ok(Arc::new(pair))
        }
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) => {
            Err(PairProblem::Mismatch)
        }
        Err(e) => Err(PairProblem::Certificate(format!(
            "holds a certificate that cannot be parsed: {e}"
        ))),
    }
}

/// A PEM syntax error in words (the library's own rendering shows markers as lists
/// of byte values).
fn pem_error(error: &rustls_pki_types::pem::Error) -> String {
    use rustls_pki_types::pem::Error;
    match error {
        Error::MissingSectionEnd { end_marker } => format!(
            "there is no \"-----END {}-----\" line (cut short?)",
            String::from_utf8_lossy(end_marker)
        ),
        Error::IllegalSectionStart { line } => {
            format!("malformed line {:?}", String::from_utf8_lossy(line))
        }
        Error::Base64Decode(e) => format!("a section is not valid base64: {e}"),
        e => e.to_string(),
    }
}

/// Why bytes that hold no PEM may be so: the commonest cause is PEM base64-encoded
/// once more than the place takes (a Secret's `.data` value copied into a `*-data`
/// field, which kubectl decodes once).
fn hint(bytes: &[u8], origin: Origin) -> &'static str {
    if !is_base64_of_pem(bytes) {
        return "";
    }
    match origin {
        Origin::Data => " (base64-encoded twice?)",
        Origin::File => " (the file holds base64: write the decoded PEM text)",
        Origin::Other => " (base64-encoded once too often?)",
    }
}

fn is_base64_of_pem(bytes: &[u8]) -> bool {
    let compact: Vec<u8> = bytes
        .iter()
        .copied()
        .filter(|b| !b.is_ascii_whitespace())
        .collect();
    base64::engine::general_purpose::STANDARD
        .decode(compact)
        .is_ok_and(|decoded| decoded.windows(11).any(|w| w == b"-----BEGIN "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crproxy_core::pki::CertificateAuthority;

    fn b64(bytes: &[u8]) -> Vec<u8> {
        base64::engine::general_purpose::STANDARD
            .encode(bytes)
            .into_bytes()
    }

    #[test]
    fn certificates_say_why_there_is_none() {
        let ca = CertificateAuthority::generate("test-ca").expect("ca");
        let pem = ca.pem().cert.as_bytes();
        assert_eq!(certificates(pem, Origin::Data).map(|c| c.len()), Ok(1));
        for (bytes, origin, want) in [
            (
                b64(pem),
                Origin::Data,
                "holds no PEM certificate (base64-encoded twice?)",
            ),
            (
                b64(pem),
                Origin::File,
                "holds no PEM certificate (the file holds base64: write the decoded PEM text)",
            ),
            (b"hello".to_vec(), Origin::Data, "holds no PEM certificate"),
            (
                ca.pem().key.as_bytes().to_vec(),
                Origin::File,
                "holds no PEM certificate",
            ),
        ] {
            assert_eq!(
                certificates(&bytes, origin).map(|c| c.len()),
                Err(want.to_string())
            );
        }
    }

    #[test]
    fn client_pairs_name_the_half_that_is_wrong() {
        let ca = CertificateAuthority::generate("test-ca").expect("ca");
        let client = ca.issue_client("admin", &[]).expect("client");
        let other = ca.issue_client("other", &[]).expect("client");
        let (cert, key) = (client.cert.as_bytes(), client.key.as_bytes());
        assert!(client_pair(cert, key, Origin::Data).is_ok());
        let problem = |cert: &[u8], key: &[u8]| client_pair(cert, key, Origin::Data).err();
        assert_eq!(
            problem(&b64(cert), key),
            Some(PairProblem::Certificate(
                "holds no PEM certificate (base64-encoded twice?)".into()
            ))
        );
        assert_eq!(
            problem(cert, &b64(key)),
            Some(PairProblem::Key(
                "holds no PEM private key (base64-encoded twice?)".into()
            ))
        );
        assert_eq!(
            problem(cert, other.key.as_bytes()),
            Some(PairProblem::Mismatch)
        );
    }
}
