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
        (edit("    kubeconfig: host.kubeconfig\n", "    kubeconfig: \"\"\n"), vec![("sync.host.kubeconfig", "is required")]),
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
        // The write-through webhook's address and how the tenant reaches it.
        (format!("{BASE}  writeThrough:\n    listenAddress: localhost:9443\n"),
            vec![("sync.writeThrough.listenAddress", "is not <ip>:<port>")]),
        (format!("{BASE}  writeThrough:\n    listenAddress: 0.0.0.0:0\n    url: https://crproxy.example.com:9443\n"),
            vec![("sync.writeThrough.listenAddress", "needs a fixed port when service or url is set")]),
        (format!("{BASE}  writeThrough:\n    listenAddress: 0.0.0.0:9443\n    url: https://a.example:9443\n    service: {{namespace: kube-system, name: crproxy-writethrough}}\n"),
            vec![("sync.writeThrough", "either service or url, not both")]),
        (format!("{BASE}  writeThrough:\n    listenAddress: 0.0.0.0:9443\n    service: {{namespace: kube-system}}\n"),
            vec![("sync.writeThrough.service.name", "is required: the selector-less Service")]),
        (format!("{BASE}  writeThrough:\n    listenAddress: 0.0.0.0:9443\n    service: {{namespace: Kube_System, name: w}}\n"),
            vec![("sync.writeThrough.service.namespace", "not a valid namespace")]),
        (format!("{BASE}  writeThrough:\n    listenAddress: 0.0.0.0:9443\n    service: {{namespace: kube-system, name: w, port: 0}}\n"),
            vec![("sync.writeThrough.service.port", "must be a whole number between 1 and 65535, found 0")]),
        (format!("{BASE}  writeThrough:\n    listenAddress: 0.0.0.0:9443\n    service: {{namespace: kube-system, name: w, port: 70000}}\n"),
            vec![("sync.writeThrough.service.port", "must be a whole number between 1 and 65535, found 70000")]),
        (format!("{BASE}  writeThrough:\n    listenAddress: 0.0.0.0:9443\n    url: http://crproxy.example.com:9443\n"),
            vec![("sync.writeThrough.url", "must start with https://")]),
        (format!("{BASE}  writeThrough:\n    listenAddress: 0.0.0.0:9443\n    url: https://crproxy.example.com/v?x=1\n"),
            vec![("sync.writeThrough.url", "query or fragment")]),
        (format!("{BASE}  writeThrough:\n    listenAddress: 0.0.0.0:9443\n    url: https://me@crproxy.example.com\n"),
            vec![("sync.writeThrough.url", "user info")]),
        (format!("{BASE}  writeThrough:\n    listenAddress: 0.0.0.0:9443\n    url: https://crproxy.example.com:99999\n"),
            vec![("sync.writeThrough.url", "port must be a number")]),
        (format!("{BASE}  writeThrough:\n    listenAddress: 0.0.0.0:9443\n    url: https://Not_A_Host\n"),
            vec![("sync.writeThrough.url", "neither an IP address nor a DNS name")]),
        (format!("{BASE}  writeThrough:\n    listenAddress: 0.0.0.0:9443\n    address: x\n"),
            vec![("sync.writeThrough.address", "unknown key; expected one of: listenAddress, service, url")]),
        // Nothing enabled anywhere: neither proxy nor sync starts.
        (BASE.replace("enabled: true", "enabled: false"), vec![("experimental.proxy.customResources", "neither the proxy nor the sync starts")]),
    ];
    for (yaml, want) in cases {
        check(&yaml, Err(want));
    }
}

/// A reference's host name is `<name>-x-<namespace>-x-<client.name>`: for a
/// client name with `-x-` or starting with `x-` it could also be another
/// tenant's object in the shared host namespace (tenant `c-x-d`'s Secret `a` in
/// `b` is tenant `d`'s `a` in `b-x-c`). Such a name is still a valid virtual
/// cluster name: only patches are refused with it.
#[test]
fn a_client_name_that_makes_references_ambiguous_is_refused_with_patches() {
    let with_patches = |name: &str| {
        edit(
            "      backups.example.org/v1:\n        enabled: true\n",
            "      backups.example.org/v1:\n        enabled: true\n        patches:\n          - path: spec.secretRef.name\n",
        )
        .replace("  name: tenant\n", &format!("  name: {name}\n"))
    };
    let plan = vec![
        ("toHost", "backups.example.org/v1", Scope::Namespaced),
        ("fromHost", "sharedstores.example.org", Scope::Cluster),
    ];
    for name in ["c-x-d", "x-d"] {
        let why = if name.starts_with("x-") {
            "the tenant name starts with \"x-\""
        } else {
            "the tenant name contains \"-x-\""
        };
        check(
            &with_patches(name),
            Err(vec![("client.name", leak(&format!(
                "{name:?} cannot be used with patches ({TO} has some): {why}, so a reference's host name <name>-x-<namespace>-x-{name} could also be another tenant's object"
            )))]),
        );
        // Without patches the name only names mirrors, which their identity
        // annotations guard.
        check(
            &BASE.replace("  name: tenant\n", &format!("  name: {name}\n")),
            Ok(plan.clone()),
        );
    }
    // Nothing follows the tenant name: ending in `-x` is harmless.
    check(&with_patches("d-x"), Ok(plan));
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

/// Two mappings of one fromHost type that copy into the same tenant object (or,
/// for namespace wildcards, the same tenant namespace) would leave one of them
/// silently never copied: refused, naming both.
#[test]
fn mappings_into_one_tenant_object_are_refused() {
    let with = |by_name: &str| {
        edit(
            "        scope: Cluster\n",
            &format!("        scope: Namespaced\n        mappings:\n          byName:\n{by_name}"),
        )
    };
    let at = |host: &str| leak(&format!("{FROM}.mappings.byName[{host:?}]"));
    check(
        &with("            \"h1/a\": \"t/x\"\n            \"h2/b\": \"t/x\"\n"),
        Err(vec![(at("h2/b"), "copies into \"t/x\" as \"h1/a\" does")]),
    );
    check(
        &with("            \"h1/*\": t\n            \"h2/*\": t\n"),
        Err(vec![(
            at("h2/*"),
            "copies into namespace \"t\" as \"h1/*\" does",
        )]),
    );
    // A third mapping into one target is told about the first.
    check(
        &with("            \"h1/a\": \"t/x\"\n            \"h2/b\": \"t/x\"\n            \"h3/c\": \"t/x\"\n"),
        Err(vec![
            (at("h2/b"), "copies into \"t/x\" as \"h1/a\" does"),
            (at("h3/c"), "copies into \"t/x\" as \"h1/a\" does"),
        ]),
    );
    // Distinct targets are fine, also an object mapped out of a wildcard's namespace.
    check(
        &with("            \"h1/*\": t\n            \"h2/*\": u\n            \"h1/a\": \"v/a\"\n            \"h2/a\": \"v/b\"\n"),
        Ok(vec![
            ("toHost", "backups.example.org/v1", Scope::Namespaced),
            ("fromHost", "sharedstores.example.org", Scope::Namespaced),
        ]),
    );
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

/// The write-through plan of `sync.writeThrough` as written below BASE.
fn write_through(section: &str) -> WriteThroughPlan {
    let yaml = format!("{BASE}{section}");
    let (config, _) = load(&yaml).unwrap_or_else(|e| panic!("{e:?}\n{yaml}"));
    validate(&config)
        .unwrap_or_else(|e| panic!("{e:?}\n{yaml}"))
        .expect("enabled")
        .write_through
}

#[test]
fn write_through_endpoints() {
    let listener = write_through("");
    assert_eq!(listener.listen, "127.0.0.1:0".parse().expect("addr"));
    assert_eq!(listener.endpoint, WebhookEndpoint::Listener);
    assert_eq!(listener.endpoint.server_name(), None);

    let service = write_through(
        "  writeThrough:\n    listenAddress: 0.0.0.0:9443\n    service: {namespace: kube-system, name: crproxy-writethrough}\n",
    );
    assert_eq!(service.listen, "0.0.0.0:9443".parse().expect("addr"));
    assert_eq!(
        service.endpoint,
        WebhookEndpoint::Service {
            namespace: "kube-system".into(),
            name: "crproxy-writethrough".into(),
            port: 443
        }
    );
    assert_eq!(
        service.endpoint.server_name().as_deref(),
        Some("crproxy-writethrough.kube-system.svc")
    );

    for (url, want_url, host) in [
        (
            "https://crproxy.example.com:9443/",
            "https://crproxy.example.com:9443",
            "crproxy.example.com",
        ),
        (
            "https://10.0.0.7:9443/hooks",
            "https://10.0.0.7:9443/hooks",
            "10.0.0.7",
        ),
        (
            "https://[fd00::7]:9443",
            "https://[fd00::7]:9443",
            "fd00::7",
        ),
        (
            "https://crproxy.example.com",
            "https://crproxy.example.com",
            "crproxy.example.com",
        ),
    ] {
        let plan = write_through(&format!(
            "  writeThrough:\n    listenAddress: \"[::]:9443\"\n    url: \"{url}\"\n"
        ));
        assert_eq!(
            plan.endpoint,
            WebhookEndpoint::Url {
                url: want_url.into(),
                host: host.into()
            },
            "{url}"
        );
        assert_eq!(plan.endpoint.server_name().as_deref(), Some(host));
    }
}

#[test]
fn write_through_errors_point_at_their_line() {
    let yaml = format!("{BASE}  writeThrough:\n    listenAddress: 0.0.0.0:9443\n    service: {{namespace: kube-system, name: w, port: 0}}\n");
    let source = crate::config::SourceMap::build(&yaml).expect("yaml");
    let line = yaml
        .lines()
        .position(|l| l.contains("service:"))
        .expect("service line")
        + 1;
    assert_eq!(source.locate("sync.writeThrough.service.port").line, line);
    let line = line - 1;
    assert_eq!(source.locate("sync.writeThrough.listenAddress").line, line);
}
