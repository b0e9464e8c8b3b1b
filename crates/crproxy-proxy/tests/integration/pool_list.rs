//! The peer list: no list yet, empty lists, the 60 s staleness tolerance measured
//! from the subscription drop, and the startup wait.

use crate::pool_support;

use std::time::Duration;

use crproxy_core::reason::Reason;
use crproxy_proxy::pool::STALENESS_TOLERANCE;
use pool_support::*;
use test_support::RefusedPort;

fn synced(s: &Scrape) -> Option<f64> {
    s.get(
        "vcluster_proxy_peer_cache_synced",
        &[("target", TARGET), ("group_version", GROUP_VERSION)],
    )
}

fn list_age(s: &Scrape) -> Option<f64> {
    s.get(
        "vcluster_proxy_peer_list_age_seconds",
        &[("target", TARGET), ("group_version", GROUP_VERSION)],
    )
}

#[tokio::test(start_paused = true)]
async fn before_the_first_list_requests_fail_with_no_peer() {
    let h = Harness::new();
    let err = h.pool.acquire().await.expect_err("no list");
    assert_eq!(err.reason(), Reason::NoPeer);
    let s = h.scrape();
    assert_eq!(s.dial_failures("no_peer"), 1.0);
    assert_eq!(s.dial_observations(), 0.0);
    assert_eq!(synced(&s), Some(0.0));
    assert_eq!(list_age(&s), None, "absent before the first publication");
    for state in ["healthy", "quarantined", "half_open"] {
        assert_eq!(s.peers(state), 0.0, "{state} is emitted even at zero");
    }

    // A dropped subscription before any list changes nothing: still no_peer.
    h.pool.subscription_dropped();
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert_eq!(
        h.pool.acquire().await.expect_err("no list").reason(),
        Reason::NoPeer
    );
}

#[tokio::test(start_paused = true)]
async fn an_empty_list_is_synced_but_has_no_peer() {
    let h = Harness::new();
    h.pool.publish(Vec::new());
    tokio::time::sleep(Duration::from_secs(7)).await;
    let err = h.pool.acquire().await.expect_err("empty list");
    assert_eq!(err.reason(), Reason::NoPeer);
    let s = h.scrape();
    assert_eq!(synced(&s), Some(1.0), "a fresh empty list is still trusted");
    assert_eq!(list_age(&s), Some(7.0));
}

#[tokio::test(start_paused = true)]
async fn staleness_counts_from_the_drop_not_from_the_last_publication() {
    let h = Harness::new();
    let peer = TlsPeer::start(&h.pki, Protocols::H2AndHttp1).await;
    h.pool.publish(vec![peer.host()]);

    // A quiet list is old but fine: nothing published for 100 s.
    tokio::time::sleep(Duration::from_secs(100)).await;
    h.get().await.expect("an old list is not a stale list");

    h.pool.subscription_dropped();
    tokio::time::sleep(Duration::from_secs(59)).await;
    h.pool.subscription_dropped(); // a retry failing again keeps the first drop time
    h.get()
        .await
        .expect("59 s after the drop the list is trusted");
    let s = h.scrape();
    assert_eq!(synced(&s), Some(1.0));
    assert_eq!(list_age(&s), Some(159.0));

    tokio::time::sleep(Duration::from_secs(2)).await;
    let err = h.pool.acquire().await.expect_err("61 s after the drop");
    assert_eq!(err.reason(), Reason::StalePeers);
    let s = h.scrape();
    assert_eq!(s.dial_failures("stale_peers"), 1.0);
    assert_eq!(synced(&s), Some(0.0));
    assert_eq!(
        s.peers("healthy"),
        1.0,
        "health is kept, only trust is gone"
    );

    // A publication resets the clock.
    h.pool.publish(vec![peer.host()]);
    h.get().await.expect("fresh list");
    let s = h.scrape();
    assert_eq!(synced(&s), Some(1.0));
    assert_eq!(list_age(&s), Some(0.0));
}

#[tokio::test(start_paused = true)]
async fn a_restored_subscription_stops_the_clock() {
    let h = Harness::new();
    let peer = TlsPeer::start(&h.pki, Protocols::H2AndHttp1).await;
    h.pool.publish(vec![peer.host()]);
    h.pool.subscription_dropped();
    tokio::time::sleep(STALENESS_TOLERANCE - Duration::from_secs(1)).await;
    h.pool.subscription_restored();
    tokio::time::sleep(Duration::from_secs(600)).await;
    h.get().await.expect("subscription is up");
}

#[tokio::test(start_paused = true)]
async fn waiting_for_the_first_list() {
    let h = Harness::new();
    assert!(!h.pool.wait_for_first_list(Duration::from_secs(60)).await);

    let pool = h.pool.clone();
    let waiter =
        tokio::spawn(async move { pool.wait_for_first_list(Duration::from_secs(60)).await });
    tokio::time::sleep(Duration::from_secs(3)).await;
    h.pool.publish(Vec::new());
    assert!(waiter.await.expect("task"), "an empty list is a list");
    assert!(h.pool.wait_for_first_list(Duration::ZERO).await);
}

#[tokio::test]
async fn publishing_keeps_health_of_hosts_that_stay() {
    let h = Harness::new();
    let refused = RefusedPort::bind();
    let dead = refused.addr.to_string();
    let live = TlsPeer::start(&h.pki, Protocols::H2AndHttp1).await;
    h.pool.publish(vec![dead.clone()]);
    for _ in 0..3 {
        h.pool.acquire().await.expect_err("refused");
    }
    assert_eq!(h.scrape().peers("quarantined"), 1.0);

    // Same dead host plus a new one: the dead host stays quarantined, the new one
    // starts healthy, and no recovery is counted for it.
    h.pool.publish(vec![dead.clone(), live.host(), live.host()]);
    assert_eq!(h.pool.hosts(), vec![dead.clone(), live.host()]);
    let s = h.scrape();
    assert_eq!((s.peers("healthy"), s.peers("quarantined")), (1.0, 1.0));
    h.get().await.expect("the new host serves");
    assert_eq!(
        h.scrape()
            .value("vcluster_proxy_peer_recoveries_total", &[]),
        0.0
    );

    // Dropping the dead host and re-adding it later starts it fresh.
    h.pool.publish(vec![live.host()]);
    h.pool.publish(vec![dead.clone(), live.host()]);
    let s = h.scrape();
    assert_eq!((s.peers("healthy"), s.peers("quarantined")), (2.0, 0.0));
}
