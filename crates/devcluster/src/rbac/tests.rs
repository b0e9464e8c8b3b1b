use super::*;
use serde_json::json;
use std::collections::BTreeMap;

fn user(name: &str, groups: &[&str]) -> UserInfo {
    UserInfo {
        name: name.into(),
        uid: String::new(),
        groups: groups.iter().map(|g| g.to_string()).collect(),
        extra: BTreeMap::new(),
    }
}

fn alice() -> UserInfo {
    user("alice", &["developers", "system:authenticated"])
}

/// Bootstrap policy plus the recorded setup: Role ref-rbac/crontab-reader bound to alice.
fn snapshot() -> RbacSnapshot {
    let mut objects = bootstrap_objects();
    objects.extend([
        json!({"kind": "Role", "metadata": {"name": "crontab-reader", "namespace": "ref-rbac"},
               "rules": [{"apiGroups": ["stable.example.io"], "resources": ["crontabs"],
                          "verbs": ["get", "list", "watch"]}]}),
        json!({"kind": "RoleBinding", "metadata": {"name": "alice-crontab-reader", "namespace": "ref-rbac"},
               "roleRef": {"kind": "Role", "name": "crontab-reader"},
               "subjects": [{"kind": "User", "name": "alice"}]}),
        json!({"kind": "ClusterRole", "metadata": {"name": "scaler"},
               "rules": [{"apiGroups": ["*"], "resources": ["*/scale"], "verbs": ["patch"]},
                         {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["cm1"], "verbs": ["get"]},
                         {"nonResourceURLs": ["/metrics/*"], "verbs": ["get"]}]}),
        json!({"kind": "RoleBinding", "metadata": {"name": "robot-scaler", "namespace": "ns1"},
               "roleRef": {"kind": "ClusterRole", "name": "scaler"},
               "subjects": [{"kind": "ServiceAccount", "name": "robot"}]}),
        json!({"kind": "ClusterRoleBinding", "metadata": {"name": "bob-scaler"},
               "roleRef": {"kind": "ClusterRole", "name": "scaler"},
               "subjects": [{"kind": "Group", "name": "viewers"}]}),
        json!({"kind": "ClusterRole", "metadata": {"name": "crontab-view",
                 "labels": {"rbac.authorization.k8s.io/aggregate-to-view": "true"}},
               "rules": [{"apiGroups": ["stable.example.io"], "resources": ["crontabs"], "verbs": ["get"]}]}),
        json!({"kind": "ClusterRoleBinding", "metadata": {"name": "dave-admin"},
               "roleRef": {"kind": "ClusterRole", "name": "admin"},
               "subjects": [{"kind": "User", "name": "dave"}]}),
    ]);
    snapshot_from_objects(&objects)
}

fn res(
    u: UserInfo,
    verb: &str,
    group: &str,
    resource: &str,
    sub: &str,
    ns: &str,
    name: &str,
) -> RequestAttributes {
    RequestAttributes {
        user: u,
        verb: verb.into(),
        resource_request: true,
        api_group: group.into(),
        api_version: "v1".into(),
        resource: resource.into(),
        subresource: sub.into(),
        namespace: ns.into(),
        name: name.into(),
        path: String::new(),
    }
}

fn nonres(u: UserInfo, verb: &str, path: &str) -> RequestAttributes {
    RequestAttributes {
        user: u,
        verb: verb.into(),
        path: path.into(),
        ..Default::default()
    }
}

#[test]
fn decisions() {
    let s = snapshot();
    let sa = user(
        "system:serviceaccount:ns1:robot",
        &["system:serviceaccounts", "system:authenticated"],
    );
    let bob = user("bob", &["viewers", "system:authenticated"]);
    let anon = user("system:anonymous", &["system:unauthenticated"]);
    let cases: Vec<(RequestAttributes, Decision)> = vec![
        (
            res(
                alice(),
                "list",
                "stable.example.io",
                "crontabs",
                "",
                "ref-rbac",
                "",
            ),
            Decision::Allow,
        ),
        (
            res(
                alice(),
                "get",
                "stable.example.io",
                "crontabs",
                "",
                "ref-rbac",
                "x",
            ),
            Decision::Allow,
        ),
        (
            res(
                alice(),
                "delete",
                "stable.example.io",
                "crontabs",
                "",
                "ref-rbac",
                "x",
            ),
            Decision::Deny,
        ),
        (
            res(
                alice(),
                "list",
                "stable.example.io",
                "crontabs",
                "",
                "ref-crud",
                "",
            ),
            Decision::Deny,
        ),
        (
            res(alice(), "list", "stable.example.io", "crontabs", "", "", ""),
            Decision::Deny,
        ),
        (
            res(
                alice(),
                "get",
                "stable.example.io",
                "crontabs",
                "status",
                "ref-rbac",
                "x",
            ),
            Decision::Deny,
        ),
        (
            res(
                user("carol", &["system:masters"]),
                "delete",
                "x",
                "y",
                "",
                "",
                "",
            ),
            Decision::Allow,
        ),
        (
            res(
                alice(),
                "create",
                "authorization.k8s.io",
                "selfsubjectaccessreviews",
                "",
                "",
                "",
            ),
            Decision::Allow,
        ),
        (
            res(
                alice(),
                "create",
                "authorization.k8s.io",
                "subjectaccessreviews",
                "",
                "",
                "",
            ),
            Decision::Deny,
        ),
        (nonres(alice(), "get", "/healthz"), Decision::Allow),
        (
            nonres(alice(), "get", "/apis/stable.example.io"),
            Decision::Allow,
        ),
        (nonres(alice(), "get", "/metrics"), Decision::Deny),
        (nonres(anon.clone(), "get", "/version"), Decision::Allow),
        (nonres(anon.clone(), "get", "/apis"), Decision::Deny),
        (
            res(
                anon,
                "list",
                "stable.example.io",
                "crontabs",
                "",
                "ref-crud",
                "",
            ),
            Decision::Deny,
        ),
        // */scale, resourceNames, nonResourceURL prefix, service account subject.
        (
            res(
                sa.clone(),
                "patch",
                "apps",
                "deployments",
                "scale",
                "ns1",
                "d",
            ),
            Decision::Allow,
        ),
        (
            res(sa.clone(), "patch", "apps", "deployments", "", "ns1", "d"),
            Decision::Deny,
        ),
        (
            res(
                sa.clone(),
                "patch",
                "apps",
                "deployments",
                "scale",
                "ns2",
                "d",
            ),
            Decision::Deny,
        ),
        (
            res(sa.clone(), "get", "", "configmaps", "", "ns1", "cm1"),
            Decision::Allow,
        ),
        (
            res(sa.clone(), "get", "", "configmaps", "", "ns1", "cm2"),
            Decision::Deny,
        ),
        (
            res(sa, "list", "", "configmaps", "", "ns1", ""),
            Decision::Deny,
        ),
        (nonres(bob.clone(), "get", "/metrics/x"), Decision::Allow),
        (nonres(bob, "get", "/metrics"), Decision::Deny),
        // Aggregation: admin ⊇ edit ⊇ view ⊇ crontab-view.
        (
            res(
                user("dave", &[]),
                "get",
                "stable.example.io",
                "crontabs",
                "",
                "any",
                "x",
            ),
            Decision::Allow,
        ),
        (
            res(user("dave", &[]), "delete", "", "pods", "", "any", "x"),
            Decision::Allow,
        ),
        (
            res(
                user("dave", &[]),
                "create",
                "rbac.authorization.k8s.io",
                "rolebindings",
                "",
                "n",
                "",
            ),
            Decision::Allow,
        ),
        (
            res(
                user("dave", &[]),
                "delete",
                "stable.example.io",
                "crontabs",
                "",
                "any",
                "x",
            ),
            Decision::Deny,
        ),
    ];
    for (attrs, expected) in cases {
        assert_eq!(authorize(&s, &attrs), expected, "{attrs:?}");
    }
}

#[test]
fn reasons_name_binding_role_and_subject() {
    let s = snapshot();
    let (d, reason) = authorize_with_reason(
        &s,
        &res(
            alice(),
            "list",
            "stable.example.io",
            "crontabs",
            "",
            "ref-rbac",
            "",
        ),
    );
    assert_eq!(d, Decision::Allow);
    assert_eq!(
        reason,
        r#"RBAC: allowed by RoleBinding "alice-crontab-reader/ref-rbac" of Role "crontab-reader" to User "alice""#
    );
    let (_, reason) = authorize_with_reason(&s, &nonres(alice(), "get", "/api"));
    assert_eq!(
        reason,
        r#"RBAC: allowed by ClusterRoleBinding "system:discovery" of ClusterRole "system:discovery" to Group "system:authenticated""#
    );
    let sa = user("system:serviceaccount:ns1:robot", &[]);
    let (_, reason) =
        authorize_with_reason(&s, &res(sa, "get", "", "configmaps", "", "ns1", "cm1"));
    assert_eq!(
        reason,
        r#"RBAC: allowed by RoleBinding "robot-scaler/ns1" of ClusterRole "scaler" to ServiceAccount "robot/ns1""#
    );
}

fn check_forbidden(a: RequestAttributes, reference: &str) {
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/reference/kube-apiserver-1.32")
        .join(reference);
    let text = std::fs::read_to_string(&file).expect("reference file");
    let recorded: serde_json::Value = serde_json::from_str(&text).expect("json");
    assert_eq!(
        forbidden_status(&a),
        recorded["response"]["body"],
        "{reference}"
    );
}

#[test]
fn forbidden_bodies_match_reference() {
    let anon = user("system:anonymous", &["system:unauthenticated"]);
    check_forbidden(
        res(
            anon,
            "list",
            "stable.example.io",
            "crontabs",
            "",
            "ref-crud",
            "",
        ),
        "081-auth-no-token.json",
    );
    check_forbidden(
        res(
            alice(),
            "get",
            "stable.example.io",
            "crontabs",
            "",
            "ref-crud",
            "my-crontab",
        ),
        "086-auth-alice-get-403.json",
    );
    check_forbidden(
        res(alice(), "list", "stable.example.io", "crontabs", "", "", ""),
        "087-auth-alice-list-cluster-403.json",
    );
    check_forbidden(
        res(
            alice(),
            "patch",
            "stable.example.io",
            "crontabs",
            "status",
            "ref-crud",
            "my-crontab",
        ),
        "089-auth-alice-status-403.json",
    );
    check_forbidden(
        res(alice(), "list", "", "namespaces", "", "", ""),
        "090-auth-alice-namespaces-403.json",
    );
    check_forbidden(
        nonres(user("bob", &[]), "get", "/metrics"),
        "094-auth-bob-nonresource-403.json",
    );
    check_forbidden(
        res(
            alice(),
            "create",
            "authorization.k8s.io",
            "subjectaccessreviews",
            "",
            "",
            "",
        ),
        "150-sar-alice-403.json",
    );
}

fn check_request(
    method: &str,
    path: &str,
    query: Option<&str>,
    expected: (&str, bool, &str, &str, &str, &str, &str),
) {
    let a = authorize_attributes_from_request(method, path, query, alice());
    let got = (
        a.verb.as_str(),
        a.resource_request,
        a.api_group.as_str(),
        a.resource.as_str(),
        a.subresource.as_str(),
        a.namespace.as_str(),
        a.name.as_str(),
    );
    assert_eq!(got, expected, "{method} {path} {query:?}");
    assert_eq!(a.path, path);
    assert_eq!(a.user, alice());
}

#[test]
fn request_info_resolution() {
    let g = "stable.example.io";
    let base = "/apis/stable.example.io/v1";
    check_request(
        "GET",
        &format!("{base}/namespaces/ns/crontabs"),
        None,
        ("list", true, g, "crontabs", "", "ns", ""),
    );
    check_request(
        "GET",
        &format!("{base}/namespaces/ns/crontabs"),
        Some("watch=true&resourceVersion=0"),
        ("watch", true, g, "crontabs", "", "ns", ""),
    );
    check_request(
        "GET",
        &format!("{base}/namespaces/ns/crontabs"),
        Some("watch=1"),
        ("watch", true, g, "crontabs", "", "ns", ""),
    );
    check_request(
        "GET",
        &format!("{base}/namespaces/ns/crontabs"),
        Some("watch=false"),
        ("list", true, g, "crontabs", "", "ns", ""),
    );
    // As kube reads it (Convert_Slice_string_To_bool): anything but 0 and
    // false in any case is a watch.
    for watch in ["watch=f", "watch=yes", "watch="] {
        check_request(
            "GET",
            &format!("{base}/namespaces/ns/crontabs"),
            Some(watch),
            ("watch", true, g, "crontabs", "", "ns", ""),
        );
    }
    check_request(
        "GET",
        &format!("{base}/namespaces/ns/crontabs"),
        Some("watch=FALSE"),
        ("list", true, g, "crontabs", "", "ns", ""),
    );
    check_request(
        "GET",
        &format!("{base}/watch/namespaces/ns/crontabs"),
        None,
        ("watch", true, g, "crontabs", "", "ns", ""),
    );
    check_request(
        "GET",
        &format!("{base}/watch/namespaces/ns/crontabs/x"),
        None,
        ("watch", true, g, "crontabs", "", "ns", "x"),
    );
    check_request(
        "GET",
        &format!("{base}/crontabs"),
        None,
        ("list", true, g, "crontabs", "", "", ""),
    );
    check_request(
        "GET",
        &format!("{base}/namespaces/ns/crontabs"),
        Some("fieldSelector=metadata.name%3Dx"),
        ("list", true, g, "crontabs", "", "ns", "x"),
    );
    check_request(
        "GET",
        &format!("{base}/namespaces/ns/crontabs/x"),
        None,
        ("get", true, g, "crontabs", "", "ns", "x"),
    );
    check_request(
        "HEAD",
        &format!("{base}/namespaces/ns/crontabs/x"),
        None,
        ("get", true, g, "crontabs", "", "ns", "x"),
    );
    check_request(
        "POST",
        &format!("{base}/namespaces/ns/crontabs"),
        None,
        ("create", true, g, "crontabs", "", "ns", ""),
    );
    check_request(
        "PUT",
        &format!("{base}/namespaces/ns/crontabs/x"),
        None,
        ("update", true, g, "crontabs", "", "ns", "x"),
    );
    check_request(
        "PATCH",
        &format!("{base}/namespaces/ns/crontabs/x/status"),
        None,
        ("patch", true, g, "crontabs", "status", "ns", "x"),
    );
    check_request(
        "PUT",
        &format!("{base}/namespaces/ns/crontabs/x/scale"),
        None,
        ("update", true, g, "crontabs", "scale", "ns", "x"),
    );
    check_request(
        "DELETE",
        &format!("{base}/namespaces/ns/crontabs/x"),
        None,
        ("delete", true, g, "crontabs", "", "ns", "x"),
    );
    check_request(
        "DELETE",
        &format!("{base}/namespaces/ns/crontabs"),
        Some("labelSelector=app%3Dcron"),
        ("deletecollection", true, g, "crontabs", "", "ns", ""),
    );
    check_request(
        "GET",
        "/api/v1/namespaces",
        None,
        ("list", true, "", "namespaces", "", "", ""),
    );
    check_request(
        "GET",
        "/api/v1/namespaces/foo",
        None,
        ("get", true, "", "namespaces", "", "foo", "foo"),
    );
    check_request(
        "DELETE",
        "/api/v1/namespaces/foo",
        None,
        ("delete", true, "", "namespaces", "", "foo", "foo"),
    );
    check_request(
        "PUT",
        "/api/v1/namespaces/foo/finalize",
        None,
        ("update", true, "", "namespaces", "finalize", "foo", "foo"),
    );
    check_request(
        "GET",
        "/api/v1/namespaces/foo/status",
        None,
        ("get", true, "", "namespaces", "status", "foo", "foo"),
    );
    check_request(
        "GET",
        "/api/v1/namespaces/foo/configmaps/c",
        None,
        ("get", true, "", "configmaps", "", "foo", "c"),
    );
    check_request(
        "POST",
        "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
        None,
        (
            "create",
            true,
            "authorization.k8s.io",
            "selfsubjectaccessreviews",
            "",
            "",
            "",
        ),
    );
    check_request(
        "GET",
        "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/l",
        None,
        (
            "get",
            true,
            "coordination.k8s.io",
            "leases",
            "",
            "kube-system",
            "l",
        ),
    );
    check_request(
        "GET",
        &format!("{base}/watch/namespaces/ns/crontabs/x/status"),
        None,
        ("watch", true, g, "crontabs", "status", "ns", "x"),
    );
    check_request("GET", "/api/v1", None, ("get", false, "", "", "", "", ""));
    check_request("GET", base, None, ("get", false, "", "", "", "", ""));
    // Non-resource paths.
    check_request("GET", "/version", None, ("get", false, "", "", "", "", ""));
    check_request("GET", "/api", None, ("get", false, "", "", "", "", ""));
    check_request("GET", "/apis", None, ("get", false, "", "", "", "", ""));
    check_request(
        "GET",
        "/apis/stable.example.io",
        None,
        ("get", false, "", "", "", "", ""),
    );
    check_request(
        "POST",
        "/metrics",
        None,
        ("post", false, "", "", "", "", ""),
    );
    check_request(
        "GET",
        "/openapi/v3/apis/stable.example.io/v1",
        None,
        ("get", false, "", "", "", "", ""),
    );
}

#[test]
fn rules_for_lists_cluster_then_namespace_rules() {
    let s = snapshot();
    let rules = rules_for(&s, &alice(), "ref-rbac");
    let kinds: Vec<String> = rules
        .iter()
        .map(|r| {
            format!(
                "{:?}",
                r.get("resources")
                    .or(r.get("nonResourceURLs"))
                    .map(|v| v[0].clone())
            )
        })
        .collect();
    assert_eq!(
        kinds,
        vec![
            "Some(String(\"selfsubjectaccessreviews\"))",
            "Some(String(\"selfsubjectreviews\"))",
            "Some(String(\"/api\"))",
            "Some(String(\"/healthz\"))",
            "Some(String(\"crontabs\"))",
        ]
    );
}

#[test]
fn label_selectors() {
    let labels = json!({"a": "1", "b": "2"});
    let cases = [
        (json!({}), true),
        (json!(null), false),
        (json!({"matchLabels": {"a": "1"}}), true),
        (json!({"matchLabels": {"a": "2"}}), false),
        (
            json!({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1", "3"]}]}),
            true,
        ),
        (
            json!({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}),
            false,
        ),
        (
            json!({"matchExpressions": [{"key": "c", "operator": "NotIn", "values": ["1"]}]}),
            true,
        ),
        (
            json!({"matchExpressions": [{"key": "b", "operator": "Exists"}]}),
            true,
        ),
        (
            json!({"matchExpressions": [{"key": "b", "operator": "DoesNotExist"}]}),
            false,
        ),
        (
            json!({"matchExpressions": [{"key": "b", "operator": "Bogus"}]}),
            false,
        ),
    ];
    for (selector, expected) in cases {
        assert_eq!(
            label_selector_matches(&selector, &labels),
            expected,
            "{selector}"
        );
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]

    /// URLs come from any client: resolution never panics and keeps the path.
    #[test]
    fn request_resolution_never_panics(
        method in "(GET|POST|PUT|PATCH|DELETE|HEAD|OPTIONS|[A-Z]{1,6})",
        path in "(/(api|apis|watch|namespaces|v1|g\\.io|x|%2F|)){0,8}/?",
        query in proptest::option::of("[ -~]{0,30}"),
    ) {
        let a = authorize_attributes_from_request(&method, &path, query.as_deref(), alice());
        proptest::prop_assert_eq!(&a.path, &path);
        // As kube decides it, by the number of segments under a prefix: an
        // empty group or version does not make a path non-resource.
        let segments = crate::request_info::segments(&path);
        let under_prefix = match segments.first().map(String::as_str) {
            Some("api") => segments.len() >= 3,
            Some("apis") => segments.len() >= 4,
            _ => false,
        };
        proptest::prop_assert_eq!(a.resource_request, under_prefix);
    }
}

#[test]
fn check_request_runs_authn_impersonation_and_rbac_in_order() {
    let authn = crate::authn::Authenticator::new(
        "admin-token,admin,admin-uid,system:masters\nalice-token,alice,alice-uid,developers\n",
        true,
    )
    .expect("tokens");
    let s = snapshot();
    let headers = |pairs: &[(&str, &str)]| {
        let mut h = http::HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::header::HeaderName::from_bytes(k.as_bytes()).expect("name"),
                http::HeaderValue::from_str(v).expect("value"),
            );
        }
        h
    };
    let list = "/apis/stable.example.io/v1/namespaces/ref-crud/crontabs";
    let run = |h: &[(&str, &str)], path: &str| {
        super::check_request(&authn, &s, "GET", path, None, &headers(h), None)
            .map(|a| a.user.name)
            .map_err(|(code, body)| {
                (
                    code,
                    body["message"].as_str().unwrap_or_default().to_string(),
                )
            })
    };
    assert_eq!(
        run(&[("authorization", "Bearer nope")], "/version"),
        Err((401, "Unauthorized".into()))
    );
    assert_eq!(run(&[], "/version"), Ok("system:anonymous".into()));
    assert_eq!(
        run(&[], list),
        Err((403, "crontabs.stable.example.io is forbidden: User \"system:anonymous\" cannot list resource \"crontabs\" in API group \"stable.example.io\" in the namespace \"ref-crud\"".into()))
    );
    assert_eq!(
        run(&[("authorization", "Bearer admin-token")], list),
        Ok("admin".into())
    );
    // Reference 091 and 093.
    assert_eq!(
        run(&[("authorization", "Bearer alice-token"), ("impersonate-user", "bob")], list),
        Err((403, "users \"bob\" is forbidden: User \"alice\" cannot impersonate resource \"users\" in API group \"\" at the cluster scope".into()))
    );
    assert_eq!(
        run(&[("authorization", "Bearer admin-token"), ("impersonate-user", "alice")], list),
        Err((403, "crontabs.stable.example.io is forbidden: User \"alice\" cannot list resource \"crontabs\" in API group \"stable.example.io\" in the namespace \"ref-crud\"".into()))
    );
    assert_eq!(
        run(
            &[
                ("authorization", "Bearer admin-token"),
                ("impersonate-user", "alice")
            ],
            "/apis/stable.example.io/v1/namespaces/ref-rbac/crontabs"
        ),
        Ok("alice".into())
    );
}

#[test]
fn aggregated_rules_for_stored_roles() {
    let s = snapshot();
    let view = aggregated_rules(&s, "view").expect("aggregated");
    assert!(
        view.iter().any(|r| r["resources"] == json!(["crontabs"])),
        "{view:?}"
    );
    let admin = aggregated_rules(&s, "admin").expect("aggregated");
    assert!(admin.len() > view.len());
    assert_eq!(aggregated_rules(&s, "cluster-admin"), None);
    assert_eq!(aggregated_rules(&s, "missing"), None);
}
