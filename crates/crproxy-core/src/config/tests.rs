use super::*;

const BASE: &str = r#"
client:
  name: client
  project: default
proxy: {}
targets:
  - name: target
    kubeconfig: /etc/crproxy/target.kubeconfig
    peers:
      static: ["127.0.0.1:7443"]
experimental:
  proxy:
    customResources:
      widgets.example.com/v1:
        enabled: true
        targetVirtualCluster: {name: target}
"#;

/// Expected outcome: the served `(group/version, port)` list, or every error as
/// `(key, message fragment)`.
type Expected<'a> = Result<Vec<(&'a str, u16)>, Vec<(&'a str, &'a str)>>;

fn check(yaml: &str, expected: Expected) {
    let got = load(yaml).map(|(_, plan)| {
        plan.group_versions
            .iter()
            .map(|g| (format!("{}/{}", g.group, g.version), g.port))
            .collect::<Vec<_>>()
    });
    match (got, expected) {
        (Ok(plan), Ok(want)) => {
            let want: Vec<(String, u16)> =
                want.into_iter().map(|(g, p)| (g.to_owned(), p)).collect();
            assert_eq!(plan, want, "yaml:\n{yaml}");
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

/// BASE with one line replaced.
fn edit(from: &str, to: &str) -> String {
    assert!(BASE.contains(from), "BASE lacks {from:?}");
    BASE.replacen(from, to, 1)
}

fn cr(key: &str) -> String {
    entry_path(key)
}

#[test]
fn valid_configs() {
    check(BASE, Ok(vec![("example.com/v1", 9100)]));
    let many = format!(
        "{BASE}      gadgets.example.com/v1:\n        enabled: true\n        targetVirtualCluster: {{name: target, project: default}}\n      \
         '*.b.io/v1':\n        enabled: true\n        targetVirtualCluster: {{name: target}}\n      \
         things.a.io/v2:\n        enabled: true\n        targetVirtualCluster: {{name: target}}\n        accessResources: all\n      \
         off.z.io/v1:\n        enabled: false\n        targetVirtualCluster: {{name: nowhere}}\n"
    );
    check(
        &many,
        Ok(vec![
            ("a.io/v2", 9100),
            ("b.io/v1", 9101),
            ("example.com/v1", 9102),
        ]),
    );
    check(
        &edit("proxy: {}", "proxy: {basePort: 20000}"),
        Ok(vec![("example.com/v1", 20000)]),
    );
    check(
        &edit("proxy: {}", "proxy: {basePort: 65535}"),
        Ok(vec![("example.com/v1", 65535)]),
    );
}

#[test]
fn plan_details_and_defaults() {
    let yaml = format!(
        "{BASE}      gadgets.example.com/v1:\n        enabled: true\n        targetVirtualCluster: {{name: target}}\n      \
         widgets.example.com/v2:\n        enabled: true\n        targetVirtualCluster: {{name: target}}\n        accessResources: all\n      \
         '*.x.io/v1':\n        enabled: true\n        targetVirtualCluster: {{name: target}}\n"
    );
    let (config, plan) = load(&yaml).expect("valid");
    assert_eq!(config.client.project_namespace(), "p-default");
    assert_eq!(config.client.kubeconfig, None);
    assert_eq!(config.proxy.bind_address, "127.0.0.1");
    assert_eq!(config.proxy.base_port, 9100);
    assert_eq!(config.proxy.metrics_address, "127.0.0.1:9090");
    assert_eq!(
        config.proxy.registration.service_type,
        ServiceType::ExternalName
    );
    assert_eq!(config.proxy.registration.external_name, "localhost");
    assert!(!config.proxy.registration.insecure_skip_tls_verify);
    assert_eq!(config.targets[0].project, "default");
    assert_eq!(
        config.targets[0].peers.source(),
        Some(PeerSource::Static(vec!["127.0.0.1:7443".into()]))
    );
    let target = TargetRef {
        name: "target".into(),
        project: "default".into(),
    };
    assert_eq!(
        plan.group_versions,
        vec![
            GroupVersionPlan {
                group: "example.com".into(),
                version: "v1".into(),
                resources: ResourceSet::Explicit(vec!["gadgets".into(), "widgets".into()]),
                target: target.clone(),
                access: AccessMode::Owned,
                port: 9100,
            },
            GroupVersionPlan {
                group: "example.com".into(),
                version: "v2".into(),
                resources: ResourceSet::Explicit(vec!["widgets".into()]),
                target: target.clone(),
                access: AccessMode::All,
                port: 9101,
            },
            GroupVersionPlan {
                group: "x.io".into(),
                version: "v1".into(),
                resources: ResourceSet::Wildcard,
                target,
                access: AccessMode::Owned,
                port: 9102,
            },
        ]
    );
}

/// Two groups that differ only by a dot where the other has a dash would share
/// one Service in the client (its name turns dots into dashes), and each
/// registration pass would point it at the other's port: refused, naming both.
#[test]
fn group_versions_whose_services_would_share_a_name_are_refused() {
    let yaml = format!(
        "{BASE}      widgets.a-b.io/v1:\n        enabled: true\n        targetVirtualCluster: {{name: target}}\n      gadgets.a.b.io/v1:\n        enabled: true\n        targetVirtualCluster: {{name: target}}\n"
    );
    check(
        &yaml,
        Err(vec![(
            &cr("gadgets.a.b.io/v1"),
            "group/version a.b.io/v1 would be served through the Service proxy-a-b-io-v1, which a-b.io/v1 already uses",
        )]),
    );
}

#[test]
fn a_wildcard_covers_explicit_keys_of_its_group_version() {
    let yaml = format!(
        "{BASE}      '*.example.com/v1':\n        enabled: true\n        targetVirtualCluster: {{name: target}}\n"
    );
    let (_, plan) = load(&yaml).expect("a wildcard and an explicit key that agree are valid");
    assert_eq!(plan.group_versions.len(), 1);
    assert_eq!(plan.group_versions[0].resources, ResourceSet::Wildcard);
}

#[test]
fn full_shape_parses() {
    let yaml = r#"
client:
  name: client
  project: team
  projectNamespace: p-team-ns
  kubeconfig: /k/client
proxy:
  bindAddress: 0.0.0.0
  basePort: 9200
  metricsAddress: 0.0.0.0:9091
  registration:
    serviceType: ClusterIP
    externalName: proxy.local
    insecureSkipTLSVerify: true
targets:
  - name: a
    project: other
    kubeconfig: /k/a
    peers:
      dns: {name: api.a.svc, port: 6443, intervalSeconds: 5}
  - name: b
    kubeconfig: /k/b
    peers:
      endpointSlices: {namespace: default, service: kubernetes, portName: https}
  - name: c
    kubeconfig: /k/c
    peers:
      file: /etc/peers.yaml
experimental:
  proxy:
    customResources:
      widgets.example.com/v1:
        enabled: true
        targetVirtualCluster: {name: a, project: other}
sync:
  toHost:
    customResources: {}
"#;
    let (c, plan) = load(yaml).expect("valid");
    assert_eq!(c.client.project_namespace(), "p-team-ns");
    assert_eq!(c.client.kubeconfig.as_deref(), Some("/k/client"));
    assert_eq!(c.proxy.registration.service_type, ServiceType::ClusterIP);
    assert!(c.proxy.registration.insecure_skip_tls_verify);
    assert_eq!(
        c.targets[0].peers.source(),
        Some(PeerSource::Dns(DnsPeers {
            name: "api.a.svc".into(),
            port: 6443,
            interval_seconds: 5
        }))
    );
    assert_eq!(
        c.targets[1].peers.source(),
        Some(PeerSource::EndpointSlices(EndpointSlicePeers {
            kubeconfig: None,
            namespace: "default".into(),
            service: "kubernetes".into(),
            port_name: Some("https".into()),
        }))
    );
    assert_eq!(c.targets[1].project, "team");
    assert_eq!(
        c.targets[2].peers.source(),
        Some(PeerSource::File("/etc/peers.yaml".into()))
    );
    assert!(!c.sync.any_enabled());
    assert_eq!(plan.group_versions[0].port, 9200);
    assert_eq!(
        plan.group_versions[0].target,
        TargetRef {
            name: "a".into(),
            project: "other".into()
        }
    );
}

#[test]
fn parse_errors() {
    let rows: Vec<(String, Vec<(&str, &str)>)> = vec![
        ("client: [".into(), vec![("", "invalid YAML")]),
        (
            "- a\n- b\n".into(),
            vec![("", "the file must be a mapping of the configuration's top-level keys (client, proxy, targets, experimental, sync), found a list")],
        ),
        (
            edit("client:", "clinet: {}\nclient:"),
            vec![(
                "clinet",
                "unknown key; expected one of: client, proxy, targets, experimental, sync",
            )],
        ),
        (
            edit("  name: client", "  name: client\n  nmae: x"),
            vec![("client.nmae", "unknown key")],
        ),
        (
            edit("proxy: {}", "proxy: {basePort: 70000}"),
            vec![("proxy.basePort", "must be a whole number between 1 and 65535, found 70000")],
        ),
        (
            edit("proxy: {}", "proxy: {basePort: -1}"),
            vec![("proxy.basePort", "must be a whole number between 1 and 65535, found -1")],
        ),
        (
            edit("proxy: {}", "proxy: {basePort: \"9100\"}"),
            vec![("proxy.basePort", "expected a number, found a string")],
        ),
        (
            edit(
                "proxy: {}",
                "proxy: {registration: {serviceType: NodePort}}",
            ),
            vec![(
                "proxy.registration.serviceType",
                "expected ExternalName or ClusterIP",
            )],
        ),
        (
            edit(
                "proxy: {}",
                "proxy: {registration: {insecureSkipTLSVerify: maybe}}",
            ),
            vec![(
                "proxy.registration.insecureSkipTLSVerify",
                "expected true or false",
            )],
        ),
        (
            edit("proxy: {}", "proxy: {registration: {extra: 1}}"),
            vec![("proxy.registration.extra", "unknown key")],
        ),
        (
            edit("  name: client", "  name: 12"),
            vec![("client.name", "expected a string, found a number")],
        ),
        (
            edit("targets:", "targets: {}\nx:"),
            vec![
                ("x", "unknown key"),
                ("targets", "expected a list, found a mapping"),
                (
                    leak(format!(
                        "{}.targetVirtualCluster",
                        cr("widgets.example.com/v1")
                    )),
                    "no entry in targets has name",
                ),
            ],
        ),
        (
            edit(
                "    kubeconfig: /etc",
                "    kubecfg: x\n    kubeconfig: /etc",
            ),
            vec![("targets[0].kubecfg", "unknown key")],
        ),
        (
            edit("      static: [\"127.0.0.1:7443\"]", "      static: [7443]"),
            vec![(
                "targets[0].peers.static[0]",
                "expected a \"host:port\" string",
            )],
        ),
        (
            edit(
                "      static: [\"127.0.0.1:7443\"]",
                "      static: [\"127.0.0.1:7443\"]\n      dns: {name: x, ttl: 3}",
            ),
            vec![("targets[0].peers.dns.ttl", "unknown key")],
        ),
        (
            edit(
                "    customResources:",
                "    customResource: {}\n    customResources:",
            ),
            vec![("experimental.proxy.customResource", "unknown key")],
        ),
        (
            edit("        enabled: true", "        enabled: \"yes\""),
            vec![(
                leak(format!("{}.enabled", cr("widgets.example.com/v1"))),
                "expected true or false",
            )],
        ),
        (
            edit(
                "        enabled: true",
                "        enabled: true\n        accessResources: some",
            ),
            vec![(
                leak(format!("{}.accessResources", cr("widgets.example.com/v1"))),
                "expected owned or all",
            )],
        ),
        (
            edit("{name: target}", "{name: target, namespace: x}"),
            vec![(
                leak(format!(
                    "{}.targetVirtualCluster.namespace",
                    cr("widgets.example.com/v1")
                )),
                "unknown key",
            )],
        ),
    ];
    for (yaml, want) in rows {
        check(&yaml, Err(want));
    }
}

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

/// One row per validation rule of the spec and of crproxy's own keys.
#[test]
fn validation_rules() {
    let w = cr("widgets.example.com/v1");
    let entry = |key: &str, body: &str| format!("{BASE}      {key}:\n{body}");
    let enabled_to = |name: &str| {
        format!("        enabled: true\n        targetVirtualCluster: {{name: {name}}}\n")
    };
    let rows: Vec<(String, Vec<(&str, &str)>)> = vec![
        // client
        (edit("  name: client\n", ""), vec![("client.name", "is required")]),
        (edit("  project: default\n", ""), vec![
            ("client.project", "is required"),
            ("targets[0].project", "is required"),
        ]),
        (edit("  name: client", "  name: Bad_Name!"), vec![("client.name", "\"Bad_Name!\" is not a valid name: use at most 63 lower-case letters, digits and '-', starting and ending with a letter or digit")]),
        (edit("  name: client", "  name: Client"), vec![("client.name", "\"Client\" is not a valid name")]),
        (edit("  project: default", "  project: my.project"), vec![
            ("client.project", "is not a valid name"),
            ("targets[0].project", "is not a valid name"),
        ]),
        (edit("  - name: target", "  - name: tar_get"), vec![
            ("targets[0].name", "is not a valid name"),
            (leak(format!("{w}.targetVirtualCluster")), "no entry in targets"),
        ]),
        (edit("  name: client", "  name: client\n  projectNamespace: ''"), vec![("client.projectNamespace", "must not be empty")]),
        (edit("  name: client", "  name: client\n  projectNamespace: P_Default"), vec![("client.projectNamespace", "\"P_Default\" is not a valid name: use at most 63 lower-case letters, digits and '-', starting and ending with a letter or digit (it is the Kubernetes namespace of the client's Platform project)")]),
        (edit("  name: client", &format!("  name: client\n  projectNamespace: {}", "n".repeat(64))), vec![("client.projectNamespace", "is not a valid name")]),
        (edit("  project: default", &format!("  project: {}", "p".repeat(62))), vec![("client.projectNamespace", "it defaults to p-<client.project>, which is too long here: set client.projectNamespace to the project's namespace")]),
        (edit("  project: default", &format!("  project: {}\n  projectNamespace: p-team", "p".repeat(62))), vec![]),
        // Written out, the default's value is the operator's: no word of a default.
        (edit("  project: default", &format!("  project: {0}\n  projectNamespace: p-{0}", "p".repeat(62))), vec![("client.projectNamespace", "(it is the Kubernetes namespace of the client's Platform project)")]),
        // proxy
        (edit("proxy: {}", "proxy: {bindAddress: localhost}"), vec![("proxy.bindAddress", "is not an IP address")]),
        (edit("proxy: {}", "proxy: {metricsAddress: '9090'}"), vec![("proxy.metricsAddress", "ip:port")]),
        (edit("proxy: {}", "proxy: {registration: {externalName: ''}}"), vec![("proxy.registration.externalName", "must not be empty")]),
        (edit("proxy: {}", "proxy: {basePort: 0}"), vec![("proxy.basePort", "must be a whole number between 1 and 65535, found 0")]),
        (
            format!("{}      gadgets.other.io/v1:\n{}", edit("proxy: {}", "proxy: {basePort: 65535}"), enabled_to("target")),
            vec![("proxy.basePort", "the last port would be 65536")],
        ),
        // targets
        (edit("  - name: target\n", "  - project: default\n"), vec![
            ("targets[0].name", "is required"),
            (leak(format!("{w}.targetVirtualCluster")), "no entry in targets"),
        ]),
        (edit("    kubeconfig: /etc/crproxy/target.kubeconfig\n", ""), vec![("targets[0].kubeconfig", "is required")]),
        (edit("      static: [\"127.0.0.1:7443\"]", "      {}"), vec![("targets[0].peers", "exactly one peer source is required (static, dns, endpointSlices or file); found 0")]),
        (edit("    peers:\n      static: [\"127.0.0.1:7443\"]\n", ""), vec![("targets[0].peers", "found 0")]),
        (edit("      static: [\"127.0.0.1:7443\"]", "      static: [\"127.0.0.1:7443\"]\n      file: /p"), vec![("targets[0].peers", "found 2")]),
        (edit("      static: [\"127.0.0.1:7443\"]", "      static: []"), vec![("targets[0].peers.static", "at least one")]),
        (edit("      static: [\"127.0.0.1:7443\"]", "      static: [\"127.0.0.1\", \"[::1]:443\", \"h:0\"]"), vec![
            ("targets[0].peers.static[0]", "is not a host:port address"),
            ("targets[0].peers.static[2]", "is not a host:port address"),
        ]),
        // Shorthand a resolver reads as another address, and a name with a blank.
        (edit("      static: [\"127.0.0.1:7443\"]", "      static: [\"0x7f.1:443\", \"api.example:443\", \"api example:443\", \"h:+443\"]"), vec![
            ("targets[0].peers.static[0]", "is not a host:port address"),
            ("targets[0].peers.static[2]", "is not a host:port address"),
            ("targets[0].peers.static[3]", "is not a host:port address"),
        ]),
        (edit("      static: [\"127.0.0.1:7443\"]", "      dns: {name: '10.1', port: 443}"), vec![("targets[0].peers.dns.name", "\"10.1\" is not a host name")]),
        (edit("      static: [\"127.0.0.1:7443\"]", "      dns: {port: 0, intervalSeconds: 0}"), vec![
            // Reading errors come before the rules' errors.
            ("targets[0].peers.dns.port", "must be a whole number between 1 and 65535, found 0"),
            ("targets[0].peers.dns.intervalSeconds", "must be a whole number between 1 and 86400, found 0"),
            ("targets[0].peers.dns.name", "is required"),
        ]),
        (edit("      static: [\"127.0.0.1:7443\"]", "      dns: {name: api, intervalSeconds: 86401}"), vec![
            ("targets[0].peers.dns.intervalSeconds", "must be a whole number between 1 and 86400, found 86401"),
        ]),
        (edit("      static: [\"127.0.0.1:7443\"]", "      endpointSlices: {namespace: '', service: ''}"), vec![
            ("targets[0].peers.endpointSlices.namespace", "must not be empty"),
            ("targets[0].peers.endpointSlices.service", "must not be empty"),
        ]),
        (edit("      static: [\"127.0.0.1:7443\"]", "      file: ''"), vec![("targets[0].peers.file", "must not be empty")]),
        (
            edit("experimental:", "  - name: target\n    project: default\n    kubeconfig: /k\n    peers: {file: /p}\nexperimental:"),
            vec![("targets[1].name", "duplicate target default/target: targets[0]")],
        ),
        // entry keys
        (entry("widgets.example.com", &enabled_to("target")), vec![(leak(cr("widgets.example.com")), "a version is required")]),
        (entry("widgets.example.com/", &enabled_to("target")), vec![(leak(cr("widgets.example.com/")), "a version is required")]),
        (entry("widgets/v1", &enabled_to("target")), vec![(leak(cr("widgets/v1")), "a group is required")]),
        (entry("widgets./v1", &enabled_to("target")), vec![(leak(cr("widgets./v1")), "a group is required")]),
        (entry(".example.com/v1", &enabled_to("target")), vec![(leak(cr(".example.com/v1")), "a resource or * is required")]),
        (entry("w.example.com/v1/x", &enabled_to("target")), vec![(leak(cr("w.example.com/v1/x")), "too many '/'")]),
        (entry("Widgets.example.com/v1", &enabled_to("target")), vec![(leak(cr("Widgets.example.com/v1")), "not a valid plural resource name")]),
        (entry("w.Example.com/v1", &enabled_to("target")), vec![(leak(cr("w.Example.com/v1")), "not a valid API group")]),
        (entry("w.example.com/V1", &enabled_to("target")), vec![(leak(cr("w.example.com/V1")), "not a valid API version")]),
        // An entry's name is judged even when a value under it cannot be read.
        (entry("widgets.example.com", "        enabled: true\n        targetVirtualCluster: {name: t}\n        accessResources: mine\n"), vec![
            (leak(format!("{}.accessResources", cr("widgets.example.com"))), "unknown value \"mine\"; expected owned or all"),
            (leak(cr("widgets.example.com")), "a version is required"),
            (leak(format!("{}.targetVirtualCluster", cr("widgets.example.com"))), "no entry in targets has name \"t\""),
        ]),
        // What follows from a value that cannot be read is not reported again.
        (edit("        enabled: true\n", "        enabled: \"yes\"\n"), vec![(leak(format!("{w}.enabled")), "expected true or false, found a string")]),
        // key errors are reported for disabled entries too
        (entry("broken", "        enabled: false\n        targetVirtualCluster: {name: target}\n"), vec![(leak(cr("broken")), "a version is required")]),
        // targetVirtualCluster.name, enabled and disabled
        (edit("{name: target}", "{project: default}"), vec![
            (leak(format!("{w}.targetVirtualCluster.name")), "is required"),
        ]),
        (entry("gadgets.example.com/v1", "        enabled: false\n"), vec![
            (leak(format!("{}.targetVirtualCluster.name", cr("gadgets.example.com/v1"))), "also for entries with enabled: false"),
        ]),
        // target must exist
        (edit("{name: target}", "{name: target, project: elsewhere}"), vec![
            (leak(format!("{w}.targetVirtualCluster")), "no entry in targets has name \"target\" and project \"elsewhere\""),
        ]),
        // same group/version: same target and access mode
        (
            format!("{}      gadgets.example.com/v1:\n        enabled: true\n        targetVirtualCluster: {{name: other}}\n",
                edit("experimental:", "  - name: other\n    kubeconfig: /k\n    peers: {file: /p}\nexperimental:")),
            vec![(leak(format!("{w}.targetVirtualCluster")), "all entries of one group/version must use the same target")],
        ),
        (
            entry("gadgets.example.com/v1", "        enabled: true\n        targetVirtualCluster: {name: target}\n        accessResources: all\n"),
            vec![(leak(format!("{w}.accessResources")), "is owned but \"gadgets.example.com/v1\" uses all")],
        ),
        // explicit + wildcard: the spec only asks them to agree (see
        // a_wildcard_covers_explicit_keys_of_its_group_version)
        (entry("'*.example.com/v1'", &enabled_to("target")), vec![]),
        (
            entry("'*.example.com/v1'", "        enabled: true\n        targetVirtualCluster: {name: target}\n        accessResources: all\n"),
            vec![(leak(format!("{w}.accessResources")), "all entries of one group/version must use the same access mode")],
        ),
        // nothing enabled
        (edit("        enabled: true", "        enabled: false"), vec![("experimental.proxy.customResources", "no custom resource is enabled")]),
        (edit("        enabled: true\n", ""), vec![("experimental.proxy.customResources", "no custom resource is enabled")]),
        (BASE.split("experimental:").next().unwrap_or_default().to_owned(), vec![("experimental.proxy.customResources", "no custom resource is enabled")]),
        // everything at once: all problems are reported, not just the first
        ("".into(), vec![
            ("client.name", "is required"),
            ("client.project", "is required"),
            ("experimental.proxy.customResources", "no custom resource is enabled"),
        ]),
    ];
    for (yaml, want) in rows {
        if want.is_empty() {
            assert!(load(&yaml).is_ok(), "{yaml}");
            continue;
        }
        check(&yaml, Err(want));
    }
}

#[test]
fn entry_keys() {
    type Parts<'a> = (Option<&'a str>, &'a str, &'a str);
    let rows: [(&str, Result<Parts, &str>); 9] = [
        (
            "widgets.example.com/v1",
            Ok((Some("widgets"), "example.com", "v1")),
        ),
        (
            "*.example.com/v1beta1",
            Ok((None, "example.com", "v1beta1")),
        ),
        ("a.b/v2", Ok((Some("a"), "b", "v2"))),
        ("widgets.example.com", Err("a version is required")),
        ("*/v1", Err("a group is required")),
        // The client's own API groups are not the proxy's to take.
        (
            "deployments.apps/v1",
            Err("group \"apps\" is served by the Kubernetes API server itself"),
        ),
        (
            "*.rbac.authorization.k8s.io/v1",
            Err("served by the Kubernetes API server itself"),
        ),
        // A CRD group under k8s.io is a custom resource group.
        (
            "gateways.gateway.networking.k8s.io/v1",
            Ok((Some("gateways"), "gateway.networking.k8s.io", "v1")),
        ),
        (
            "gateways.networking.k8s.io/v1",
            Err("served by the Kubernetes API server itself"),
        ),
    ];
    for (key, want) in rows {
        let got = parse_entry_key(key);
        match (got, want) {
            (Ok(k), Ok((r, g, v))) => {
                assert_eq!(
                    (k.resource.as_deref(), k.group.as_str(), k.version.as_str()),
                    (r, g, v)
                );
            }
            (Err(m), Err(fragment)) => assert!(m.contains(fragment), "{key}: {m}"),
            (got, want) => panic!("{key}: got {got:?}, want {want:?}"),
        }
    }
}

#[test]
fn display_names_the_key() {
    let e = ConfigError::new("client.name", "is required");
    assert_eq!(e.to_string(), "client.name: is required");
    assert_eq!(
        entry_path("widgets.example.com/v1"),
        "experimental.proxy.customResources[\"widgets.example.com/v1\"]"
    );
    let first = parse("client: {nmae: x}").expect_err("unknown key");
    assert_eq!(first.key, "client.nmae");
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn never_panics(yaml in "[a-zA-Z:{}\\[\\], \\n\\-\"'*./0-9]{0,80}") {
            let _ = load(&yaml);
        }

        /// Ports are consecutive from basePort in alphabetical group/version order,
        /// whatever order the keys were written in.
        #[test]
        fn ports_follow_alphabetical_order(groups in prop::collection::btree_set("[a-z]{1,3}\\.(io|com)", 1..6), base in 1024u16..60000) {
            let mut yaml = BASE.replace("proxy: {}", &format!("proxy: {{basePort: {base}}}"));
            for g in groups.iter().rev() {
                yaml.push_str(&format!("      r.{g}/v1:\n        enabled: true\n        targetVirtualCluster: {{name: target}}\n"));
            }
            let (_, plan) = load(&yaml).expect("valid");
            let names: Vec<String> = plan.group_versions.iter().map(|g| format!("{}/{}", g.group, g.version)).collect();
            let mut sorted = names.clone();
            sorted.sort();
            prop_assert_eq!(&names, &sorted);
            for (i, g) in plan.group_versions.iter().enumerate() {
                prop_assert_eq!(u32::from(g.port), u32::from(base) + i as u32);
            }
        }
    }
}

/// Reading problems (unknown keys, wrong types, duplicates) do not stop the rules:
/// one run reports everything, and a key with a reading problem is not reported
/// again by a rule.
#[test]
fn every_problem_is_reported_in_one_run() {
    let yaml = edit("  name: client", "  name: 12\n  nmae: x").replace(
        "proxy: {}",
        "proxy: {basePort: 9100, basePort: 9200, metricsAddress: nowhere}",
    );
    let errors = load(&yaml).expect_err("invalid");
    let shown: Vec<String> = errors.iter().map(ToString::to_string).collect();
    let keys: Vec<&str> = errors.iter().map(|e| e.key.as_str()).collect();
    assert_eq!(
        keys,
        [
            "proxy.basePort",
            "client.nmae",
            "client.name",
            "proxy.metricsAddress"
        ],
        "{shown:#?}"
    );
    assert!(errors[0].message.contains("written twice"), "{shown:#?}");
    assert!(
        errors[2].message.contains("expected a string"),
        "not also 'is required': {shown:#?}"
    );
    // The later duplicate is the one used.
    let (config, _) = load(&BASE.replace("proxy: {}", "proxy: {basePort: 9100}")).expect("valid");
    assert_eq!(config.proxy.base_port, 9100);
    let source = SourceMap::build(&yaml).expect("yaml");
    assert_eq!(source.duplicates().len(), 1);
}

/// Where each key path is written, spelled as the errors spell it.
#[test]
fn positions_of_key_paths() {
    let source = SourceMap::build(BASE).expect("yaml");
    let w = cr("widgets.example.com/v1");
    for (key, line, column) in [
        ("client", 2, 1),
        ("client.name", 3, 3),
        ("client.project", 4, 3),
        ("targets[0]", 7, 5),
        ("targets[0].name", 7, 5),
        ("targets[0].kubeconfig", 8, 5),
        ("targets[0].peers.static[0]", 10, 16),
        ("experimental.proxy.customResources", 13, 5),
        (&w, 14, 7),
        (&format!("{w}.enabled"), 15, 9),
        (&format!("{w}.targetVirtualCluster.name"), 16, 32),
        // Missing keys are reported where their parent is written.
        ("client.kubeconfig", 2, 1),
        (&format!("{w}.accessResources"), 14, 7),
        ("targets[3].name", 6, 1),
        // Keys outside the file point at its start.
        (
            "sync.toHost.customResources[\"backups.example.org/v1\"].scope",
            1,
            1,
        ),
        ("", 1, 1),
    ] {
        assert_eq!(source.locate(key), Position { line, column }, "{key}");
    }
}

/// Syntax errors point at the mistake and say what to do, in crproxy's words.
#[test]
fn yaml_syntax_errors_point_at_the_mistake() {
    for (yaml, line, column, fragment) in [
        (
            "client:\n  name: client\n  project default\nproxy: {}\n",
            3,
            3,
            "must be followed by ':'",
        ),
        (
            "client:\n  name: \"client\n  project: default\n",
            2,
            9,
            "quoted string is never closed",
        ),
        (
            "client: {name: client\nproxy: {}\n",
            1,
            9,
            "this '{' is never closed",
        ),
        (
            "targets:\n  - name: a\n    peers: {static: [\"a:1\"}\n",
            3,
            21,
            "does not match",
        ),
        (
            "targets:\n  - name: a\n  kubeconfig: x\n",
            3,
            3,
            "not indented like the list items",
        ),
        (
            "client:\n\tname: a\n",
            2,
            2,
            "YAML indentation must be spaces",
        ),
        ("client: {}\n---\nproxy: {}\n", 2, 1, "second YAML document"),
    ] {
        let error = SourceMap::build(yaml).expect_err(yaml);
        assert_eq!(
            error.position,
            Position { line, column },
            "{yaml:?}: {error}"
        );
        assert!(error.message.contains(fragment), "{yaml:?}: {error}");
        let errors = load(yaml).expect_err(yaml);
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].key, "", "no key for a syntax error");
        let shown = errors[0].to_string();
        assert!(shown.starts_with("invalid YAML at line"), "{shown}");
        assert!(!shown.contains('\n'), "one line: {shown}");
    }
}

/// A value the parser refuses for its tag (which the source map's walk lets
/// through) is one line naming its key and where, not the parser's snippet.
#[test]
fn values_their_tags_refuse_are_one_line_naming_where() {
    for (yaml, key, place) in [
        (
            "client:\n  name: !!int abc\n",
            "client.name",
            "line 2, column 15",
        ),
        (
            "client:\n  name: !!binary '%%%'\n",
            "client.name",
            "line 2, column 18",
        ),
        (
            "client: {name: a, project: b}\ntargets:\n  - name: t\n    kubeconfig: !!float x\n",
            "targets[0].kubeconfig",
            "line 4",
        ),
        ("!!int abc\n", "", "line 1"),
    ] {
        let errors = load(yaml).expect_err(yaml);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].key, key, "{yaml:?}");
        assert!(
            errors[0].message.starts_with("invalid YAML: "),
            "{}",
            errors[0]
        );
        assert!(errors[0].message.contains(place), "{}", errors[0]);
        assert!(!errors[0].message.contains('\n'), "one line: {}", errors[0]);
    }
}

#[test]
fn a_key_written_twice_is_a_config_error_not_parser_advice() {
    let yaml = edit("  project: default", "  project: default\n  name: other");
    let errors = load(&yaml).expect_err("duplicate");
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].key, "client.name");
    assert!(
        errors[0].message.contains("also on line 3"),
        "{}",
        errors[0]
    );
    assert!(!errors[0].message.contains("DuplicateKeyPolicy"));
    let source = SourceMap::build(&yaml).expect("yaml");
    assert_eq!(
        source.locate("client.name"),
        Position { line: 5, column: 3 }
    );
}

/// An invalid client name gets one rule, the one it must satisfy (a DNS label is
/// always a valid label value, so the label-value rule would only contradict it).
#[test]
fn an_invalid_client_name_is_told_one_rule() {
    for (name, shown) in [
        ("\"Client Name!\"", "\"Client Name!\""),
        (&"c".repeat(64), &format!("{:?}", "c".repeat(64))),
    ] {
        let errors = load(&edit("  name: client", &format!("  name: {name}"))).expect_err(name);
        let lines: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert_eq!(
            lines,
            [format!(
                "client.name: {shown} is not a valid name: use at most 63 lower-case letters, \
                 digits and '-', starting and ending with a letter or digit"
            )]
        );
    }
}
