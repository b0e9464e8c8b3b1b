//! A replica's memory under concurrent large write bodies stays bounded: every
//! body is capped at 3 MiB and parses run under a memory budget, so 8 callers
//! sending 3 MiB bodies that expand the most when parsed (small numbers: ~17x)
//! raise the process's peak RSS by less than 150 MiB, and 8 callers sending
//! 15 MiB bodies are refused before their bodies are read.
//!
//! Its own test binary (own process), so other tests cannot move the peak. The
//! peak is reset through `/proc/self/clear_refs` and read from `VmHWM`.

mod target_support;

use crproxy_core::config::AccessMode;
use target_support::{
    harness, peak_rss_kib, reset_peak_rss, send, widget_object, OWNER_LABELS, WIDGETS,
};

/// The bound the issue sets for a replica under this load.
const PEAK_GROWTH_LIMIT_KIB: u64 = 150 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_concurrent_three_mebibyte_bodies_stay_under_150_mib() {
    let h = harness(AccessMode::Owned).await;
    // A strategic merge patch of an owned object: the proxy reads, parses, labels
    // and pins the body; the target refuses that media type for a custom resource
    // before parsing it (415), so only the proxy's memory is measured.
    h.widgets
        .create(
            &kube::api::PostParams::default(),
            &widget_object("held", serde_json::from_str(OWNER_LABELS).expect("labels")),
        )
        .await
        .expect("owned widget");
    let mut body = String::from(r#"{"spec":{"x":["#);
    // Just under the limit, leaving room for the labels and pins the proxy adds.
    while body.len() < 3 * 1024 * 1024 - 2048 {
        body.push_str("0,");
    }
    body.push_str("0]}}");
    let body = bytes::Bytes::from(body);

    reset_peak_rss();
    let before = peak_rss_kib();
    let requests = (0..8).map(|_| {
        let body = body.clone();
        let h = &h;
        async move {
            send(
                h,
                "PATCH",
                &format!("{WIDGETS}/held"),
                Some("application/strategic-merge-patch+json"),
                body,
            )
            .await
        }
    });
    let replies = futures_util::future::join_all(requests).await;
    let growth = peak_rss_kib().saturating_sub(before);
    for reply in &replies {
        assert_eq!(reply.status, 415, "{:?}", reply.body);
    }
    println!(
        "peak RSS growth under 8 concurrent 3 MiB bodies: {} MiB",
        growth / 1024
    );
    assert!(
        growth < PEAK_GROWTH_LIMIT_KIB,
        "peak RSS grew by {} MiB",
        growth / 1024
    );

    // Bodies far over the limit (15 MiB) are refused before they are read.
    let mut huge = String::from(r#"{"spec":{"x":["#);
    while huge.len() < 15 * 1024 * 1024 {
        huge.push_str("0,");
    }
    huge.push_str("0]}}");
    let huge = bytes::Bytes::from(huge);
    reset_peak_rss();
    let before = peak_rss_kib();
    let requests = (0..8).map(|_| {
        let body = huge.clone();
        let h = &h;
        async move {
            send(
                h,
                "PATCH",
                &format!("{WIDGETS}/held"),
                Some("application/merge-patch+json"),
                body,
            )
            .await
        }
    });
    let replies = futures_util::future::join_all(requests).await;
    let growth = peak_rss_kib().saturating_sub(before);
    println!(
        "peak RSS growth under 8 concurrent 15 MiB bodies: {} MiB",
        growth / 1024
    );
    for reply in &replies {
        assert_eq!(reply.status, 413, "{:?}", reply.body);
    }
    assert!(
        growth < PEAK_GROWTH_LIMIT_KIB,
        "peak RSS grew by {} MiB",
        growth / 1024
    );
    h.proxy.shutdown().await;
}
