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

#[test]
fn the_child_gets_the_worker_threads_it_is_asked_for() {
    let threads = |command: &tokio::process::Command| {
        command
            .as_std()
            .get_envs()
            .find(|(name, _)| *name == WORKER_THREADS_VAR)
            .and_then(|(_, value)| value)
            .map(|value| value.to_string_lossy().into_owned())
    };
    let binary = Path::new("/bin/crproxy");
    let config = Path::new("crproxy.yaml");
    let asked = run_command(binary, config, NonZeroUsize::new(1));
    assert_eq!(threads(&asked).as_deref(), Some("1"));
    let args: Vec<_> = asked.as_std().get_args().collect();
    assert_eq!(args, ["run", "--config", "crproxy.yaml"]);
    // Not asked: nothing set, so the child keeps its default (or what this
    // process inherited).
    assert_eq!(threads(&run_command(binary, config, None)), None);
}

#[test]
fn the_report_names_the_worker_threads_it_set() {
    assert_eq!(worker_threads_setting(NonZeroUsize::new(3)), "3");
}
