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
