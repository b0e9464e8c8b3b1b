use super::*;
use http::HeaderValue;
use rustls_pki_types::pem::PemObject;

const TOKENS: &str = "admin-token,admin,admin-uid,system:masters\n\
alice-token,alice,alice-uid,\"developers,testers\"\n\
\n\
bob-token,bob,bob-uid\n";

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(
            http::header::HeaderName::from_bytes(k.as_bytes()).expect("name"),
            HeaderValue::from_str(v).expect("value"),
        );
    }
    h
}

fn user(name: &str, uid: &str, groups: &[&str]) -> UserInfo {
    UserInfo {
        name: name.into(),
        uid: uid.into(),
        groups: groups.iter().map(|g| g.to_string()).collect(),
        extra: BTreeMap::new(),
    }
}

fn check(authn: &Authenticator, hdrs: &[(&str, &str)], expected: Result<UserInfo, AuthnError>) {
    assert_eq!(
        authn.authenticate(&headers(hdrs), None),
        expected,
        "{hdrs:?}"
    );
}

#[test]
fn bearer_tokens_anonymous_and_unknown_tokens() {
    let authn = Authenticator::new(TOKENS, true).expect("tokens");
    check(
        &authn,
        &[("authorization", "Bearer alice-token")],
        Ok(user(
            "alice",
            "alice-uid",
            &["developers", "testers", "system:authenticated"],
        )),
    );
    check(
        &authn,
        &[("authorization", "bearer bob-token")],
        Ok(user("bob", "bob-uid", &["system:authenticated"])),
    );
    check(
        &authn,
        &[("authorization", "Bearer admin-token")],
        Ok(user(
            "admin",
            "admin-uid",
            &["system:masters", "system:authenticated"],
        )),
    );
    check(
        &authn,
        &[("authorization", "Bearer not-a-real-token")],
        Err(AuthnError::Unauthorized),
    );
    check(
        &authn,
        &[],
        Ok(user("system:anonymous", "", &["system:unauthenticated"])),
    );
    // Other schemes are not bearer credentials: kube falls through to anonymous.
    check(
        &authn,
        &[("authorization", "Basic YTpi")],
        Ok(user("system:anonymous", "", &["system:unauthenticated"])),
    );

    let strict = Authenticator::new(TOKENS, false).expect("tokens");
    check(&strict, &[], Err(AuthnError::Unauthorized));
}

#[test]
fn runtime_tokens_are_added() {
    let authn = Authenticator::new("", true).expect("empty file");
    check(
        &authn,
        &[("authorization", "Bearer t1")],
        Err(AuthnError::Unauthorized),
    );
    authn.add_token("t1", user("carol", "c", &["g"]));
    check(
        &authn,
        &[("authorization", "Bearer t1")],
        Ok(user("carol", "c", &["g", "system:authenticated"])),
    );
}

#[test]
fn comments_and_empty_tokens_are_skipped() {
    let authn =
        Authenticator::new("# generated\n,nobody,x\nt2,b,u2\nt1,b,u1\n", true).expect("file");
    assert_eq!(authn.token_of("b").as_deref(), Some("t1"));
    assert_eq!(authn.token_of("nobody"), None);
}

#[test]
fn malformed_token_files_name_the_line() {
    let err = Authenticator::new("a,b,c\nonly,two\n", true).err();
    assert!(
        matches!(err, Some(AuthnError::TokenFile { line: 2, .. })),
        "{err:?}"
    );
    let err = Authenticator::new("a,b,c,\"open\n", true).err();
    assert!(
        matches!(err, Some(AuthnError::TokenFile { line: 1, .. })),
        "{err:?}"
    );
}

#[test]
fn client_certificates_name_user_and_groups() {
    let ca = crproxy_core::pki::CertificateAuthority::generate("ca").expect("ca");
    // crproxy_core::pki keeps only one O entry (rcgen replaces repeated DN types), so
    // one group is what can be issued today; the parser reads every O entry.
    let pem = ca.issue_client("carol", &["ops"]).expect("client");
    let der = CertificateDer::from_pem_slice(pem.cert.as_bytes()).expect("der");
    let authn = Authenticator::new(TOKENS, true).expect("tokens");
    // The certificate wins over a bearer token, as kube's x509 authenticator runs first.
    let got = authn
        .authenticate(
            &headers(&[("authorization", "Bearer alice-token")]),
            Some(&der),
        )
        .expect("user");
    assert_eq!(got.name, "carol");
    let mut groups = got.groups.clone();
    groups.sort();
    assert_eq!(groups, vec!["ops", "system:authenticated"]);
}

#[test]
fn unauthorized_status_matches_reference() {
    assert_eq!(
        unauthorized_status(),
        serde_json::json!({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
            "message":"Unauthorized","reason":"Unauthorized","code":401})
    );
}

fn alice() -> UserInfo {
    user(
        "alice",
        "alice-uid",
        &["developers", "system:authenticated"],
    )
}

#[test]
fn impersonation_denied_names_the_user_first() {
    // Reference 091/092: the user check fails before the group check.
    for hdrs in [
        vec![("impersonate-user", "bob")],
        vec![
            ("impersonate-user", "bob"),
            ("impersonate-group", "viewers"),
        ],
    ] {
        let err = impersonate(&alice(), &headers(&hdrs), |_| false).expect_err("denied");
        assert_eq!(
            err,
            serde_json::json!({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
            "message":"users \"bob\" is forbidden: User \"alice\" cannot impersonate resource \"users\" in API group \"\" at the cluster scope",
            "reason":"Forbidden","details":{"name":"bob","kind":"users"},"code":403})
        );
    }
}

#[test]
fn impersonation_checks_every_part() {
    let seen = std::sync::Mutex::new(Vec::new());
    let hdrs = headers(&[
        ("impersonate-user", "system:serviceaccount:ns1:robot"),
        ("impersonate-group", "g1"),
        ("impersonate-group", "g2"),
        ("impersonate-uid", "u-1"),
        ("impersonate-extra-acme.com%2fproject", "p1"),
        ("impersonate-extra-acme.com%2fproject", "p2"),
    ]);
    let got = impersonate(&alice(), &hdrs, |a| {
        seen.lock().expect("lock").push(format!(
            "{} {}/{} {}/{} {}",
            a.verb, a.api_group, a.resource, a.subresource, a.namespace, a.name
        ));
        true
    })
    .expect("allowed");
    assert_eq!(
        seen.into_inner().expect("lock"),
        vec![
            "impersonate /serviceaccounts /ns1 robot",
            "impersonate /groups / g1",
            "impersonate /groups / g2",
            "impersonate authentication.k8s.io/userextras acme.com/project/ p1",
            "impersonate authentication.k8s.io/userextras acme.com/project/ p2",
            "impersonate authentication.k8s.io/uids / u-1",
        ]
    );
    assert_eq!(got.name, "system:serviceaccount:ns1:robot");
    assert_eq!(got.uid, "u-1");
    assert_eq!(got.groups, vec!["g1", "g2", "system:authenticated"]);
    assert_eq!(got.extra["acme.com/project"], vec!["p1", "p2"]);
}

#[test]
fn impersonating_a_service_account_without_groups_adds_its_groups() {
    let hdrs = headers(&[("impersonate-user", "system:serviceaccount:ns1:robot")]);
    let got = impersonate(&alice(), &hdrs, |_| true).expect("allowed");
    assert_eq!(
        got.groups,
        vec![
            "system:serviceaccounts",
            "system:serviceaccounts:ns1",
            "system:authenticated"
        ]
    );
}

#[test]
fn impersonation_without_user_is_an_error_and_no_headers_is_identity() {
    let err = impersonate(&alice(), &headers(&[("impersonate-group", "g")]), |_| true)
        .expect_err("no user");
    assert_eq!(err["code"], 500);
    assert_eq!(
        impersonate(&alice(), &HeaderMap::new(), |_| false),
        Ok(alice())
    );
}

proptest::proptest! {
    /// The token file is operator input: bad content is an error, never a panic.
    #[test]
    fn token_files_never_panic(text in "[ -~\n\"]{0,200}") {
        let _ = Authenticator::new(&text, true);
    }
}
