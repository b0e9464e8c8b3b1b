use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use hyper::rt::Executor;
use tokio::sync::oneshot;

use super::*;

/// The serving task's own waker: counts how often it is woken.
#[derive(Default)]
struct CountingWaker(AtomicUsize);

impl ArcWake for CountingWaker {
    fn wake_by_ref(counter: &Arc<Self>) {
        counter.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn counting_waker() -> (Arc<CountingWaker>, Waker) {
    let counter = Arc::new(CountingWaker::default());
    let waker = futures_util::task::waker(Arc::clone(&counter));
    (counter, waker)
}

fn wakes(counter: &CountingWaker) -> usize {
    counter.0.load(Ordering::SeqCst)
}

/// A connection that starts `streams` on its first poll and then ends.
fn connection_starting(
    executor: &ConnectionStreams,
    streams: Vec<StreamFuture>,
) -> ConnectionFuture {
    let executor = executor.clone();
    Box::pin(async move {
        for stream in streams {
            executor.execute(stream);
        }
        Ok(())
    })
}

/// A connection that starts `stream` on its first poll and stays open, never
/// waking itself; with the count of its polls.
fn open_connection_starting(
    executor: &ConnectionStreams,
    stream: StreamFuture,
) -> (ConnectionFuture, Arc<AtomicUsize>) {
    let executor = executor.clone();
    let polls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&polls);
    let mut stream = Some(stream);
    let connection: ConnectionFuture = Box::pin(std::future::poll_fn(move |_| {
        counted.fetch_add(1, Ordering::SeqCst);
        if let Some(stream) = stream.take() {
            executor.execute(stream);
        }
        Poll::Pending
    }));
    (connection, polls)
}

/// A future that is pending on its first `pending_polls` polls, waking itself
/// each time, and then ready.
fn woken_by_itself(pending_polls: usize, finished: Arc<AtomicUsize>) -> StreamFuture {
    let mut polls = 0;
    Box::pin(std::future::poll_fn(move |cx| {
        if polls < pending_polls {
            polls += 1;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        finished.fetch_add(1, Ordering::SeqCst);
        Poll::Ready(())
    }))
}

#[test]
fn a_stream_woken_while_the_connection_is_served_runs_again_in_the_same_poll() {
    let (streams, served) = ConnectionStreams::new();
    let finished = Arc::new(AtomicUsize::new(0));
    let connection = connection_starting(&streams, vec![woken_by_itself(3, Arc::clone(&finished))]);
    let mut serving = served.serve(connection);
    let (counter, waker) = counting_waker();

    let polled = Pin::new(&mut serving).poll(&mut Context::from_waker(&waker));

    assert!(matches!(polled, Poll::Ready(Ok(()))), "{polled:?}");
    assert_eq!(finished.load(Ordering::SeqCst), 1);
    assert_eq!(
        wakes(&counter),
        0,
        "a wake-up during the serving poll must not reschedule the task"
    );
}

#[test]
fn the_connection_ends_after_its_last_stream_and_wakes_from_elsewhere_reach_the_task() {
    let (streams, served) = ConnectionStreams::new();
    let (answer, answered) = oneshot::channel::<()>();
    let connection = connection_starting(
        &streams,
        vec![Box::pin(async move {
            let _ = answered.await;
        })],
    );
    let mut serving = served.serve(connection);
    let (counter, waker) = counting_waker();
    let mut cx = Context::from_waker(&waker);

    assert!(Pin::new(&mut serving).poll(&mut cx).is_pending());
    assert_eq!(wakes(&counter), 0);
    answer.send(()).expect("the stream is waiting");
    assert_eq!(wakes(&counter), 1, "the stream's wake-up reaches the task");
    assert!(matches!(
        Pin::new(&mut serving).poll(&mut cx),
        Poll::Ready(Ok(()))
    ));
}

#[test]
fn a_stream_that_panics_ends_alone() {
    let (streams, served) = ConnectionStreams::new();
    let finished = Arc::new(AtomicUsize::new(0));
    let connection = connection_starting(
        &streams,
        vec![
            woken_by_itself(1, Arc::clone(&finished)),
            Box::pin(async { panic!("a handler's bug") }),
            woken_by_itself(2, Arc::clone(&finished)),
        ],
    );
    let mut serving = served.serve(connection);
    let (_, waker) = counting_waker();

    let polled = Pin::new(&mut serving).poll(&mut Context::from_waker(&waker));

    assert!(matches!(polled, Poll::Ready(Ok(()))), "{polled:?}");
    assert_eq!(finished.load(Ordering::SeqCst), 2);
}

#[test]
fn a_connection_that_keeps_waking_itself_yields_to_the_scheduler() {
    let (_, served) = ConnectionStreams::new();
    let polls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&polls);
    let busy: ConnectionFuture = Box::pin(std::future::poll_fn(move |cx| {
        counted.fetch_add(1, Ordering::SeqCst);
        cx.waker().wake_by_ref();
        Poll::Pending
    }));
    let mut serving = served.serve(busy);
    let (counter, waker) = counting_waker();

    assert!(Pin::new(&mut serving)
        .poll(&mut Context::from_waker(&waker))
        .is_pending());
    assert_eq!(polls.load(Ordering::SeqCst), ROUNDS_PER_POLL);
    assert_eq!(wakes(&counter), 1, "it asks to be polled again");
}

#[tokio::test]
async fn no_stream_is_refused_for_the_budget_other_streams_spent() {
    // tokio's budget is 128 operations a poll; more streams than that, each
    // using one, would exhaust a budget they shared.
    const STREAMS: usize = 300;
    let (streams, served) = ConnectionStreams::new();
    let short_of_budget = Arc::new(AtomicUsize::new(0));
    let started = (0..STREAMS)
        .map(|_| {
            let short_of_budget = Arc::clone(&short_of_budget);
            Box::pin(async move {
                tokio::task::coop::consume_budget().await;
                if !tokio::task::coop::has_budget_remaining() {
                    short_of_budget.fetch_add(1, Ordering::SeqCst);
                }
            }) as StreamFuture
        })
        .collect();

    let ended = tokio::time::timeout(
        Duration::from_secs(10),
        served.serve(connection_starting(&streams, started)),
    )
    .await
    .expect("the streams finish");

    assert!(ended.is_ok());
    assert_eq!(short_of_budget.load(Ordering::SeqCst), 0);
}

#[test]
fn a_stream_that_waits_holds_up_neither_the_others_nor_the_connection() {
    let (streams, served) = ConnectionStreams::new();
    let finished = Arc::new(AtomicUsize::new(0));
    let (_never_answered, waiting) = oneshot::channel::<()>();
    let executor = streams.clone();
    let started = Arc::clone(&finished);
    // Starts a stream that waits for ever (a watch, say) and, on its next poll,
    // one more that finishes; it ends on the poll after that.
    let mut polls = 0;
    let mut waiting = Some(waiting);
    let connection: ConnectionFuture = Box::pin(std::future::poll_fn(move |cx| {
        polls += 1;
        match polls {
            1 => {
                let waiting = waiting.take().expect("taken on the first poll only");
                executor.execute(Box::pin(async move {
                    let _ = waiting.await;
                }) as StreamFuture);
            }
            2 => executor.execute(woken_by_itself(0, Arc::clone(&started))),
            _ => return Poll::Ready(Ok(())),
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }));
    let mut serving = served.serve(connection);
    let (_, waker) = counting_waker();

    let polled = Pin::new(&mut serving).poll(&mut Context::from_waker(&waker));

    assert!(polled.is_pending(), "one stream is still waiting");
    assert_eq!(finished.load(Ordering::SeqCst), 1);
    assert!(
        matches!(serving.connection, ConnectionState::Ended(_)),
        "the connection has ended"
    );
}

#[test]
fn an_ended_connection_is_dropped_at_once_not_when_its_last_stream_ends() {
    // h2 fails the streams still open when its connection is dropped; a stream
    // waiting on the connection (here, on a channel it holds) must see that.
    let (streams, served) = ConnectionStreams::new();
    let (kept_by_the_connection, waited_on) = oneshot::channel::<()>();
    let executor = streams.clone();
    let mut waited_on = Some(waited_on);
    let mut polls = 0;
    let connection: ConnectionFuture = Box::pin(std::future::poll_fn(move |cx| {
        let _holds = &kept_by_the_connection;
        polls += 1;
        if polls > 1 {
            return Poll::Ready(Ok(()));
        }
        let waited_on = waited_on.take().expect("taken on the first poll only");
        executor.execute(Box::pin(async move {
            let _ = waited_on.await;
        }) as StreamFuture);
        cx.waker().wake_by_ref();
        Poll::Pending
    }));
    let mut serving = served.serve(connection);
    let (_, waker) = counting_waker();

    let polled = Pin::new(&mut serving).poll(&mut Context::from_waker(&waker));

    assert!(
        matches!(polled, Poll::Ready(Ok(()))),
        "the stream ended with its connection: {polled:?}"
    );
}

#[test]
fn a_stream_the_connection_starts_runs_in_the_same_round() {
    let (streams, served) = ConnectionStreams::new();
    let finished = Arc::new(AtomicUsize::new(0));
    let (connection, connection_polls) =
        open_connection_starting(&streams, woken_by_itself(0, Arc::clone(&finished)));
    let mut serving = served.serve(connection);
    let (counter, waker) = counting_waker();

    let polled = Pin::new(&mut serving).poll(&mut Context::from_waker(&waker));

    assert!(polled.is_pending());
    assert_eq!(finished.load(Ordering::SeqCst), 1);
    assert_eq!(
        connection_polls.load(Ordering::SeqCst),
        1,
        "starting a stream costs no second round"
    );
    assert_eq!(wakes(&counter), 0);
}

#[test]
fn a_round_only_a_stream_asked_for_leaves_the_connection_alone() {
    let (streams, served) = ConnectionStreams::new();
    let (answer, answered) = oneshot::channel::<()>();
    let waiting: StreamFuture = Box::pin(async move {
        let _ = answered.await;
    });
    let (connection, connection_polls) = open_connection_starting(&streams, waiting);
    let mut serving = served.serve(connection);
    let (counter, waker) = counting_waker();
    let mut cx = Context::from_waker(&waker);

    assert!(Pin::new(&mut serving).poll(&mut cx).is_pending());
    answer.send(()).expect("the stream is waiting");
    assert_eq!(wakes(&counter), 1, "the stream's wake-up reaches the task");
    assert!(Pin::new(&mut serving).poll(&mut cx).is_pending());

    assert!(serving.running.is_empty(), "the stream has finished");
    assert_eq!(
        connection_polls.load(Ordering::SeqCst),
        1,
        "nothing woke the connection"
    );
}

#[test]
fn a_stream_started_by_another_stream_runs_in_the_same_poll() {
    // As hyper starts an upgraded connection's task from a stream's poll.
    let (streams, served) = ConnectionStreams::new();
    let finished = Arc::new(AtomicUsize::new(0));
    let executor = streams.clone();
    let started = Arc::clone(&finished);
    let starter: StreamFuture = Box::pin(async move {
        executor.execute(woken_by_itself(0, Arc::clone(&started)));
        started.fetch_add(1, Ordering::SeqCst);
    });
    let mut serving = served.serve(connection_starting(&streams, vec![starter]));
    let (counter, waker) = counting_waker();

    let polled = Pin::new(&mut serving).poll(&mut Context::from_waker(&waker));

    assert!(matches!(polled, Poll::Ready(Ok(()))), "{polled:?}");
    assert_eq!(finished.load(Ordering::SeqCst), 2);
    assert_eq!(wakes(&counter), 0);
}

#[test]
fn streams_never_run_are_dropped_with_the_serving_future() {
    // A stream holds its connection's executor (hyper's H2Stream does), which
    // holds the queue it waits in: that cycle must not outlive the serving.
    let (streams, served) = ConnectionStreams::new();
    let held = Arc::new(());
    let executor = streams.clone();
    let in_stream = Arc::clone(&held);
    streams.execute(Box::pin(async move {
        let _ = (&executor, &in_stream);
    }) as StreamFuture);
    drop(streams);
    let serving = served.serve(Box::pin(std::future::pending()));

    drop(serving);

    assert_eq!(Arc::strong_count(&held), 1, "the queued stream was dropped");
}
