use super::*;
use crate::types::UserInfo;
use serde_json::json;

const PROTECTED: &str = "vcluster.loft.sh/protected";

fn protection_policy() -> AdmissionSnapshot {
    AdmissionSnapshot {
        policies: vec![json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": "vcluster-protected-apiservices"},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": [
                    {"apiGroups": ["apiregistration.k8s.io"], "apiVersions": ["*"],
                     "operations": ["DELETE"], "resources": ["apiservices"]},
                    {"apiGroups": [""], "apiVersions": ["*"],
                     "operations": ["DELETE"], "resources": ["services"]},
                ]},
                "validations": [{"expression": "false",
                                 "message": "deleting resource proxy objects is not allowed"}],
            },
        })],
        bindings: vec![json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": "vcluster-protected-resource-proxy"},
            "spec": {
                "policyName": "vcluster-protected-apiservices",
                "validationActions": ["Deny"],
                "matchResources": {"objectSelector": {"matchLabels": {PROTECTED: "resource-proxy"}}},
            },
        })],
        namespaces: vec![
            json!({"metadata": {"name": "kube-system", "labels": {"tier": "system"}}}),
            json!({"metadata": {"name": "apps", "labels": {"tier": "apps"}}}),
        ],
    }
}

fn attrs(group: &str, resource: &str, sub: &str, ns: &str, name: &str) -> RequestAttributes {
    RequestAttributes {
        user: UserInfo {
            name: "alice".into(),
            groups: vec!["developers".into(), "system:authenticated".into()],
            ..Default::default()
        },
        verb: String::new(),
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

fn object(name: &str, labels: Value) -> Value {
    json!({"metadata": {"name": name, "labels": labels}, "spec": {"replicas": 3}})
}

type Outcome = Result<Vec<String>, (u64, String)>;

/// Runs one request: (operation, attrs, kind, object, old object) → Ok(warnings) or the
/// denial's (code, message).
fn run(
    s: &AdmissionSnapshot,
    op: &str,
    a: &RequestAttributes,
    kind: (&str, &str, &str),
    obj: Option<&Value>,
    old: Option<&Value>,
) -> Outcome {
    validate(
        s,
        &AdmissionRequest {
            operation: op,
            attrs: a,
            kind,
            object: obj,
            old_object: old,
        },
    )
    .map_err(|st| {
        (
            st["code"].as_u64().unwrap_or(0),
            st["message"].as_str().unwrap_or("").to_string(),
        )
    })
}

#[test]
fn protection_blocks_delete_of_labelled_services_and_apiservices_only() {
    let s = protection_policy();
    let labelled = object("proxy-example-com-v1", json!({PROTECTED: "resource-proxy"}));
    let plain = object("other", json!({"app": "x"}));
    let svc = attrs("", "services", "", "kube-system", "proxy-example-com-v1");
    let svc_kind = ("", "v1", "Service");
    let api = attrs(
        "apiregistration.k8s.io",
        "apiservices",
        "",
        "",
        "v1.example.com",
    );
    let api_kind = ("apiregistration.k8s.io", "v1", "APIService");

    let denied = run(&s, "DELETE", &svc, svc_kind, None, Some(&labelled));
    assert_eq!(
        denied,
        Err((
            422,
            "services \"proxy-example-com-v1\" is forbidden: ValidatingAdmissionPolicy \
             'vcluster-protected-apiservices' with binding 'vcluster-protected-resource-proxy' \
             denied request: deleting resource proxy objects is not allowed"
                .to_string()
        ))
    );
    let denied = run(&s, "DELETE", &api, api_kind, None, Some(&labelled));
    assert_eq!(
        denied.map_err(|(c, m)| (c, m.starts_with("apiservices.apiregistration.k8s.io \"v1.example.com\" is forbidden: ValidatingAdmissionPolicy"))),
        Err((422, true))
    );
    // Updates (e.g. removing the label) pass; unlabelled objects are unaffected.
    assert_eq!(
        run(&s, "UPDATE", &api, api_kind, Some(&plain), Some(&labelled)),
        Ok(vec![])
    );
    assert_eq!(
        run(&s, "DELETE", &api, api_kind, None, Some(&plain)),
        Ok(vec![])
    );
    assert_eq!(
        run(&s, "DELETE", &svc, svc_kind, None, Some(&plain)),
        Ok(vec![])
    );
    // Other resources are not matched even when labelled.
    let cm = attrs("", "configmaps", "", "kube-system", "c");
    assert_eq!(
        run(
            &s,
            "DELETE",
            &cm,
            ("", "v1", "ConfigMap"),
            None,
            Some(&labelled)
        ),
        Ok(vec![])
    );
}

#[test]
fn denial_status_shape() {
    let s = protection_policy();
    let labelled = object("p", json!({PROTECTED: "resource-proxy"}));
    let a = attrs("", "services", "", "kube-system", "p");
    let st = validate(
        &s,
        &AdmissionRequest {
            operation: "DELETE",
            attrs: &a,
            kind: ("", "v1", "Service"),
            object: None,
            old_object: Some(&labelled),
        },
    )
    .expect_err("denied");
    let text = "ValidatingAdmissionPolicy 'vcluster-protected-apiservices' with binding \
                'vcluster-protected-resource-proxy' denied request: deleting resource proxy objects is not allowed";
    assert_eq!(
        st,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": format!("services \"p\" is forbidden: {text}"), "reason": "Invalid",
               "details": {"name": "p", "kind": "services", "causes": [{"message": text}]}, "code": 422})
    );
}

fn single_policy(spec: Value, binding_spec: Value) -> AdmissionSnapshot {
    let mut binding_spec = binding_spec;
    binding_spec["policyName"] = json!("p");
    AdmissionSnapshot {
        policies: vec![json!({"metadata": {"name": "p"}, "spec": spec})],
        bindings: vec![json!({"metadata": {"name": "b"}, "spec": binding_spec})],
        namespaces: protection_policy().namespaces,
    }
}

fn crontab_rules() -> Value {
    json!({"resourceRules": [{"apiGroups": ["stable.example.io"], "apiVersions": ["v1"],
                              "operations": ["CREATE", "UPDATE"], "resources": ["crontabs"]}]})
}

#[test]
fn cel_variables_messages_and_reasons() {
    let a = attrs("stable.example.io", "crontabs", "", "apps", "");
    let kind = ("stable.example.io", "v1", "CronTab");
    let obj = object("c1", json!({}));
    let old = object("c1", json!({}));
    let cases: Vec<(Value, &str, bool, Outcome)> = vec![
        // object fields, with the default message.
        (json!({"expression": "object.spec.replicas <= 2"}), "CREATE", false,
         Err((422, "crontabs.stable.example.io \"c1\" is forbidden: ValidatingAdmissionPolicy 'p' with binding 'b' denied request: failed expression: object.spec.replicas <= 2".into()))),
        (json!({"expression": "object.spec.replicas <= 3"}), "CREATE", false, Ok(vec![])),
        // oldObject is null on create, set on update.
        (json!({"expression": "oldObject == null"}), "CREATE", false, Ok(vec![])),
        (json!({"expression": "oldObject == null", "message": "m"}), "UPDATE", true,
         Err((422, "crontabs.stable.example.io \"c1\" is forbidden: ValidatingAdmissionPolicy 'p' with binding 'b' denied request: m".into()))),
        // request variable, messageExpression, reason → code.
        (json!({"expression": "request.userInfo.username != 'alice'",
                "messageExpression": "'user ' + request.userInfo.username + ' may not ' + request.operation",
                "reason": "Forbidden"}), "CREATE", false,
         Err((403, "crontabs.stable.example.io \"c1\" is forbidden: ValidatingAdmissionPolicy 'p' with binding 'b' denied request: user alice may not CREATE".into()))),
        (json!({"expression": "request.namespace == 'apps' && request.kind.kind == 'CronTab' && request.resource.resource == 'crontabs' && 'developers' in request.userInfo.groups && namespaceObject.metadata.labels.tier == 'apps' && params == null"}),
         "CREATE", false, Ok(vec![])),
        (json!({"expression": "has(object.metadata.labels.missing)"}), "CREATE", false,
         Err((422, "crontabs.stable.example.io \"c1\" is forbidden: ValidatingAdmissionPolicy 'p' with binding 'b' denied request: failed expression: has(object.metadata.labels.missing)".into()))),
    ];
    for (validation, op, with_old, expected) in cases {
        let s = single_policy(
            json!({"matchConstraints": crontab_rules(), "validations": [validation.clone()]}),
            json!({"validationActions": ["Deny"]}),
        );
        let old = with_old.then_some(&old);
        assert_eq!(
            run(&s, op, &a, kind, Some(&obj), old),
            expected,
            "{validation}"
        );
    }
}

#[test]
fn match_conditions_variables_warn_and_failure_policy() {
    let a = attrs("stable.example.io", "crontabs", "", "apps", "c1");
    let kind = ("stable.example.io", "v1", "CronTab");
    let obj = object("c1", json!({"env": "prod"}));
    let deny_all = json!([{"expression": "false", "message": "no"}]);
    let check = |spec: Value, binding: Value, expected: Result<Vec<String>, u64>| {
        let s = single_policy(spec.clone(), binding);
        let got = run(&s, "CREATE", &a, kind, Some(&obj), None).map_err(|(c, _)| c);
        assert_eq!(got, expected, "{spec}");
    };
    let rules = crontab_rules();
    check(
        json!({"matchConstraints": rules, "matchConditions": [{"name": "prod", "expression": "object.metadata.labels.env == 'prod'"}], "validations": deny_all}),
        json!({"validationActions": ["Deny"]}),
        Err(422),
    );
    check(
        json!({"matchConstraints": rules, "matchConditions": [{"name": "dev", "expression": "object.metadata.labels.env == 'dev'"}], "validations": deny_all}),
        json!({"validationActions": ["Deny"]}),
        Ok(vec![]),
    );
    check(
        json!({"matchConstraints": rules, "variables": [{"name": "env", "expression": "object.metadata.labels.env"}],
                 "validations": [{"expression": "variables.env == 'prod'"}]}),
        json!({"validationActions": ["Deny"]}),
        Ok(vec![]),
    );
    check(
        json!({"matchConstraints": rules, "validations": deny_all}),
        json!({"validationActions": ["Warn"]}),
        Ok(vec![
            "Validation failed for ValidatingAdmissionPolicy 'p' with binding 'b': no".into(),
        ]),
    );
    check(
        json!({"matchConstraints": rules, "validations": deny_all}),
        json!({"validationActions": ["Audit"]}),
        Ok(vec![]),
    );
    // Evaluation errors: Fail denies, Ignore admits.
    let broken = json!([{"expression": "object.spec.nope.deeper == 1"}]);
    check(
        json!({"matchConstraints": rules, "validations": broken}),
        json!({"validationActions": ["Deny"]}),
        Err(422),
    );
    check(
        json!({"matchConstraints": rules, "failurePolicy": "Ignore", "validations": broken}),
        json!({"validationActions": ["Deny"]}),
        Ok(vec![]),
    );
    // Binding selectors narrow the policy.
    check(
        json!({"matchConstraints": rules, "validations": deny_all}),
        json!({"validationActions": ["Deny"], "matchResources": {"namespaceSelector": {"matchLabels": {"tier": "system"}}}}),
        Ok(vec![]),
    );
    check(
        json!({"matchConstraints": rules, "validations": deny_all}),
        json!({"validationActions": ["Deny"], "matchResources": {"namespaceSelector": {"matchLabels": {"tier": "apps"}}}}),
        Err(422),
    );
    // A policy without a binding does nothing.
    let mut s = single_policy(
        json!({"matchConstraints": rules, "validations": deny_all}),
        json!({"validationActions": ["Deny"]}),
    );
    s.bindings.clear();
    assert_eq!(run(&s, "CREATE", &a, kind, Some(&obj), None), Ok(vec![]));
}

#[test]
fn resource_rule_patterns() {
    let check = |resources: Value, resource: &str, sub: &str, expected: bool| {
        let rule = json!({"apiGroups": ["*"], "apiVersions": ["*"], "operations": ["*"], "resources": resources});
        let a = attrs("g", resource, sub, "apps", "n");
        let r = AdmissionRequest {
            operation: "UPDATE",
            attrs: &a,
            kind: ("g", "v1", "K"),
            object: None,
            old_object: None,
        };
        assert_eq!(rule_matches(&rule, &r), expected, "{rule} {resource}/{sub}");
    };
    check(json!(["*"]), "crontabs", "", true);
    check(json!(["*"]), "crontabs", "status", false);
    check(json!(["*/*"]), "crontabs", "status", true);
    check(json!(["*/*"]), "crontabs", "", true);
    check(json!(["crontabs"]), "crontabs", "status", false);
    check(json!(["crontabs/status"]), "crontabs", "status", true);
    check(json!(["*/scale"]), "crontabs", "scale", true);
    check(json!(["crontabs/*"]), "crontabs", "", false);
    check(json!(["crontabs/*"]), "crontabs", "scale", true);
    check(json!(["services"]), "crontabs", "", false);
}

/// The expression crproxy-wiring registers (kept literally here: devcluster must not
/// depend on the wiring crate) evaluates as intended on its own, without the
/// binding's objectSelector narrowing it.
#[test]
fn wiring_protection_expression() {
    let key = crproxy_core::names::PROTECTION_LABEL_KEY;
    let value = crproxy_core::names::PROTECTION_LABEL_VALUE;
    let expression = format!(
        "!has(oldObject.metadata.labels) || !('{key}' in oldObject.metadata.labels) || oldObject.metadata.labels['{key}'] != '{value}'"
    );
    let s = single_policy(
        json!({"failurePolicy": "Fail",
               "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["*"],
                                    "operations": ["DELETE"], "resources": ["services"]}]},
               "validations": [{"expression": expression, "message": "protected"}]}),
        json!({"validationActions": ["Deny"]}),
    );
    let a = attrs("", "services", "", "kube-system", "svc");
    let kind = ("", "v1", "Service");
    let cases = [
        (json!({"metadata": {"name": "svc"}}), true),
        (json!({"metadata": {"name": "svc", "labels": {}}}), true),
        (
            json!({"metadata": {"name": "svc", "labels": {key: "other"}}}),
            true,
        ),
        (
            json!({"metadata": {"name": "svc", "labels": {key: value}}}),
            false,
        ),
    ];
    for (old, allowed) in cases {
        let got = run(&s, "DELETE", &a, kind, None, Some(&old));
        assert_eq!(got.is_ok(), allowed, "{old}: {got:?}");
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

    /// Policies are user input: no expression text may panic the evaluator.
    #[test]
    fn arbitrary_expressions_never_panic(expr in "([ -~]|[()\\[\\]{}.,!?:'\"a-c0-9 +*/%<>=|&-]){0,40}", msg in "[ -~]{0,20}") {
        let s = single_policy(
            json!({"matchConstraints": crontab_rules(),
                   "matchConditions": [{"name": "c", "expression": expr.clone()}],
                   "validations": [{"expression": expr, "messageExpression": msg}]}),
            json!({"validationActions": ["Deny", "Warn"]}),
        );
        let a = attrs("stable.example.io", "crontabs", "", "apps", "c1");
        let obj = object("c1", json!({"a": "b"}));
        let _ = run(&s, "CREATE", &a, ("stable.example.io", "v1", "CronTab"), Some(&obj), None);
    }
}
