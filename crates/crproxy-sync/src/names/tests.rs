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
    let check = |name: &str, namespace: &str, want: Option<&str>| {
        assert_eq!(ambiguity(name, namespace), want, "{name} in {namespace}");
    };
    check("a", "b", None);
    check("x", "x", None);
    check("ax", "xb", None);
    check("a-xb", "bx-c", None);
    check("a-x-b", "c", Some("the name contains \"-x-\""));
    check("a-x", "b", Some("the name ends in \"-x\""));
    check("a", "b-x-c", Some("the namespace contains \"-x-\""));
    check("a", "x-b", Some("the namespace starts with \"x-\""));
    assert_eq!(
        reference_host_name("a", "b-x-c", "T"),
        Err("the namespace contains \"-x-\"")
    );
    assert_eq!(
        reference_host_name("a", "b", "T"),
        Ok("a-x-b-x-T".to_owned())
    );
}

/// Every name and namespace of up to five characters of `a`, `x` and `-` (not
/// starting or ending in `-`): a pair `ambiguity` accepts shares its host name
/// with no other pair, accepted or not; and every pair it refuses shares it with
/// another one, so it refuses no more than it must (checked where the other
/// pair's parts are short enough to be among them, six characters in all, and
/// cannot end in `-`: without `--`).
#[test]
fn accepted_translations_are_one_to_one_and_refused_ones_are_not() {
    let mut words = vec![String::new()];
    for _ in 0..5 {
        let longer: Vec<String> = words
            .iter()
            .flat_map(|w| ['a', 'x', '-'].map(|c| format!("{w}{c}")))
            .collect();
        words.extend(longer);
    }
    words.retain(|w| !w.is_empty() && !w.starts_with('-') && !w.ends_with('-'));
    words.sort();
    words.dedup();
    let mut by_host_name: BTreeMap<String, Vec<(&str, &str)>> = BTreeMap::new();
    for name in &words {
        for namespace in &words {
            by_host_name
                .entry(host_name(name, namespace, "t"))
                .or_default()
                .push((name, namespace));
        }
    }
    for pairs in by_host_name.values() {
        for (name, namespace) in pairs {
            let accepted = ambiguity(name, namespace).is_none();
            let partner_listed = name.len() + namespace.len() <= 6
                && !name.contains("--")
                && !namespace.contains("--");
            if accepted || partner_listed {
                assert_eq!(
                    accepted,
                    pairs.len() == 1,
                    "{name} in {namespace} shares its host name with {pairs:?}"
                );
            }
        }
    }
}
