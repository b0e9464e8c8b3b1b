//! The authentication and authorization seams of the request pipeline.
//!
//! Authentication, impersonation and RBAC come from `crate::authn` and
//! `crate::rbac`; this module feeds them: the TLS peer certificate, a cached RBAC
//! snapshot (rebuilt only after RBAC objects change) and the token file format.

use crate::admission::AdmissionSnapshot;
use crate::authn::Authenticator;
use crate::error::ApiError;
use crate::rbac::RbacSnapshot;
use crate::registry::GroupResource;
use crate::store::Store;
use crate::types::{RequestAttributes, UserInfo};
use crproxy_core::locks;
use http::HeaderMap;
use rustls_pki_types::CertificateDer;
use serde_json::Value;
use std::sync::{Arc, Mutex};

/// The verified client certificate chain of a TLS connection (leaf first), put
/// into every request's extensions.
#[derive(Clone, Debug)]
pub struct PeerCertificates(pub Arc<Vec<CertificateDer<'static>>>);

/// Parses kube's static token file: `token,user,uid,"group1,group2"` per line.
pub fn parse_token_file(text: &str) -> Result<Vec<(String, UserInfo)>, String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let fields = split_csv(line);
        if fields.len() < 3 {
            return Err(format!("line {}: expected at least token,user,uid", i + 1));
        }
        let groups = fields
            .get(3)
            .map(|g| {
                g.split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        out.push((
            fields[0].clone(),
            UserInfo {
                name: fields[1].clone(),
                uid: fields[2].clone(),
                groups,
                extra: Default::default(),
            },
        ));
    }
    Ok(out)
}

fn split_csv(line: &str) -> Vec<String> {
    let mut fields = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' if quoted && chars.peek() == Some(&'"') => {
                cur.push('"');
                chars.next();
            }
            '"' => quoted = !quoted,
            ',' if !quoted => fields.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    fields.push(cur);
    fields
}

/// One token-file line.
pub fn token_file_line(token: &str, user: &UserInfo) -> String {
    format!(
        "{token},{},{},\"{}\"\n",
        user.name,
        user.uid,
        user.groups.join(",")
    )
}

/// The RBAC snapshot, rebuilt only when a Role, ClusterRole or binding changed.
pub struct PolicyCache {
    rbac: Mutex<Option<([u64; 4], Arc<RbacSnapshot>)>>,
    admission: Mutex<Option<([u64; 3], Arc<AdmissionSnapshot>)>>,
    webhooks: Mutex<Option<([u64; 3], Arc<crate::webhook::WebhookSnapshot>)>>,
}

impl Default for PolicyCache {
    fn default() -> Self {
        PolicyCache {
            rbac: Mutex::new(None),
            admission: Mutex::new(None),
            webhooks: Mutex::new(None),
        }
    }
}

fn gr(group: &str, resource: &str) -> GroupResource {
    (group.to_string(), resource.to_string())
}

const RBAC: &str = "rbac.authorization.k8s.io";
const ADMISSION: &str = "admissionregistration.k8s.io";

fn all(store: &Store, g: &GroupResource) -> Vec<Value> {
    store
        .list(g, None)
        .0
        .iter()
        .map(|o| (**o).clone())
        .collect()
}

impl PolicyCache {
    pub fn rbac(&self, store: &Store) -> Arc<RbacSnapshot> {
        let grs = [
            gr(RBAC, "clusterroles"),
            gr(RBAC, "roles"),
            gr(RBAC, "clusterrolebindings"),
            gr(RBAC, "rolebindings"),
        ];
        let key = [
            store.last_change(&grs[0]),
            store.last_change(&grs[1]),
            store.last_change(&grs[2]),
            store.last_change(&grs[3]),
        ];
        let mut cache = locks::lock(&self.rbac);
        if let Some((k, snap)) = cache.as_ref() {
            if *k == key {
                return snap.clone();
            }
        }
        let snap = Arc::new(RbacSnapshot {
            cluster_roles: all(store, &grs[0]),
            roles: all(store, &grs[1]),
            cluster_role_bindings: all(store, &grs[2]),
            role_bindings: all(store, &grs[3]),
        });
        *cache = Some((key, snap.clone()));
        snap
    }

    /// Policies, bindings and namespaces, or `None` when no policy exists (the
    /// common case, which then costs nothing).
    pub fn admission(&self, store: &Store) -> Option<Arc<AdmissionSnapshot>> {
        let grs = [
            gr(ADMISSION, "validatingadmissionpolicies"),
            gr(ADMISSION, "validatingadmissionpolicybindings"),
            gr("", "namespaces"),
        ];
        if store.count(&grs[0]) == 0 {
            return None;
        }
        let key = [
            store.last_change(&grs[0]),
            store.last_change(&grs[1]),
            store.last_change(&grs[2]),
        ];
        let mut cache = locks::lock(&self.admission);
        if let Some((k, snap)) = cache.as_ref() {
            if *k == key {
                return Some(snap.clone());
            }
        }
        let snap = Arc::new(AdmissionSnapshot {
            policies: all(store, &grs[0]),
            bindings: all(store, &grs[1]),
            namespaces: all(store, &grs[2]),
        });
        *cache = Some((key, snap.clone()));
        Some(snap)
    }

    /// Webhook configurations and namespaces, or `None` when no webhook
    /// configuration exists (then writes skip webhooks at no cost).
    pub fn webhooks(&self, store: &Store) -> Option<Arc<crate::webhook::WebhookSnapshot>> {
        let grs = [
            gr(ADMISSION, "validatingwebhookconfigurations"),
            gr(ADMISSION, "mutatingwebhookconfigurations"),
            gr("", "namespaces"),
        ];
        if store.count(&grs[0]) == 0 && store.count(&grs[1]) == 0 {
            return None;
        }
        let key = [
            store.last_change(&grs[0]),
            store.last_change(&grs[1]),
            store.last_change(&grs[2]),
        ];
        let mut cache = locks::lock(&self.webhooks);
        if let Some((k, snap)) = cache.as_ref() {
            if *k == key {
                return Some(snap.clone());
            }
        }
        let snap = Arc::new(crate::webhook::WebhookSnapshot {
            validating: all(store, &grs[0]),
            mutating: all(store, &grs[1]),
            namespaces: all(store, &grs[2]),
        });
        *cache = Some((key, snap.clone()));
        Some(snap)
    }

    /// Whether RBAC allows the request (`system:masters` without a snapshot).
    pub fn allows(&self, store: &Store, attrs: &RequestAttributes) -> bool {
        if attrs.user.in_system_masters() {
            return true;
        }
        crate::rbac::authorize(&self.rbac(store), attrs) == crate::rbac::Decision::Allow
    }
}

/// kube's Forbidden writer (`responsewriters.Forbidden`, used by the
/// impersonation and authorization filters) adds `X-Content-Type-Options:
/// nosniff`; other 403s, such as admission's NamespaceTerminating, do not
/// (reference exchanges 091 and 130).
fn refusal(status: &Value) -> ApiError {
    let error = ApiError::from_status(status);
    match error.code {
        403 => super::http::nosniff_error(error),
        _ => error,
    }
}

/// Authenticates one request and applies impersonation: the user the request
/// acts as.
pub fn identify(
    authn: &Authenticator,
    policy: &PolicyCache,
    store: &Store,
    headers: &HeaderMap,
    certs: Option<&PeerCertificates>,
) -> Result<UserInfo, ApiError> {
    let leaf = certs.and_then(|c| c.0.first());
    let user = authn
        .authenticate(headers, leaf)
        .map_err(|_| ApiError::from_status(&crate::authn::unauthorized_status()))?;
    crate::authn::impersonate(&user, headers, |a| policy.allows(store, a)).map_err(|s| refusal(&s))
}

/// Authorizes one request of an identified user.
pub fn authorize(
    policy: &PolicyCache,
    store: &Store,
    attrs: RequestAttributes,
) -> Result<RequestAttributes, ApiError> {
    if !policy.allows(store, &attrs) {
        return Err(refusal(&crate::rbac::forbidden_status(&attrs)));
    }
    Ok(attrs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_file_lines_parse_with_quoted_groups() {
        let users = parse_token_file(
            "tok1,admin,admin-uid,\"system:masters\"\ntok2,alice,2,\"developers,qa\"\n\ntok3,bob,3\n",
        )
        .expect("parse");
        assert_eq!(users.len(), 3);
        assert_eq!(users[1].1.groups, vec!["developers", "qa"]);
        assert!(users[2].1.groups.is_empty());
        let line = token_file_line("t", &users[1].1);
        assert_eq!(line, "t,alice,2,\"developers,qa\"\n");
    }
}
