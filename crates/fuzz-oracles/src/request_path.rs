//! The request classifier and path parser, the owner-scoped query and dry-run
//! detection: never a panic, a classified resource path always stays under the
//! group/version and names the resource `path_resource` reads from the path
//! (the one an explicit configuration is asked about), an owner-scoped query
//! has no more parameters than the target reads, a query with a literal
//! `dryRun` parameter Go's query parser keeps is a dry run, and a collection GET classified as a list is
//! one kube-apiserver's handler would not serve as a watch.

use crproxy_core::ownership::{self, Owner};
use crproxy_core::request::{self, RequestKind, Verb};

const METHODS: [&str; 8] = [
    "GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS", "CONNECT",
];

/// Checks one input against the properties above; a panic is a finding.
pub fn check(data: &[u8]) {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(rest);
    let (path, query) = match text.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (text.as_ref(), None),
    };
    let method = METHODS[usize::from(selector) % METHODS.len()];
    let upgrade = selector & 0x80 != 0;
    let classified = request::classify(method, path, query, upgrade, "example.com", "v1");
    let named = request::path_resource(path, "example.com", "v1");
    if matches!(classified, Ok(RequestKind::Discovery)) {
        assert_eq!(named, None);
    }
    if let Ok(RequestKind::Resource {
        path: resource,
        verb,
    }) = classified
    {
        assert_eq!(named.as_deref(), Some(resource.resource.as_ref()));
        assert!(!resource.resource.is_empty());
        assert!(!resource.resource.contains('/'));
        if verb == Verb::List {
            // kube's handler reads the first `watch` value: false only for `0`
            // and `false` in any case, Go's EqualFold (Convert_Slice_string_To_bool).
            let first_watch = request::query_pairs(query)
                .into_iter()
                .find(|(name, _)| name == "watch")
                .map(|(_, value)| value);
            let served_as_watch = first_watch.is_some_and(|v| request::query_bool(&v));
            assert!(
                !served_as_watch,
                "a list kube would serve as a watch: {query:?}"
            );
        }
    }
    // A pair Go's query parser drops (a `;`, a malformed escape) never reaches
    // kube-apiserver, so its `dryRun` makes no dry run.
    let names_dry_run = request::go_query_pairs(query)
        .any(|pair| pair.raw == "dryRun" || pair.raw.starts_with("dryRun="));
    if names_dry_run {
        assert!(request::is_dry_run(query));
    }
    let owner = Owner::new("client", "project");
    if let Ok(scoped) = ownership::scoped_query(query, &owner) {
        assert!(scoped.contains("labelSelector="));
        // Go counts a query's parameters by its `&`s: more, and it drops them all.
        let params = scoped.matches('&').count() + 1;
        assert!(params <= ownership::MAX_SCOPED_QUERY_PARAMS, "{params}");
    }
}
