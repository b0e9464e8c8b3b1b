//! devcluster's integration tests (real kubectl against a devcluster), as one test
//! binary: each file here was a binary of its own, and each linked its own copy
//! of the API server. One binary builds them once and links once.
//!
//! One file's tests: `cargo test -p devcluster --test integration kubectl_access::`.

use std::future::Future;
use std::time::Duration;

mod aggregation_kubectl;
mod example_apiserver_kubectl;
mod kubectl;
mod kubectl_access;
mod raw_http;
mod reference_replay;
mod serve_for_manual;
mod webhooks_kubectl;

/// How often and how long a test waits for something the cluster does a little
/// later (the aggregator following a backend, the namespace controller).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Polling {
    /// At most this many attempts...
    pub attempts: u32,
    /// ...this far apart.
    pub pause: Duration,
}

impl Polling {
    /// The usual bounds: 100 attempts, 100 ms apart.
    pub(crate) const USUAL: Polling = Polling {
        attempts: 100,
        pause: Duration::from_millis(100),
    };
}

/// The first `Some` that `attempt` gives within `bounds`; `None` when every
/// attempt gave `None`. The pause uses tokio's clock, so a test with paused
/// time does not wait for it.
pub(crate) async fn poll<T, F, Fut>(bounds: Polling, mut attempt: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    for n in 0..bounds.attempts {
        if n > 0 {
            tokio::time::sleep(bounds.pause).await;
        }
        if let Some(answer) = attempt().await {
            return Some(answer);
        }
    }
    None
}

/// `poll` stops at the first answer, makes at most `attempts` attempts, and
/// pauses between attempts only (paused time: no real waiting).
#[tokio::test(start_paused = true)]
async fn polling_is_bounded_by_count_and_pause() {
    let start = tokio::time::Instant::now();
    let mut tries = 0;
    let never: Option<()> = poll(Polling::USUAL, || {
        tries += 1;
        async { None }
    })
    .await;
    assert_eq!((never, tries), (None, 100));
    assert_eq!(start.elapsed(), Duration::from_millis(99 * 100));

    let mut tries = 0;
    let third = poll(Polling::USUAL, || {
        tries += 1;
        let n = tries;
        async move { (n == 3).then_some(n) }
    })
    .await;
    assert_eq!((third, tries), (Some(3), 3));
}
