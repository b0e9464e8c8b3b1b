//! The pool's log lines operators search for: message substrings, levels, fields,
//! and how often they are written.

mod pool_support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crproxy_proxy::pool::{QUARANTINE_DURATION, STALENESS_TOLERANCE};
use pool_support::*;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

#[derive(Clone, Debug)]
struct Line {
    level: Level,
    message: String,
    fields: BTreeMap<String, String>,
}

/// Records every event on the current thread (the tests run on a current-thread
/// runtime, so pool code runs here too).
#[derive(Clone, Default)]
struct Capture {
    lines: Arc<Mutex<Vec<Line>>>,
    ids: Arc<AtomicU64>,
}

impl Capture {
    fn with_message(&self, fragment: &str) -> Vec<Line> {
        self.lines
            .lock()
            .expect("lock")
            .iter()
            .filter(|l| l.message.contains(fragment))
            .cloned()
            .collect()
    }
}

struct Fields(BTreeMap<String, String>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(
            field.name().to_owned(),
            format!("{value:?}").trim_matches('"').to_owned(),
        );
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl Subscriber for Capture {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(self.ids.fetch_add(1, Ordering::SeqCst) + 1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut fields = Fields(BTreeMap::new());
        event.record(&mut fields);
        let message = fields.0.remove("message").unwrap_or_default();
        self.lines.lock().expect("lock").push(Line {
            level: *event.metadata().level(),
            message,
            fields: fields.0,
        });
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

const QUARANTINE_LOG: &str = "quarantining proxy target peer host after consecutive dial failures";
const ALL_QUARANTINED_LOG: &str = "all peer hosts for the proxy target are quarantined";
const STALE_LOG: &str = "peer watch subscription is down and no fresh netmap is available";

#[tokio::test(start_paused = true)]
async fn quarantine_lines_carry_host_failures_and_target() {
    let capture = Capture::default();
    let _guard = tracing::subscriber::set_default(capture.clone());
    let h = Harness::new();
    let addr = refused_addr().await.to_string();
    h.pool.publish(vec![addr.clone()]);
    for _ in 0..3 {
        h.pool.acquire().await.expect_err("refused");
    }

    let lines = capture.with_message(QUARANTINE_LOG);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0].level, Level::WARN);
    assert_eq!(lines[0].fields["host"], addr);
    assert_eq!(lines[0].fields["consecutiveFailures"], "3");
    assert_eq!(lines[0].fields["target"], TARGET);

    let all = capture.with_message(ALL_QUARANTINED_LOG);
    assert_eq!(all.len(), 1, "{all:?}");
    assert_eq!(all[0].level, Level::ERROR);
    assert_eq!(all[0].fields["target"], TARGET);

    // The failed trial re-quarantines (logged again, one more failure) but the
    // outage is the same: no second all-quarantined line.
    tokio::time::sleep(QUARANTINE_DURATION).await;
    h.pool.acquire().await.expect_err("trial refused");
    let lines = capture.with_message(QUARANTINE_LOG);
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[1].fields["consecutiveFailures"], "4");
    assert_eq!(capture.with_message(ALL_QUARANTINED_LOG).len(), 1);
}

#[tokio::test(start_paused = true)]
async fn the_stale_line_is_written_once_per_outage_with_the_list_age() {
    let capture = Capture::default();
    let _guard = tracing::subscriber::set_default(capture.clone());
    let h = Harness::new();
    h.pool.publish(vec!["10.0.0.1:443".into()]);
    tokio::time::sleep(Duration::from_secs(15)).await;
    h.pool.subscription_dropped();
    tokio::time::sleep(STALENESS_TOLERANCE + Duration::from_secs(1)).await;
    for _ in 0..3 {
        h.pool.acquire().await.expect_err("stale");
    }
    let lines = capture.with_message(STALE_LOG);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0].fields["lastNetmapAge"], "76s");
    assert_eq!(lines[0].fields["target"], TARGET);

    // A new outage after a publication logs again.
    h.pool.publish(vec!["10.0.0.1:443".into()]);
    h.pool.subscription_dropped();
    tokio::time::sleep(STALENESS_TOLERANCE + Duration::from_secs(1)).await;
    h.pool.acquire().await.expect_err("stale again");
    assert_eq!(capture.with_message(STALE_LOG).len(), 2);
}
