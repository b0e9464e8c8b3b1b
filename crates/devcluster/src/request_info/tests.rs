use super::*;

/// What a request resolves to: verb, resource request, group, namespace,
/// resource, name, subresource.
type Resolved<'a> = (&'a str, bool, &'a str, &'a str, &'a str, &'a str, &'a str);

fn check(method: &str, path: &str, query: Option<&str>, expected: Resolved<'_>) {
    let info = resolve(method, path, query).expect("resolvable");
    let got = (
        info.verb.as_str(),
        info.resource_request,
        info.api_group.as_str(),
        info.namespace.as_str(),
        info.resource.as_str(),
        info.name.as_str(),
        info.subresource.as_str(),
    );
    assert_eq!(got, expected, "{method} {path} {query:?}");
}

#[test]
fn verbs_follow_the_method_and_the_name() {
    let pods = "/api/v1/namespaces/ns/pods";
    check("GET", pods, None, ("list", true, "", "ns", "pods", "", ""));
    check("HEAD", pods, None, ("list", true, "", "ns", "pods", "", ""));
    check(
        "GET",
        pods,
        Some("watch=true"),
        ("watch", true, "", "ns", "pods", "", ""),
    );
    check(
        "GET",
        pods,
        Some("watch=0"),
        ("list", true, "", "ns", "pods", "", ""),
    );
    check(
        "GET",
        &format!("{pods}/p"),
        None,
        ("get", true, "", "ns", "pods", "p", ""),
    );
    // The parameter codec reads `watch` with Go's EqualFold, which folds the
    // long s to an `s`.
    check(
        "GET",
        pods,
        Some("watch=fal%C5%BFe"),
        ("list", true, "", "ns", "pods", "", ""),
    );
    // `?watch` only turns a collection GET into a watch.
    check(
        "GET",
        &format!("{pods}/p"),
        Some("watch=true"),
        ("get", true, "", "ns", "pods", "p", ""),
    );
    check(
        "POST",
        pods,
        None,
        ("create", true, "", "ns", "pods", "", ""),
    );
    check(
        "PUT",
        &format!("{pods}/p"),
        None,
        ("update", true, "", "ns", "pods", "p", ""),
    );
    check(
        "PATCH",
        &format!("{pods}/p/status"),
        None,
        ("patch", true, "", "ns", "pods", "p", "status"),
    );
    check(
        "DELETE",
        &format!("{pods}/p"),
        None,
        ("delete", true, "", "ns", "pods", "p", ""),
    );
    check(
        "DELETE",
        pods,
        None,
        ("deletecollection", true, "", "ns", "pods", "", ""),
    );
    check(
        "GET",
        "/apis/apps/v1/watch/namespaces/ns/deployments/d",
        None,
        ("watch", true, "apps", "ns", "deployments", "d", ""),
    );
    check(
        "GET",
        "/apis/apps/v1/deployments",
        Some("fieldSelector=metadata.name%3Dd"),
        ("list", true, "apps", "", "deployments", "d", ""),
    );
    for method in ["OPTIONS", "TRACE", "CONNECT", "BREW"] {
        check(method, pods, None, ("", true, "", "ns", "pods", "", ""));
    }
}

/// A list names the object its field selector requires as kube's resolver does:
/// the first clause on `metadata.name` in sorted order, unescaped, when it could
/// be a path segment; a selector that does not parse names nothing.
#[test]
fn a_list_names_the_object_its_field_selector_requires() {
    let list = |selector: &str| {
        let query = format!("fieldSelector={selector}");
        resolve("GET", "/api/v1/namespaces/ns/configmaps", Some(&query))
            .expect("resolved")
            .name
    };
    assert_eq!(list("metadata.name%3Db,metadata.name%3Da"), "a");
    assert_eq!(list("metadata.name%3D%3Db,metadata.name%3Da"), "b");
    assert_eq!(list("metadata.namespace%3Dns,metadata.name%3Da"), "a");
    assert_eq!(list("metadata.name%3Da%5C,b"), "a,b");
    for selector in [
        "metadata.name!%3Da",
        "metadata.name%3D..",
        "metadata.name%3Da%25b",
        "metadata.name%3Da,no-operator",
        "metadata.name%3Da%5Cb",
        " metadata.name%3Da",
    ] {
        assert_eq!(list(selector), "", "{selector}");
    }
}

/// Where `route` and the authorization attributes used to disagree, kube's
/// resolver decides.
#[test]
fn a_watch_segment_is_the_verb_whatever_the_method() {
    // `route` made these create, deletecollection and no verb.
    let watch = "/api/v1/watch/namespaces/ns/configmaps";
    for method in ["POST", "DELETE", "OPTIONS", "PUT"] {
        check(
            method,
            watch,
            None,
            ("watch", true, "", "ns", "configmaps", "", ""),
        );
    }
}

#[test]
fn a_proxy_segment_is_the_verb_and_has_no_subresource() {
    // `route` took `proxy` for the resource.
    check(
        "GET",
        "/api/v1/proxy/namespaces/ns/pods/p/some/path",
        None,
        ("proxy", true, "", "ns", "pods", "p", ""),
    );
}

#[test]
fn a_watch_or_proxy_segment_with_nothing_after_it_is_unresolvable() {
    // `route` made `/api/v1/watch` a non-resource path, and the attributes a
    // list of the resource `watch`.
    for (path, query, url) in [
        ("/api/v1/watch", None, "/api/v1/watch"),
        (
            "/apis/apps/v1/proxy/",
            Some("a=b"),
            "/apis/apps/v1/proxy/?a=b",
        ),
    ] {
        let e = resolve("GET", path, query).expect_err(path);
        assert_eq!(e.url, url);
        assert_eq!(
            e.to_string(),
            format!("unable to determine kind and namespace from url, {url}")
        );
        assert!(e.partial.resource_request, "{path}");
        assert_eq!(e.partial.verb, "get", "{path}");
        assert_eq!(e.partial.resource, "", "{path}");
    }
}

#[test]
fn empty_segments_are_kept_as_kube_splits_the_path() {
    // `route` dropped the empty namespace and served `get namespaces/pods`
    // while authorization checked `list pods` at the cluster scope.
    check(
        "GET",
        "/api/v1/namespaces//pods",
        None,
        ("list", true, "", "", "pods", "", ""),
    );
    check(
        "GET",
        "/api/v1//pods",
        None,
        ("get", true, "", "", "", "pods", ""),
    );
    // An empty group or version is a segment like any other.
    check(
        "GET",
        "/apis//v1/x",
        None,
        ("list", true, "", "", "x", "", ""),
    );
    check(
        "DELETE",
        "/api//pods/p",
        None,
        ("delete", true, "", "", "pods", "p", ""),
    );
}

#[test]
fn segments_are_percent_decoded() {
    // The attributes used to keep `a%20b` while `route` served `a b`.
    check(
        "GET",
        "/api/v1/namespaces/a%20b/configmaps/c%3Ad",
        None,
        ("get", true, "", "a b", "configmaps", "c:d", ""),
    );
}

#[test]
fn methods_are_matched_exactly() {
    // The attributes used to upper-case the method; kube and `route` do not.
    check(
        "post",
        "/api/v1/namespaces/ns/pods",
        None,
        ("", true, "", "ns", "pods", "", ""),
    );
}

#[test]
fn non_resource_paths_have_the_methods_verb() {
    for path in [
        "/",
        "/healthz",
        "/api",
        "/api/v1",
        "/apis",
        "/apis/apps",
        "/apis/apps/v1",
    ] {
        let info = resolve("GET", path, None).expect("resolvable");
        assert!(!info.resource_request, "{path}");
        assert_eq!(info.verb, "get", "{path}");
    }
    let info = resolve("OPTIONS", "/version", None).expect("resolvable");
    assert_eq!(info.verb, "options");
}
