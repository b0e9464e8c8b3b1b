//! Requests against a target that stops answering, or for a caller that stops
//! reading, still end, and are counted, as the spec's deadlines say: the startup
//! probe, discovery within the aggregator's availability check, an apply past the
//! 60 s cap counted once, a list whose caller stops reading cut at the cap; a
//! request whose caller goes away is counted too; an idle pooled connection to a
//! host gone silent is closed by TCP keepalive.
//! A real proxy and devcluster client over TLS, with fault-injecting peers on
//! 127.0.0.1 (the silent host in network namespaces of the test's own); every
//! loop and wait is bounded in count and time.
//!
//! In the real-time group (tests that mostly wait on real clocks): a plain
//! `cargo test` lists them as ignored; `scripts/test` runs them with `--ignored`
//! beside the rest of the suite.

mod log_support;
mod netns_support;
mod pool_support;
mod target_support;

use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use kube::api::{Api, PostParams};
use serde_json::json;
use tokio::time::Instant;

use crproxy_core::config::{AccessMode, GroupVersionPlan, ResourceSet, TargetRef};
use crproxy_core::ownership::Owner;
use crproxy_core::pki::CertificateAuthority;
use crproxy_kube::{Auth, ClusterConfig};
use crproxy_proxy::app::{self, ProxySetup, TargetSetup};
use crproxy_proxy::metrics::Metrics;
use crproxy_proxy::server::ServingIdentity;
use crproxy_proxy::sources::PeerSourceConfig;
use log_support::LogBuffer;
use pool_support::{Pki, SilentPeer, SERVER_NAME};
use target_support::{
    aggregator_get, caller_h2, harness, harness_behind, harness_with_peers, metric_value,
    widget_object, Harness, WIDGETS,
};
use test_support::relay::Relay;

fn lines(metrics: &Metrics, name: &str) -> Vec<String> {
    metrics
        .encode()
        .lines()
        .filter(|l| l.starts_with(name))
        .map(str::to_owned)
        .collect()
}

/// A caller that goes away mid-dial (operate.txt:115, `canceled`: the caller's own
/// context ended) is counted on `vcluster_proxy_peer_dial_failures_total` and, as
/// a request, on `vcluster_proxy_request_total` with reason `canceled` (it once
/// reached no request series at all).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "real-time group: scripts/test runs it beside the rest"]
async fn a_caller_that_hangs_up_mid_dial_is_counted_as_a_canceled_request() {
    // Installs the binary\'s log subscriber before any proxy code logs.
    let (_logs, _log_guard) = LogBuffer::capture();
    let silent = SilentPeer::start().await;
    let host = silent.host();
    let h: Harness = harness_with_peers(AccessMode::All, move |_| {
        PeerSourceConfig::Static(vec![host])
    })
    .await;
    // Let the startup probe's own dial to the silent peer end (5 s) first.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let before = lines(&h.metrics, "vcluster_proxy_request_total");
    let canceled_before = metric_value(
        &h.metrics,
        "vcluster_proxy_peer_dial_failures_total",
        "reason=\"canceled\"",
    );
    let mut sender = caller_h2(h.addr, &h.serving_ca_pem, &h.front_proxy_client).await;
    // The caller gives up after 1 s, while the proxy's dial still hangs.
    let gave_up = tokio::time::timeout(
        Duration::from_secs(1),
        sender.send_request(aggregator_get(WIDGETS)),
    )
    .await;
    assert!(
        gave_up.is_err(),
        "the dial to a silent peer cannot answer within 1 s"
    );
    drop(sender);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let canceled = metric_value(
        &h.metrics,
        "vcluster_proxy_peer_dial_failures_total",
        "reason=\"canceled\"",
    ) - canceled_before;
    let after = lines(&h.metrics, "vcluster_proxy_request_total");
    assert_eq!(canceled, 1.0, "the abandoned dial is counted as canceled");
    assert!(after != before, "no request series moved: {after:?}");
    assert_eq!(
        metric_value(
            &h.metrics,
            "vcluster_proxy_request_total",
            "code=\"503\",reason=\"canceled\""
        ),
        1.0,
        "{after:?}"
    );
    h.proxy.shutdown().await;
}

/// Where a [`HungPeer`] stops answering.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stall {
    BeforeHead,
    InBody,
}

/// A target replica that completes TCP, TLS and the HTTP/2 handshake, then never
/// finishes an answer (a wedged API server).
struct HungPeer {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl HungPeer {
    /// `stall`: where the replica stops: before its answer's head, or in its body
    /// after the head and a first chunk.
    async fn start(pki: &Pki, stall: Stall) -> HungPeer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let acceptor = tokio_rustls::TlsAcceptor::from(pki.server_config(&[b"h2", b"http/1.1"]));
        let task = tokio::spawn(async move {
            // Bounded by the abort in Drop.
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service = hyper::service::service_fn(
                        move |_req: hyper::Request<hyper::body::Incoming>| async move {
                            if stall == Stall::BeforeHead {
                                std::future::pending::<()>().await;
                            }
                            let first = futures_util::stream::once(async {
                                Ok::<_, Infallible>(hyper::body::Frame::data(Bytes::from(
                                    "{\"kind\":\"APIResourceList\",",
                                )))
                            });
                            let body =
                                http_body_util::StreamBody::new(futures_util::StreamExt::chain(
                                    first,
                                    futures_util::stream::pending(),
                                ));
                            let mut response = hyper::Response::new(body);
                            response.headers_mut().insert(
                                http::header::CONTENT_TYPE,
                                http::HeaderValue::from_static("application/json"),
                            );
                            Ok::<_, Infallible>(response)
                        },
                    );
                    let _ = hyper_util::server::conn::auto::Builder::new(
                        hyper_util::rt::TokioExecutor::new(),
                    )
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                    .await;
                });
            }
        });
        HungPeer { addr, task }
    }
}

impl Drop for HungPeer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Hung {
    proxy: app::RunningProxy,
    addr: SocketAddr,
    serving_ca_pem: String,
    front_proxy: crproxy_core::pki::CertPem,
    metrics: Arc<Metrics>,
    _client_api: test_support::TestCluster,
    _peer: HungPeer,
}

/// A proxy whose only target peer is a [`HungPeer`]; the client cluster is a
/// devcluster as in the other tests.
async fn proxy_in_front_of_a_hung_target(stall: Stall) -> Hung {
    let pki = Pki::new();
    let peer = HungPeer::start(&pki, stall).await;
    let client_api = test_support::devcluster("client").await;
    let front_proxy = client_api.cluster.front_proxy_client();
    let mut client_config =
        ClusterConfig::new(url::Url::parse(&client_api.cluster.url()).expect("url"));
    client_config.ca_pem = Some(client_api.cluster.ca_pem().into_bytes());
    client_config.auth = Auth::Token(client_api.cluster.admin_token());
    let client = crproxy_kube::ClusterAccess::new(client_config).expect("credentials");
    let client_admin = client.kube_client().expect("client admin");
    let demo: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(json!({"metadata": {"name": "demo"}})).expect("namespace");
    Api::all(client_admin)
        .create(&PostParams::default(), &demo)
        .await
        .expect("namespace created on the client");
    let mut target_config =
        ClusterConfig::new(url::Url::parse(&format!("https://{SERVER_NAME}:443")).expect("url"));
    target_config.ca_pem = Some(pki.ca.pem().cert.clone().into_bytes());
    target_config.auth = Auth::Token("client-token".into());
    let serving_ca = CertificateAuthority::generate("serving-ca").expect("ca");
    let serving = serving_ca
        .issue_server(&["localhost"], &[IpAddr::V4(Ipv4Addr::LOCALHOST)])
        .expect("serving cert");
    let metrics = Metrics::new();
    let setup = ProxySetup {
        owner: Owner::new("client", "default"),
        plan: vec![GroupVersionPlan {
            group: "example.com".into(),
            version: "v1".into(),
            resources: ResourceSet::Explicit(vec!["widgets".into()]),
            target: TargetRef {
                name: "target".into(),
                project: "default".into(),
            },
            access: AccessMode::All,
            port: 0,
        }],
        bind: IpAddr::V4(Ipv4Addr::LOCALHOST),
        metrics_addr: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
        client: client.kube_client_without_retries().expect("client"),
        client_watches: crproxy_proxy::watches::WatchClient::new(&client).expect("watch client"),
        targets: vec![TargetSetup {
            name: "target".into(),
            project: "default".into(),
            access: crproxy_kube::ClusterAccess::new(target_config).expect("target credentials"),
            peers: PeerSourceConfig::Static(vec![peer.addr.to_string()]),
        }],
        serving: ServingIdentity {
            cert_chain_pem: serving.cert.clone(),
            key_pem: serving.key.clone(),
        },
        metrics: Arc::clone(&metrics),
        share_ports: false,
        startup_sync_timeout: Duration::from_secs(60),
    };
    let proxy = app::start(setup, true).await.expect("proxy starts");
    let addr = proxy.servers[0].1;
    Hung {
        proxy,
        addr,
        serving_ca_pem: serving_ca.pem().cert.clone(),
        front_proxy,
        metrics,
        _client_api: client_api,
        _peer: peer,
    }
}

/// troubleshoot.txt:303: "initial probe of proxy target failed, requests will keep
/// retrying". A target that accepts the connection and never answers is reported
/// too: the probe ends at the 60 s cap of any request (it once waited for ever,
/// and the line never came).
#[tokio::test(flavor = "current_thread")]
#[ignore = "real-time group: scripts/test runs it beside the rest"]
async fn the_startup_probe_of_a_target_that_never_answers_is_logged_at_the_deadline() {
    let (logs, _guard) = LogBuffer::capture();
    let hung = proxy_in_front_of_a_hung_target(Stall::BeforeHead).await;
    // Bounded: 70 s in 1 s steps, well past the 60 s cap of any proxied request.
    let mut logged = false;
    for _ in 0..70 {
        if !logs
            .with_message("initial probe of proxy target failed")
            .is_empty()
        {
            logged = true;
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let text = logs.text();
    assert!(
        logged,
        "no 'initial probe of proxy target failed' line after 70 s; logs:\n{text}"
    );
    hung.proxy.shutdown().await;
}

/// how-it-works.txt:85: when the target is unreachable the proxy serves discovery
/// locally so the APIService stays Available. kube-aggregator's availability
/// check gives the discovery GET 5 s before it marks the APIService
/// `FailedDiscoveryCheck`, so a target that accepts and never answers gets 4 s,
/// then the fallback (`upstream_error`: a transport failure the proxy converted),
/// and the cut is a deadline the proxy set (it once held discovery for 60 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "real-time group: scripts/test runs it beside the rest"]
async fn discovery_against_a_target_that_never_answers_falls_back_within_the_aggregators_check() {
    // Installs the binary's log subscriber before any proxy code logs.
    let (_logs, _log_guard) = LogBuffer::capture();
    // A replica that never sends its answer's head, and one that stalls in the
    // body after it: discovery buffers the whole document, so both must end.
    for stall in [Stall::BeforeHead, Stall::InBody] {
        let hung = proxy_in_front_of_a_hung_target(stall).await;
        let mut sender = caller_h2(hung.addr, &hung.serving_ca_pem, &hung.front_proxy).await;
        let started = Instant::now();
        let answer = tokio::time::timeout(
            Duration::from_secs(6),
            sender.send_request(aggregator_get("/apis/example.com/v1")),
        )
        .await;
        let waited = started.elapsed();
        let fallbacks = lines(&hung.metrics, "vcluster_proxy_discovery_fallbacks_total");
        assert!(
            matches!(&answer, Ok(Ok(response)) if response.status() == 200),
            "no discovery answer after {waited:?}: {answer:?}; fallbacks {fallbacks:?}"
        );
        assert!(
            waited < Duration::from_secs(5),
            "answered after {waited:?}, past the aggregator's 5 s check"
        );
        assert_eq!(
            metric_value(
                &hung.metrics,
                "vcluster_proxy_discovery_fallbacks_total",
                "reason=\"upstream_error\""
            ),
            1.0,
            "{fallbacks:?}"
        );
        assert_eq!(
            metric_value(
                &hung.metrics,
                "vcluster_proxy_request_terminations_total",
                "reason=\"deadline\""
            ),
            1.0
        );
        drop(sender);
        hung.proxy.shutdown().await;
    }
}

/// operate.txt:94-97: `vcluster_proxy_request_terminations_total` counts requests
/// the proxy terminated, `deadline` when the 60 s cap expired. An owned-mode
/// server-side apply that runs into the cap on the ownership cache's fast path
/// is one termination: it is not sent down the checked path again (it once was,
/// and that path's ownership GET met the same expired deadline and counted it a
/// second time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "real-time group: scripts/test runs it beside the rest"]
async fn one_apply_past_the_cap_is_one_deadline_termination() {
    // Installs the binary\'s log subscriber before any proxy code logs.
    let (_logs, _log_guard) = LogBuffer::capture();
    // TLS stays end to end through the relay.
    let relay = Relay::unconnected().await;
    let h = harness_behind(&relay, AccessMode::Owned).await;
    let owned =
        json!({"vcluster.com/owner-vcluster": "client", "vcluster.com/owner-project": "default"});
    h.widgets
        .create(&PostParams::default(), &widget_object("applied", owned))
        .await
        .expect("created");
    let path = format!("{WIDGETS}/applied");
    // Warm the ownership cache until a write takes its fast path (bounded: 200 tries).
    let hits = |h: &Harness| {
        metric_value(
            &h.metrics,
            "crproxy_ownership_cache_lookups_total",
            "result=\"hit\"",
        )
    };
    let mut warm = false;
    for attempt in 0..200 {
        let before = hits(&h);
        let reply = target_support::send(
            &h,
            "PATCH",
            &path,
            Some("application/merge-patch+json"),
            json!({"metadata": {"annotations": {"warm": attempt.to_string()}}}).to_string(),
        )
        .await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        if hits(&h) > before {
            warm = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(warm, "the ownership cache never answered");
    // The replica wedges on every connection the proxy holds; new ones forward.
    relay.freeze();
    relay.thaw();
    let mut sender = caller_h2(h.addr, &h.serving_ca_pem, &h.front_proxy_client).await;
    let body = "apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: applied\n  namespace: demo\nspec:\n  replicas: 7\n";
    let request = http::Request::builder()
        .method("PATCH")
        .uri(format!(
            "https://localhost{path}?fieldManager=tenant&force=true"
        ))
        .header("x-remote-user", "alice")
        .header("x-remote-group", "system:authenticated")
        .header("accept", "application/json")
        .header("content-type", "application/apply-patch+yaml")
        .body(http_body_util::Full::new(Bytes::from(body)))
        .expect("request");
    let started = Instant::now();
    let answer = tokio::time::timeout(Duration::from_secs(75), sender.send_request(request))
        .await
        .expect("an answer within 75 s")
        .expect("response");
    let elapsed = started.elapsed();
    let terminations = lines(&h.metrics, "vcluster_proxy_request_terminations_total");
    let requests = lines(&h.metrics, "vcluster_proxy_request_total");
    assert_eq!(answer.status(), 503, "after {elapsed:?}");
    // The caller reads the cause as the runbook's log-based alerts match it.
    let body = answer.into_body().collect().await.expect("body").to_bytes();
    let refused: serde_json::Value = serde_json::from_slice(&body).expect("a Status");
    let message = refused["message"].as_str().unwrap_or_default();
    assert!(
        message.ends_with("is unavailable: context deadline exceeded"),
        "{message}"
    );
    assert_eq!(
        metric_value(&h.metrics,
            "vcluster_proxy_request_terminations_total",
            "reason=\"deadline\""
        ),
        1.0,
        "one request past the cap after {elapsed:?}: terminations {terminations:?}; requests {requests:?}"
    );
    h.proxy.shutdown().await;
}

/// A watch streams past the 60 s cap every other request gets, and the cap's
/// accounting leaves it out: while open it is not in flight, and it ends in no
/// `deadline` termination and no duration sample (the spec's fixed thresholds,
/// and its notes on the duration and in-flight series).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "real-time group: scripts/test runs it beside the rest"]
async fn a_watch_outlives_the_request_cap_and_stays_out_of_its_series() {
    use crproxy_proxy::transport::REQUEST_DEADLINE;
    let h = harness(AccessMode::Owned).await;
    let mut sender = caller_h2(h.addr, &h.serving_ca_pem, &h.front_proxy_client).await;
    let request = aggregator_get(&format!("{WIDGETS}?watch=true"));
    let response = tokio::time::timeout(Duration::from_secs(10), sender.send_request(request))
        .await
        .expect("the watch's head within 10 s")
        .expect("response");
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    assert_eq!(
        metric_value(&h.metrics, "vcluster_proxy_inflight_requests", ""),
        0.0,
        "{:?}",
        lines(&h.metrics, "vcluster_proxy_inflight_requests")
    );
    tokio::time::sleep(REQUEST_DEADLINE + Duration::from_secs(2)).await;
    // Still open past the cap: an object made now arrives on it.
    let owned =
        json!({"vcluster.com/owner-vcluster": "client", "vcluster.com/owner-project": "default"});
    h.widgets
        .create(&PostParams::default(), &widget_object("late", owned))
        .await
        .expect("created");
    let arrived = async {
        let mut seen = Vec::new();
        // Bounded: at most 100 frames, and the timeout below.
        for _ in 0..100 {
            let Some(frame) = body.frame().await else {
                break;
            };
            let frame = frame.expect("the watch is still open");
            if let Some(data) = frame.data_ref() {
                seen.extend_from_slice(data);
                if String::from_utf8_lossy(&seen).contains("\"late\"") {
                    return;
                }
            }
        }
        panic!(
            "the watch ended, or sent 100 frames without it: {}",
            String::from_utf8_lossy(&seen)
        );
    };
    tokio::time::timeout(Duration::from_secs(10), arrived)
        .await
        .expect("the new object arrives within 10 s");
    assert_eq!(
        metric_value(
            &h.metrics,
            "vcluster_proxy_request_terminations_total",
            "reason=\"deadline\""
        ),
        0.0
    );
    let watch_durations: Vec<String> = lines(&h.metrics, "vcluster_proxy_request_duration_seconds")
        .into_iter()
        .filter(|l| l.contains("verb=\"WATCH\""))
        .collect();
    assert!(watch_durations.is_empty(), "{watch_durations:?}");
    h.proxy.shutdown().await;
}

/// A caller (the aggregator, behind it a slow kubectl) that stops reading a large
/// list must not keep the request, its in-flight place and its target connection
/// past the cap; the cut is one `deadline` termination (operate.txt:97).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "real-time group: scripts/test runs it beside the rest"]
async fn a_caller_that_stops_reading_a_list_is_cut_at_the_deadline() {
    let h = harness(AccessMode::All).await;
    // About 2 MiB of widgets: far more than the caller's 64 KiB window.
    let padding = "x".repeat(50 * 1024);
    for i in 0..40 {
        let mut widget = widget_object(&format!("big-{i:02}"), json!({}));
        widget.data["spec"]["padding"] = json!(padding);
        h.widgets
            .create(&PostParams::default(), &widget)
            .await
            .expect("created on the target");
    }
    let mut sender = caller_h2(h.addr, &h.serving_ca_pem, &h.front_proxy_client).await;
    let started = Instant::now();
    let response = tokio::time::timeout(
        Duration::from_secs(20),
        sender.send_request(aggregator_get(WIDGETS)),
    )
    .await
    .expect("headers in time")
    .expect("response");
    assert_eq!(response.status(), 200);
    // The caller stops reading for longer than the cap.
    tokio::time::sleep(Duration::from_secs(66)).await;
    let inflight = metric_value(&h.metrics, "vcluster_proxy_inflight_requests", "target=");
    let deadline = metric_value(
        &h.metrics,
        "vcluster_proxy_request_terminations_total",
        "reason=\"deadline\"",
    );
    let durations = lines(&h.metrics, "vcluster_proxy_request_duration_seconds_sum");
    let measured = metric_value(
        &h.metrics,
        "vcluster_proxy_request_duration_seconds_count",
        "verb=\"LIST\"",
    );
    // Reading on now must not deliver the whole list long after the cap.
    let rest = tokio::time::timeout(Duration::from_secs(20), response.into_body().collect()).await;
    let completed = matches!(rest, Ok(Ok(_)));
    let rest = match rest {
        Ok(Ok(body)) => format!("complete, {} bytes", body.to_bytes().len()),
        Ok(Err(e)) => format!("error: {e}"),
        Err(_) => "no end within 20 s".to_owned(),
    };
    assert!(
        inflight == 0.0 && deadline == 1.0 && measured == 1.0 && !completed,
        "after {:?}: inflight {inflight}, deadline terminations {deadline}, LIST durations \
         observed {measured}, whole list still delivered after the cap: {completed} ({rest}); \
         durations {durations:?}",
        started.elapsed()
    );
    // Once cut, nothing is counted again when the caller reads on.
    assert_eq!(
        metric_value(
            &h.metrics,
            "vcluster_proxy_request_terminations_total",
            "reason=\"deadline\""
        ),
        1.0
    );
    assert_eq!(
        metric_value(
            &h.metrics,
            "vcluster_proxy_request_duration_seconds_count",
            "verb=\"LIST\""
        ),
        1.0
    );
    h.proxy.shutdown().await;
}

/// A target host that goes silent without closing anything (powered off, its
/// route dropped: no FIN, no reset, its kernel answering nothing) leaves an idle
/// pooled HTTP/1.1 connection that looks usable. TCP keepalive has the kernel
/// close it some 30 s into its idleness, so a request afterwards dials afresh
/// and fails on the 5 s dial budget, instead of waiting on the dead connection
/// until the kernel's retransmissions give up (many minutes; the proxy's 60 s
/// cap at best). Once the host answers again, the next request gets through on
/// a new connection.
///
/// Real, not simulated: the peer lives in a network namespace of its own, and a
/// blackhole route there discards everything it would send back.
#[test]
#[ignore = "real-time group: scripts/test runs it beside the rest"]
fn an_idle_connection_to_a_host_gone_silent_is_closed_by_tcp_keepalive() {
    use crproxy_proxy::dial::{KEEPALIVE_IDLE, KEEPALIVE_INTERVAL, KEEPALIVE_PROBES};
    use crproxy_proxy::pool::Lane;
    use netns_support::{Namespaces, SERVER_ADDR};
    use pool_support::{Harness as PoolHarness, Protocols, TlsPeer};

    let namespaces = match Namespaces::create() {
        Ok(namespaces) => namespaces,
        Err(error) if !test_support::tool::is_ci() => {
            eprintln!("skipped: network namespaces cannot be made here ({error})");
            return;
        }
        Err(error) => panic!("CI=true needs network namespaces (root, iproute2): {error}"),
    };
    // A namespace belongs to a thread: the peer's socket is made on a thread that
    // entered the server's, the pool's on the one that runs the client's runtime.
    let server = namespaces.server.clone();
    let listener = std::thread::spawn(move || {
        Namespaces::enter(&server)?;
        std::net::TcpListener::bind((SERVER_ADDR, 0)).map_err(|e| e.to_string())
    })
    .join()
    .expect("the server thread")
    .expect("a listener in the server namespace");
    listener.set_nonblocking(true).expect("non-blocking");
    let client = namespaces.client.clone();
    let silent_for =
        KEEPALIVE_IDLE + KEEPALIVE_INTERVAL * KEEPALIVE_PROBES + Duration::from_secs(5);
    std::thread::spawn(move || {
        Namespaces::enter(&client).expect("enter the client namespace");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(async {
            let h = PoolHarness::new();
            let listener = tokio::net::TcpListener::from_std(listener).expect("a tokio listener");
            let peer = TlsPeer::serve(listener, &h.pki, Protocols::Http1Only);
            h.pool.publish(vec![peer.host()]);
            // Two requests on one connection: it is pooled, and the request after
            // the silence would take it again if it were still open.
            for _ in 0..2 {
                let answer =
                    tokio::time::timeout(Duration::from_secs(10), h.get_in(Lane::Exchange))
                        .await
                        .expect("a request before the silence, in time");
                assert!(answer.is_ok(), "{answer:?}");
            }
            assert_eq!(
                peer.connections.load(std::sync::atomic::Ordering::SeqCst),
                1
            );

            namespaces.silence_server().expect("silence the server");
            tokio::time::sleep(silent_for).await;
            let started = Instant::now();
            let while_silent =
                tokio::time::timeout(Duration::from_secs(20), h.get_in(Lane::Exchange)).await;
            let Ok(while_silent) = while_silent else {
                panic!(
                    "a request {silent_for:?} after the host went silent was still waiting after \
                     20 s: its pooled connection was not closed"
                );
            };
            assert_eq!(
                while_silent,
                Err("timeout".to_owned()),
                "after {:?}",
                started.elapsed()
            );

            namespaces.restore_server().expect("restore the server");
            let after = tokio::time::timeout(Duration::from_secs(10), h.get_in(Lane::Exchange))
                .await
                .expect("a request after the host answers again, in time");
            assert!(after.is_ok(), "{after:?}");
            assert_eq!(
                peer.connections.load(std::sync::atomic::Ordering::SeqCst),
                2,
                "the first connection, then one made after the host answered again"
            );
        });
    })
    .join()
    .expect("the client thread");
}
