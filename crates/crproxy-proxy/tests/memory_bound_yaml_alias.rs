//! YAML aliases cannot make write bodies escape the parse memory budget.
//!
//! A ~70 KB YAML create whose aliases repeat one 64 KiB string a thousand times
//! reads as a 64 MiB document. Before the expansion was counted, each such body
//! was admitted for the size of its text, then built, written out as JSON and
//! labelled: eight at once raised the peak RSS by some 700 MiB, and a few hundred
//! (the in-flight limit is 400) would exhaust a node. Such a document could never
//! be stored: its JSON is over the target's 3 MiB body limit, so the proxy answers
//! 413 as the target would, before building it.
//!
//! Its own test binary (own process), so other tests cannot move the peak.

mod target_support;

use crproxy_core::config::AccessMode;
use target_support::{harness, peak_rss_kib, reset_peak_rss, send, WIDGETS};

const PEAK_GROWTH_LIMIT_KIB: u64 = 150 * 1024;

/// A Widget whose `spec.copies` aliases a 64 KiB anchored scalar 1000 times,
/// with one more anchor per ten aliases to satisfy saphyr's alias/anchor ratio.
fn alias_bomb(name: &str) -> String {
    let mut body = format!(
        "apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: {name}\n  namespace: demo\nspec:\n  big: &b \"{}\"\n  anchors: [",
        "x".repeat(64 * 1024)
    );
    for i in 0..101 {
        body.push_str(&format!("&a{i} 0,"));
    }
    body.push_str("0]\n  copies: [");
    for _ in 0..1000 {
        body.push_str("*b,");
    }
    body.push_str("0]\n");
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_concurrent_yaml_alias_creates_stay_under_150_mib() {
    let h = harness(AccessMode::Owned).await;
    let size = alias_bomb("bomb-0").len();
    reset_peak_rss();
    let before = peak_rss_kib();
    let requests = (0..8).map(|i| {
        let h = &h;
        async move {
            send(
                h,
                "POST",
                WIDGETS,
                Some("application/yaml"),
                alias_bomb(&format!("bomb-{i}")),
            )
            .await
        }
    });
    let replies = futures_util::future::join_all(requests).await;
    let growth = peak_rss_kib().saturating_sub(before);
    println!(
        "peak RSS growth under 8 concurrent {size}-byte YAML creates: {} MiB; answers {:?}",
        growth / 1024,
        replies.iter().map(|r| r.status).collect::<Vec<_>>()
    );
    for reply in &replies {
        assert_eq!(reply.status, 413, "{}", reply.body);
        assert_eq!(
            reply.body["reason"], "RequestEntityTooLarge",
            "{}",
            reply.body
        );
    }
    assert!(
        growth < PEAK_GROWTH_LIMIT_KIB,
        "8 YAML bodies of {size} bytes each raised the peak RSS by {} MiB",
        growth / 1024
    );
    h.proxy.shutdown().await;
}
