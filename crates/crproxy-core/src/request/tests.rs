use super::*;

const G: &str = "example.com";
const V: &str = "v1";

/// Expected outcome: a kind, or an HTTP status code.
enum Want {
    Discovery,
    Upgrade,
    Res(
        Verb,
        Option<&'static str>,
        &'static str,
        Option<&'static str>,
        Option<&'static str>,
    ),
    Code(u16),
}

type Input<'a> = (&'a str, &'a str, Option<&'a str>, bool);

fn check(input: Input, expected: Want) {
    let (method, path, query, upgrade) = input;
    let got = classify(method, path, query, upgrade, G, V);
    let ctx = format!("{method} {path}?{query:?} upgrade={upgrade}: got {got:?}");
    match expected {
        Want::Discovery => assert_eq!(got, Ok(RequestKind::Discovery), "{ctx}"),
        Want::Upgrade => assert_eq!(got, Ok(RequestKind::Upgrade), "{ctx}"),
        Want::Res(verb, ns, resource, name, sub) => assert_eq!(
            got,
            Ok(RequestKind::Resource {
                verb,
                path: ResourcePath {
                    namespace: ns.map(Cow::Borrowed),
                    resource: Cow::Borrowed(resource),
                    name: name.map(Cow::Borrowed),
                    subresource: sub.map(Cow::Borrowed),
                },
            }),
            "{ctx}"
        ),
        Want::Code(code) => match got {
            Err(e) => assert_eq!(e.status_code(), code, "{ctx}"),
            Ok(_) => panic!("expected {code}: {ctx}"),
        },
    }
}

#[test]
fn classification_table() {
    use Verb::*;
    use Want::*;
    let ns = Some("ns");
    let rows: Vec<(Input, Want)> = vec![
        // Discovery.
        (("GET", "/apis/example.com/v1", None, false), Discovery),
        (
            ("GET", "/apis/example.com/v1", Some("timeout=32s"), false),
            Discovery,
        ),
        (("POST", "/apis/example.com/v1", None, false), Code(405)),
        (("GET", "/apis/example.com/v1/", None, false), Code(400)),
        // Not ours: 404.
        (("GET", "/", None, false), Code(404)),
        (("GET", "/apis", None, false), Code(404)),
        (("GET", "/apis/example.com", None, false), Code(404)),
        (("GET", "/apis/example.com/v2", None, false), Code(404)),
        (
            ("GET", "/apis/other.com/v1/widgets", None, false),
            Code(404),
        ),
        (("GET", "/apis/Example.com/v1", None, false), Code(404)),
        (("GET", "/api/v1/pods", None, false), Code(404)),
        (("GET", "/api/v1", None, false), Code(404)),
        (("GET", "/version", None, false), Code(404)),
        (
            ("GET", "/apis/example.com/v1/namespaces", None, false),
            Code(404),
        ),
        (
            ("GET", "/apis/example.com/v1/namespaces/ns", None, false),
            Code(404),
        ),
        (
            (
                "PUT",
                "/apis/example.com/v1/namespaces/ns/finalize",
                None,
                false,
            ),
            Code(404),
        ),
        (
            (
                "GET",
                "/apis/example.com/v1/namespaces/ns/status",
                None,
                false,
            ),
            Code(404),
        ),
        (
            (
                "GET",
                "/apis/example.com/v1/namespaces/ns/widgets/a/status/x",
                None,
                false,
            ),
            Code(404),
        ),
        (
            (
                "GET",
                "/apis/example.com/v1/widgets/a/status/x",
                None,
                false,
            ),
            Code(404),
        ),
        (
            ("GET", "/apis/example.com/v1/watch", None, false),
            Code(404),
        ),
        // Ambiguous or malformed: 400.
        (
            ("GET", "/apis/example.com/v1/../v2/widgets", None, false),
            Code(400),
        ),
        (
            ("GET", "/apis/example.com/v1/./widgets", None, false),
            Code(400),
        ),
        (
            ("GET", "/apis/example.com/v1/widgets/%2e%2e", None, false),
            Code(400),
        ),
        (
            ("GET", "/apis/example.com/v1/widgets/%2E", None, false),
            Code(400),
        ),
        (
            ("GET", "/apis/example.com/v1/widgets/a%2Fb", None, false),
            Code(400),
        ),
        (
            ("GET", "/apis/example.com/v1/widgets/a%2fb", None, false),
            Code(400),
        ),
        (
            ("GET", "/apis/example.com/v1/widgets/a%5Cb", None, false),
            Code(400),
        ),
        (
            ("GET", "/apis/example.com/v1/widgets/a%252Fb", None, false),
            Code(400),
        ),
        (
            ("GET", "/apis/example.com/v1/widgets/a%00", None, false),
            Code(400),
        ),
        (
            ("GET", "/apis/example.com/v1/widgets/a\\b", None, false),
            Code(400),
        ),
        (
            ("GET", "/apis/example.com/v1/widgets/%ff", None, false),
            Code(400),
        ),
        (
            ("GET", "/apis/example.com/v1//widgets", None, false),
            Code(400),
        ),
        (
            ("GET", "/apis/example.com/v1/widgets/", None, false),
            Code(400),
        ),
        (
            ("GET", "//apis/example.com/v1/widgets", None, false),
            Code(400),
        ),
        (
            ("GET", "/../apis/example.com/v1/widgets", None, false),
            Code(400),
        ),
        (
            ("GET", "apis/example.com/v1/widgets", None, false),
            Code(400),
        ),
        (
            ("GET", "/apis/example.com/v1/proxy/widgets/a", None, false),
            Code(400),
        ),
        (
            (
                "GET",
                "/apis/example.com/v1/widgets",
                Some("watch=true&watch=false"),
                false,
            ),
            Code(400),
        ),
        // kube-apiserver reads anything but `0` and `false` (any case) as a
        // watch, where it authorizes the request and where it serves it:
        // `f`, `yes` and an empty value too.
        (
            (
                "GET",
                "/apis/example.com/v1/widgets",
                Some("watch=f"),
                false,
            ),
            Res(Watch, None, "widgets", None, None),
        ),
        (
            (
                "GET",
                "/apis/example.com/v1/widgets",
                Some("watch=yes"),
                false,
            ),
            Res(Watch, None, "widgets", None, None),
        ),
        (
            ("GET", "/apis/example.com/v1/widgets", Some("watch="), false),
            Res(Watch, None, "widgets", None, None),
        ),
        (
            (
                "GET",
                "/apis/example.com/v1/widgets",
                Some("watch=FALSE"),
                false,
            ),
            Res(List, None, "widgets", None, None),
        ),
        (
            (
                "GET",
                "/apis/example.com/v1/widgets",
                Some("watch=fAlSe"),
                false,
            ),
            Res(List, None, "widgets", None, None),
        ),
        // Go's EqualFold folds the long s to an `s`: kube serves a list.
        (
            (
                "GET",
                "/apis/example.com/v1/widgets",
                Some("watch=fal%C5%BFe"),
                false,
            ),
            Res(List, None, "widgets", None, None),
        ),
        // Reads.
        (
            ("GET", "/apis/example.com/v1/widgets", None, false),
            Res(List, None, "widgets", None, None),
        ),
        (
            (
                "GET",
                "/apis/example.com/v1/namespaces/ns/widgets",
                None,
                false,
            ),
            Res(List, ns, "widgets", None, None),
        ),
        (
            (
                "GET",
                "/apis/example.com/v1/namespaces/ns/widgets",
                Some("limit=500&watch=false"),
                false,
            ),
            Res(List, ns, "widgets", None, None),
        ),
        (
            (
                "GET",
                "/apis/example.com/v1/namespaces/ns/widgets",
                Some("watch=0"),
                false,
            ),
            Res(List, ns, "widgets", None, None),
        ),
        (
            (
                "GET",
                "/apis/example.com/v1/namespaces/ns/widgets",
                Some("watch=true"),
                false,
            ),
            Res(Watch, ns, "widgets", None, None),
        ),
        (
            (
                "GET",
                "/apis/example.com/v1/namespaces/ns/widgets",
                Some("watch=1&resourceVersion=0"),
                false,
            ),
            Res(Watch, ns, "widgets", None, None),
        ),
        (
            (
                "GET",
                "/apis/example.com/v1/widgets",
                Some("allowWatchBookmarks=true&watch=True"),
                false,
            ),
            Res(Watch, None, "widgets", None, None),
        ),
        (
            ("GET", "/apis/example.com/v1/watch/widgets", None, false),
            Res(Watch, None, "widgets", None, None),
        ),
        (
            (
                "GET",
                "/apis/example.com/v1/watch/namespaces/ns/widgets",
                None,
                false,
            ),
            Res(Watch, ns, "widgets", None, None),
        ),
        (
            (
                "GET",
                "/apis/example.com/v1/watch/namespaces/ns/widgets/a",
                None,
                false,
            ),
            Res(Watch, ns, "widgets", Some("a"), None),
        ),
        (
            ("POST", "/apis/example.com/v1/watch/widgets", None, false),
            Code(405),
        ),
        (
            ("GET", "/apis/example.com/v1/widgets/a", None, false),
            Res(Get, None, "widgets", Some("a"), None),
        ),
        // A named GET stays a GET even with watch=true (kube ignores it there).
        (
            (
                "GET",
                "/apis/example.com/v1/namespaces/ns/widgets/a",
                Some("watch=true"),
                false,
            ),
            Res(Get, ns, "widgets", Some("a"), None),
        ),
        (
            (
                "GET",
                "/apis/example.com/v1/namespaces/ns/widgets/a/status",
                None,
                false,
            ),
            Res(Get, ns, "widgets", Some("a"), Some("status")),
        ),
        (
            (
                "GET",
                "/apis/example.com/v1/namespaces/ns/widgets/a/scale",
                None,
                false,
            ),
            Res(Get, ns, "widgets", Some("a"), Some("scale")),
        ),
        (
            (
                "GET",
                "/apis/example.com/v1/namespaces/ns/widgets/my%2Dname",
                None,
                false,
            ),
            Res(Get, ns, "widgets", Some("my-name"), None),
        ),
        (
            (
                "GET",
                "/apis/example.com/v1/namespaces/namespaces/widgets",
                None,
                false,
            ),
            Res(List, Some("namespaces"), "widgets", None, None),
        ),
        // Writes.
        (
            (
                "POST",
                "/apis/example.com/v1/namespaces/ns/widgets",
                None,
                false,
            ),
            Res(Create, ns, "widgets", None, None),
        ),
        (
            (
                "POST",
                "/apis/example.com/v1/widgets",
                Some("dryRun=All"),
                false,
            ),
            Res(Create, None, "widgets", None, None),
        ),
        (
            (
                "POST",
                "/apis/example.com/v1/namespaces/ns/widgets/a",
                None,
                false,
            ),
            Res(Create, ns, "widgets", Some("a"), None),
        ),
        (
            (
                "POST",
                "/apis/example.com/v1/namespaces/ns/widgets/a/status",
                None,
                false,
            ),
            Code(405),
        ),
        (
            (
                "PUT",
                "/apis/example.com/v1/namespaces/ns/widgets/a",
                None,
                false,
            ),
            Res(Update, ns, "widgets", Some("a"), None),
        ),
        (
            (
                "PUT",
                "/apis/example.com/v1/namespaces/ns/widgets/a/status",
                None,
                false,
            ),
            Res(Update, ns, "widgets", Some("a"), Some("status")),
        ),
        (
            (
                "PUT",
                "/apis/example.com/v1/namespaces/ns/widgets",
                None,
                false,
            ),
            Code(400),
        ),
        (
            ("PUT", "/apis/example.com/v1/widgets", None, false),
            Code(400),
        ),
        (
            (
                "PATCH",
                "/apis/example.com/v1/namespaces/ns/widgets/a",
                None,
                false,
            ),
            Res(Patch, ns, "widgets", Some("a"), None),
        ),
        (
            (
                "PATCH",
                "/apis/example.com/v1/namespaces/ns/widgets/a/scale",
                None,
                false,
            ),
            Res(Patch, ns, "widgets", Some("a"), Some("scale")),
        ),
        (
            (
                "PATCH",
                "/apis/example.com/v1/namespaces/ns/widgets",
                None,
                false,
            ),
            Code(400),
        ),
        (
            (
                "DELETE",
                "/apis/example.com/v1/namespaces/ns/widgets/a",
                None,
                false,
            ),
            Res(Delete, ns, "widgets", Some("a"), None),
        ),
        (
            (
                "DELETE",
                "/apis/example.com/v1/namespaces/ns/widgets",
                Some("labelSelector=a%3Db"),
                false,
            ),
            Res(DeleteCollection, ns, "widgets", None, None),
        ),
        (
            ("DELETE", "/apis/example.com/v1/widgets", None, false),
            Res(DeleteCollection, None, "widgets", None, None),
        ),
        (
            (
                "DELETE",
                "/apis/example.com/v1/widgets/a/status",
                None,
                false,
            ),
            Code(405),
        ),
        (
            ("HEAD", "/apis/example.com/v1/widgets", None, false),
            Code(405),
        ),
        (
            ("OPTIONS", "/apis/example.com/v1/widgets/a", None, false),
            Code(405),
        ),
        (
            ("CONNECT", "/apis/example.com/v1/widgets/a", None, false),
            Code(405),
        ),
        (
            ("get", "/apis/example.com/v1/widgets", None, false),
            Code(405),
        ),
        // Upgrades.
        (
            (
                "GET",
                "/apis/example.com/v1/namespaces/ns/widgets/a",
                None,
                true,
            ),
            Upgrade,
        ),
        (
            (
                "GET",
                "/apis/example.com/v1/namespaces/ns/widgets",
                Some("watch=true"),
                true,
            ),
            Upgrade,
        ),
        (("GET", "/apis/example.com/v1", None, true), Upgrade),
        (
            (
                "POST",
                "/apis/example.com/v1/namespaces/ns/widgets/a/exec",
                Some("command=sh"),
                true,
            ),
            Upgrade,
        ),
        (
            (
                "POST",
                "/apis/example.com/v1/namespaces/ns/widgets/a/exec",
                None,
                false,
            ),
            Upgrade,
        ),
        (
            (
                "GET",
                "/apis/example.com/v1/namespaces/ns/widgets/a/attach",
                None,
                false,
            ),
            Upgrade,
        ),
        (
            (
                "POST",
                "/apis/example.com/v1/namespaces/ns/widgets/a/portforward",
                None,
                false,
            ),
            Upgrade,
        ),
        (
            ("GET", "/apis/example.com/v1/widgets/a/proxy", None, false),
            Upgrade,
        ),
        // An upgrade outside our group is still 404, and a malformed one still 400.
        (
            ("GET", "/api/v1/namespaces/ns/pods/p/exec", None, true),
            Code(404),
        ),
        (("GET", "/apis/example.com/v1/../x", None, true), Code(400)),
    ];
    assert!(rows.len() > 80);
    for (input, want) in rows {
        check(input, want);
    }
}

#[test]
fn metric_labels() {
    let rows = [
        (Verb::Get, "GET"),
        (Verb::List, "LIST"),
        (Verb::Watch, "WATCH"),
        (Verb::Create, "POST"),
        (Verb::Update, "PUT"),
        (Verb::Patch, "PATCH"),
        (Verb::Delete, "DELETE"),
        (Verb::DeleteCollection, "DELETECOLLECTION"),
    ];
    for (verb, label) in rows {
        assert_eq!(verb.metric_label(), label);
    }
}

#[test]
fn query_decoding() {
    assert_eq!(
        query_pairs(Some("a=1&labelSelector=x+in+%28a%2Cb%29&&flag")),
        vec![
            ("a".to_owned(), "1".to_owned()),
            ("labelSelector".to_owned(), "x in (a,b)".to_owned()),
            ("flag".to_owned(), String::new()),
        ]
    );
    assert!(query_pairs(None).is_empty());
}

/// Pairs Go's `url.ParseQuery` drops are not read: kube-apiserver never sees
/// them, so a `watch` or `dryRun` among them changes nothing.
#[test]
fn pairs_go_drops_are_not_read() {
    assert_eq!(
        query_pairs(Some("watch=true;x&x=%zz&dryRun=%2&y=%41+b&z&q=a%3Bb")),
        vec![
            ("y".to_string(), "A b".to_string()),
            ("z".to_string(), String::new()),
            ("q".to_string(), "a;b".to_string()),
        ]
    );
    assert!(!is_dry_run(Some("dryRun=All;x")));
    for kept in ["a", "a=", "a=%41", "%61=b+c"] {
        let pairs: Vec<_> = go_query_pairs(Some(kept)).map(|pair| pair.raw).collect();
        assert_eq!(pairs, [kept], "{kept}");
    }
    for dropped in ["", "a;b", "a=b;", "a=%4", "a=%4g", "%zz=b", "a=%"] {
        assert_eq!(go_query_pairs(Some(dropped)).count(), 0, "{dropped}");
    }
}

#[test]
fn boolean_parameters_are_false_only_for_what_go_folds_to_false() {
    for value in ["0", "false", "FALSE", "fAlSe", "fal\u{17f}e", "FAL\u{17f}E"] {
        assert!(!query_bool(value), "{value:?}");
    }
    for value in [
        "",
        "1",
        "true",
        "00",
        "fals",
        "falsee",
        " false",
        "fal\u{1e9e}e",
        "\u{ff46}alse",
    ] {
        assert!(query_bool(value), "{value:?}");
    }
}

#[test]
fn retained_query_pairs_stay_as_written() {
    let query = "a=1&%6Cimit=5&&labelSelector=x+in+%28a%2Cb%29&flag&limit";
    assert_eq!(
        retain_query(query, |name| name != "limit"),
        "a=1&labelSelector=x+in+%28a%2Cb%29&flag"
    );
    assert_eq!(
        retain_query(query, |name| name == "limit"),
        "%6Cimit=5&limit"
    );
    assert_eq!(retain_query("", |_| true), "");
    // A pair Go drops is not kept, whatever its name.
    assert_eq!(retain_query("limit=1;2&a=%zz&b=1", |_| true), "b=1");
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn never_panics(method in "(GET|POST|PUT|PATCH|DELETE|HEAD|X)", path in "[/a-z.%2fFeE0-9]{0,40}", query in prop::option::of(".{0,30}"), up in any::<bool>()) {
            let _ = classify(&method, &path, query.as_deref(), up, G, V);
        }

        /// Only paths under our own group/version are ever classified as forwardable.
        #[test]
        fn forwarded_paths_stay_under_the_prefix(path in "/(apis|api|x)(/(example\\.com|other|v1|v2|\\.\\.|\\.|%2e|%2F|namespaces|ns|widgets|a|watch|status)){0,7}") {
            if let Ok(kind) = classify("GET", &path, None, false, G, V) {
                prop_assert!(path.starts_with("/apis/example.com/v1"), "{} -> {:?}", path, kind);
                prop_assert!(!path.contains("/..") && !path.contains("/./") && !path.ends_with("/.") && !path.to_ascii_lowercase().contains("%2"), "{}", path);
            }
        }
    }
}

#[test]
fn a_query_naming_dry_run_is_a_dry_run_whatever_its_value() {
    for (query, dry_run) in [
        (None, false),
        (Some(""), false),
        (Some("fieldManager=kubectl"), false),
        (Some("dryRun=All"), true),
        (Some("fieldManager=kubectl&dryRun=All"), true),
        (Some("dryRun=All&dryRun=All"), true),
        // kube refuses these, so they never persist anything either.
        (Some("dryRun="), true),
        (Some("dryRun"), true),
        (Some("dryRun=Bogus"), true),
        // The name is decoded as kube decodes it.
        (Some("dry%52un=All"), true),
        // Not the parameter, only alike.
        (Some("xdryRun=All"), false),
        (Some("dryRunx=All"), false),
        (Some("dryrun=All"), false),
        (Some("fieldManager=dryRun"), false),
    ] {
        assert_eq!(is_dry_run(query), dry_run, "{query:?}");
    }
}

#[test]
fn a_segment_is_escaped_so_it_stays_one_segment() {
    let check = |decoded: &str, expected: &str| {
        let encoded = encode_segment(decoded);
        assert_eq!(encoded, expected, "{decoded:?}");
        assert_eq!(
            percent_decode_str(&encoded).decode_utf8().as_deref(),
            Ok(decoded),
            "{decoded:?} round trip"
        );
    };
    check("demo", "demo");
    check("my-widget.v2_~", "my-widget.v2_~");
    check("default?x", "default%3Fx");
    check("a/b", "a%2Fb");
    check("a#b", "a%23b");
    check("100%", "100%25");
    check("a b", "a%20b");
    check("ä", "%C3%A4");
    // Nothing to escape borrows.
    assert!(matches!(encode_segment("demo"), Cow::Borrowed("demo")));
}

#[test]
fn a_query_value_is_escaped_so_it_stays_one_value_and_reads_back() {
    for (value, expected) in [
        ("eyJ2Ijo+/=", "eyJ2Ijo%2B%2F%3D"),
        ("a=b,c!=d", "a%3Db%2Cc%21%3Dd"),
        ("x&y#z", "x%26y%23z"),
        ("a b", "a%20b"),
    ] {
        let encoded = encode_query_value(value);
        assert_eq!(encoded, expected, "{value:?}");
        // kube reads query values form-decoded: `+` would turn into a space.
        assert_eq!(
            go_query_unescape(&encoded).as_deref(),
            Some(value),
            "{value:?} round trip"
        );
    }
    assert!(matches!(encode_query_value("v1-2_3.~"), Cow::Borrowed(_)));
}

#[test]
fn only_dns_1123_labels_name_namespaces() {
    let check = |name: &str, expected: bool| {
        assert_eq!(crate::config::is_dns_label(name), expected, "{name:?}");
    };
    for good in ["demo", "a", "0", "kube-system", "a-1-b", &"a".repeat(63)] {
        check(good, true);
    }
    for bad in [
        "",
        &"a".repeat(64),
        "default?x",
        "default#x",
        "a/b",
        "a%2Fb",
        "Demo",
        "-a",
        "a-",
        "a.b",
        "a_b",
        ".",
        "..",
        "ä",
    ] {
        check(bad, false);
    }
}

/// A create or a delete of a subresource gets the Status kube's custom-resource
/// handler sends: the verb and the qualified resource in the message, the group
/// and the resource in `details`.
#[test]
fn a_create_or_delete_of_a_subresource_is_refused_in_kube_words() {
    let failure = |code: u16, reason: &str, message: String, details: serde_json::Value| {
        serde_json::json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": reason,
            "details": details,
            "code": code,
        })
    };
    let declarable = [
        (
            "POST",
            "/apis/example.com/v1/namespaces/ns/widgets/a/status",
            "create",
        ),
        ("DELETE", "/apis/example.com/v1/widgets/a/scale", "delete"),
    ];
    for (method, path, verb) in declarable {
        let error = classify(method, path, None, false, G, V).expect_err(path);
        let message =
            format!("{verb} is not supported on resources of kind \"widgets.example.com\"");
        let details = serde_json::json!({"group": "example.com", "kind": "widgets"});
        assert_eq!(
            error.status(),
            failure(405, "MethodNotAllowed", message, details),
            "{method} {path}"
        );
    }
    // A subresource no CRD can declare: kube answers it as a missing object.
    for method in ["POST", "DELETE"] {
        let path = "/apis/example.com/v1/namespaces/ns/widgets/a/logs";
        let error = classify(method, path, None, false, G, V).expect_err(path);
        let message = "widgets.example.com \"a\" not found".to_owned();
        let details = serde_json::json!({"name": "a", "group": "example.com", "kind": "widgets"});
        assert_eq!(
            error.status(),
            failure(404, "NotFound", message, details),
            "{method} {path}"
        );
    }
}

/// The resource a path names, whatever the method: what a server that has only
/// some resources of its group/version checks first.
#[test]
fn path_resource_reads_the_resource_of_every_resource_path() {
    for (path, resource) in [
        ("/apis/example.com/v1/gadgets", Some("gadgets")),
        (
            "/apis/example.com/v1/namespaces/ns/gadgets/g1",
            Some("gadgets"),
        ),
        (
            "/apis/example.com/v1/namespaces/ns/gadgets/g1/exec",
            Some("gadgets"),
        ),
        (
            "/apis/example.com/v1/watch/namespaces/ns/gadgets/g1/status",
            Some("gadgets"),
        ),
        ("/apis/example.com/v1/watch/gadgets", Some("gadgets")),
        ("/apis/example.com/v1/g%61dgets", Some("gadgets")),
        ("/apis/example.com/v1", None),
        ("/apis/example.com/v1/namespaces/ns", None),
        (
            "/apis/example.com/v1/namespaces/ns/gadgets/g1/status/x",
            None,
        ),
        ("/apis/example.com/v2/gadgets", None),
        ("/apis/example.com/v1/proxy/gadgets", None),
        ("/apis/example.com/v1/gadgets/%2f", None),
    ] {
        assert_eq!(path_resource(path, G, V).as_deref(), resource, "{path}");
    }
}

#[test]
fn a_paths_parts_borrow_its_text_unless_a_segment_was_escaped() {
    let path = "/apis/example.com/v1/namespaces/ns/widgets/my%2Dname/status";
    let Ok(RequestKind::Resource { path: parts, .. }) = classify("GET", path, None, false, G, V)
    else {
        panic!("not a resource request");
    };
    let borrowed = |part: &Cow<'_, str>| matches!(part, Cow::Borrowed(_));
    assert!(parts.namespace.as_ref().is_some_and(borrowed));
    assert!(borrowed(&parts.resource));
    assert!(parts.subresource.as_ref().is_some_and(borrowed));
    // The escaped name is decoded, so it is a copy.
    assert_eq!(parts.name.as_deref(), Some("my-name"));
    assert!(!parts.name.as_ref().is_some_and(borrowed));
}
