//! The pool's log lines operators search for: message substrings, levels, fields,
//! and how often they are written.
//!
//! Captured through the binary's one subscriber ([`LogBuffer`]); the tests run on
//! a current-thread runtime, so the pool's events happen on the capturing thread.

use crate::log_support;
use crate::pool_support;

use std::time::Duration;

use crproxy_proxy::pool::{QUARANTINE_DURATION, STALENESS_TOLERANCE};
use log_support::LogBuffer;
use pool_support::*;
use test_support::RefusedPort;
use tracing::Level;

const QUARANTINE_LOG: &str = "quarantining proxy target peer host after consecutive dial failures";
const ALL_QUARANTINED_LOG: &str = "all peer hosts for the proxy target are quarantined; requests fail fast with 503 until a peer becomes dialable";
const STALE_LOG: &str =
    "peer watch subscription is down and no fresh netmap is available; requests to the target fail with 503 until it recovers";

#[tokio::test(start_paused = true)]
async fn quarantine_lines_carry_host_failures_and_target() {
    let (logs, _guard) = LogBuffer::capture();
    let h = Harness::new();
    let refused = RefusedPort::bind();
    let addr = refused.addr.to_string();
    h.pool.publish(vec![addr.clone()]);
    for _ in 0..3 {
        h.pool.acquire().await.expect_err("refused");
    }

    let lines = logs.with_message(QUARANTINE_LOG);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0].level, Level::WARN);
    assert_eq!(lines[0].fields["host"], addr);
    assert_eq!(lines[0].fields["consecutiveFailures"], "3");
    assert_eq!(lines[0].fields["target"], TARGET);

    let all = logs.with_message(ALL_QUARANTINED_LOG);
    assert_eq!(all.len(), 1, "{all:?}");
    assert_eq!(all[0].level, Level::ERROR);
    assert_eq!(all[0].fields["target"], TARGET);

    // The failed trial re-quarantines (logged again, one more failure), which
    // leaves nothing selectable again: logged and counted again, as each such
    // transition is.
    tokio::time::sleep(QUARANTINE_DURATION).await;
    h.pool.acquire().await.expect_err("trial refused");
    let lines = logs.with_message(QUARANTINE_LOG);
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(lines[1].fields["consecutiveFailures"], "4");
    assert_eq!(logs.with_message(ALL_QUARANTINED_LOG).len(), 2);
}

#[tokio::test(start_paused = true)]
async fn the_stale_line_is_written_once_per_outage_with_the_list_age() {
    let (logs, _guard) = LogBuffer::capture();
    let h = Harness::new();
    h.pool.publish(vec!["10.0.0.1:443".into()]);
    tokio::time::sleep(Duration::from_secs(15)).await;
    h.pool.subscription_dropped();
    tokio::time::sleep(STALENESS_TOLERANCE + Duration::from_secs(1)).await;
    for _ in 0..3 {
        h.pool.acquire().await.expect_err("stale");
    }
    let lines = logs.with_message(STALE_LOG);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0].level, Level::ERROR);
    assert_eq!(lines[0].fields["lastNetmapAge"], "76s");
    assert_eq!(lines[0].fields["target"], TARGET);

    // A new outage after a publication logs again.
    h.pool.publish(vec!["10.0.0.1:443".into()]);
    h.pool.subscription_dropped();
    tokio::time::sleep(STALENESS_TOLERANCE + Duration::from_secs(1)).await;
    h.pool.acquire().await.expect_err("stale again");
    assert_eq!(logs.with_message(STALE_LOG).len(), 2);
}
