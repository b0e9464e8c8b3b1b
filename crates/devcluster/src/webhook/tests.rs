use super::*;

fn attrs(group: &str, version: &str, resource: &str, sub: &str, ns: &str) -> RequestAttributes {
    RequestAttributes {
        verb: "create".into(),
        resource_request: true,
        api_group: group.into(),
        api_version: version.into(),
        resource: resource.into(),
        subresource: sub.into(),
        namespace: ns.into(),
        name: "x".into(),
        ..Default::default()
    }
}

fn hook(rules: Value, extra: Value) -> Value {
    let mut h = json!({"name": "h.example.com", "rules": rules});
    if let (Some(h), Some(extra)) = (h.as_object_mut(), extra.as_object()) {
        h.extend(extra.clone());
    }
    h
}

fn rule(ops: &[&str], groups: &[&str], versions: &[&str], resources: &[&str]) -> Value {
    json!({"operations": ops, "apiGroups": groups, "apiVersions": versions, "resources": resources})
}

/// Which version (if any) `hook` is called in for a CREATE of `a` labelled `labels`.
fn check(hook: &Value, a: &RequestAttributes, labels: Value, expected: Option<&str>) {
    let object = json!({"metadata": {"name": "x", "labels": labels}});
    let namespaces = vec![
        json!({"metadata": {"name": "prod", "labels": {"env": "prod"}}}),
        json!({"metadata": {"name": "dev", "labels": {"env": "dev"}}}),
    ];
    let versions = vec!["v1".to_string(), "v2".to_string()];
    let options = json!({});
    let call = Call {
        operation: "CREATE",
        attrs: a,
        kind: "Thing",
        served_versions: &versions,
        kind_group_version: None,
        object: Some(&object),
        old_object: None,
        dry_run: false,
        options: &options,
    };
    let got = matches(hook, &call, &namespaces).map(|m| m.version);
    assert_eq!(got.as_deref(), expected, "{hook} for {a:?}");
}

#[test]
fn rules_match_operations_groups_versions_resources_and_scope() {
    let things = attrs("example.com", "v1", "things", "", "prod");
    let none = json!(null);
    for (rules, expected) in [
        (
            rule(&["CREATE"], &["example.com"], &["v1"], &["things"]),
            Some("v1"),
        ),
        (rule(&["*"], &["*"], &["*"], &["*"]), Some("v1")),
        (
            rule(&["UPDATE"], &["example.com"], &["v1"], &["things"]),
            None,
        ),
        (
            rule(&["CREATE"], &["other.com"], &["v1"], &["things"]),
            None,
        ),
        (
            rule(&["CREATE"], &["example.com"], &["v1"], &["others"]),
            None,
        ),
        // `r/*` is subresources only.
        (
            rule(&["CREATE"], &["example.com"], &["v1"], &["things/*"]),
            None,
        ),
        (
            rule(&["CREATE"], &["example.com"], &["v1"], &["*/*"]),
            Some("v1"),
        ),
    ] {
        check(
            &hook(json!([rules]), json!({})),
            &things,
            none.clone(),
            expected,
        );
    }
    let status = attrs("example.com", "v1", "things", "status", "prod");
    for (resources, expected) in [
        (&["things/status"][..], Some("v1")),
        (&["things/*"][..], Some("v1")),
        (&["*/status"][..], Some("v1")),
        (&["things"][..], None),
        (&["*"][..], None),
        (&["things/scale"][..], None),
    ] {
        let r = rule(&["CREATE"], &["example.com"], &["v1"], resources);
        check(
            &hook(json!([r]), json!({})),
            &status,
            none.clone(),
            expected,
        );
    }
    let cluster = attrs("example.com", "v1", "things", "", "");
    for (scope, namespaced, cluster_scoped) in [
        ("*", Some("v1"), Some("v1")),
        ("Namespaced", Some("v1"), None),
        ("Cluster", None, Some("v1")),
    ] {
        let mut r = rule(&["CREATE"], &["example.com"], &["v1"], &["things"]);
        r["scope"] = json!(scope);
        let h = hook(json!([r]), json!({}));
        check(&h, &things, none.clone(), namespaced);
        check(&h, &cluster, none.clone(), cluster_scoped);
    }
}

#[test]
fn match_policy_equivalent_sends_other_served_versions() {
    let v2 = attrs("example.com", "v2", "things", "", "prod");
    let v1_rule = json!([rule(&["CREATE"], &["example.com"], &["v1"], &["things"])]);
    check(
        &hook(v1_rule.clone(), json!({})),
        &v2,
        json!(null),
        Some("v1"),
    );
    check(
        &hook(v1_rule.clone(), json!({"matchPolicy": "Equivalent"})),
        &v2,
        json!(null),
        Some("v1"),
    );
    check(
        &hook(v1_rule, json!({"matchPolicy": "Exact"})),
        &v2,
        json!(null),
        None,
    );
}

#[test]
fn namespace_and_object_selectors_filter() {
    let all = json!([rule(&["*"], &["*"], &["*"], &["*"])]);
    let prod = attrs("", "v1", "configmaps", "", "prod");
    let dev = attrs("", "v1", "configmaps", "", "dev");
    let by_ns = hook(
        all.clone(),
        json!({"namespaceSelector": {"matchLabels": {"env": "prod"}}}),
    );
    check(&by_ns, &prod, json!(null), Some("v1"));
    check(&by_ns, &dev, json!(null), None);
    let by_object = hook(
        all.clone(),
        json!({"objectSelector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["web"]}]}}),
    );
    check(&by_object, &prod, json!({"app": "web"}), Some("v1"));
    check(&by_object, &prod, json!({"app": "db"}), None);
    // An empty selector matches everything.
    let empty = hook(all, json!({"namespaceSelector": {}, "objectSelector": {}}));
    check(&empty, &dev, json!(null), Some("v1"));
}

#[test]
fn admission_configuration_resources_never_go_to_webhooks() {
    let all = hook(json!([rule(&["*"], &["*"], &["*"], &["*"])]), json!({}));
    for resource in [
        "validatingwebhookconfigurations",
        "mutatingwebhookconfigurations",
        "validatingadmissionpolicies",
        "validatingadmissionpolicybindings",
    ] {
        check(
            &all,
            &attrs("admissionregistration.k8s.io", "v1", resource, "", ""),
            json!(null),
            None,
        );
    }
}

#[test]
fn dry_run_needs_a_side_effect_free_webhook() {
    let a = attrs("", "v1", "configmaps", "", "prod");
    let options = json!({});
    let versions = vec!["v1".to_string()];
    let object = json!({"metadata": {"name": "x"}});
    let call = Call {
        operation: "CREATE",
        attrs: &a,
        kind: "ConfigMap",
        served_versions: &versions,
        kind_group_version: None,
        object: Some(&object),
        old_object: None,
        dry_run: true,
        options: &options,
    };
    let snapshot = WebhookSnapshot::default();
    let rules = json!([rule(&["*"], &["*"], &["*"], &["*"])]);
    for (side_effects, allowed) in [
        (json!("None"), true),
        (json!("NoneOnDryRun"), true),
        (json!("Some"), false),
        (json!(null), false),
    ] {
        let h = hook(rules.clone(), json!({"sideEffects": side_effects}));
        match matching_version(&snapshot, &h, &call) {
            Ok(Some(_)) => assert!(allowed, "{side_effects}"),
            Ok(None) => panic!("matches"),
            Err(status) => {
                assert!(!allowed, "{side_effects}");
                assert_eq!(status["code"], 400);
                assert_eq!(status["reason"], "BadRequest");
                assert_eq!(
                    status["message"],
                    "admission webhook \"h.example.com\" does not support dry run"
                );
            }
        }
    }
}

#[test]
fn match_conditions_are_cel_over_the_request() {
    let a = attrs("", "v1", "configmaps", "", "prod");
    let options = json!({});
    let versions = vec!["v1".to_string()];
    let object = json!({"metadata": {"name": "x", "labels": {"skip": "yes"}}});
    let call = Call {
        operation: "CREATE",
        attrs: &a,
        kind: "ConfigMap",
        served_versions: &versions,
        kind_group_version: None,
        object: Some(&object),
        old_object: None,
        dry_run: false,
        options: &options,
    };
    let cond = |e: &str| json!({"matchConditions": [{"name": "c", "expression": e}]});
    assert_eq!(
        match_conditions(&cond("request.operation == 'CREATE'"), &call),
        Ok(true)
    );
    assert_eq!(
        match_conditions(&cond("!('skip' in object.metadata.labels)"), &call),
        Ok(false)
    );
    assert!(match_conditions(&cond("1"), &call).is_err());
    // An error fails closed with a Forbidden, or skips the webhook under Ignore.
    let mut h = hook(json!([rule(&["*"], &["*"], &["*"], &["*"])]), cond("1"));
    let snapshot = WebhookSnapshot::default();
    let status = matching_version(&snapshot, &h, &call).expect_err("fails closed");
    assert_eq!(status["code"], 403);
    assert!(
        status["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("configmaps \"x\" is forbidden: matchCondition \"c\"")),
        "{status}"
    );
    h["failurePolicy"] = json!("Ignore");
    assert_eq!(matching_version(&snapshot, &h, &call), Ok(None));
}

#[test]
fn responses_are_checked_like_kube() {
    let review = json!({"request": {"uid": "u1"}});
    let ok = |response: Value| json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response});
    assert!(verify_response(&review, ok(json!({"uid": "u1", "allowed": true})), false).is_ok());
    assert_eq!(
        verify_response(&review, ok(json!({"uid": "u2", "allowed": true})), false),
        Err("expected response.uid=\"u1\", got \"u2\"".to_string())
    );
    assert_eq!(
        verify_response(
            &review,
            ok(json!({"uid": "u1", "allowed": true, "patch": "W10=", "patchType": "JSONPatch"})),
            false
        ),
        Err("validating webhooks may not return patches".to_string())
    );
    assert_eq!(
        verify_response(
            &review,
            ok(json!({"uid": "u1", "allowed": true, "patch": "W10="})),
            true
        ),
        Err("webhook returned response.patch but not response.patchType".to_string())
    );
    assert!(verify_response(&review, json!({"kind": "AdmissionReview"}), false).is_err());
    assert_eq!(
        verify_response(&review, ok(json!(null)), false),
        Err("webhook response was absent".to_string())
    );
}

#[test]
fn denials_keep_the_webhook_status_with_at_least_400() {
    let d = denied(
        "h.example.com",
        &json!({"code": 422, "reason": "Invalid", "message": "bad port"}),
    );
    assert_eq!(d["code"], 422);
    assert_eq!(d["reason"], "Invalid");
    assert_eq!(
        d["message"],
        "admission webhook \"h.example.com\" denied the request: bad port"
    );
    let d = denied("h.example.com", &json!({"code": 200, "reason": "NotGood"}));
    assert_eq!(d["code"], 400);
    assert_eq!(
        d["message"],
        "admission webhook \"h.example.com\" denied the request: NotGood"
    );
    let d = denied("h.example.com", &Value::Null);
    assert_eq!(d["code"], 400);
    assert_eq!(
        d["message"],
        "admission webhook \"h.example.com\" denied the request without explanation"
    );
    let f = calling_failed("h.example.com", "failed to call webhook: boom");
    assert_eq!(f["code"], 500);
    assert_eq!(f["reason"], "InternalError");
    assert_eq!(
        f["message"],
        "Internal error occurred: failed calling webhook \"h.example.com\": failed to call webhook: boom"
    );
}

#[test]
fn reviews_carry_the_matched_and_the_requested_version() {
    let a = attrs("example.com", "v2", "things", "status", "prod");
    let options = json!({"kind": "UpdateOptions"});
    let versions = vec!["v1".to_string(), "v2".to_string()];
    let object = json!({"apiVersion": "example.com/v2", "metadata": {"name": "x"}});
    let call = Call {
        operation: "UPDATE",
        attrs: &a,
        kind: "Thing",
        served_versions: &versions,
        kind_group_version: None,
        object: Some(&object),
        old_object: Some(&object),
        dry_run: true,
        options: &options,
    };
    let matched = MatchedVersion {
        group: "example.com".into(),
        version: "v1".into(),
        resource: "things".into(),
        kind: "Thing".into(),
    };
    let review = review_request(&call, &matched);
    let r = &review["request"];
    assert_eq!(r["kind"]["version"], "v1");
    assert_eq!(r["requestKind"]["version"], "v2");
    assert_eq!(r["resource"]["resource"], "things");
    assert_eq!(r["subResource"], "status");
    assert_eq!(r["requestSubResource"], "status");
    assert_eq!(r["object"]["apiVersion"], "example.com/v1");
    assert_eq!(r["oldObject"]["apiVersion"], "example.com/v1");
    assert_eq!(r["dryRun"], true);
    assert_eq!(r["options"], options);
    assert!(r["uid"].as_str().is_some_and(|u| !u.is_empty()));
}

#[test]
fn configurations_are_defaulted_and_validated() {
    let mut c = json!({"webhooks": [{"name": "a.example.com", "sideEffects": "None",
        "admissionReviewVersions": ["v1"], "clientConfig": {"service": {"namespace": "n", "name": "s"}},
        "rules": [{"operations": ["*"], "apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*"]}]}]});
    apply_defaults(&mut c, true);
    let h = &c["webhooks"][0];
    assert_eq!(h["failurePolicy"], "Fail");
    assert_eq!(h["reinvocationPolicy"], "Never");
    assert_eq!(h["timeoutSeconds"], 10);
    assert!(validate_configuration(&c, true).is_empty());

    let bad = json!({"webhooks": [
        {"name": "a.example.com", "clientConfig": {}, "failurePolicy": "Maybe", "rules": [{"scope": "All"}]},
        {"name": "a.example.com", "sideEffects": "None", "admissionReviewVersions": ["v2"],
         "clientConfig": {"service": {"namespace": "n", "name": "s", "path": "x", "port": 0}}}]});
    let fields: Vec<(String, String)> = validate_configuration(&bad, false)
        .into_iter()
        .map(|c| (c.field, c.message))
        .collect();
    let expected = [
        (
            "webhooks[0].admissionReviewVersions",
            "Required value: must specify one of v1, v1beta1",
        ),
        (
            "webhooks[0].sideEffects",
            "Required value: must specify one of None, NoneOnDryRun",
        ),
        (
            "webhooks[0].failurePolicy",
            "Unsupported value: \"Maybe\": supported values: \"Fail\", \"Ignore\"",
        ),
        (
            "webhooks[0].clientConfig",
            "Required value: exactly one of url or service is required",
        ),
        ("webhooks[0].rules[0].operations", "Required value"),
        ("webhooks[0].rules[0].apiGroups", "Required value"),
        ("webhooks[0].rules[0].apiVersions", "Required value"),
        ("webhooks[0].rules[0].resources", "Required value"),
        (
            "webhooks[0].rules[0].scope",
            "Unsupported value: \"All\": supported values: \"*\", \"Cluster\", \"Namespaced\"",
        ),
        ("webhooks[1].name", "Duplicate value: \"a.example.com\""),
        (
            "webhooks[1].admissionReviewVersions",
            "Invalid value: [\"v2\"]: must include at least one of v1, v1beta1",
        ),
        (
            "webhooks[1].clientConfig.service.path",
            "Invalid value: \"x\": must start with a '/'",
        ),
        (
            "webhooks[1].clientConfig.service.port",
            "Invalid value: 0: port is not valid: must be between 1 and 65535, inclusive",
        ),
    ];
    let expected: Vec<(String, String)> = expected
        .iter()
        .map(|(f, m)| (f.to_string(), m.to_string()))
        .collect();
    assert_eq!(fields, expected);
}

#[test]
fn a_denial_with_a_retry_delay_answers_with_retry_after() {
    let status = denied(
        "h.example.com",
        &json!({"code": 503, "reason": "ServiceUnavailable", "message": "not ready",
                "details": {"retryAfterSeconds": 1}}),
    );
    assert_eq!(status["code"], 503);
    assert_eq!(status["details"]["retryAfterSeconds"], 1);
    let error = crate::ApiError::from_status(&status);
    assert_eq!(
        error.headers,
        vec![("Retry-After".to_string(), "1".to_string())]
    );
}

#[test]
fn patches_are_base64_json_patches() {
    let encode = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    assert_eq!(decode_patch(&json!({"allowed": true})), Ok(None));
    let ok = decode_patch(&json!({"patch": encode(r#"[{"op":"remove","path":"/a"}]"#)}));
    assert!(matches!(ok, Ok(Some(p)) if p.0.len() == 1));
    for bad in [json!({"patch": "%%%"}), json!({"patch": encode("{}")})] {
        let e = decode_patch(&bad).expect_err("undecodable");
        assert!(
            e.starts_with("received undecodable patch in webhook response: "),
            "{e}"
        );
    }
}
