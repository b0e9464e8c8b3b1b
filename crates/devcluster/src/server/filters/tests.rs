use super::*;
use crate::test_util::values;
use crate::types::UserInfo;

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        map.append(
            HeaderName::from_bytes(name.as_bytes()).expect("name"),
            HeaderValue::from_str(value).expect("value"),
        );
    }
    map
}

fn is_uuid(text: &str) -> bool {
    uuid::Uuid::parse_str(text).is_ok() && text.len() == 36
}

/// (request's Audit-Id values, the audit ID expected; `None` for a new UUID)
#[test]
fn the_audit_id_is_the_callers_or_a_new_uuid() {
    let cases: [(&[&str], Option<&str>); 5] = [
        (&["caller-chosen"], Some("caller-chosen")),
        // Kept as sent, however it looks (kube does not truncate or check it).
        (&["not a uuid at all"], Some("not a uuid at all")),
        // Go's Header.Get: the first value.
        (&["first", "second"], Some("first")),
        // An empty value counts as none.
        (&[""], None),
        (&[], None),
    ];
    for (sent, expected) in cases {
        let pairs: Vec<(&str, &str)> = sent.iter().map(|v| ("audit-id", *v)).collect();
        let mut request = headers(&pairs);
        let exchange = Exchange::begin(&mut request);
        let mut response = Response::new(super::super::http::empty());
        stamp(&mut response, &exchange);
        let answered = values(response.headers(), "audit-id");
        assert_eq!(answered.len(), 1, "{sent:?}: {answered:?}");
        match expected {
            Some(id) => assert_eq!(answered[0], id, "{sent:?}"),
            None => assert!(is_uuid(&answered[0]), "{sent:?}: {answered:?}"),
        }
        // The request now carries that one ID, for an aggregated backend.
        assert_eq!(values(&request, "audit-id"), answered, "{sent:?}");
    }
    // A new ID per request.
    let (mut a, mut b) = (HeaderMap::new(), HeaderMap::new());
    assert_ne!(
        Exchange::begin(&mut a).audit_id,
        Exchange::begin(&mut b).audit_id
    );
}

fn attrs(user: &str, groups: &[&str], verb: &str, path: &str) -> RequestAttributes {
    let resource_request = path.starts_with("/api");
    let segments: Vec<&str> = path.split('/').collect();
    RequestAttributes {
        user: UserInfo {
            name: user.into(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            ..UserInfo::default()
        },
        verb: verb.into(),
        resource_request,
        // Enough of kube's RequestInfo for classification:
        // /apis/<g>/<v>/namespaces/<ns>/<resource>/<name>/<subresource>.
        resource: segments.get(6).copied().unwrap_or_default().into(),
        subresource: segments.get(8).copied().unwrap_or_default().into(),
        path: path.into(),
        ..RequestAttributes::default()
    }
}

#[test]
fn requests_are_classified_into_kubes_bootstrap_flow_schemas() {
    let schemas = FlowSchemas::new();
    let admin = ["system:masters", "system:authenticated"];
    let alice = ["developers", "system:authenticated"];
    let anonymous = ["system:unauthenticated"];
    let crontabs = "/apis/stable.example.io/v1/namespaces/ns/crontabs";
    // (attributes, expected flow; None: not classified)
    let cases = [
        (
            attrs("admin", &admin, "list", crontabs),
            Some(&schemas.exempt),
        ),
        // Precedence 1 before probes' 2.
        (
            attrs("admin", &admin, "get", "/healthz"),
            Some(&schemas.exempt),
        ),
        (
            attrs("alice", &alice, "get", "/readyz"),
            Some(&schemas.probes),
        ),
        (
            attrs("system:anonymous", &anonymous, "get", "/livez"),
            Some(&schemas.probes),
        ),
        // Probes are GETs of those exact paths.
        (
            attrs("alice", &alice, "head", "/healthz"),
            Some(&schemas.global_default),
        ),
        (
            attrs("alice", &alice, "get", "/healthz/etcd"),
            Some(&schemas.global_default),
        ),
        (
            attrs("alice", &alice, "list", crontabs),
            Some(&schemas.global_default),
        ),
        (
            attrs("alice", &alice, "watch", crontabs),
            Some(&schemas.global_default),
        ),
        (
            attrs("system:anonymous", &anonymous, "get", "/version"),
            Some(&schemas.global_default),
        ),
        // Long-running requests other than watches are not classified.
        (
            attrs("alice", &alice, "create", &format!("{crontabs}/x/exec")),
            None,
        ),
        (
            attrs("admin", &admin, "get", &format!("{crontabs}/x/log")),
            None,
        ),
        (
            attrs("alice", &alice, "get", &format!("{crontabs}/x/status")),
            Some(&schemas.global_default),
        ),
    ];
    for (request, expected) in cases {
        assert_eq!(
            schemas.classify(&request).as_ref(),
            expected,
            "{} {} {}",
            request.user.name,
            request.verb,
            request.path
        );
    }
    // Probes run at the exempt priority level; the UIDs differ otherwise.
    assert_eq!(schemas.probes.priority_level, schemas.exempt.priority_level);
    assert_ne!(schemas.probes.schema, schemas.exempt.schema);
    assert_ne!(
        schemas.global_default.priority_level,
        schemas.exempt.priority_level
    );
    assert_ne!(schemas.global_default.schema, schemas.exempt.schema);
    // Each cluster has UIDs of its own.
    assert_ne!(FlowSchemas::new().exempt, schemas.exempt);
}

/// The headers `stamp` leaves on an answer with `answer` headers (and, when
/// `relayed`, marked so) to a request sending `audit-id: front`, classified into
/// `flow`.
fn stamped(answer: &[(&str, &str)], relayed: Option<Relayed>, flow: Option<Flow>) -> HeaderMap {
    let mut request = headers(&[("audit-id", "front")]);
    let mut exchange = Exchange::begin(&mut request);
    exchange.flow = flow;
    let mut response = Response::new(super::super::http::empty());
    *response.headers_mut() = headers(answer);
    if let Some(relayed) = relayed {
        response.extensions_mut().insert(relayed);
    }
    stamp(&mut response, &exchange);
    response.headers().clone()
}

#[test]
fn answers_get_the_filters_headers() {
    let flow = FlowSchemas::new().global_default;
    let schema = flow.schema.to_str().expect("text").to_string();
    let level = flow.priority_level.to_str().expect("text").to_string();

    // A local answer: the handler's own Cache-Control wins.
    let h = stamped(
        &[("content-type", "application/json")],
        None,
        Some(flow.clone()),
    );
    assert_eq!(values(&h, "audit-id"), ["front"]);
    assert_eq!(values(&h, "cache-control"), ["no-cache, private"]);
    assert_eq!(
        values(&h, "x-kubernetes-pf-flowschema-uid"),
        [schema.as_str()]
    );
    assert_eq!(
        values(&h, "x-kubernetes-pf-prioritylevel-uid"),
        [level.as_str()]
    );
    let h = stamped(&[("cache-control", "public")], None, Some(flow.clone()));
    assert_eq!(values(&h, "cache-control"), ["public"]);

    // Refused before priority and fairness (401, refused impersonation): no flow.
    let h = stamped(&[], None, None);
    assert_eq!(values(&h, "audit-id"), ["front"]);
    assert_eq!(values(&h, "cache-control"), ["no-cache, private"]);
    assert!(!h.contains_key("x-kubernetes-pf-flowschema-uid"));
    assert!(!h.contains_key("x-kubernetes-pf-prioritylevel-uid"));

    // A relayed answer: the front's values first, then the backend's.
    let backend = [
        ("audit-id", "front"),
        ("cache-control", "no-cache, private"),
        ("x-kubernetes-pf-flowschema-uid", "backend-schema"),
        ("x-kubernetes-pf-prioritylevel-uid", "backend-level"),
        ("content-type", "application/json"),
    ];
    let h = stamped(&backend, Some(Relayed::Answer), Some(flow.clone()));
    assert_eq!(values(&h, "audit-id"), ["front", "front"]);
    assert_eq!(
        values(&h, "cache-control"),
        ["no-cache, private", "no-cache, private"]
    );
    assert_eq!(
        values(&h, "x-kubernetes-pf-flowschema-uid"),
        [schema.as_str(), "backend-schema"]
    );
    assert_eq!(
        values(&h, "x-kubernetes-pf-prioritylevel-uid"),
        [level.as_str(), "backend-level"]
    );
    assert_eq!(values(&h, "content-type"), ["application/json"]);
    // A backend that sends none of them.
    let h = stamped(&[], Some(Relayed::Answer), Some(flow.clone()));
    assert_eq!(values(&h, "audit-id"), ["front"]);
    assert_eq!(values(&h, "cache-control"), ["no-cache, private"]);
    assert_eq!(
        values(&h, "x-kubernetes-pf-flowschema-uid"),
        [schema.as_str()]
    );

    // The answer to an upgrade goes out as the backend sent it.
    let h = stamped(
        &[("upgrade", "SPDY/3.1")],
        Some(Relayed::Upgrade),
        Some(flow),
    );
    assert_eq!(h, headers(&[("upgrade", "SPDY/3.1")]));
}
