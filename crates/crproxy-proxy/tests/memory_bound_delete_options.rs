//! A deletecollection's DeleteOptions stay the size of their text while the
//! collection is listed and deleted.
//!
//! The options are read once, as a tree, under the parse memory budget, and
//! kept as text: each listed object's delete writes them out with its own pin.
//! They were once kept as the tree for the whole collection, outside the
//! budget: 3 MiB of small numbers is some 50 MiB as a tree, so eight such
//! requests waiting on a target that had stopped answering held about 400 MiB,
//! and the in-flight limit (400) would let a caller exhaust a node.
//!
//! Its own test binary (own process), so other tests cannot move the peak.

mod target_support;

use std::time::Duration;

use crproxy_core::config::AccessMode;
use target_support::{harness_behind, peak_rss_kib, reset_peak_rss, send, WIDGETS};
use test_support::relay::Relay;

const PEAK_GROWTH_LIMIT_KIB: u64 = 150 * 1024;

/// How long the requests wait on the frozen target before the peak is read:
/// long enough for all eight to read their options (debug builds parse 3 MiB
/// in a few hundred ms), shorter than the proxy's 5 s dial timeout.
const WAITING: Duration = Duration::from_millis(3500);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_deletecollections_waiting_on_the_target_keep_their_options_small() {
    let relay = Relay::unconnected().await;
    let h = harness_behind(&relay, AccessMode::Owned).await;
    let mut options = String::from(r#"{"kind":"DeleteOptions","apiVersion":"v1","x":["#);
    while options.len() < 3 * 1024 * 1024 - 2048 {
        options.push_str("0,");
    }
    options.push_str("0]}");
    let options = bytes::Bytes::from(options);

    // Every connection to the target, open or new, stops answering: each
    // deletecollection reads its options, then waits on its list.
    relay.freeze();
    reset_peak_rss();
    let before = peak_rss_kib();
    let requests = futures_util::future::join_all((0..8).map(|_| {
        let body = options.clone();
        let h = &h;
        async move { send(h, "DELETE", WIDGETS, Some("application/json"), body).await }
    }));
    tokio::select! {
        replies = requests => panic!(
            "answered while the target was frozen: {:?}",
            replies.iter().map(|r| r.status).collect::<Vec<_>>()
        ),
        () = tokio::time::sleep(WAITING) => {}
    }
    let growth = peak_rss_kib().saturating_sub(before);
    println!(
        "peak RSS growth under 8 deletecollections with 3 MiB options: {} MiB",
        growth / 1024
    );
    assert!(
        growth < PEAK_GROWTH_LIMIT_KIB,
        "8 deletecollections with 3 MiB options raised the peak RSS by {} MiB",
        growth / 1024
    );
    relay.thaw();
    h.proxy.shutdown().await;
}
