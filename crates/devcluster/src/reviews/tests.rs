use super::*;
use crate::rbac::{bootstrap_objects, snapshot_from_objects};
use serde_json::json;

fn reference(name: &str) -> Value {
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/reference/kube-apiserver-1.32")
        .join(name);
    let text = std::fs::read_to_string(&file).expect("reference file");
    serde_json::from_str(&text).expect("json")
}

/// The recorded setup: token users and alice's Role in ref-rbac.
fn fixture() -> (RbacSnapshot, Authenticator) {
    let authn = Authenticator::new(
        "<admin-token>,admin,admin-uid,system:masters\n\
         <alice-token>,alice,alice-uid,developers\n\
         <bob-token>,bob,bob-uid,viewers\n",
        true,
    )
    .expect("tokens");
    authn.set_api_audiences(vec!["https://target.realk8s.local".into()]);
    let mut objects = bootstrap_objects();
    objects.extend([
        json!({"kind": "Role", "metadata": {"name": "crontab-reader", "namespace": "ref-rbac"},
               "rules": [{"apiGroups": ["stable.example.io"], "resources": ["crontabs"],
                          "verbs": ["get", "list", "watch"]}]}),
        json!({"kind": "RoleBinding", "metadata": {"name": "alice-crontab-reader", "namespace": "ref-rbac"},
               "roleRef": {"kind": "Role", "name": "crontab-reader"},
               "subjects": [{"kind": "User", "name": "alice"}]}),
    ]);
    (snapshot_from_objects(&objects), authn)
}

/// Replays a recorded review and compares the body. managedFields (written by the
/// pipeline's field manager, not here) and `<time>` placeholders are ignored.
fn check(file: &str) {
    let (rbac, authn) = fixture();
    let recorded = reference(file);
    let request = &recorded["request"];
    let path = request["path"].as_str().expect("path");
    let resource = path.rsplit('/').next().expect("resource");
    let token = request["headers"]["Authorization"]
        .as_str()
        .and_then(|h| h.strip_prefix("Bearer "))
        .expect("token");
    let caller = authn.authenticate_token(token).expect("caller");
    let got = handle_review(resource, &request["body"], &caller, &rbac, &authn);
    let status = recorded["response"]["status"].as_u64().expect("status");
    let mut expected = recorded["response"]["body"].clone();
    if let Some(m) = expected["metadata"].as_object_mut() {
        m.remove("managedFields");
    }
    let mut got = match got {
        Ok(v) => {
            assert_eq!(status, 201, "{file}: expected an error, got {v}");
            v
        }
        Err(v) => {
            assert_eq!(v["code"].as_u64(), Some(status), "{file}: {v}");
            v
        }
    };
    // kube lists bindings in informer (random) order; compare rule lists as sets.
    for rules in ["resourceRules", "nonResourceRules"] {
        for v in [&mut got, &mut expected] {
            if let Some(list) = v["status"]
                .as_object_mut()
                .and_then(|s| s.get_mut(rules))
                .and_then(Value::as_array_mut)
            {
                list.sort_by_key(|r| r.to_string());
            }
        }
    }
    if expected["metadata"]["creationTimestamp"] == "<time>" {
        assert!(got["metadata"]["creationTimestamp"].is_string(), "{file}");
        got["metadata"]["creationTimestamp"] = json!("<time>");
    }
    assert_eq!(got, expected, "{file}");
}

#[test]
fn recorded_reviews() {
    for file in [
        "145-sar-allowed.json",
        "146-sar-denied.json",
        "147-sar-allowed-system-masters.json",
        "148-sar-nonresource.json",
        "149-sar-invalid-422.json",
        "151-ssar-alice-allowed.json",
        "152-ssar-alice-denied.json",
        "153-ssrr-alice.json",
        "154-tokenreview-alice.json",
        "155-tokenreview-bad.json",
        "156-selfsubjectreview-alice.json",
    ] {
        check(file);
    }
}

#[test]
fn invalid_self_subject_access_review_has_one_cause() {
    let (rbac, authn) = fixture();
    let caller = authn.authenticate_token("<alice-token>").expect("alice");
    let err = handle_review(
        "selfsubjectaccessreviews",
        &json!({"spec": {"resourceAttributes": {"verb": "get"}, "nonResourceAttributes": {"path": "/x", "verb": "get"}}}),
        &caller,
        &rbac,
        &authn,
    )
    .expect_err("both attributes");
    assert_eq!(
        err["message"],
        ".authorization.k8s.io \"\" is invalid: spec.nonResourceAttributes: Invalid value: \
         authorization.NonResourceAttributes{Path:\"/x\", Verb:\"get\"}: cannot be specified in \
         combination with resourceAttributes"
    );
    assert_eq!(err["code"], 422);
}

#[test]
fn rules_review_for_masters_and_missing_namespace() {
    let (rbac, authn) = fixture();
    let admin = authn.authenticate_token("<admin-token>").expect("admin");
    let got = handle_review(
        "selfsubjectrulesreviews",
        &json!({"spec": {"namespace": "default"}}),
        &admin,
        &rbac,
        &authn,
    )
    .expect("rules");
    assert_eq!(
        got["status"]["resourceRules"][0],
        json!({"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]})
    );
    let err = handle_review(
        "selfsubjectrulesreviews",
        &json!({"spec": {}}),
        &admin,
        &rbac,
        &authn,
    )
    .expect_err("no namespace");
    assert_eq!(err["code"], 400);
}

#[test]
fn local_subject_access_review_is_namespaced() {
    let (rbac, authn) = fixture();
    let admin = authn.authenticate_token("<admin-token>").expect("admin");
    let body = json!({"apiVersion": "authorization.k8s.io/v1", "kind": "LocalSubjectAccessReview",
        "metadata": {"namespace": "ref-rbac"},
        "spec": {"user": "alice", "resourceAttributes": {"namespace": "ref-rbac", "verb": "get",
                 "group": "stable.example.io", "resource": "crontabs"}}});
    let got = handle_review("localsubjectaccessreviews", &body, &admin, &rbac, &authn).expect("ok");
    assert_eq!(got["kind"], "LocalSubjectAccessReview");
    assert_eq!(got["status"]["allowed"], true);
    let mut wrong = body.clone();
    wrong["metadata"]["namespace"] = json!("other");
    let err = handle_review("localsubjectaccessreviews", &wrong, &admin, &rbac, &authn)
        .expect_err("mismatch");
    assert_eq!(err["code"], 400);
}

#[test]
fn token_review_audiences() {
    let (rbac, authn) = fixture();
    let admin = authn.authenticate_token("<admin-token>").expect("admin");
    let review = |aud: Value| {
        handle_review(
            "tokenreviews",
            &json!({"spec": {"token": "<bob-token>", "audiences": aud}}),
            &admin,
            &rbac,
            &authn,
        )
        .expect("review")
    };
    let ok = review(json!(["https://target.realk8s.local", "other"]));
    assert_eq!(
        ok["status"]["audiences"],
        json!(["https://target.realk8s.local"])
    );
    assert_eq!(ok["status"]["authenticated"], true);
    let bad = review(json!(["other"]));
    assert!(bad["status"].get("authenticated").is_none(), "{bad}");
}
