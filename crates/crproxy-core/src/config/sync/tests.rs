use super::*;
use crate::config::load;

/// A sync-only file: no proxy entries, so only the sync starts.
const BASE: &str = r#"
client:
  name: tenant
  project: default
sync:
  host:
    kubeconfig: host.kubeconfig
    namespace: vcluster-tenant
  toHost:
    customResources:
      backups.example.org/v1:
        enabled: true
  fromHost:
    customResources:
      sharedstores.example.org:
        enabled: true
        scope: Cluster
"#;

/// Every error of `yaml` as `(key, message fragment)`, or the plan's
/// `(direction, key, scope)` list.
type Expected<'a> = Result<Vec<(&'a str, &'a str, Scope)>, Vec<(&'a str, &'a str)>>;

fn check(yaml: &str, expected: Expected) {
    let got = load(yaml).and_then(|(config, _)| {
        let plan = validate(&config)?;
        Ok(plan
            .map(|p| p.resources)
            .unwrap_or_default()
            .into_iter()
            .map(|r| (r.direction.as_str().to_owned(), r.key, r.scope))
            .collect::<Vec<_>>())
    });
    match (got, expected) {
        (Ok(got), Ok(want)) => {
            let want: Vec<(String, String, Scope)> = want
                .into_iter()
                .map(|(d, k, s)| (d.to_owned(), k.to_owned(), s))
                .collect();
            assert_eq!(got, want, "yaml:\n{yaml}");
        }
        (Err(errs), Err(want)) => {
            let shown: Vec<String> = errs.iter().map(ToString::to_string).collect();
            assert_eq!(errs.len(), want.len(), "errors: {shown:#?}\nyaml:\n{yaml}");
            for ((key, fragment), e) in want.iter().zip(&errs) {
                assert_eq!(&e.key, key, "errors: {shown:#?}");
                assert!(
                    e.message.contains(fragment),
                    "{e} lacks {fragment:?}; all: {shown:#?}"
                );
            }
        }
        (got, want) => panic!("got {got:?}\nwant {want:?}\nyaml:\n{yaml}"),
    }
}

fn edit(from: &str, to: &str) -> String {
    assert!(BASE.contains(from), "BASE lacks {from:?}");
    BASE.replacen(from, to, 1)
}

const TO: &str = "sync.toHost.customResources[\"backups.example.org/v1\"]";
const FROM: &str = "sync.fromHost.customResources[\"sharedstores.example.org\"]";

#[test]
fn valid_files_give_the_plan() {
    check(
        BASE,
        Ok(vec![
            ("toHost", "backups.example.org/v1", Scope::Namespaced),
            ("fromHost", "sharedstores.example.org", Scope::Cluster),
        ]),
    );
    // Namespaced fromHost with both mapping forms.
    let namespaced = edit(
        "        scope: Cluster\n",
        "        scope: Namespaced\n        mappings:\n          byName:\n            \"shared/*\": \"team\"\n            \"shared/one\": \"team/uno\"\n",
    );
    check(
        &namespaced,
        Ok(vec![
            ("toHost", "backups.example.org/v1", Scope::Namespaced),
            ("fromHost", "sharedstores.example.org", Scope::Namespaced),
        ]),
    );
    let (config, _) = load(&namespaced).expect("valid");
    let plan = validate(&config).expect("valid").expect("enabled");
    assert_eq!(plan.tenant, "tenant");
    assert_eq!(plan.host_namespace, "vcluster-tenant");
    assert_eq!(
        plan.resources[1].mappings,
        vec![
            Mapping::Namespace {
                host_namespace: "shared".into(),
                tenant_namespace: "team".into()
            },
            Mapping::Object {
                host_namespace: "shared".into(),
                host_name: "one".into(),
                tenant_namespace: "team".into(),
                tenant_name: "uno".into()
            },
        ]
    );
    // Disabled entries are read but not planned; an all-disabled sync plans nothing.
    check(
        &edit(
            "        enabled: true\n  fromHost",
            "        enabled: false\n  fromHost",
        ),
        Ok(vec![(
            "fromHost",
            "sharedstores.example.org",
            Scope::Cluster,
        )]),
    );
    // Without toHost entries the host namespace is not needed.
    check(
        &edit("    namespace: vcluster-tenant\n", "").replace(
            "        enabled: true\n  fromHost",
            "        enabled: false\n  fromHost",
        ),
        Ok(vec![(
            "fromHost",
            "sharedstores.example.org",
            Scope::Cluster,
        )]),
    );
    // A patch on a toHost entry.
    let patched = edit(
        "      backups.example.org/v1:\n        enabled: true\n",
        "      backups.example.org/v1:\n        enabled: true\n        patches:\n          - path: spec.secretRef.name\n            reference: {apiVersion: v1, kind: Secret}\n",
    );
    let (config, _) = load(&patched).expect("valid");
    let plan = validate(&config).expect("valid").expect("enabled");
    assert_eq!(plan.resources[0].patches[0].text, "spec.secretRef.name");
}

#[test]
fn every_rule_names_its_key() {
    #[rustfmt::skip]
    let cases: Vec<(String, Vec<(&str, &str)>)> = vec![
        // Scope per direction.
        (edit("        enabled: true\n  fromHost", "        enabled: true\n        scope: Cluster\n  fromHost"),
            vec![(&format!("{TO}.scope"), "namespaced types only")].into_iter().map(|(k, m)| (leak(k), m)).collect()),
        (edit("        scope: Cluster\n", "        scope: Global\n"),
            vec![(leak(&format!("{FROM}.scope")), "expected Namespaced or Cluster")]),
        // Namespaced fromHost needs mappings; Cluster fromHost must not have them.
        (edit("        scope: Cluster\n", "        scope: Namespaced\n"),
            vec![(leak(&format!("{FROM}.mappings")), "is required for a Namespaced fromHost type")]),
        (edit("        scope: Cluster\n", "        scope: Cluster\n        mappings:\n          byName:\n            \"a/*\": \"b\"\n"),
            vec![(leak(&format!("{FROM}.mappings")), "only for Namespaced types")]),
        (edit("        scope: Cluster\n", "        scope: Namespaced\n        mappings:\n          byName:\n            \"a\": \"b\"\n"),
            vec![(leak(&format!("{FROM}.mappings.byName[\"a\"]")), "needs a host namespace")]),
        (edit("        scope: Cluster\n", "        scope: Namespaced\n        mappings:\n          byName:\n            \"a/x\": \"b\"\n"),
            vec![(leak(&format!("{FROM}.mappings.byName[\"a/x\"]")), "an object maps to")]),
        // A group both proxied and synced.
        (format!("{BASE}experimental:\n  proxy:\n    customResources:\n      widgets.example.org/v1:\n        enabled: true\n        targetVirtualCluster: {{name: t}}\ntargets:\n  - name: t\n    kubeconfig: k\n    peers: {{static: [\"127.0.0.1:1\"]}}\n"),
            vec![(TO, "also proxied"), (FROM, "also proxied")]),
        // Host settings are required once something is enabled.
        (edit("    kubeconfig: host.kubeconfig\n", ""), vec![("sync.host.kubeconfig", "is required")]),
        (edit("    namespace: vcluster-tenant\n", ""), vec![("sync.host.namespace", "is required when a toHost entry is enabled")]),
        (edit("    namespace: vcluster-tenant\n", "    namespace: Not_A_Namespace\n"), vec![("sync.host.namespace", "not a valid namespace")]),
        // Keys.
        (edit("      backups.example.org/v1:", "      backups/v1:"), vec![("sync.toHost.customResources[\"backups/v1\"]", "a group is required")]),
        (edit("      backups.example.org/v1:", "      backups.example/v1:"), vec![("sync.toHost.customResources[\"backups.example/v1\"]", "at least one dot")]),
        (edit("      backups.example.org/v1:", "      backups.example.org/v1/x:"), vec![("sync.toHost.customResources[\"backups.example.org/v1/x\"]", "too many '/'")]),
        (edit("      backups.example.org/v1:", "      backups.example.org/V1:"), vec![("sync.toHost.customResources[\"backups.example.org/V1\"]", "not a valid API version")]),
        // Two keys for one type in one direction.
        (edit("      backups.example.org/v1:\n        enabled: true\n", "      backups.example.org/v1:\n        enabled: true\n      backups.example.org:\n        enabled: true\n"),
            vec![(TO, "same type as \"backups.example.org\"")]),
        // Patches.
        (edit("      backups.example.org/v1:\n        enabled: true\n", "      backups.example.org/v1:\n        enabled: true\n        patches:\n          - path: spec.refs[x].name\n"),
            vec![(leak(&format!("{TO}.patches[0].path")), "only [*] and [<number>]")]),
        (edit("      backups.example.org/v1:\n        enabled: true\n", "      backups.example.org/v1:\n        enabled: true\n        patches:\n          - path: metadata.name\n"),
            vec![(leak(&format!("{TO}.patches[0].path")), "must not point into metadata")]),
        (edit("      backups.example.org/v1:\n        enabled: true\n", "      backups.example.org/v1:\n        enabled: true\n        patches:\n          - {}\n"),
            vec![(leak(&format!("{TO}.patches[0].path")), "must name a field")]),
        (edit("        scope: Cluster\n", "        scope: Cluster\n        patches:\n          - path: spec.a\n"),
            vec![(leak(&format!("{FROM}.patches")), "toHost only")]),
        // Reading: unknown keys and wrong types name the full path.
        (edit("  toHost:\n", "  toHost:\n    pods: {enabled: true}\n"), vec![("sync.toHost.pods", "unknown key; expected one of: customResources")]),
        (edit("        enabled: true\n  fromHost", "        enabled: true\n        mappings: {}\n  fromHost"), vec![(leak(&format!("{TO}.mappings")), "unknown key")]),
        (edit("        enabled: true\n  fromHost", "        enabled: yes please\n  fromHost"), vec![(leak(&format!("{TO}.enabled")), "expected true or false")]),
        (edit("    namespace: vcluster-tenant\n", "    namespace: vcluster-tenant\n    server: x\n"), vec![("sync.host.server", "unknown key")]),
        // Nothing enabled anywhere: neither proxy nor sync starts.
        (BASE.replace("enabled: true", "enabled: false"), vec![("experimental.proxy.customResources", "neither the proxy nor the sync starts")]),
    ];
    for (yaml, want) in cases {
        check(&yaml, Err(want));
    }
}

fn leak(s: &str) -> &'static str {
    Box::leak(s.to_owned().into_boxed_str())
}

#[test]
fn a_type_in_both_directions_is_synced_to_the_host_and_warned_about() {
    let yaml = BASE.replace(
        "      sharedstores.example.org:",
        "      backups.example.org:",
    );
    check(
        &yaml,
        Ok(vec![(
            "toHost",
            "backups.example.org/v1",
            Scope::Namespaced,
        )]),
    );
    let (config, _) = load(&yaml).expect("valid");
    let warnings = warnings(&config.sync);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(
        warnings[0].key,
        "sync.fromHost.customResources[\"backups.example.org\"]"
    );
    assert!(warnings[0].message.contains("fromHost skips it"));
    assert!(super::warnings(&load(BASE).expect("valid").0.sync).is_empty());
}

#[test]
fn field_paths() {
    let ok = |text: &str, steps: Vec<PathStep>| {
        assert_eq!(FieldPath::parse(text).map(|p| p.steps), Ok(steps), "{text}");
    };
    let key = |k: &str| PathStep::Key(k.to_owned());
    ok(
        "spec.secretRef.name",
        vec![key("spec"), key("secretRef"), key("name")],
    );
    ok("$.spec.a", vec![key("spec"), key("a")]);
    ok(".spec.a", vec![key("spec"), key("a")]);
    ok(
        "spec.volumes[*].secret.name",
        vec![
            key("spec"),
            key("volumes"),
            PathStep::Each,
            key("secret"),
            key("name"),
        ],
    );
    ok(
        "spec.m[0][*]",
        vec![key("spec"), key("m"), PathStep::Index(0), PathStep::Each],
    );
    for bad in [
        "",
        "$.",
        "spec..a",
        "spec.a[",
        "spec.a[x]",
        "spec.a[0]b",
        "[0].a",
    ] {
        assert!(FieldPath::parse(bad).is_err(), "{bad:?} should be rejected");
    }
}
