use super::*;

#[tokio::test(start_paused = true)]
async fn keys_are_queued_once_and_never_worked_on_twice_at_once() {
    let q = WorkQueue::new();
    q.add("a");
    let first = Instant::now();
    tokio::time::advance(Duration::from_secs(1)).await;
    q.add("a");
    q.add("b");
    assert_eq!(q.depth(), 2);
    let (k, since) = q.next().await;
    assert_eq!((k, since), ("a", first), "first-add time is kept");
    // "a" is active: adding it again does not hand it out until done.
    q.add("a");
    let (k, _) = q.next().await;
    assert_eq!(k, "b");
    assert_eq!(q.depth(), 1, "the re-added a waits");
    q.done(&"b");
    q.done(&"a");
    let (k, _) = q.next().await;
    assert_eq!(k, "a");
    q.done(&"a");
    assert_eq!(q.depth(), 0);
}

#[tokio::test(start_paused = true)]
async fn add_after_waits() {
    let q = WorkQueue::new();
    let seen = Instant::now();
    q.add_after("x", Duration::from_secs(5), seen);
    tokio::task::yield_now().await;
    assert_eq!(q.depth(), 0);
    let got = tokio::time::timeout(Duration::from_secs(10), q.next()).await;
    assert_eq!(
        got,
        Ok(("x", seen)),
        "the first-seen time survives the retry"
    );
}

#[test]
fn backoff_doubles_from_5_ms_up_to_5_minutes() {
    let ms = |failures| backoff(failures).as_millis();
    assert_eq!(
        [0, 1, 2, 3, 10].map(ms),
        [5, 10, 20, 40, 5120],
        "client-go's item backoff"
    );
    assert_eq!(ms(16), 300_000, "5 ms * 2^16 is past the cap");
    assert_eq!(ms(u32::MAX), 300_000);
}

/// A failed key waits out its backoff: a resync leaves it alone, a change (a watch
/// event) queues it at once without starting the count over, and the retry scheduled
/// before the change is dropped rather than adding a second attempt.
#[tokio::test(start_paused = true)]
async fn a_failed_key_waits_for_its_retry_unless_it_changes() {
    let q = WorkQueue::new();
    let t0 = Instant::now();
    q.add("a");
    let (k, _) = q.next().await;
    let mut delays = Vec::new();
    for _ in 0..4 {
        delays.push(q.retry_failed(k, Duration::ZERO, t0));
        q.done(&k);
        q.resync(k);
        assert_eq!(q.depth(), 0, "a resync does not cut a backoff short");
        let (again, since) = tokio::time::timeout(Duration::from_secs(1), q.next())
            .await
            .expect("retried within its backoff");
        assert_eq!((again, since), (k, t0), "first-seen time kept");
    }
    assert_eq!(
        delays.iter().map(Duration::as_millis).collect::<Vec<_>>(),
        [5, 10, 20, 40]
    );
    assert_eq!(Instant::now() - t0, Duration::from_millis(75));

    // Fails again (80 ms backoff), then its object changes: handled at once.
    assert_eq!(
        q.retry_failed(k, Duration::ZERO, t0),
        Duration::from_millis(80)
    );
    q.done(&k);
    q.add(k);
    let (k, _) = q.next().await;
    assert_eq!(Instant::now() - t0, Duration::from_millis(75), "no wait");
    // The count goes on (only a success ends it, as in client-go, so an object
    // that changes often cannot keep a failing key at the shortest delays), and
    // the 80 ms retry of before is dropped.
    assert_eq!(
        q.retry_failed(k, Duration::ZERO, t0),
        Duration::from_millis(160)
    );
    q.done(&k);
    let (k, _) = q.next().await;
    assert_eq!(Instant::now() - t0, Duration::from_millis(235));
    q.forget(&k);
    q.done(&k);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(q.depth(), 0, "no stale retry fired");

    // A floor longer than the backoff wins.
    assert_eq!(
        q.retry_failed("b", Duration::from_secs(30), t0),
        Duration::from_secs(30)
    );
}

/// When many keys fail at once, the first hundred retries go after their own
/// backoff and the rest wait their turn at ten a second; a bucket left alone
/// fills up again.
#[tokio::test(start_paused = true)]
async fn retries_of_all_keys_share_ten_a_second_after_a_burst_of_a_hundred() {
    let q = WorkQueue::new();
    let t0 = Instant::now();
    let delays: Vec<Duration> = (0..150)
        .map(|key| q.retry_failed(key, Duration::ZERO, t0))
        .collect();
    assert!(
        delays[..100].iter().all(|d| *d == BACKOFF_BASE),
        "{delays:?}"
    );
    assert_eq!(delays[100], Duration::from_millis(100));
    assert_eq!(delays[149], Duration::from_secs(5));
    // Ten seconds later the debt of fifty is paid and fifty tokens are back.
    tokio::time::advance(Duration::from_secs(10)).await;
    let again: Vec<Duration> = (150..201)
        .map(|key| q.retry_failed(key, Duration::ZERO, t0))
        .collect();
    assert!(again[..50].iter().all(|d| *d == BACKOFF_BASE), "{again:?}");
    assert_eq!(again[50], Duration::from_millis(100));
    // A key's own longer backoff still wins over an early turn.
    tokio::time::advance(Duration::from_secs(60)).await;
    assert_eq!(
        q.retry_failed(1000, Duration::from_secs(30), t0),
        Duration::from_secs(30)
    );
}

/// Failures that outpace the rate (4 000 at once, or watch events re-failing keys)
/// never push a retry past the longest backoff.
#[tokio::test(start_paused = true)]
async fn a_retry_never_waits_past_the_longest_backoff_for_its_turn() {
    let q = WorkQueue::new();
    let t0 = Instant::now();
    let longest = (0..4_000)
        .map(|key| q.retry_failed(key, Duration::ZERO, t0))
        .max();
    assert_eq!(longest, Some(BACKOFF_CAP));
    // A second later the bucket has refilled ten turns of the floor's debt.
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(
        q.retry_failed(5_000, Duration::ZERO, t0),
        Duration::from_millis(299_100)
    );
}
