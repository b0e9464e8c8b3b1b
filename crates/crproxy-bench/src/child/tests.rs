use super::*;

const DEV_CONFIG: &str = "# Written by `crproxy dev`.
client:
  name: client
proxy:
  bindAddress: 127.0.0.1
  basePort: 9100
  metricsAddress: 127.0.0.1:9090
  registration:
    serviceType: ExternalName
targets:
  - name: target
";

#[test]
fn only_the_ports_change() {
    let metrics: SocketAddr = "127.0.0.1:40001".parse().expect("addr");
    let out = rewrite_ports(DEV_CONFIG, 40000, metrics).expect("rewrite");
    let expected = DEV_CONFIG
        .replace("basePort: 9100", "basePort: 40000")
        .replace(
            "metricsAddress: 127.0.0.1:9090",
            "metricsAddress: 127.0.0.1:40001",
        );
    assert_eq!(out, expected);
}

#[test]
fn a_config_without_ports_is_refused() {
    let metrics: SocketAddr = "127.0.0.1:1".parse().expect("addr");
    assert!(matches!(
        rewrite_ports("proxy:\n  metricsAddress: x\n", 1, metrics),
        Err(ChildError::Config("basePort"))
    ));
    assert!(matches!(
        rewrite_ports("proxy:\n  basePort: 1\n", 1, metrics),
        Err(ChildError::Config("metricsAddress"))
    ));
}
