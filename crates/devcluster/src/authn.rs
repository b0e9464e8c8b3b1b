//! Authentication: who is calling, as kube-apiserver decides it.
//!
//! Order and outcomes follow kube-apiserver with `--token-auth-file` and the default
//! `--anonymous-auth=true`:
//!
//! 1. a client certificate that the TLS layer already verified against the client CA
//!    names the user (CN) and the groups (O entries);
//! 2. otherwise an `Authorization: Bearer <token>` header is looked up in the static
//!    token file (plus tokens added at run time by tests); an unknown token is a 401,
//!    and it stays a 401 even for `/version` (reference 083/084) because anonymous
//!    access is only the fallback for requests that carry *no* credentials;
//! 3. otherwise the caller is `system:anonymous` in `system:unauthenticated`, which
//!    RBAC then refuses almost everything (reference 081/082).
//!
//! Every authenticated user also gets the `system:authenticated` group.
//!
//! [`impersonate`] runs after authentication, before authorization, as kube's
//! impersonation filter: every requested identity part is authorized separately with
//! the verb `impersonate`.

use crate::types::{RequestAttributes, UserInfo};
use crproxy_core::locks;
use http::HeaderMap;
use rustls_pki_types::CertificateDer;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::sync::RwLock;

/// The group every authenticated caller is in.
pub const AUTHENTICATED_GROUP: &str = "system:authenticated";
/// The group of the anonymous user.
pub const UNAUTHENTICATED_GROUP: &str = "system:unauthenticated";
/// The user name of a request without credentials.
pub const ANONYMOUS_USER: &str = "system:anonymous";

/// Why a caller could not be authenticated, or why the token file is unusable.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AuthnError {
    /// Credentials were presented but are not valid (unknown bearer token, unreadable
    /// client certificate), or none were presented and anonymous access is off.
    /// Answer with [`unauthorized_status`] (HTTP 401).
    #[error("invalid bearer token")]
    Unauthorized,
    /// A line of the static token file does not have the `token,user,uid[,groups]`
    /// shape; fix the file (`DATA/tokens.csv`) and restart.
    #[error("token file line {line}: {reason}")]
    TokenFile { line: usize, reason: String },
}

/// Looks callers up by client certificate or bearer token.
pub struct Authenticator {
    tokens: RwLock<HashMap<String, UserInfo>>,
    anonymous_enabled: bool,
    audiences: RwLock<Vec<String>>,
}

/// The audience kube-apiserver reports for tokens that are not audience-bound, when
/// no `--api-audiences` are configured it uses the service account issuer; ours is
/// fixed.
pub const DEFAULT_API_AUDIENCE: &str = "https://kubernetes.default.svc.cluster.local";

impl Authenticator {
    /// Reads a kube static token file (`token,user,uid,"group1,group2"`; the groups
    /// column is optional) and decides whether requests without credentials run as
    /// `system:anonymous`.
    pub fn new(tokens_csv: &str, anonymous_enabled: bool) -> Result<Self, AuthnError> {
        let mut tokens = HashMap::new();
        for (index, line) in tokens_csv.lines().enumerate() {
            let line_no = index + 1;
            // Blank lines carry no record for Go's csv reader; `#` lines are accepted
            // as comments so generated files can explain themselves.
            if line.trim().is_empty() || line.trim_start().starts_with('#') {
                continue;
            }
            let fields = split_csv_line(line).map_err(|reason| AuthnError::TokenFile {
                line: line_no,
                reason,
            })?;
            if fields.len() < 3 {
                return Err(AuthnError::TokenFile {
                    line: line_no,
                    reason: format!(
                        "expected at least 3 columns (token,user,uid), found {}",
                        fields.len()
                    ),
                });
            }
            let token = fields[0].trim().to_string();
            if token.is_empty() {
                // kube warns and skips such a record.
                tracing::warn!(
                    line = line_no,
                    "empty token in the token file; record ignored"
                );
                continue;
            }
            let groups = fields
                .get(3)
                .map(|g| {
                    g.split(',')
                        .map(str::trim)
                        .filter(|g| !g.is_empty())
                        .map(String::from)
                        .collect()
                })
                .unwrap_or_default();
            tokens.insert(
                token,
                UserInfo {
                    name: fields[1].trim().to_string(),
                    uid: fields[2].trim().to_string(),
                    groups,
                    extra: BTreeMap::new(),
                },
            );
        }
        Ok(Self {
            tokens: RwLock::new(tokens),
            anonymous_enabled,
            audiences: RwLock::new(vec![DEFAULT_API_AUDIENCE.to_string()]),
        })
    }

    /// Registers (or replaces) a bearer token at run time, for users tests create.
    /// `user.groups` should not contain `system:authenticated`; it is added on use.
    pub fn add_token(&self, token: impl Into<String>, user: UserInfo) {
        let mut tokens = locks::write(&self.tokens);
        tokens.insert(token.into(), user);
    }

    /// Forgets a bearer token: later requests with it are 401.
    pub fn remove_token(&self, token: &str) {
        let mut tokens = locks::write(&self.tokens);
        tokens.remove(token);
    }

    /// The first token (in sort order) of a user, for writing kubeconfigs.
    pub fn token_of(&self, user: &str) -> Option<String> {
        let tokens = locks::read(&self.tokens);
        tokens
            .iter()
            .filter(|(_, u)| u.name == user)
            .map(|(t, _)| t)
            .min()
            .cloned()
    }

    /// Sets the audiences reported by TokenReview (kube's `--api-audiences`).
    pub fn set_api_audiences(&self, audiences: Vec<String>) {
        *locks::write(&self.audiences) = audiences;
    }

    /// The configured API audiences.
    pub fn api_audiences(&self) -> Vec<String> {
        locks::read(&self.audiences).clone()
    }

    /// Who is calling. `peer_cert` is the leaf client certificate, already verified by
    /// the TLS layer against the client CA (pass `None` when the client sent none).
    pub fn authenticate(
        &self,
        headers: &HeaderMap,
        peer_cert: Option<&CertificateDer<'_>>,
    ) -> Result<UserInfo, AuthnError> {
        if let Some(cert) = peer_cert {
            return user_from_certificate(cert.as_ref()).map(with_authenticated_group);
        }
        if let Some(token) = bearer_token(headers) {
            return self.authenticate_token(token);
        }
        if self.anonymous_enabled {
            return Ok(anonymous_user());
        }
        Err(AuthnError::Unauthorized)
    }

    /// Looks a bearer token up (also what TokenReview does). The returned user has
    /// `system:authenticated`.
    pub fn authenticate_token(&self, token: &str) -> Result<UserInfo, AuthnError> {
        let tokens = locks::read(&self.tokens);
        tokens
            .get(token)
            .cloned()
            .map(with_authenticated_group)
            .ok_or(AuthnError::Unauthorized)
    }
}

/// The anonymous caller, as kube builds it.
pub fn anonymous_user() -> UserInfo {
    UserInfo {
        name: ANONYMOUS_USER.into(),
        uid: String::new(),
        groups: vec![UNAUTHENTICATED_GROUP.into()],
        extra: BTreeMap::new(),
    }
}

fn with_authenticated_group(mut user: UserInfo) -> UserInfo {
    if !user.groups.iter().any(|g| g == AUTHENTICATED_GROUP) {
        user.groups.push(AUTHENTICATED_GROUP.into());
    }
    user
}

/// The token of an `Authorization: Bearer <token>` header. Other schemes and empty
/// tokens are ignored, as kube does, so such a request falls through to anonymous.
fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(http::header::AUTHORIZATION)?.to_str().ok()?;
    let value = value.trim();
    let (scheme, token) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let token = token.trim();
    (!token.is_empty()).then_some(token)
}

/// CN is the user name, each O is a group; kube reads no uid from certificates.
fn user_from_certificate(der: &[u8]) -> Result<UserInfo, AuthnError> {
    let (_, cert) =
        x509_parser::parse_x509_certificate(der).map_err(|_| AuthnError::Unauthorized)?;
    let subject = cert.subject();
    let name = subject
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .unwrap_or_default()
        .to_string();
    if name.is_empty() {
        // kube refuses certificates without a common name.
        return Err(AuthnError::Unauthorized);
    }
    let groups = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok())
        .map(String::from)
        .collect();
    Ok(UserInfo {
        name,
        uid: String::new(),
        groups,
        extra: BTreeMap::new(),
    })
}

/// Splits one CSV record (RFC 4180 quoting, as Go's encoding/csv reads the token
/// file).
fn split_csv_line(line: &str) -> Result<Vec<String>, String> {
    let mut fields = Vec::new();
    let mut field = String::new();
    let mut chars = line.chars().peekable();
    let mut in_quotes = false;
    let mut was_quoted = false;
    while let Some(c) = chars.next() {
        match (in_quotes, c) {
            (true, '"') => {
                if chars.peek() == Some(&'"') {
                    chars.next();
                    field.push('"');
                } else {
                    in_quotes = false;
                }
            }
            (true, c) => field.push(c),
            (false, '"') if field.is_empty() && !was_quoted => {
                in_quotes = true;
                was_quoted = true;
            }
            (false, ',') => {
                fields.push(std::mem::take(&mut field));
                was_quoted = false;
            }
            (false, c) => {
                if was_quoted {
                    return Err(format!("unexpected {c:?} after a closing quote"));
                }
                field.push(c)
            }
        }
    }
    if in_quotes {
        return Err("unterminated quoted field".into());
    }
    fields.push(field);
    Ok(fields)
}

/// A `Status` failure object as kube-apiserver writes it.
pub(crate) fn failure_status(
    code: u16,
    reason: &str,
    message: &str,
    details: Option<Value>,
) -> Value {
    let mut status = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
    });
    if !reason.is_empty() {
        status["reason"] = json!(reason);
    }
    if let Some(details) = details {
        status["details"] = details;
    }
    status["code"] = json!(code);
    status
}

/// The 401 body: no details, no `WWW-Authenticate` (reference 083).
pub fn unauthorized_status() -> Value {
    failure_status(401, "Unauthorized", "Unauthorized", None)
}

const IMPERSONATE_USER: &str = "impersonate-user";
const IMPERSONATE_UID: &str = "impersonate-uid";
const IMPERSONATE_GROUP: &str = "impersonate-group";
const IMPERSONATE_EXTRA_PREFIX: &str = "impersonate-extra-";

/// True when the request carries any `Impersonate-*` header.
pub fn has_impersonation_headers(headers: &HeaderMap) -> bool {
    headers
        .keys()
        .any(|k| k.as_str().starts_with("impersonate-"))
}

/// Applies `Impersonate-*` headers. Without them the caller is returned unchanged.
///
/// Each requested part is checked with `authorize` (verb `impersonate`): the user
/// (`users`, or `serviceaccounts` for `system:serviceaccount:<ns>:<name>`), every
/// group (`groups`), every extra value (`userextras/<key>` in `authentication.k8s.io`)
/// and the uid (`uids` in `authentication.k8s.io`). The first refusal is the 403
/// Status kube writes (reference 091/092); asking for groups, extras or a uid without
/// a user is a 500 as in kube.
///
/// The caller must remove the `Impersonate-*` headers before forwarding the request
/// anywhere (the aggregation proxy never forwards them).
pub fn impersonate(
    user: &UserInfo,
    headers: &HeaderMap,
    authorize: impl Fn(&RequestAttributes) -> bool,
) -> Result<UserInfo, Value> {
    if !has_impersonation_headers(headers) {
        return Ok(user.clone());
    }
    let header_values = |name: &str| -> Vec<String> {
        headers
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .map(String::from)
            .collect()
    };
    // Empty values count as absent, as Go's `Header.Get` + length checks do.
    let target_user = header_values(IMPERSONATE_USER)
        .into_iter()
        .find(|v| !v.is_empty());
    let groups = header_values(IMPERSONATE_GROUP);
    let uid = header_values(IMPERSONATE_UID)
        .into_iter()
        .find(|v| !v.is_empty());
    let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, value) in headers {
        if let Some(raw_key) = name.as_str().strip_prefix(IMPERSONATE_EXTRA_PREFIX) {
            let key = percent_encoding::percent_decode_str(raw_key)
                .decode_utf8_lossy()
                .to_lowercase();
            if let Ok(v) = value.to_str() {
                extra.entry(key).or_default().push(v.to_string());
            }
        }
    }

    if target_user.is_none() && groups.is_empty() && extra.is_empty() && uid.is_none() {
        return Ok(user.clone());
    }
    let Some(target_user) = target_user else {
        let mut requested = Vec::new();
        requested.extend(groups.iter().map(|g| format!("group {g:?}")));
        requested.extend(extra.keys().map(|k| format!("extra {k:?}")));
        requested.extend(uid.iter().map(|u| format!("uid {u:?}")));
        let message = format!(
            "Internal error occurred: requested [{}] without impersonating a user",
            requested.join(" ")
        );
        return Err(failure_status(
            500,
            "InternalError",
            &message,
            Some(json!({"causes": [{"message": message}]})),
        ));
    };

    let check = |attrs: RequestAttributes| -> Result<(), Value> {
        if authorize(&attrs) {
            Ok(())
        } else {
            Err(crate::rbac::forbidden_status(&attrs))
        }
    };
    let base = RequestAttributes {
        user: user.clone(),
        verb: "impersonate".into(),
        resource_request: true,
        ..Default::default()
    };

    let mut new_groups = groups.clone();
    if let Some((ns, name)) = split_service_account(&target_user) {
        check(RequestAttributes {
            resource: "serviceaccounts".into(),
            namespace: ns.to_string(),
            name: name.to_string(),
            ..base.clone()
        })?;
        if groups.is_empty() {
            new_groups = vec![
                "system:serviceaccounts".to_string(),
                format!("system:serviceaccounts:{ns}"),
            ];
        }
    } else {
        check(RequestAttributes {
            resource: "users".into(),
            name: target_user.clone(),
            ..base.clone()
        })?;
    }
    for group in &groups {
        check(RequestAttributes {
            resource: "groups".into(),
            name: group.clone(),
            ..base.clone()
        })?;
    }
    for (key, values) in &extra {
        for value in values {
            check(RequestAttributes {
                api_group: "authentication.k8s.io".into(),
                resource: "userextras".into(),
                subresource: key.clone(),
                name: value.clone(),
                ..base.clone()
            })?;
        }
    }
    if let Some(uid) = &uid {
        check(RequestAttributes {
            api_group: "authentication.k8s.io".into(),
            resource: "uids".into(),
            name: uid.clone(),
            ..base.clone()
        })?;
    }

    let implicit = if target_user == ANONYMOUS_USER {
        UNAUTHENTICATED_GROUP
    } else {
        AUTHENTICATED_GROUP
    };
    if !new_groups.iter().any(|g| g == implicit) {
        new_groups.push(implicit.to_string());
    }
    Ok(UserInfo {
        name: target_user,
        uid: uid.unwrap_or_default(),
        groups: new_groups,
        extra,
    })
}

/// `system:serviceaccount:<ns>:<name>` → (ns, name).
pub fn split_service_account(user: &str) -> Option<(&str, &str)> {
    let rest = user.strip_prefix("system:serviceaccount:")?;
    let (ns, name) = rest.split_once(':')?;
    (!ns.is_empty() && !name.is_empty() && !name.contains(':')).then_some((ns, name))
}

#[cfg(test)]
#[path = "authn/tests.rs"]
mod tests;
