use super::*;

#[test]
fn the_ephemeral_range_start_is_read_from_the_kernels_format() {
    let check = |text: &str, expected: Option<u16>| {
        assert_eq!(ephemeral_range_start(text), expected, "{text:?}");
    };
    check("32768\t60999\n", Some(32768));
    check("1024 65535", Some(1024));
    check("", None);
    check("many ports", None);
}

#[test]
fn free_ports_lie_below_the_ephemeral_range_and_can_be_bound() {
    let text = std::fs::read_to_string(EPHEMERAL_RANGE_FILE).expect("ip_local_port_range");
    let ephemeral_start = ephemeral_range_start(&text).expect("a port range");
    let room_below = usize::from(ephemeral_start.saturating_sub(FIXED_PORTS_START));
    for _ in 0..20 {
        let port = free_port().expect("a free port");
        if room_below >= MIN_FIXED_PORTS {
            assert!(
                (FIXED_PORTS_START..ephemeral_start).contains(&port),
                "{port} is not below the ephemeral range starting at {ephemeral_start}"
            );
        }
        std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, port)).expect("binding the port");
    }
}

#[test]
fn free_listeners_hold_distinct_ports() {
    let listeners: Vec<_> = (0..6)
        .map(|_| free_listener().expect("a free listener"))
        .collect();
    let mut ports: Vec<u16> = listeners
        .iter()
        .map(|l| l.local_addr().expect("addr").port())
        .collect();
    ports.sort_unstable();
    ports.dedup();
    assert_eq!(ports.len(), listeners.len(), "{ports:?}");
}

/// What [`DevOptions::check_plan`] says of the `crproxy dev` defaults changed by
/// `edit`: `None` when it accepts them, else a fragment of its message.
fn check_plan(edit: impl FnOnce(&mut DevOptions), expected: Option<&str>) {
    let mut options = DevOptions {
        dir: PathBuf::from("dev"),
        clients: 1,
        target_replicas: 1,
        target_port: 7443,
        client_port: 6443,
        proxy_base_port: 9100,
        metrics_port: 9090,
        host_port: 8443,
        sync_metrics_port: 9190,
        persistent: true,
        share_ports: false,
    };
    edit(&mut options);
    let result = options.check_plan().map_err(|e| e.to_string());
    match expected {
        None => assert!(result.is_ok(), "{options:?}: {result:?}"),
        Some(fragment) => {
            let message = result.expect_err(fragment);
            assert!(message.contains(fragment), "{message:?} lacks {fragment:?}");
        }
    }
}

#[test]
fn the_plan_refuses_what_dev_cannot_run_with() {
    check_plan(|_| {}, None);
    check_plan(|o| o.clients = 9, None);
    check_plan(|o| o.clients = 0, Some("--clients must be 1 or more"));
    check_plan(
        |o| o.target_replicas = 0,
        Some("--target-replicas must be 1 or more"),
    );
    check_plan(
        |o| {
            o.proxy_base_port = 65530;
            o.clients = 2;
        },
        Some("--proxy-port 65530 with --clients 2 needs ports 65530 to 65540, 10 apart"),
    );
    check_plan(
        |o| {
            o.proxy_base_port = 65525;
            o.clients = 2;
        },
        None,
    );
    check_plan(
        |o| {
            o.target_port = 65535;
            o.target_replicas = 2;
        },
        Some("give --target-port 65534 or lower"),
    );
    // More clients than ports: no base fits.
    check_plan(
        |o| {
            o.client_port = 1;
            o.clients = 70_000;
        },
        Some("lower --clients"),
    );
    // Ports picked freely have no end to go past, and nothing to overlap.
    check_plan(
        |o| {
            *o = DevOptions::ephemeral(Path::new("dev"), 70_000, 70_000);
        },
        None,
    );
    check_plan(
        |o| o.metrics_port = 9100,
        Some("--proxy-port and --metrics-port both take port 9100"),
    );
    check_plan(
        |o| o.clients = 10,
        Some("--proxy-port and --sync-metrics-port both take port 9190"),
    );
    check_plan(
        |o| {
            o.host_port = 7444;
            o.target_replicas = 2;
        },
        Some("--target-port and --host-port both take port 7444"),
    );
}

#[test]
fn fixed_ports_are_listed_replica_by_replica_then_client_by_client() {
    let mut options = DevOptions::ephemeral(Path::new("dev"), 2, 2);
    options.target_port = 7443;
    options.proxy_base_port = 9100;
    options.metrics_port = 9090;
    options.sync_metrics_port = 9190;
    // The client port and the host port are left to free picks: not listed.
    let ports = options.fixed_ports().expect("the plan's ports");
    assert_eq!(
        ports,
        vec![
            (PortRole::Target, 7443),
            (PortRole::Target, 7444),
            (PortRole::Proxy, 9100),
            (PortRole::Metrics, 9090),
            (PortRole::Proxy, 9110),
            (PortRole::Metrics, 9091),
            (PortRole::SyncMetrics, 9190),
        ]
    );
}
