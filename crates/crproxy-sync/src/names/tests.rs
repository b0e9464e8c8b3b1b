use super::*;

#[test]
fn host_names() {
    let check = |name: &str, ns: &str, tenant: &str, want: &str| {
        assert_eq!(host_name(name, ns, tenant), want, "{name} {ns} {tenant}");
    };
    check("db", "team-a", "client", "db-x-team-a-x-client");
    // Exactly 63 characters stays as is.
    let name63 = "a".repeat(63 - "-x-ns-x-t".len());
    check(&name63, "ns", "t", &format!("{name63}-x-ns-x-t"));
    // Longer: 52 characters, '-', 10 hex digits; stable and distinct.
    let long = "b".repeat(60);
    let a = host_name(&long, "ns", "t");
    assert_eq!(a.len(), 63);
    assert!(a.starts_with(&"b".repeat(52)), "{a}");
    assert_eq!(&a[52..53], "-");
    assert!(a[53..].chars().all(|c| c.is_ascii_hexdigit()), "{a}");
    assert_eq!(a, host_name(&long, "ns", "t"), "stable");
    assert_ne!(a, host_name(&long, "ns", "u"), "tenant is part of the hash");
}

#[test]
fn reverse_translation() {
    assert_eq!(tenant_name_of("db-x-team-x-c", "team", "c"), Some("db"));
    assert_eq!(tenant_name_of("db-x-team-x-c", "other", "c"), None);
    assert_eq!(tenant_name_of("-x-team-x-c", "team", "c"), None);
}

#[test]
fn long_label_values_are_hashed() {
    assert_eq!(label_value("client"), "client");
    let long = "n".repeat(70);
    let hashed = label_value(&long);
    assert_eq!(hashed.len(), 63);
    assert_eq!(hashed, label_value(&long));
    assert_ne!(hashed, label_value(&"n".repeat(71)));
}

#[test]
fn identity_carries_the_seven_annotations_and_two_labels() {
    let id = MirrorIdentity {
        tenant: "client",
        project: "default",
        name: "db",
        namespace: "team",
        uid: "u-1",
        api_version: "example.org/v1",
        kind: "Backup",
        host_name: "db-x-team-x-client",
        host_namespace: "vcluster-client",
    };
    let a = id.annotations();
    assert_eq!(a.len(), 7);
    assert_eq!(a[TENANT_PROJECT], "default");
    assert_eq!(a[OBJECT_KIND], "example.org/v1, Kind=Backup");
    assert_eq!(a[OBJECT_HOST_NAMESPACE], "vcluster-client");
    let l = id.labels();
    assert_eq!(l[MANAGED_BY], "client");
    assert_eq!(l[NAMESPACE_LABEL], "team");
}

/// A host object as crproxy writes the mirror of `namespace/name` for `tenant`
/// of the project `default`.
fn mirror_of(tenant: &str, namespace: &str, name: &str, uid: &str) -> Value {
    let id = MirrorIdentity {
        tenant,
        project: "default",
        name,
        namespace,
        uid,
        api_version: "example.org/v1",
        kind: "Backup",
        host_name: "any",
        host_namespace: "vcluster-client",
    };
    serde_json::json!({"metadata": {"labels": id.labels(), "annotations": id.annotations()}})
}

#[test]
fn a_mirror_is_known_by_its_tenant_and_tenant_object() {
    let long_tenant = "t".repeat(70);
    for tenant in ["client", long_tenant.as_str()] {
        let mirror = mirror_of(tenant, "team", "db", "u-1");
        assert!(mirrors(&mirror, tenant, "default", "team", "db"));
        // Any incarnation: the uid is not compared.
        assert!(mirrors(
            &mirror_of(tenant, "team", "db", "u-2"),
            tenant,
            "default",
            "team",
            "db"
        ));
        assert!(!mirrors(&mirror, "other", "default", "team", "db"));
        assert!(!mirrors(&mirror, tenant, "default", "other", "db"));
        assert!(!mirrors(&mirror, tenant, "default", "team", "other"));
    }
    let mut unlabelled = mirror_of("client", "team", "db", "u-1");
    unlabelled["metadata"]["labels"] = Value::Null;
    assert!(!mirrors(&unlabelled, "client", "default", "team", "db"));
    assert!(!mirrors(&Value::Null, "client", "default", "team", "db"));
}

/// Tenants are named per project: the tenant of this name in another project,
/// sharing the host namespace, does not take this one's mirror for its own (it
/// would delete it as an orphan). A mirror written before the project was
/// recorded is its tenant's in any project.
#[test]
fn a_mirror_is_its_tenants_in_its_project_only() {
    let mirror = mirror_of("client", "team", "db", "u-1");
    assert!(mirrors(&mirror, "client", "default", "team", "db"));
    assert!(!mirrors(&mirror, "client", "other", "team", "db"));
    let mut older = mirror.clone();
    older["metadata"]["annotations"][TENANT_PROJECT] = Value::Null;
    assert!(mirrors(&older, "client", "other", "team", "db"));
    assert!(
        same_mirror(&older, &mirror),
        "replaced, it gains the project"
    );

    let mut elsewhere = mirror.clone();
    elsewhere["metadata"]["annotations"][TENANT_PROJECT] = serde_json::json!("other");
    assert!(!same_mirror(&elsewhere, &mirror));
    assert!(!same_mirror(&mirror, &elsewhere));

    // An annotation kube would never store (not a string) is no project's.
    let mut malformed = mirror.clone();
    malformed["metadata"]["annotations"][TENANT_PROJECT] = serde_json::json!(7);
    assert!(!mirrors(&malformed, "client", "default", "team", "db"));
}

#[test]
fn the_same_mirror_is_this_incarnations() {
    let desired = mirror_of("client", "team", "db", "u-1");
    assert!(same_mirror(&desired, &desired));
    for other in [
        mirror_of("client", "team", "db", "u-2"),
        mirror_of("other", "team", "db", "u-1"),
        mirror_of("client", "other", "db", "u-1"),
        mirror_of("client", "team", "other", "u-1"),
    ] {
        assert!(!same_mirror(&other, &desired), "{other}");
    }
    // A desired mirror without its identity replaces nothing, not even another
    // object without one.
    let bare = serde_json::json!({"metadata": {}});
    assert!(!same_mirror(&bare, &bare));
}

#[test]
fn ambiguous_translations() {
    let check = |name: &str, namespace: &str, tenant: &str, want: Option<&str>| {
        assert_eq!(
            ambiguity(name, namespace, tenant),
            want,
            "{name} in {namespace} of {tenant}"
        );
    };
    check("a", "b", "t", None);
    check("x", "x", "x", None);
    check("ax", "xb", "xt", None);
    check("a-xb", "bx-c", "tx-u", None);
    check("x-a", "b", "t-x", None);
    check("a-x-b", "c", "t", Some("the name contains \"-x-\""));
    check("a-x", "b", "t", Some("the name ends in \"-x\""));
    check("a", "b-x-c", "t", Some("the namespace contains \"-x-\""));
    check("a", "x-b", "t", Some("the namespace starts with \"x-\""));
    // Tenant `d`'s namespace `b-x` naming `a` is tenant `x-d`'s `a` in `b`.
    check("a", "b-x", "d", Some("the namespace ends in \"-x\""));
    // Tenant `c-x-d`'s `a` in `b` is tenant `d`'s `a` in `b-x-c`; tenant
    // `x-d`'s is tenant `d`'s `a` in `b-x`.
    check("a", "b", "c-x-d", Some("the tenant name contains \"-x-\""));
    check("a", "b", "x-d", Some("the tenant name starts with \"x-\""));
    assert_eq!(
        reference_host_name("a", "b-x-c", "T"),
        Err("the namespace contains \"-x-\"")
    );
    assert_eq!(
        reference_host_name("a", "b", "T"),
        Ok("a-x-b-x-T".to_owned())
    );
    // An empty reference names nothing, whatever its namespace and tenant.
    assert_eq!(reference_host_name("", "b-x-c", "c-x-d"), Ok(String::new()));
}

/// A shortened host name keeps 40 bits of a hash: a tenant could search for a
/// reference whose host name is another object's. References are translated
/// only while the host name is the whole text, up to 63 characters.
#[test]
fn a_reference_whose_host_name_would_be_shortened_is_refused() {
    let fits = "a".repeat(63 - "-x-ns-x-t".len());
    assert_eq!(
        reference_host_name(&fits, "ns", "t"),
        Ok(format!("{fits}-x-ns-x-t"))
    );
    let over = format!("{fits}a");
    assert_eq!(reference_host_name(&over, "ns", "t"), Err(SHORTENED));
    assert_eq!(SHORTENED, "the host name would be shortened");
    // The object's own host name is shortened all the same (its identity
    // annotations guard it).
    assert_eq!(host_name(&over, "ns", "t").len(), 63);
}

/// The way back gives only names the way there translates: not those of a
/// tenant of an ambiguous name, nor ambiguous or over-long ones.
#[test]
fn references_translate_back_only_where_they_translate_there() {
    let check = |host: &str, namespace: &str, tenant: &str, want: Option<&str>| {
        assert_eq!(
            reference_name_of(host, namespace, tenant),
            want,
            "{host} in {namespace} of {tenant}"
        );
    };
    check("a-x-b-x-t", "b", "t", Some("a"));
    check("a-x-b-x-t", "c", "t", None);
    // Tenant `d`'s Secret `a` in `b-x-c`, not tenant `c-x-d`'s `a` in `b`.
    check("a-x-b-x-c-x-d", "b", "c-x-d", None);
    check("a-x-b-x-x-d", "b", "x-d", None);
    check("a-x-b-x-x-d", "b-x", "d", None);
    check("a-x-b-x-c-x-t", "c", "t", None);
    check("a-x-x-b-x-t", "b", "t", None);
    let long = format!("{}-x-ns-x-t", "a".repeat(60));
    check(&long, "ns", "t", None);
    assert_eq!(
        tenant_name_of(&long, "ns", "t"),
        Some("a".repeat(60).as_str())
    );
}

/// Every name, namespace and tenant name of `a`, `x` and `-` (not starting or
/// ending in `-`) of up to 10 characters in all: a triple `ambiguity` accepts
/// shares its host name with no other triple, accepted or not; and every triple
/// it refuses shares it with another one, so it refuses no more than it must.
/// A triple sharing a host name has as many characters in all, so each one's
/// partners are among them; one may need a part starting or ending in `-`,
/// which is no name, where a refused triple's part has `--` (those are not
/// checked for a partner).
#[test]
fn accepted_translations_are_one_to_one_and_refused_ones_are_not() {
    const MOST: usize = 10;
    // Words by length.
    let mut words: Vec<Vec<String>> = vec![vec![String::new()]];
    for len in 1..MOST - 1 {
        let longer = words[len - 1]
            .iter()
            .flat_map(|w| ['a', 'x', '-'].map(|c| format!("{w}{c}")))
            .collect();
        words.push(longer);
    }
    let names: Vec<Vec<&str>> = words
        .iter()
        .map(|ws| {
            ws.iter()
                .map(String::as_str)
                .filter(|w| !w.is_empty() && !w.starts_with('-') && !w.ends_with('-'))
                .collect()
        })
        .collect();
    let mut by_host_name: BTreeMap<String, Vec<[&str; 3]>> = BTreeMap::new();
    for (name_len, namespace_len, tenant_len) in (1..MOST)
        .flat_map(|a| (1..MOST - a).flat_map(move |b| (1..=MOST - a - b).map(move |c| (a, b, c))))
    {
        for name in &names[name_len] {
            for namespace in &names[namespace_len] {
                for tenant in &names[tenant_len] {
                    by_host_name
                        .entry(host_name(name, namespace, tenant))
                        .or_default()
                        .push([name, namespace, tenant]);
                }
            }
        }
    }
    let (mut accepted_seen, mut refused_seen) = (0, 0);
    for triples in by_host_name.values() {
        for [name, namespace, tenant] in triples {
            let accepted = ambiguity(name, namespace, tenant).is_none();
            let partner_is_a_name = ![name, namespace, tenant]
                .iter()
                .any(|part| part.contains("--"));
            if accepted || partner_is_a_name {
                assert_eq!(
                    accepted,
                    triples.len() == 1,
                    "{name} in {namespace} of {tenant} shares its host name with {triples:?}"
                );
            }
            if accepted {
                accepted_seen += 1;
            } else {
                refused_seen += 1;
            }
        }
    }
    assert!(accepted_seen > 10_000 && refused_seen > 10_000);
}
