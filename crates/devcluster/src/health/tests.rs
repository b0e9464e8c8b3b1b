use super::*;
use http::header;

/// Status, body and whether nosniff is set, for `path?query` on
/// kube-apiserver's checks; `None` when the path is no health path.
fn check(path: &str, query: Option<&str>) -> Option<(u16, String, bool)> {
    answer(path, query, kube_apiserver_checks).map(|r| {
        (
            r.status().as_u16(),
            String::from_utf8_lossy(r.body()).into_owned(),
            r.headers().contains_key(header::X_CONTENT_TYPE_OPTIONS),
        )
    })
}

fn not_found() -> Option<(u16, String, bool)> {
    Some((404, "404 page not found\n".to_string(), true))
}

#[test]
fn paths_match_exactly_as_kubes_mux_does() {
    let ok = Some((200, "ok".to_string(), true));
    let check_ok = Some((200, "ok".to_string(), false));
    for endpoint in ["/healthz", "/livez", "/readyz"] {
        assert_eq!(check(endpoint, None), ok, "{endpoint}");
        assert_eq!(check(&format!("{endpoint}/ping"), None), check_ok);
        assert_eq!(
            check(
                &format!("{endpoint}/poststarthook/rbac/bootstrap-roles"),
                None
            ),
            check_ok
        );
        // No handler has these paths.
        for path in ["/", "//ping", "/ping/", "/nope", "/ping/extra"] {
            let path = format!("{endpoint}{path}");
            assert_eq!(check(&path, None), not_found(), "{path}");
        }
    }
    // The mux sees the decoded path.
    assert_eq!(
        check("/healthz%2Fping", None),
        Some((200, "ok".into(), false))
    );
    for path in ["/", "/healthzz", "/version", "/api/v1/healthz"] {
        assert_eq!(check(path, None), None, "{path}");
    }
}

#[test]
fn excluded_checks_are_skipped_and_listed_when_verbose() {
    let (code, text, _) =
        check("/livez", Some("verbose&exclude=etcd&exclude=log")).expect("health path");
    assert_eq!(code, 200);
    assert!(
        text.starts_with(
            "[+]ping ok\n[+]log excluded: ok\n[+]etcd excluded: ok\n[+]poststarthook/"
        ),
        "{text}"
    );
    assert!(
        text.ends_with("[+]poststarthook/apiservice-openapiv3-controller ok\nlivez check passed\n"),
        "{text}"
    );
    // Without verbose, exclusions change nothing that is shown.
    assert_eq!(
        check("/readyz", Some("exclude=etcd")),
        Some((200, "ok".to_string(), true))
    );
}

#[test]
fn an_exclude_naming_no_check_is_warned_about() {
    let (code, text, _) = check(
        "/readyz",
        Some("verbose&exclude=zzz&exclude=shutdown&exclude=a%22b&exclude=zzz"),
    )
    .expect("health path");
    assert_eq!(code, 200);
    assert!(text.contains("[+]shutdown excluded: ok\n"), "{text}");
    assert!(
        text.ends_with(
            "[+]shutdown excluded: ok\n\
             warn: some health checks cannot be excluded: no matches for \"a\\\"b\",\"zzz\"\n\
             readyz check passed\n"
        ),
        "{text}"
    );
    // `shutdown` is readyz's alone.
    let (_, text, _) = check("/healthz", Some("verbose=1&exclude=shutdown")).expect("health path");
    assert!(
        text.ends_with(
            "warn: some health checks cannot be excluded: no matches for \"shutdown\"\n\
             healthz check passed\n"
        ),
        "{text}"
    );
}
