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
