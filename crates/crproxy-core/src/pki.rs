//! Certificate authorities and leaf certificates, generated in memory as PEM.
//!
//! devcluster (serving, client and front-proxy certificates), the proxy (its serving
//! certificate, whose CA goes into the APIService `caBundle`) and the test harness all
//! need the same few shapes, so they are made here, in one place. No I/O: callers
//! decide where the PEM goes.

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use std::net::IpAddr;

/// A certificate failed to generate or a stored one failed to load.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    /// rcgen rejected the parameters or the stored PEM.
    #[error("certificate generation failed: {0}")]
    Rcgen(#[from] rcgen::Error),
}

/// A PEM certificate and its PEM private key.
#[derive(Clone, Debug)]
pub struct CertPem {
    pub cert: String,
    pub key: String,
}

/// A certificate authority that can issue leaf certificates.
pub struct CertificateAuthority {
    pem: CertPem,
    issuer: Issuer<'static, KeyPair>,
}

impl CertificateAuthority {
    /// A new self-signed CA named `common_name`, valid for ten years.
    pub fn generate(common_name: &str) -> Result<Self, PkiError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        params.distinguished_name = name(common_name, &[]);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        set_validity(&mut params);
        let cert = params.self_signed(&key)?;
        let pem = CertPem {
            cert: cert.pem(),
            key: key.serialize_pem(),
        };
        Self::from_pem(&pem)
    }

    /// Loads a CA previously produced by [`CertificateAuthority::generate`].
    pub fn from_pem(pem: &CertPem) -> Result<Self, PkiError> {
        let key = KeyPair::from_pem(&pem.key)?;
        let issuer = Issuer::from_ca_cert_pem(&pem.cert, key)?;
        Ok(Self {
            pem: pem.clone(),
            issuer,
        })
    }

    /// The CA certificate and key.
    pub fn pem(&self) -> &CertPem {
        &self.pem
    }

    /// A TLS server certificate for the given DNS names and IP addresses.
    pub fn issue_server(&self, dns_names: &[&str], ips: &[IpAddr]) -> Result<CertPem, PkiError> {
        let common_name = dns_names.first().copied().unwrap_or("server");
        let mut params = CertificateParams::default();
        params.distinguished_name = name(common_name, &[]);
        params.subject_alt_names = dns_names
            .iter()
            .filter_map(|d| (*d).try_into().ok().map(SanType::DnsName))
            .chain(ips.iter().map(|ip| SanType::IpAddress(*ip)))
            .collect();
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        self.issue(params)
    }

    /// A TLS client certificate: CN is the user name, O entries are the groups, as
    /// Kubernetes reads them.
    pub fn issue_client(&self, user: &str, groups: &[&str]) -> Result<CertPem, PkiError> {
        let mut params = CertificateParams::default();
        params.distinguished_name = name(user, groups);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        self.issue(params)
    }

    fn issue(&self, mut params: CertificateParams) -> Result<CertPem, PkiError> {
        set_validity(&mut params);
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(CertPem {
            cert: cert.pem(),
            key: key.serialize_pem(),
        })
    }
}

fn name(common_name: &str, organizations: &[&str]) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    for org in organizations {
        dn.push(DnType::OrganizationName, *org);
    }
    dn.push(DnType::CommonName, common_name);
    dn
}

fn set_validity(params: &mut CertificateParams) {
    // One day in the past tolerates small clock differences between processes.
    let now = std::time::SystemTime::now();
    params.not_before = (now - std::time::Duration::from_secs(24 * 3600)).into();
    params.not_after = (now + std::time::Duration::from_secs(10 * 365 * 24 * 3600)).into();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ca_round_trips_through_pem_and_issues_leaves() {
        let ca = CertificateAuthority::generate("test-ca").expect("ca");
        let again = CertificateAuthority::from_pem(ca.pem()).expect("reload");
        let server = again
            .issue_server(&["localhost"], &["127.0.0.1".parse().expect("ip")])
            .expect("server");
        assert!(server.cert.starts_with("-----BEGIN CERTIFICATE-----"));
        let client = again
            .issue_client("alice", &["developers", "system:authenticated"])
            .expect("client");
        assert!(client.key.contains("PRIVATE KEY"));
    }
}
