//! Peer health: dial failures, the 5 s dial timeout, quarantine after 3 failures,
//! the 20 s quarantine and its single trial dial, departures mid-dial.
//!
//! Tests that need the fixed thresholds run on paused tokio time. The peers live on
//! the same single-threaded runtime, so a loopback exchange is always ready before
//! the runtime would auto-advance the clock; only peers that never answer let the
//! clock jump to the next timer, which is exactly the timeout under test.

use crate::pool_support;

use std::time::Duration;

use crproxy_core::reason::Reason;
use crproxy_proxy::dial::DIAL_TIMEOUT;
use crproxy_proxy::pool::{QUARANTINE_DURATION, QUARANTINE_THRESHOLD};
use pool_support::*;
use test_support::RefusedPort;
use tokio::time::Instant;

#[tokio::test]
async fn a_refusing_peer_counts_errors_then_is_quarantined_and_skipped() {
    let h = Harness::new();
    let refused = RefusedPort::bind();
    let addr = refused.addr;
    h.pool.publish(vec![addr.to_string()]);

    for n in 1..=QUARANTINE_THRESHOLD {
        let err = h.pool.acquire().await.expect_err("nobody listens");
        assert_eq!(err.reason(), Reason::Error);
        assert!(
            err.message().contains(&addr.to_string()),
            "dial errors name the peer: {err}"
        );
        let s = h.scrape();
        assert_eq!(s.dial_failures("error"), f64::from(n));
        assert_eq!(s.dial_observations(), f64::from(n));
    }

    let s = h.scrape();
    assert_eq!(s.value("vcluster_proxy_peer_quarantines_total", &[]), 1.0);
    assert_eq!(
        s.value("vcluster_proxy_target_all_peers_quarantined_total", &[]),
        1.0
    );
    assert_eq!(
        (
            s.peers("healthy"),
            s.peers("quarantined"),
            s.peers("half_open")
        ),
        (0.0, 1.0, 0.0)
    );

    // While quarantined, requests fail fast and never dial.
    let err = h.pool.acquire().await.expect_err("quarantined");
    assert_eq!(err.reason(), Reason::AllQuarantined);
    let s = h.scrape();
    assert_eq!(s.dial_failures("all_quarantined"), 1.0);
    assert_eq!(s.dial_observations(), 3.0, "a rejection is not a dial");
}

#[tokio::test(start_paused = true)]
async fn a_peer_that_never_completes_tls_times_out_after_five_seconds() {
    let h = Harness::new();
    let silent = SilentPeer::start().await;
    h.pool.publish(vec![silent.host()]);

    let started = Instant::now();
    let err = h.pool.acquire().await.expect_err("no TLS answer");
    assert_eq!(err.reason(), Reason::Timeout);
    assert_eq!(started.elapsed(), DIAL_TIMEOUT);

    let s = h.scrape();
    assert_eq!(s.dial_failures("timeout"), 1.0);
    assert_eq!(s.dial_observations(), 1.0);
    assert_eq!(
        s.value("vcluster_proxy_peer_dial_duration_seconds_sum", &[]),
        5.0
    );
    assert_eq!(
        s.value(
            "vcluster_proxy_peer_dial_duration_seconds_bucket",
            &[("le", "2.5")]
        ),
        0.0
    );
    assert_eq!(
        s.value(
            "vcluster_proxy_peer_dial_duration_seconds_bucket",
            &[("le", "5.0")]
        ),
        1.0,
        "the dial timeout is the last finite bucket"
    );
}

#[tokio::test(start_paused = true)]
async fn a_peer_removed_mid_dial_fails_with_peer_departed_without_a_duration() {
    let h = Harness::new();
    let silent = SilentPeer::start().await;
    h.pool.publish(vec![silent.host()]);

    let pool = h.pool.clone();
    let started = Instant::now();
    let request = tokio::spawn(async move { pool.acquire().await });
    tokio::time::sleep(Duration::from_secs(1)).await;
    h.pool.publish(Vec::new());

    let err = request.await.expect("task").expect_err("departed");
    assert_eq!(err.reason(), Reason::PeerDeparted);
    assert_eq!(
        started.elapsed(),
        Duration::from_secs(1),
        "no wait for the timeout"
    );
    let s = h.scrape();
    assert_eq!(s.dial_failures("peer_departed"), 1.0);
    assert_eq!(s.dial_failures("timeout"), 0.0);
    assert_eq!(s.dial_observations(), 0.0);
}

#[tokio::test(start_paused = true)]
async fn a_departed_peer_is_replaced_by_the_new_list_without_a_caller_error() {
    let h = Harness::new();
    let silent = SilentPeer::start().await;
    let peer = TlsPeer::start(&h.pki, Protocols::H2AndHttp1).await;
    h.pool.publish(vec![silent.host()]);

    let pool = h.pool.clone();
    let request = tokio::spawn(async move { pool.acquire().await });
    tokio::time::sleep(Duration::from_secs(1)).await;
    h.pool.publish(vec![peer.host()]);

    let sender = request
        .await
        .expect("task")
        .expect("retried on the new peer");
    assert_eq!(*sender.peer, *peer.host());
    assert_eq!(h.scrape().dial_failures("peer_departed"), 1.0);
}

#[tokio::test(start_paused = true)]
async fn a_failed_trial_requarantines_and_a_successful_trial_recovers() {
    let h = Harness::new();
    let refused = RefusedPort::bind();
    let addr = refused.addr;
    h.pool.publish(vec![addr.to_string()]);
    for _ in 0..QUARANTINE_THRESHOLD {
        h.pool.acquire().await.expect_err("refused");
    }
    assert_eq!(
        h.pool.acquire().await.expect_err("quarantined").reason(),
        Reason::AllQuarantined
    );

    // The quarantine expires: the scrape already shows it, no request needed.
    tokio::time::sleep(QUARANTINE_DURATION).await;
    let s = h.scrape();
    assert_eq!(
        (
            s.peers("healthy"),
            s.peers("quarantined"),
            s.peers("half_open")
        ),
        (0.0, 0.0, 1.0)
    );

    // The single trial fails: quarantined again for another 20 s.
    let err = h.pool.acquire().await.expect_err("trial refused");
    assert_eq!(err.reason(), Reason::Error);
    let s = h.scrape();
    assert_eq!(s.value("vcluster_proxy_peer_quarantines_total", &[]), 2.0);
    assert_eq!(
        s.value("vcluster_proxy_target_all_peers_quarantined_total", &[]),
        2.0,
        "the failed trial's quarantine left nothing selectable again"
    );
    assert_eq!(s.peers("quarantined"), 1.0);
    tokio::time::sleep(QUARANTINE_DURATION - Duration::from_secs(1)).await;
    assert_eq!(
        h.pool
            .acquire()
            .await
            .expect_err("still quarantined")
            .reason(),
        Reason::AllQuarantined
    );

    // The peer comes back; the next trial succeeds.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let peer = TlsPeer::start_on(refused, &h.pki, Protocols::H2AndHttp1);
    let body = h.get().await.expect("trial succeeds");
    assert!(body.starts_with(&format!("peer {}", addr.port())), "{body}");
    let s = h.scrape();
    assert_eq!(s.value("vcluster_proxy_peer_recoveries_total", &[]), 1.0);
    assert_eq!(
        (
            s.peers("healthy"),
            s.peers("quarantined"),
            s.peers("half_open")
        ),
        (1.0, 0.0, 0.0)
    );
    assert_eq!(
        peer.connections.load(std::sync::atomic::Ordering::SeqCst),
        1
    );

    // Healthy again: later requests go through and count nothing new.
    h.get().await.expect("healthy");
    assert_eq!(
        h.scrape()
            .value("vcluster_proxy_peer_recoveries_total", &[]),
        1.0
    );
}

#[tokio::test(start_paused = true)]
async fn the_only_peer_in_its_trial_dial_is_not_selectable() {
    let h = Harness::new();
    let silent = SilentPeer::start().await;
    h.pool.publish(vec![silent.host()]);
    for _ in 0..QUARANTINE_THRESHOLD {
        assert_eq!(
            h.pool.acquire().await.expect_err("timeout").reason(),
            Reason::Timeout
        );
    }
    tokio::time::sleep(QUARANTINE_DURATION).await;

    let pool = h.pool.clone();
    let trial = tokio::spawn(async move { pool.acquire().await });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(h.scrape().peers("half_open"), 1.0);
    let started = Instant::now();
    let err = h.pool.acquire().await.expect_err("mid-trial");
    assert_eq!(err.reason(), Reason::AllQuarantined);
    assert_eq!(
        started.elapsed(),
        Duration::ZERO,
        "never waits on the trial"
    );

    let err = trial.await.expect("task").expect_err("trial times out");
    assert_eq!(err.reason(), Reason::Timeout);
    let s = h.scrape();
    assert_eq!(s.peers("quarantined"), 1.0);
    assert_eq!(s.value("vcluster_proxy_peer_quarantines_total", &[]), 2.0);
    assert_eq!(s.dial_failures("timeout"), 4.0);
}

#[tokio::test(start_paused = true)]
async fn an_abandoned_trial_frees_the_slot_and_counts_as_canceled() {
    let h = Harness::new();
    let silent = SilentPeer::start().await;
    h.pool.publish(vec![silent.host()]);
    for _ in 0..QUARANTINE_THRESHOLD {
        h.pool.acquire().await.expect_err("timeout");
    }
    tokio::time::sleep(QUARANTINE_DURATION).await;

    // The caller gives up one second into the trial dial.
    let abandoned = tokio::time::timeout(Duration::from_secs(1), h.pool.acquire()).await;
    assert!(abandoned.is_err(), "the trial dial was still running");
    assert_eq!(h.scrape().dial_failures("canceled"), 1.0);

    // The next request gets to make the trial instead of being rejected.
    let err = h.pool.acquire().await.expect_err("trial times out");
    assert_eq!(err.reason(), Reason::Timeout);
}

#[tokio::test(start_paused = true)]
async fn a_request_deadline_mid_dial_counts_as_deadline() {
    let h = Harness::new();
    let silent = SilentPeer::start().await;
    h.pool.publish(vec![silent.host()]);

    let started = Instant::now();
    let deadline = started + Duration::from_secs(2);
    let err = h.pool.acquire_before(deadline).await.expect_err("deadline");
    assert_eq!(err.reason(), Reason::Deadline);
    assert_eq!(started.elapsed(), Duration::from_secs(2));
    let s = h.scrape();
    assert_eq!(s.dial_failures("deadline"), 1.0);
    assert_eq!(s.dial_failures("canceled"), 0.0);
    assert_eq!(s.dial_failures("timeout"), 0.0);
    assert_eq!(
        s.dial_observations(),
        0.0,
        "an abandoned dial has no duration"
    );
    assert_eq!(s.peers("healthy"), 1.0, "says nothing about the peer");

    // A deadline later than the dial timeout leaves the timeout in charge.
    let err = h
        .pool
        .acquire_before(Instant::now() + Duration::from_secs(30))
        .await
        .expect_err("timeout");
    assert_eq!(err.reason(), Reason::Timeout);
}
