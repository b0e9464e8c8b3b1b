use super::*;
use serde_json::{json, Value};
use std::path::Path;

fn slice(address_type: &str, ports: Value, endpoints: Value) -> Value {
    json!({
        "metadata": {"name": "s", "labels": {"kubernetes.io/service-name": "kube"}},
        "addressType": address_type,
        "ports": ports,
        "endpoints": endpoints,
    })
}

fn check_slices(slices: &[Value], port_name: Option<&str>, expected: &[&str]) {
    let typed: Vec<EndpointSlice> = slices
        .iter()
        .map(|s| serde_json::from_value(s.clone()).expect("an EndpointSlice"))
        .collect();
    assert_eq!(peers_from_slices(&typed, port_name), expected, "{slices:?}");
}

#[test]
fn ready_endpoints_on_the_chosen_port() {
    let ports = json!([{"name": "metrics", "port": 9090}, {"name": "https", "port": 6443}]);
    let endpoints = json!([
        {"addresses": ["10.0.0.2"], "conditions": {"ready": true}},
        {"addresses": ["10.0.0.1"]},
        {"addresses": ["10.0.0.3"], "conditions": {"ready": false}},
        {"addresses": ["10.0.0.4"], "conditions": {"ready": null, "serving": true}},
    ]);
    let v4 = slice("IPv4", ports.clone(), endpoints);
    check_slices(
        std::slice::from_ref(&v4),
        Some("https"),
        &["10.0.0.1:6443", "10.0.0.2:6443", "10.0.0.4:6443"],
    );
    check_slices(
        std::slice::from_ref(&v4),
        None,
        &["10.0.0.1:9090", "10.0.0.2:9090", "10.0.0.4:9090"],
    );
    check_slices(std::slice::from_ref(&v4), Some("nope"), &[]);

    let v6 = slice(
        "IPv6",
        json!([{"port": 443}]),
        json!([{"addresses": ["fd00::1"]}]),
    );
    check_slices(
        &[v4.clone(), v6],
        Some("https"),
        &["10.0.0.1:6443", "10.0.0.2:6443", "10.0.0.4:6443"],
    );
    let v6 = slice(
        "IPv6",
        json!([{"port": 443}]),
        json!([{"addresses": ["fd00::1"]}]),
    );
    check_slices(&[v6], None, &["[fd00::1]:443"]);

    // No ports, a port without a number, or no endpoints: nothing.
    check_slices(
        &[slice(
            "IPv4",
            json!([]),
            json!([{"addresses": ["10.0.0.1"]}]),
        )],
        None,
        &[],
    );
    check_slices(
        &[slice(
            "IPv4",
            json!([{"name": "https"}]),
            json!([{"addresses": ["10.0.0.1"]}]),
        )],
        Some("https"),
        &[],
    );
    check_slices(&[slice("IPv4", json!([{"port": 1}]), json!([]))], None, &[]);
}

fn check_file(content: &str, expected: Result<&[&str], &str>) {
    let got = parse_peer_file(Path::new("peers.yaml"), content.as_bytes());
    match (got, expected) {
        (Ok(list), Ok(want)) => assert_eq!(list, want, "{content:?}"),
        (Err(err), Err(fragment)) => {
            assert!(err.to_string().contains(fragment), "{content:?}: {err}")
        }
        (got, want) => panic!("{content:?}: got {got:?}, want {want:?}"),
    }
}

#[test]
fn peer_files_are_json_or_yaml_lists() {
    check_file(
        r#"["10.0.0.2:443", "10.0.0.1:443"]"#,
        Ok(&["10.0.0.1:443", "10.0.0.2:443"]),
    );
    check_file(
        "- 10.0.0.1:443\n- \"[fd00::1]:6443\"\n",
        Ok(&["10.0.0.1:443", "[fd00::1]:6443"]),
    );
    check_file("[]", Ok(&[]));
    check_file("", Ok(&[]));
    check_file(
        "- api.example:443\n- api.example:443\n",
        Ok(&["api.example:443"]),
    );
    check_file("peers: [a:1]", Err("not a JSON or YAML list"));
    // The YAML parser's complaint on one line, saying where.
    check_file(
        "- a:1\n- [b:2\n",
        Err("unclosed bracket '[' at line 2, column 3"),
    );
    check_file("[1, 2]", Err("is not \"host:port\""));
    check_file(r#"["10.0.0.1"]"#, Err("\"10.0.0.1\" is not \"host:port\""));
    check_file(r#"["10.0.0.1:https"]"#, Err("a port from 1 to 65535"));
    check_file(r#"["fd00::1:443"]"#, Err("is not \"host:port\""));
    check_file(r#"[":443"]"#, Err("is not \"host:port\""));
    // What a dial could only fail on, refused when the file is read.
    check_file(r#"["10.0.0.1:0"]"#, Err("a port from 1 to 65535"));
    check_file(r#"["10.0.0.1:+443"]"#, Err("a port from 1 to 65535"));
    check_file(r#"["10.0.0.1:65536"]"#, Err("a port from 1 to 65535"));
    check_file(r#"["api example:443"]"#, Err("is not \"host:port\""));
    check_file(
        r#"["https://api.example:443"]"#,
        Err("is not \"host:port\""),
    );
    check_file(r#"["[api.example]:443"]"#, Err("is not \"host:port\""));
    check_file(r#"["[::1:443"]"#, Err("is not \"host:port\""));
    check_file(
        r#"["[::1]:443", "api-0.example_x:65535"]"#,
        Ok(&["[::1]:443", "api-0.example_x:65535"]),
    );
    // Numbers a resolver would read as some other IPv4 address.
    for shorthand in [
        "10.1",
        "0x7f.1",
        "010.0.0.1",
        "999.1.1.1",
        "1.2.3.4.5",
        "127",
        "0xa",
    ] {
        check_file(
            &format!("[\"{shorthand}:443\"]"),
            Err("is not \"host:port\""),
        );
    }
    check_file(
        r#"["0x7f.example:443", "1.2.3.example:443", "10.0.0.255:443"]"#,
        Ok(&["0x7f.example:443", "1.2.3.example:443", "10.0.0.255:443"]),
    );
}
