use super::*;
use std::sync::Arc;

fn cfg() -> RegistrarConfig {
    RegistrarConfig::local(b"-----BEGIN CERTIFICATE-----\nCA\n-----END CERTIFICATE-----\n".to_vec())
}

fn reg() -> Registration {
    Registration {
        group: "example.com".into(),
        version: "v1".into(),
        port: 9100,
    }
}

#[test]
fn desired_objects() {
    let svc = desired_service(&cfg(), &reg());
    assert_eq!(svc["metadata"]["name"], "proxy-example-com-v1");
    assert_eq!(svc["metadata"]["namespace"], "kube-system");
    assert_eq!(
        svc["metadata"]["labels"]["vcluster.loft.sh/protected"],
        "resource-proxy"
    );
    assert_eq!(svc["spec"]["type"], "ExternalName");
    assert_eq!(svc["spec"]["externalName"], "localhost");
    assert_eq!(svc["spec"]["ports"][0]["port"], 9100);

    let api = desired_apiservice(&cfg(), &reg());
    assert_eq!(api["metadata"]["name"], "v1.example.com");
    assert_eq!(
        api["metadata"]["labels"]["vcluster.loft.sh/protected"],
        "resource-proxy"
    );
    assert_eq!(
        api["spec"],
        json!({
            "group": "example.com", "version": "v1",
            "service": {"namespace": "kube-system", "name": "proxy-example-com-v1", "port": 9100},
            "caBundle": base64::engine::general_purpose::STANDARD.encode(&cfg().ca_bundle_pem),
            "groupPriorityMinimum": 1000, "versionPriority": 15,
        })
    );
    let insecure = RegistrarConfig {
        insecure_skip_tls_verify: true,
        ..cfg()
    };
    let api = desired_apiservice(&insecure, &reg());
    assert_eq!(api["spec"]["insecureSkipTLSVerify"], true);
    assert!(
        api["spec"].get("caBundle").is_none(),
        "rejected together by the API server"
    );

    let cip = RegistrarConfig {
        service_mode: ServiceMode::ClusterIP {
            selector: BTreeMap::from([("app".to_owned(), "crproxy".to_owned())]),
        },
        ..cfg()
    };
    let svc = desired_service(&cip, &reg());
    assert_eq!(svc["spec"]["type"], "ClusterIP");
    assert_eq!(svc["spec"]["selector"], json!({"app": "crproxy"}));
    assert!(svc["spec"].get("externalName").is_none());

    let policy = desired_policy();
    assert_eq!(policy["metadata"]["name"], "vcluster-protected-apiservices");
    assert_eq!(
        policy["spec"]["validations"][0]["message"],
        names::DELETION_DENIED_MESSAGE
    );
    let binding = desired_binding();
    assert_eq!(
        binding["metadata"]["name"],
        "vcluster-protected-resource-proxy"
    );
    assert_eq!(
        binding["spec"]["policyName"],
        "vcluster-protected-apiservices"
    );
    assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
    assert_eq!(
        binding["spec"]["matchResources"]["objectSelector"]["matchLabels"],
        json!({"vcluster.loft.sh/protected": "resource-proxy"})
    );
}

/// Applies `edit` to what the server would hold for `desired` and checks drift.
fn check(kind: Kind, desired: Value, edit: impl Fn(&mut Value), expected_drift: bool) {
    let mut live = desired.clone();
    live["metadata"]["resourceVersion"] = json!("42");
    edit(&mut live);
    assert_eq!(
        drifted(kind, &desired, &live),
        expected_drift,
        "{kind:?} live {live}"
    );
    // A repair always yields something that is no longer drifted and keeps the
    // resourceVersion for optimistic concurrency.
    let fixed = repaired(kind, &desired, &live);
    assert!(
        !drifted(kind, &desired, &fixed),
        "repair of {live} gave {fixed}"
    );
    assert_eq!(fixed["metadata"]["resourceVersion"], "42");
}

#[test]
fn drift() {
    let svc = || desired_service(&cfg(), &reg());
    let api = || desired_apiservice(&cfg(), &reg());
    // Server defaults and foreign metadata are not drift.
    check(Kind::Service, svc(), |_| {}, false);
    check(
        Kind::Service,
        svc(),
        |v| {
            v["spec"]["sessionAffinity"] = json!("None");
            v["metadata"]["labels"]["team"] = json!("x");
            v["metadata"]["annotations"] = json!({"a": "b"});
        },
        false,
    );
    check(
        Kind::Service,
        svc(),
        |v| v["spec"]["externalName"] = json!("evil"),
        true,
    );
    check(
        Kind::Service,
        svc(),
        |v| v["spec"]["ports"][0]["port"] = json!(9101),
        true,
    );
    check(
        Kind::Service,
        svc(),
        |v| v["spec"]["ports"] = json!([v["spec"]["ports"][0].clone(), {"port": 1}]),
        true,
    );
    check(
        Kind::Service,
        svc(),
        |v| {
            v["metadata"]["labels"]
                .as_object_mut()
                .map(|l| l.remove("vcluster.loft.sh/protected"));
        },
        true,
    );
    check(
        Kind::Service,
        svc(),
        |v| v["metadata"]["labels"] = Value::Null,
        true,
    );
    // Switching a ClusterIP Service to ExternalName drops its cluster IP.
    check(
        Kind::Service,
        svc(),
        |v| {
            v["spec"]["type"] = json!("ClusterIP");
            v["spec"]["clusterIP"] = json!("10.0.0.7");
            v["spec"]["selector"] = json!({"app": "x"});
        },
        true,
    );

    check(Kind::ApiService, api(), |_| {}, false);
    check(
        Kind::ApiService,
        api(),
        |v| v["spec"]["caBundle"] = json!("b2xk"),
        true,
    );
    check(
        Kind::ApiService,
        api(),
        |v| v["spec"]["insecureSkipTLSVerify"] = json!(false),
        false,
    );
    check(
        Kind::ApiService,
        api(),
        |v| v["spec"]["insecureSkipTLSVerify"] = json!(true),
        true,
    );
    check(
        Kind::ApiService,
        api(),
        |v| v["spec"]["versionPriority"] = json!(100),
        true,
    );
    check(
        Kind::ApiService,
        api(),
        |v| v["spec"]["service"]["name"] = json!("other"),
        true,
    );
    check(
        Kind::ApiService,
        api(),
        |v| v["status"] = json!({"conditions": [{"type": "Available", "status": "True"}]}),
        false,
    );

    // Policy: server defaults added to rules are fine; a changed expression is not.
    check(
        Kind::Policy,
        desired_policy(),
        |v| {
            v["spec"]["matchConstraints"]["resourceRules"][0]["scope"] = json!("*");
            v["spec"]["matchConstraints"]["matchPolicy"] = json!("Equivalent");
        },
        false,
    );
    check(
        Kind::Policy,
        desired_policy(),
        |v| v["spec"]["validations"][0]["expression"] = json!("true"),
        true,
    );
    check(
        Kind::Binding,
        desired_binding(),
        |v| v["spec"]["validationActions"] = json!(["Warn"]),
        true,
    );
    check(
        Kind::Binding,
        desired_binding(),
        |v| v["spec"]["matchResources"]["namespaceSelector"] = json!({}),
        false,
    );
    // Every default kube's admissionregistration/v1 fills in is not drift.
    check(
        Kind::Policy,
        desired_policy(),
        |v| {
            let spec = &mut v["spec"];
            spec["failurePolicy"] = json!("Fail");
            spec["matchConstraints"]["namespaceSelector"] = json!({});
            spec["matchConstraints"]["objectSelector"] = json!({});
            spec["matchConstraints"]["resourceRules"][1]["scope"] = json!("*");
        },
        false,
    );
    check(
        Kind::Binding,
        desired_binding(),
        |v| v["spec"]["matchResources"]["matchPolicy"] = json!("Equivalent"),
        false,
    );
    // Anything added that could switch the protection off is drift.
    type Edit = fn(&mut Value);
    let narrowing_policy: [Edit; 4] = [
        |v| v["spec"]["matchConditions"] = json!([{"name": "off", "expression": "false"}]),
        |v| {
            v["spec"]["matchConstraints"]["excludeResourceRules"] = json!([{
                "apiGroups": ["*"], "apiVersions": ["*"], "operations": ["*"], "resources": ["*"]
            }])
        },
        |v| {
            v["spec"]["matchConstraints"]["objectSelector"] =
                json!({"matchLabels": {"nothing": "has-this"}})
        },
        |v| v["spec"]["failurePolicy"] = json!("Ignore"),
    ];
    for edit in narrowing_policy {
        check(Kind::Policy, desired_policy(), edit, true);
    }
    let narrowing_binding: [Edit; 3] = [
        |v| v["spec"]["matchResources"]["objectSelector"]["matchLabels"]["extra"] = json!("x"),
        |v| {
            v["spec"]["matchResources"]["objectSelector"]["matchExpressions"] =
                json!([{"key": "x", "operator": "Exists"}])
        },
        |v| {
            v["spec"]["matchResources"]["namespaceSelector"] =
                json!({"matchLabels": {"nothing": "has-this"}})
        },
    ];
    for edit in narrowing_binding {
        check(Kind::Binding, desired_binding(), edit, true);
    }
}

#[test]
fn cluster_ip_repairs_keep_the_allocated_ip() {
    let cip = RegistrarConfig {
        service_mode: ServiceMode::ClusterIP {
            selector: BTreeMap::from([("app".to_owned(), "crproxy".to_owned())]),
        },
        ..cfg()
    };
    let desired = desired_service(&cip, &reg());
    let mut live = desired.clone();
    live["spec"]["clusterIP"] = json!("10.0.0.9");
    live["spec"]["selector"] = json!({"app": "crproxy", "extra": "x"});
    assert!(
        drifted(Kind::Service, &desired, &live),
        "extra selector keys are drift"
    );
    let fixed = repaired(Kind::Service, &desired, &live);
    assert_eq!(fixed["spec"]["clusterIP"], "10.0.0.9");
    assert_eq!(fixed["spec"]["selector"], json!({"app": "crproxy"}));
}

#[test]
fn invalid_registrations_are_refused() {
    for bad in [
        Registration { port: 0, ..reg() },
        Registration {
            group: String::new(),
            ..reg()
        },
        Registration {
            version: String::new(),
            ..reg()
        },
    ] {
        assert!(matches!(validate(&[bad]), Err(WiringError::Invalid(_))));
    }
    assert!(validate(&[reg()]).is_ok());
}

/// Which live APIServices are the client cluster's own: local ones (no
/// `spec.service`), those kube-aggregator manages, and another extension API
/// server's (routed to a Service not ours, unlabelled); ours, labelled or routed
/// to our Service (a hand-edited one of ours), may be registered over.
#[test]
fn the_clients_own_apiservices_are_recognised() {
    let ours = || desired_apiservice(&cfg(), &reg());
    let local = || {
        let mut v = ours();
        v["metadata"]["labels"] = json!({});
        v["spec"] = json!({"group": "example.com", "version": "v1",
                           "groupPriorityMinimum": 17800, "versionPriority": 15});
        v
    };
    let automanaged = |value: &str| {
        let mut v = local();
        v["metadata"]["labels"] = json!({ AUTOMANAGED_LABEL: value });
        v
    };
    let cases: [(&str, Value, Option<&str>); 9] = [
        ("ours", ours(), None),
        (
            "another extension API server's",
            {
                let mut v = ours();
                v["metadata"]["labels"] = Value::Null;
                v["spec"]["service"] = json!({"namespace": "monitoring", "name": "m"});
                v
            },
            Some("routes to Service monitoring/m, which is not crproxy's"),
        ),
        (
            "ours, routed elsewhere by hand",
            {
                let mut v = ours();
                v["spec"]["service"] = json!({"namespace": "monitoring", "name": "m"});
                v
            },
            None,
        ),
        (
            "ours, unlabelled by hand",
            {
                let mut v = ours();
                v["metadata"]["labels"] = Value::Null;
                v
            },
            None,
        ),
        ("local", local(), Some("no spec.service")),
        (
            "service null",
            {
                let mut v = ours();
                v["spec"]["service"] = Value::Null;
                v
            },
            Some("no spec.service"),
        ),
        ("built-in", automanaged("onstart"), Some("automanaged")),
        ("CRD group", automanaged("true"), Some("automanaged")),
        (
            "automanaged with a service",
            {
                let mut v = ours();
                v["metadata"]["labels"][AUTOMANAGED_LABEL] = json!("true");
                v
            },
            Some("automanaged"),
        ),
    ];
    for (what, live, expected) in cases {
        let why = served_by_client(&live, &ours());
        match (why, expected) {
            (None, None) => {}
            (Some(why), Some(needle)) => assert!(why.contains(needle), "{what}: {why}"),
            (why, expected) => panic!("{what}: {why:?}, expected {expected:?}"),
        }
    }
}

/// The public drift checks `crproxy doctor` uses: what the API server returns for
/// the desired objects (with its defaults and metadata) is not drift; anything
/// that could switch the protection off is.
#[test]
fn protection_drift_is_judged_on_the_whole_spec() {
    let served_policy = || {
        let mut v = desired_policy();
        v["metadata"]["resourceVersion"] = json!("7");
        v["metadata"]["uid"] = json!("u-1");
        let spec = &mut v["spec"];
        spec["failurePolicy"] = json!("Fail");
        let rules = &mut spec["matchConstraints"];
        rules["matchPolicy"] = json!("Equivalent");
        rules["namespaceSelector"] = json!({});
        rules["objectSelector"] = json!({});
        rules["resourceRules"][0]["scope"] = json!("*");
        rules["resourceRules"][1]["scope"] = json!("*");
        v["status"] = json!({"observedGeneration": 1});
        v
    };
    let served_binding = || {
        let mut v = desired_binding();
        v["metadata"]["resourceVersion"] = json!("8");
        let rules = &mut v["spec"]["matchResources"];
        rules["matchPolicy"] = json!("Equivalent");
        rules["namespaceSelector"] = json!({});
        v
    };
    assert!(!policy_drifted(&desired_policy()));
    assert!(!policy_drifted(&served_policy()));
    assert!(!binding_drifted(&desired_binding()));
    assert!(!binding_drifted(&served_binding()));

    type Edit = fn(&mut Value);
    let tampered_policy: [(&str, Edit); 5] = [
        ("never-true matchConditions", |v| {
            v["spec"]["matchConditions"] = json!([{"name": "off", "expression": "false"}])
        }),
        ("excludeResourceRules", |v| {
            v["spec"]["matchConstraints"]["excludeResourceRules"] = json!([{
                "apiGroups": ["*"], "apiVersions": ["*"], "operations": ["*"],
                "resources": ["*"], "scope": "*"
            }])
        }),
        ("failurePolicy Ignore", |v| {
            v["spec"]["failurePolicy"] = json!("Ignore")
        }),
        ("changed expression", |v| {
            v["spec"]["validations"][0]["expression"] = json!("true")
        }),
        ("missing spec", |v| v["spec"] = Value::Null),
    ];
    for (what, edit) in tampered_policy {
        let mut live = served_policy();
        edit(&mut live);
        assert!(policy_drifted(&live), "{what}: {live}");
    }
    let tampered_binding: [(&str, Edit); 4] = [
        ("extra selector label", |v| {
            v["spec"]["matchResources"]["objectSelector"]["matchLabels"]["extra"] = json!("x")
        }),
        ("never-true matchConditions", |v| {
            v["spec"]["matchConditions"] = json!([{"name": "off", "expression": "false"}])
        }),
        ("Deny and Audit", |v| {
            v["spec"]["validationActions"] = json!(["Deny", "Audit"])
        }),
        ("excludeResourceRules", |v| {
            v["spec"]["matchResources"]["excludeResourceRules"] = json!([{
                "apiGroups": [""], "apiVersions": ["*"], "operations": ["*"],
                "resources": ["services"]
            }])
        }),
    ];
    for (what, edit) in tampered_binding {
        let mut live = served_binding();
        edit(&mut live);
        assert!(binding_drifted(&live), "{what}: {live}");
    }
}

#[test]
fn the_protection_expression_names_the_label() {
    assert_eq!(
        protection_expression(),
        "!has(oldObject.metadata.labels) || !('vcluster.loft.sh/protected' in oldObject.metadata.labels) || oldObject.metadata.labels['vcluster.loft.sh/protected'] != 'resource-proxy'"
    );
}

/// An API server on 127.0.0.1 that answers every request 404 (a Status) after
/// `delay`, and records each request's method and path as it arrives.
async fn slow_api(delay: Duration) -> (kube::Client, Arc<std::sync::Mutex<Vec<String>>>) {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("address");
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let recorded = Arc::clone(&seen);
    tokio::spawn(async move {
        // A few connections at most, each within the test's few seconds.
        for _ in 0..8 {
            let Ok((socket, _)) = listener.accept().await else {
                return;
            };
            let recorded = Arc::clone(&recorded);
            tokio::spawn(async move {
                let mut socket = BufReader::new(socket);
                // One request after another on the connection, at most 16.
                for _ in 0..16 {
                    let mut head = String::new();
                    let mut length = 0usize;
                    loop {
                        let mut line = String::new();
                        if socket.read_line(&mut line).await.unwrap_or(0) == 0 {
                            return;
                        }
                        if line == "\r\n" {
                            break;
                        }
                        if let Some(value) =
                            line.to_ascii_lowercase().strip_prefix("content-length:")
                        {
                            length = value.trim().parse().unwrap_or(0);
                        }
                        head.push_str(&line);
                    }
                    let mut body = vec![0; length];
                    if socket.read_exact(&mut body).await.is_err() {
                        return;
                    }
                    let request_line = head.lines().next().unwrap_or_default().to_owned();
                    crproxy_core::locks::lock(&recorded).push(request_line);
                    tokio::time::sleep(delay).await;
                    let status = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","reason":"NotFound","code":404}"#;
                    let answer = format!(
                        "HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{status}",
                        status.len()
                    );
                    if socket.get_mut().write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    let mut config = kube::Config::new(format!("http://{addr}").parse().expect("url"));
    config.default_retry = false;
    (kube::Client::try_from(config).expect("client"), seen)
}

/// Waits (bounded: 5 s) until [`slow_api`] has seen a request.
async fn until_a_request_arrives(seen: &std::sync::Mutex<Vec<String>>) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while crproxy_core::locks::lock(seen).is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no request reached the API server"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits (at most `limit`) for the registrar task to end once its election has
/// ended, and for it to have ended without a panic.
async fn ends_with_the_election(task: tokio::task::JoinHandle<()>, limit: Duration) {
    tokio::time::timeout(limit, task)
        .await
        .expect("the registrar ends with the election")
        .expect("the registrar ran to its end");
}

/// A registration pass stops when leadership goes: against an API server that
/// takes 1.5 s to say the first object is missing, a replica that stepped down
/// meanwhile must not go on to create it (its successor owns the objects now).
#[tokio::test]
async fn a_pass_in_flight_ends_when_leadership_goes() {
    let (client, seen) = slow_api(Duration::from_millis(1500)).await;
    let (leader, leading) = LeaderHandle::manual(true);
    let registrar = spawn_registrar(client, cfg(), vec![reg()], leader, Duration::from_secs(30));
    // The first read is in flight.
    until_a_request_arrives(&seen).await;
    leading.set(false);
    // Past the read's answer, when a pass that went on would create the object.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let requests = crproxy_core::locks::lock(&seen).clone();
    assert_eq!(requests.len(), 1, "{requests:?}");
    assert!(requests[0].starts_with("GET "), "{requests:?}");
    drop(leading);
    ends_with_the_election(registrar, Duration::from_secs(2)).await;
}

/// An election that ends while a pass is in flight ends the registrar (a closed
/// channel is not a lost leadership to start over from, again and again).
#[tokio::test]
async fn an_election_that_ends_mid_pass_ends_the_registrar() {
    let (client, seen) = slow_api(Duration::from_millis(1500)).await;
    let (leader, leading) = LeaderHandle::manual(true);
    let registrar = spawn_registrar(client, cfg(), vec![reg()], leader, Duration::from_secs(30));
    until_a_request_arrives(&seen).await;
    drop(leading);
    ends_with_the_election(registrar, Duration::from_secs(1)).await;
}
