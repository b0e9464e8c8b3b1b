use super::*;

fn resource(namespace: &str, name: &str, subresource: &str) -> ResourcePath {
    ResourcePath {
        group: "example.com".into(),
        version: "v1".into(),
        namespace: namespace.into(),
        resource: "widgets".into(),
        name: name.into(),
        subresource: subresource.into(),
        ..ResourcePath::default()
    }
}

fn headers(content_type: &str) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_str(content_type).expect("header"),
    );
    headers
}

fn query(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn verbs_are_reported_as_kube_names_them() {
    let plain = HeaderMap::new();
    let cases = [
        ("get", "GET"),
        ("list", "LIST"),
        ("watch", "WATCH"),
        ("create", "POST"),
        ("update", "PUT"),
        ("patch", "PATCH"),
        ("delete", "DELETE"),
        ("deletecollection", "DELETECOLLECTION"),
    ];
    for (verb, reported) in cases {
        let labels = RequestLabels::new(verb, &resource("demo", "a", ""), &plain, &query(&[]))
            .expect("counted");
        assert_eq!(labels.verb, reported, "{verb}");
    }
    let apply = headers("application/apply-patch+yaml");
    let labels = RequestLabels::new("patch", &resource("demo", "a", ""), &apply, &query(&[]))
        .expect("counted");
    assert_eq!(labels.verb, "APPLY");
}

/// kube counts a request only in the handler that serves it, and none
/// serves a method its RequestInfo has no verb for, or the `proxy` verb.
#[test]
fn requests_no_handler_serves_are_not_counted() {
    let plain = HeaderMap::new();
    for verb in ["", "proxy"] {
        let labels = RequestLabels::new(verb, &resource("demo", "a", ""), &plain, &query(&[]));
        assert_eq!(labels, None, "{verb:?}");
    }
}

#[test]
fn scope_and_dry_run_follow_the_request() {
    let plain = HeaderMap::new();
    let scope = |namespace, name| {
        RequestLabels::new("get", &resource(namespace, name, ""), &plain, &query(&[]))
            .expect("counted")
            .scope
    };
    assert_eq!(scope("demo", "a"), "resource");
    assert_eq!(scope("demo", ""), "namespace");
    assert_eq!(scope("", ""), "cluster");
    let dry_run = |value| {
        RequestLabels::new("create", &resource("demo", "", ""), &plain, &query(value))
            .expect("counted")
            .dry_run
    };
    assert_eq!(dry_run(&[]), "");
    assert_eq!(dry_run(&[("dryRun", "All")]), "All");
    assert_eq!(dry_run(&[("dryRun", "Some")]), "invalid");
}

#[test]
fn the_exposition_counts_each_series_by_code() {
    let metrics = RequestMetrics::default();
    let plain = HeaderMap::new();
    let labels = RequestLabels::new("update", &resource("demo", "a", ""), &plain, &query(&[]))
        .expect("counted");
    metrics.record(labels.clone(), 200);
    metrics.record(labels.clone(), 200);
    metrics.record(labels, 409);
    let status = RequestLabels::new(
        "patch",
        &resource("demo", "a", "status"),
        &plain,
        &query(&[]),
    )
    .expect("counted");
    metrics.record(status, 200);
    let text = metrics.render();
    let put = "apiserver_request_total{code=\"200\",component=\"apiserver\",dry_run=\"\",\
               group=\"example.com\",resource=\"widgets\",scope=\"resource\",subresource=\"\",\
               verb=\"PUT\",version=\"v1\"} 2";
    assert!(text.lines().any(|l| l == put), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("apiserver_request_total{code=\"409\"") && l.ends_with("} 1")),
        "{text}"
    );
    assert!(
        text.contains("subresource=\"status\",verb=\"PATCH\""),
        "{text}"
    );
    assert!(
        text.contains("# TYPE apiserver_request_total counter\n"),
        "{text}"
    );
}

#[test]
fn a_watch_is_counted_when_its_guard_goes() {
    let metrics = Arc::new(RequestMetrics::default());
    let plain = HeaderMap::new();
    let labels = RequestLabels::new("watch", &resource("demo", "", ""), &plain, &query(&[]))
        .expect("counted");
    let guard = CountWhenDropped::new(metrics.clone(), labels, 200);
    assert!(!metrics.render().contains("verb=\"WATCH\""));
    drop(guard);
    assert!(metrics
        .render()
        .contains("verb=\"WATCH\",version=\"v1\"} 1"));
}

#[test]
fn label_values_are_escaped() {
    assert_eq!(escaped("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
}
