//! Runs a caller connection's HTTP/2 streams inside the connection's own task.
//!
//! hyper hands every HTTP/2 stream it accepts to an executor. With tokio's, each
//! stream is a task of its own: every request then costs a task spawn, and every
//! frame read for a stream, or written for it, is a wake-up from one task to the
//! other, often across worker threads, which moves the connection's state between
//! CPU caches. [`ConnectionStreams`] keeps the streams with the connection
//! instead: one task polls the connection and then whichever of its streams were
//! woken, as nginx serves a connection's streams from the worker that owns it.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use futures_util::future::{CatchUnwind, FutureExt as _};
use futures_util::stream::{FuturesUnordered, StreamExt};
use futures_util::task::{ArcWake, AtomicWaker};
use tokio::sync::mpsc;
use tokio::task::coop::Unconstrained;

type StreamFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// How a caller connection ended, as hyper reports it.
pub(crate) type ConnectionOutcome = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// A caller connection being served. Boxed as a trait object: the concrete
/// connection type's output, seen through generics, trips rustc's check that
/// the spawned task is `Send` (its higher-ranked lifetimes).
pub(crate) type ConnectionFuture = Pin<Box<dyn Future<Output = ConnectionOutcome> + Send>>;

/// How many times one poll of [`Serving`] goes round before it yields to the
/// scheduler when its connection and streams keep waking one another.
const ROUNDS_PER_POLL: usize = 16;

/// hyper's executor for one connection: streams it starts are run by the
/// [`StartedStreams`] made with it, in the task that serves the connection.
#[derive(Clone)]
pub(crate) struct ConnectionStreams {
    shared: Arc<Shared>,
    started: mpsc::UnboundedSender<StreamFuture>,
}

/// The serving side of [`ConnectionStreams`]: the streams hyper starts, until
/// [`StartedStreams::serve`] runs them.
pub(crate) struct StartedStreams {
    shared: Arc<Shared>,
    started: mpsc::UnboundedReceiver<StreamFuture>,
}

#[derive(Default)]
struct Shared {
    /// The serving task, woken when a stream is started or woken from elsewhere.
    serving_task: AtomicWaker,
    /// Whether the serving task is in the middle of a poll.
    in_poll: AtomicBool,
    /// Whether anything woke the connection or a stream since the serving
    /// task's current round began.
    woken: AtomicBool,
    /// Whether the connection itself was woken since it was last polled: a round
    /// that only a stream asked for leaves it alone.
    connection_woken: AtomicBool,
}

/// The waker the streams are polled with. A wake during the serving task's own
/// poll (a stream has the connection's data to read) only asks for another round
/// of that poll: waking the running task would have tokio queue it behind others
/// and unpark the other worker thread to steal it, moving the connection to
/// another CPU once per request.
impl ArcWake for Shared {
    fn wake_by_ref(shared: &Arc<Self>) {
        shared.ask_for_round();
    }
}

/// The waker the connection is polled with: as a stream's, and the next round
/// polls the connection too.
struct ConnectionWaker(Arc<Shared>);

impl ArcWake for ConnectionWaker {
    fn wake_by_ref(waker: &Arc<Self>) {
        waker.0.connection_woken.store(true, Ordering::SeqCst);
        waker.0.ask_for_round();
    }
}

impl Shared {
    fn ask_for_round(&self) {
        self.woken.store(true, Ordering::SeqCst);
        self.wake_task_unless_polling();
    }

    fn wake_task_unless_polling(&self) {
        if !self.in_poll.load(Ordering::SeqCst) {
            self.serving_task.wake();
        }
    }

    /// Marks the serving task as polling and clears what asked for this round.
    fn begin_round(&self) {
        self.in_poll.store(true, Ordering::SeqCst);
        // A swap, not a store: reading the flag a waker set also makes what it
        // wrote before (a queued stream, delivered data) visible here.
        self.woken.swap(false, Ordering::SeqCst);
    }

    /// Ends a round; whether a wake-up asked for another one meanwhile. The
    /// fence pairs with the one in `execute`: either the queue is then seen
    /// holding what `execute` sent, or `execute` sees the poll over and wakes
    /// the task.
    fn end_round(&self) -> bool {
        self.in_poll.store(false, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        self.woken.load(Ordering::SeqCst)
    }
}

impl ConnectionStreams {
    /// An executor for one connection, and the side that serves what it starts.
    pub(crate) fn new() -> (ConnectionStreams, StartedStreams) {
        let shared = Arc::new(Shared::default());
        let (sender, receiver) = mpsc::unbounded_channel();
        let executor = ConnectionStreams {
            shared: Arc::clone(&shared),
            started: sender,
        };
        let served = StartedStreams {
            shared,
            started: receiver,
        };
        (executor, served)
    }
}

/// hyper starts streams from the connection's poll, whose round then takes
/// them: a started stream asks for no round of its own.
impl<F> hyper::rt::Executor<F> for ConnectionStreams
where
    F: Future<Output = ()> + Send + 'static,
{
    fn execute(&self, stream: F) {
        // Refused only once the connection is no longer served; the stream is
        // dropped with it, as hyper drops what the connection ends.
        if self.started.send(Box::pin(stream)).is_ok() {
            fence(Ordering::SeqCst);
            self.shared.wake_task_unless_polling();
        }
    }
}

impl StartedStreams {
    /// Drives `connection` and the streams it starts until the connection has
    /// ended and every stream has finished, as spawned streams would, and
    /// resolves to what the connection ended with. Streams hyper started but
    /// never ran are dropped with the returned future.
    pub(crate) fn serve(self, connection: ConnectionFuture) -> Serving {
        self.shared.connection_woken.store(true, Ordering::SeqCst);
        Serving {
            stream_waker: futures_util::task::waker(Arc::clone(&self.shared)),
            connection_waker: futures_util::task::waker(Arc::new(ConnectionWaker(Arc::clone(
                &self.shared,
            )))),
            started: self,
            connection: ConnectionState::Open(connection),
            running: FuturesUnordered::new(),
        }
    }
}

/// A stream as the serving task runs it. tokio's cooperative budget belongs to
/// a task, and every stream of the connection now shares one: without
/// `unconstrained`, a busy connection would spend it on its first few streams,
/// and the rest would find their sockets "not ready" and their pooled target
/// connections looking closed. What bounds one stream's turn instead is its own
/// work: h2 takes at most its send buffer (400 KiB) from a body before the
/// connection must write, and request bodies are read to a limit.
/// FuturesUnordered itself yields once it has polled as many streams as it
/// holds. `catch_unwind` ends a stream that panics alone, as a task of its own
/// would end: h2 resets it (CANCEL) once it is dropped, and the connection's
/// other streams go on.
type RunningStream = Unconstrained<CatchUnwind<AssertUnwindSafe<StreamFuture>>>;

/// Where the connection itself is.
enum ConnectionState {
    Open(ConnectionFuture),
    /// Ended with this outcome, kept until the last stream finishes. The
    /// connection was dropped as it ended, as a spawned one would be: h2 fails
    /// the streams still open when its connection is dropped, and some of its
    /// error paths (a failed write) rely on that to end them.
    Ended(ConnectionOutcome),
    /// The outcome has been returned.
    Returned,
}

/// A connection and its streams, served together: see [`StartedStreams::serve`].
pub(crate) struct Serving {
    started: StartedStreams,
    /// Wakes `started.shared` as a stream: see its `ArcWake`.
    stream_waker: Waker,
    /// Wakes it as the connection: see [`ConnectionWaker`].
    connection_waker: Waker,
    connection: ConnectionState,
    running: FuturesUnordered<RunningStream>,
}

impl Serving {
    /// Polls the connection if it was woken, then starts and polls its streams.
    fn round(&mut self) {
        let shared = &self.started.shared;
        if let ConnectionState::Open(connection) = &mut self.connection {
            if shared.connection_woken.swap(false, Ordering::SeqCst) {
                let mut cx = Context::from_waker(&self.connection_waker);
                if let Poll::Ready(outcome) = connection.as_mut().poll(&mut cx) {
                    self.connection = ConnectionState::Ended(outcome);
                }
            }
        }
        while let Ok(stream) = self.started.started.try_recv() {
            self.running.push(tokio::task::coop::unconstrained(
                AssertUnwindSafe(stream).catch_unwind(),
            ));
        }
        let mut cx = Context::from_waker(&self.stream_waker);
        while let Poll::Ready(Some(finished)) = self.running.poll_next_unpin(&mut cx) {
            if finished.is_err() {
                tracing::error!("serving a caller's request panicked; its stream is reset");
            }
        }
    }
}

impl Future for Serving {
    type Output = ConnectionOutcome;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<ConnectionOutcome> {
        let this = &mut *self;
        this.started.shared.serving_task.register(cx.waker());
        for _ in 0..ROUNDS_PER_POLL {
            this.started.shared.begin_round();
            this.round();
            // Streams started from elsewhere than the connection's poll (another
            // stream's, another thread) wait in the queue for the next round.
            let woken = this.started.shared.end_round();
            let queued = !this.started.started.is_empty();
            let more = woken || queued;
            let finished = this.running.is_empty() && !queued;
            if finished && matches!(this.connection, ConnectionState::Ended(_)) {
                if let ConnectionState::Ended(outcome) =
                    std::mem::replace(&mut this.connection, ConnectionState::Returned)
                {
                    return Poll::Ready(outcome);
                }
            }
            if !more {
                return Poll::Pending;
            }
        }
        // Still being woken: let the scheduler run other tasks first.
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

#[cfg(test)]
mod tests;
