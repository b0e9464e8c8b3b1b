use super::*;

fn config() -> NginxConfig {
    NginxConfig {
        dir: PathBuf::from("/tmp/bench-nginx"),
        listen: "127.0.0.1:18443".parse().expect("addr"),
        upstream: "127.0.0.1:16443".parse().expect("addr"),
        upstream_name: "localhost".into(),
        workers: 2,
        as_root: false,
        aggregator: None,
    }
}

#[test]
fn the_config_streams_and_keeps_upstream_connections_alive() {
    let text = config().render();
    for expected in [
        "listen 127.0.0.1:18443 ssl http2;",
        "server 127.0.0.1:16443;",
        "proxy_pass https://target;",
        "proxy_http_version 1.1;",
        "proxy_set_header Connection \"\";",
        "keepalive 256;",
        "proxy_buffering off;",
        "proxy_request_buffering off;",
        "worker_processes 2;",
        "pid /tmp/bench-nginx/nginx.pid;",
        "ssl_certificate /tmp/bench-nginx/tls.crt;",
        // The target is verified as crproxy verifies it.
        "proxy_ssl_verify on;",
        "proxy_ssl_trusted_certificate /tmp/bench-nginx/upstream-ca.crt;",
        "proxy_ssl_name localhost;",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in\n{text}");
    }
    assert!(!text.contains("daemon"), "daemon off is passed with -g");
    assert!(!text.contains("user root"));
    let root = NginxConfig {
        as_root: true,
        ..config()
    };
    assert!(root.render().starts_with("# Written by crproxy-bench"));
    assert!(root.render().contains("\nuser root;\n"));
}

#[test]
fn the_braces_balance() {
    for config in [config(), behind_aggregator()] {
        let text = config.render();
        let open = text.matches('{').count();
        let close = text.matches('}').count();
        assert_eq!(open, close, "{text}");
    }
}

fn behind_aggregator() -> NginxConfig {
    NginxConfig {
        aggregator: Some(AggregatorBackend {
            front_proxy_ca_pem: "-----BEGIN CERTIFICATE-----".into(),
            target_token: "t0ken".into(),
        }),
        ..config()
    }
}

#[test]
fn behind_an_aggregator_it_checks_the_front_proxy_and_sends_the_target_token() {
    let plain = config().render();
    let text = behind_aggregator().render();
    for expected in [
        "ssl_client_certificate /tmp/bench-nginx/front-proxy-ca.crt;",
        "ssl_verify_client on;",
        "proxy_set_header Authorization \"Bearer t0ken\";",
        "proxy_set_header X-Remote-User \"\";",
        "proxy_set_header X-Remote-Group \"\";",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in\n{text}");
        assert!(
            !plain.contains(expected),
            "{expected:?} in the plain config"
        );
    }
    // Everything else is the configuration of the direct comparison.
    for line in plain.lines() {
        assert!(
            text.contains(line),
            "{line:?} missing behind the aggregator"
        );
    }
}

#[test]
fn tail_keeps_the_end_on_a_char_boundary() {
    assert_eq!(tail("abc", 10), "abc");
    assert_eq!(tail("0123456789", 3), "789");
    assert_eq!(tail("ééé", 3), "é");
}

/// Runs only where nginx is installed; the suite never requires it.
#[tokio::test]
async fn nginx_starts_and_stops_when_installed() {
    let Some(binary) = find_binary() else {
        eprintln!("nginx not installed: skipping");
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let listen = std::net::SocketAddr::from((
        [127, 0, 0, 1],
        crproxy::devenv::free_port().expect("free port"),
    ));
    let target_ca = CertificateAuthority::generate("nginx-test-target-ca").expect("ca");
    let upstream = Upstream::devcluster(
        "127.0.0.1:9".parse().expect("addr"),
        target_ca.pem().cert.clone(),
    );
    let nginx = Nginx::start(&binary, dir.path(), listen, upstream, 1, None)
        .await
        .expect("nginx starts");
    let written = std::fs::read_to_string(dir.path().join(UPSTREAM_CA_FILE)).expect("ca file");
    assert_eq!(written, target_ca.pem().cert);
    assert!(nginx.ca_pem.contains("BEGIN CERTIFICATE"));
    let pid = nginx.pid;
    nginx.stop().await;
    assert!(
        crate::rss::memory(pid).is_none(),
        "nginx master still running"
    );
}
