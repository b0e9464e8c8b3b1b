//! The authentication and authorization seams of the request pipeline.
//!
//! Until the full authn/RBAC modules are wired in, these are deliberately simple:
//! bearer tokens from the static token file, x509 client certificates (CN = user,
//! O = groups), anonymous requests as `system:anonymous`, and an authorizer that
//! allows `system:masters`, discovery and health paths, and self-reviews.

use crate::error::{ApiError, Details};
use crate::types::{RequestAttributes, UserInfo};
use http::HeaderMap;
use rustls_pki_types::CertificateDer;
use std::collections::HashMap;
use std::sync::{Arc, RwLock};

/// The verified client certificate chain of a TLS connection (leaf first), put
/// into every request's extensions.
#[derive(Clone, Debug)]
pub struct PeerCertificates(pub Arc<Vec<CertificateDer<'static>>>);

/// Users known by bearer token.
#[derive(Default)]
pub struct TokenUsers {
    tokens: RwLock<HashMap<String, UserInfo>>,
}

impl TokenUsers {
    pub fn insert(&self, token: &str, user: UserInfo) {
        self.tokens
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(token.to_string(), user);
    }

    pub fn lookup(&self, token: &str) -> Option<UserInfo> {
        self.tokens
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(token)
            .cloned()
    }
}

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

pub fn unauthorized() -> ApiError {
    ApiError::new(401, "Unauthorized", "Unauthorized")
}

/// Who sent the request: a bearer token wins over a client certificate; neither
/// means anonymous. An unknown token is 401.
pub fn authenticate(
    tokens: &TokenUsers,
    headers: &HeaderMap,
    certs: Option<&PeerCertificates>,
) -> Result<UserInfo, ApiError> {
    if let Some(auth) = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    {
        let token = auth
            .strip_prefix("Bearer ")
            .or_else(|| auth.strip_prefix("bearer "))
            .map(str::trim)
            .unwrap_or("");
        if token.is_empty() {
            return Err(unauthorized());
        }
        let mut user = tokens.lookup(token).ok_or_else(unauthorized)?;
        add_group(&mut user, "system:authenticated");
        return Ok(user);
    }
    if let Some(leaf) = certs.and_then(|c| c.0.first()) {
        if let Some(mut user) = user_from_cert(leaf) {
            add_group(&mut user, "system:authenticated");
            return Ok(user);
        }
    }
    Ok(UserInfo {
        name: "system:anonymous".into(),
        uid: String::new(),
        groups: vec!["system:unauthenticated".into()],
        extra: Default::default(),
    })
}

fn add_group(user: &mut UserInfo, group: &str) {
    if !user.groups.iter().any(|g| g == group) {
        user.groups.push(group.to_string());
    }
}

/// CN = user, O = groups, as kube's x509 authenticator reads a client certificate.
pub fn user_from_cert(der: &CertificateDer<'_>) -> Option<UserInfo> {
    let (_, cert) = x509_parser::parse_x509_certificate(der.as_ref()).ok()?;
    let subject = cert.subject();
    let name = subject
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())?
        .to_string();
    let groups = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_string))
        .collect();
    Some(UserInfo {
        name,
        uid: String::new(),
        groups,
        extra: Default::default(),
    })
}

/// Applies `Impersonate-User` / `Impersonate-Group` when the caller may.
pub fn impersonate(
    user: UserInfo,
    headers: &HeaderMap,
    authorize: impl Fn(&RequestAttributes) -> Result<(), ApiError>,
) -> Result<UserInfo, ApiError> {
    let Some(target) = headers
        .get("impersonate-user")
        .and_then(|v| v.to_str().ok())
    else {
        if headers.contains_key("impersonate-group") {
            return Err(ApiError::new(
                500,
                "InternalError",
                "requested [{Group  system:masters  authentication.k8s.io/v1  }] without impersonating a user",
            ));
        }
        return Ok(user);
    };
    let check = |resource: &str, name: &str| {
        authorize(&RequestAttributes {
            user: user.clone(),
            verb: "impersonate".into(),
            resource_request: true,
            resource: resource.into(),
            name: name.into(),
            ..Default::default()
        })
    };
    check("users", target)?;
    let groups: Vec<String> = headers
        .get_all("impersonate-group")
        .iter()
        .filter_map(|v| v.to_str().ok().map(str::to_string))
        .collect();
    for g in &groups {
        check("groups", g)?;
    }
    let mut out = UserInfo {
        name: target.to_string(),
        uid: String::new(),
        groups,
        extra: Default::default(),
    };
    if out.name != "system:anonymous" {
        add_group(&mut out, "system:authenticated");
    }
    Ok(out)
}

/// The placeholder authorizer.
pub fn authorize(attrs: &RequestAttributes) -> Result<(), ApiError> {
    let u = &attrs.user;
    if u.groups.iter().any(|g| g == "system:masters") {
        return Ok(());
    }
    let authenticated = u.groups.iter().any(|g| g == "system:authenticated");
    if !attrs.resource_request {
        let p = attrs.path.as_str();
        let public = p == "/version"
            || p == "/healthz"
            || p == "/livez"
            || p == "/readyz"
            || p.starts_with("/openapi")
            || p == "/api"
            || p.starts_with("/api/")
            || p == "/apis"
            || p.starts_with("/apis/");
        if public && (authenticated || p == "/version" || p.ends_with("z")) {
            return Ok(());
        }
    } else if authenticated
        && attrs.verb == "create"
        && matches!(
            attrs.resource.as_str(),
            "selfsubjectaccessreviews" | "selfsubjectrulesreviews" | "selfsubjectreviews"
        )
    {
        return Ok(());
    }
    Err(forbidden(attrs, ""))
}

/// kube's Forbidden Status for a request the authorizer refused.
pub fn forbidden(attrs: &RequestAttributes, reason: &str) -> ApiError {
    let user = &attrs.user.name;
    let suffix = if reason.is_empty() {
        String::new()
    } else {
        format!(": {reason}")
    };
    if !attrs.resource_request {
        return ApiError::new(
            403,
            "Forbidden",
            format!(
                "forbidden: User \"{user}\" cannot {} path \"{}\"{suffix}",
                attrs.verb, attrs.path
            ),
        )
        .with_empty_details();
    }
    let qualified = crate::error::qualified(&attrs.resource, &attrs.api_group);
    let named = if attrs.name.is_empty() {
        String::new()
    } else {
        format!(" \"{}\"", attrs.name)
    };
    let res = if attrs.subresource.is_empty() {
        attrs.resource.clone()
    } else {
        format!("{}/{}", attrs.resource, attrs.subresource)
    };
    let scope = if attrs.namespace.is_empty() {
        "at the cluster scope".to_string()
    } else {
        format!("in the namespace \"{}\"", attrs.namespace)
    };
    ApiError::new(
        403,
        "Forbidden",
        format!(
            "{qualified}{named} is forbidden: User \"{user}\" cannot {} resource \"{res}\" in API group \"{}\" {scope}{suffix}",
            attrs.verb, attrs.api_group
        ),
    )
    .with_details(Details {
        name: &attrs.name,
        group: &attrs.api_group,
        kind: &attrs.resource,
        ..Default::default()
    })
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

    #[test]
    fn forbidden_messages_match_kube() {
        let attrs = RequestAttributes {
            user: UserInfo {
                name: "alice".into(),
                ..Default::default()
            },
            verb: "patch".into(),
            resource_request: true,
            api_group: "stable.example.io".into(),
            resource: "crontabs".into(),
            subresource: "status".into(),
            namespace: "ref-crud".into(),
            name: "my-crontab".into(),
            ..Default::default()
        };
        assert_eq!(
            forbidden(&attrs, "").message,
            "crontabs.stable.example.io \"my-crontab\" is forbidden: User \"alice\" cannot patch resource \"crontabs/status\" in API group \"stable.example.io\" in the namespace \"ref-crud\""
        );
        let nr = RequestAttributes {
            user: UserInfo {
                name: "bob".into(),
                ..Default::default()
            },
            verb: "get".into(),
            path: "/metrics".into(),
            ..Default::default()
        };
        assert_eq!(
            forbidden(&nr, "").message,
            "forbidden: User \"bob\" cannot get path \"/metrics\""
        );
    }
}
