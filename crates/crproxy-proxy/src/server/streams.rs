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
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Waker};

use futures_util::future::{CatchUnwind, FutureExt as _};
use futures_util::stream::{FuturesUnordered, StreamExt};
use futures_util::task::{ArcWake, AtomicWaker};
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

/// hyper's executor for one connection: streams it starts are run by
/// [`ConnectionStreams::serve`], in the task that serves the connection.
#[derive(Clone, Default)]
pub(crate) struct ConnectionStreams {
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    /// Streams hyper started that the serving task has not taken yet.
    started: Mutex<Vec<StreamFuture>>,
    /// Whether `started` may hold streams: set after each is queued, so a round
    /// without new streams does not take the lock.
    has_started: AtomicBool,
    /// The serving task, woken when a stream is started or woken from elsewhere.
    serving_task: AtomicWaker,
    /// Whether the serving task is in the middle of a poll.
    in_poll: AtomicBool,
    /// Whether anything woke the connection or a stream since the serving
    /// task's current round began.
    woken: AtomicBool,
}

/// The waker the connection and its streams are polled with. A wake during the
/// serving task's own poll (the connection has a stream's frame to write, or a
/// stream has the connection's data to read) only asks for another round of
/// that poll: waking the running task would have tokio queue it behind others
/// and unpark the other worker thread to steal it, moving the connection to
/// another CPU once per request.
impl ArcWake for Shared {
    fn wake_by_ref(shared: &Arc<Self>) {
        shared.woken.store(true, Ordering::SeqCst);
        shared.wake_task_unless_polling();
    }
}

impl Shared {
    /// Marks the serving task as polling and clears what asked for this round.
    fn begin_round(&self) {
        self.in_poll.store(true, Ordering::SeqCst);
        // A swap, not a store: reading the flag a waker set also makes what it
        // wrote before (a queued stream, delivered data) visible here.
        self.woken.swap(false, Ordering::SeqCst);
    }

    /// Ends a round; whether something asked for another one meanwhile.
    fn end_round(&self) -> bool {
        self.in_poll.store(false, Ordering::SeqCst);
        self.woken.load(Ordering::SeqCst) || self.has_started.load(Ordering::SeqCst)
    }

    fn wake_task_unless_polling(&self) {
        if !self.in_poll.load(Ordering::SeqCst) {
            self.serving_task.wake();
        }
    }
}

/// hyper starts streams from the connection's poll, whose round then takes
/// them: a started stream asks for no round of its own.
impl<F> hyper::rt::Executor<F> for ConnectionStreams
where
    F: Future<Output = ()> + Send + 'static,
{
    fn execute(&self, stream: F) {
        self.shared
            .started
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Box::pin(stream));
        self.shared.has_started.store(true, Ordering::SeqCst);
        self.shared.wake_task_unless_polling();
    }
}

impl ConnectionStreams {
    /// Drives `connection` and the streams it starts until the connection has
    /// ended and every stream has finished, as spawned streams would, and
    /// resolves to what the connection ended with.
    pub(crate) fn serve(&self, connection: ConnectionFuture) -> Serving {
        Serving {
            waker: futures_util::task::waker(Arc::clone(&self.shared)),
            streams: self.clone(),
            connection: ConnectionState::Open(connection),
            running: FuturesUnordered::new(),
        }
    }

    /// Moves the streams started since the last call into `running` (without
    /// taking the lock when none was). The queue keeps its allocation.
    fn run_started(&self, running: &mut FuturesUnordered<RunningStream>) {
        if !self.shared.has_started.swap(false, Ordering::SeqCst) {
            return;
        }
        running.extend(self.lock_started().drain(..).map(|stream| {
            tokio::task::coop::unconstrained(AssertUnwindSafe(stream).catch_unwind())
        }));
    }

    fn lock_started(&self) -> std::sync::MutexGuard<'_, Vec<StreamFuture>> {
        self.shared
            .started
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
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

/// A connection and its streams, served together: see [`ConnectionStreams::serve`].
pub(crate) struct Serving {
    streams: ConnectionStreams,
    /// Wakes `streams.shared`: see its `ArcWake`.
    waker: Waker,
    connection: ConnectionState,
    running: FuturesUnordered<RunningStream>,
}

/// Streams hyper started but the serving task never took hold the executor,
/// and with it the queue they sit in: dropped here, or that cycle would keep
/// them for ever.
impl Drop for Serving {
    fn drop(&mut self) {
        drop(std::mem::take(&mut *self.streams.lock_started()));
    }
}

impl Serving {
    /// Polls the connection, then starts and polls its streams.
    fn round(&mut self) {
        let mut cx = Context::from_waker(&self.waker);
        if let ConnectionState::Open(connection) = &mut self.connection {
            if let Poll::Ready(outcome) = connection.as_mut().poll(&mut cx) {
                self.connection = ConnectionState::Ended(outcome);
            }
        }
        self.streams.run_started(&mut self.running);
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
        this.streams.shared.serving_task.register(cx.waker());
        for _ in 0..ROUNDS_PER_POLL {
            this.streams.shared.begin_round();
            this.round();
            let more = this.streams.shared.end_round();
            if this.running.is_empty() && matches!(this.connection, ConnectionState::Ended(_)) {
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
