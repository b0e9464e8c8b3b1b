//! Watch delivery latency: open watches through a path, write on the target, and
//! time how long each event takes to arrive on every watch.
//!
//! Events are recognised by object name (`<marker><seq>`) with a byte search, not
//! a JSON parse: with 1 000 watches every event is read 1 000 times, and the
//! driver's own parsing cost would otherwise show up as latency.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BytesMut};
use http::Method;
use http_body_util::BodyExt;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::driver::{DriverError, Endpoint};

/// How long [`WatchSet::open`] waits for further response heads before it
/// leaves the rest to an event.
pub const HEAD_QUIET: Duration = Duration::from_secs(3);

/// The sequence number of the event that primes watches whose heads were held.
pub const PRIME_SEQ: u64 = 999_999_999;

/// Splits a byte stream into newline-terminated lines across frame boundaries.
#[derive(Default)]
pub struct LineSplitter {
    pending: BytesMut,
}

impl LineSplitter {
    /// Adds a frame and calls `line` for every line it completes (without `\n`).
    pub fn push(&mut self, data: &[u8], mut line: impl FnMut(&[u8])) {
        self.pending.extend_from_slice(data);
        while let Some(end) = self.pending.iter().position(|b| *b == b'\n') {
            line(&self.pending[..end]);
            self.pending.advance(end + 1);
        }
    }
}

/// The sequence number in an event line naming the object `<marker><seq>`:
/// the digits after the first `"name":"<marker>`.
pub fn event_seq(line: &[u8], marker: &str) -> Option<u64> {
    let needle = format!("\"name\":\"{marker}");
    let needle = needle.as_bytes();
    let start = line.windows(needle.len()).position(|w| w == needle)? + needle.len();
    let digits: &[u8] = &line[start..];
    let end = digits
        .iter()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(digits.len());
    std::str::from_utf8(&digits[..end]).ok()?.parse().ok()
}

/// An event seen on one watch.
#[derive(Clone, Copy, Debug)]
struct Arrival {
    seq: u64,
    at: Instant,
}

/// Open watches and the events they deliver.
pub struct WatchSet {
    arrivals: mpsc::UnboundedReceiver<Arrival>,
    tasks: Vec<JoinHandle<()>>,
    /// Watches whose response head arrived with 200.
    pub established: usize,
    /// Watches that failed to open, and the first reason.
    pub failed: usize,
    pub first_error: Option<String>,
}

impl WatchSet {
    /// Opens `count` watches of `path_and_query` and waits (up to `limit`) until
    /// every one has its response head, or until no head arrived for
    /// [`HEAD_QUIET`]: some proxies (nginx over HTTP/2) hold the head of a
    /// streaming response back until its first data, so the caller primes such
    /// watches with an event (see [`WatchSet::prime`]).
    pub async fn open(
        endpoint: Arc<Endpoint>,
        path_and_query: &str,
        count: usize,
        marker: &str,
        limit: Duration,
    ) -> Result<Self, DriverError> {
        let senders = endpoint.senders(count).await?;
        let (arrival_tx, arrivals) = mpsc::unbounded_channel();
        let (head_tx, mut heads) = mpsc::unbounded_channel::<Result<(), String>>();
        let mut tasks = Vec::with_capacity(count);
        for mut sender in senders {
            let request = endpoint.request(Method::GET, path_and_query, None)?;
            let arrival_tx = arrival_tx.clone();
            let head_tx = head_tx.clone();
            let marker = marker.to_string();
            let label = endpoint.label.clone();
            tasks.push(tokio::spawn(async move {
                let response = match sender.send(request).await {
                    Ok(r) if r.status().is_success() => r,
                    Ok(r) => {
                        let status = r.status();
                        let body = r.into_body().collect().await.map(|c| c.to_bytes());
                        let text = body
                            .map(|b| String::from_utf8_lossy(&b[..b.len().min(300)]).into_owned())
                            .unwrap_or_default();
                        let _ = head_tx.send(Err(format!("{label} answered {status}: {text}")));
                        return;
                    }
                    Err(e) => {
                        let _ = head_tx.send(Err(format!("{label}: {e}")));
                        return;
                    }
                };
                let _ = head_tx.send(Ok(()));
                let mut body = response.into_body();
                let mut lines = LineSplitter::default();
                while let Some(Ok(frame)) = body.frame().await {
                    let Ok(data) = frame.into_data() else {
                        continue;
                    };
                    let at = Instant::now();
                    lines.push(&data, |line| {
                        if let Some(seq) = event_seq(line, &marker) {
                            let _ = arrival_tx.send(Arrival { seq, at });
                        }
                    });
                }
            }));
        }
        drop(head_tx);
        let mut set = Self {
            arrivals,
            tasks,
            established: 0,
            failed: 0,
            first_error: None,
        };
        let deadline = Instant::now() + limit;
        let mut quiet_until = Instant::now() + HEAD_QUIET;
        while set.established + set.failed < count {
            match tokio::time::timeout_at(deadline.min(quiet_until), heads.recv()).await {
                Ok(Some(Ok(()))) => {
                    set.established += 1;
                    quiet_until = Instant::now() + HEAD_QUIET;
                }
                Ok(Some(Err(e))) => {
                    set.failed += 1;
                    set.first_error.get_or_insert(e);
                }
                Ok(None) => break,
                Err(_) => break,
            }
        }
        Ok(set)
    }

    /// Counts as established every watch that delivers event `seq` (written by
    /// the caller just before) within `limit`, for watches whose head was held
    /// back. Returns how many watches are established now.
    pub async fn prime(
        &mut self,
        seq: u64,
        count: usize,
        sent_at: Instant,
        limit: Duration,
    ) -> usize {
        let (arrived, _) = self.collect(seq, count, sent_at, limit).await;
        self.established = self.established.max(arrived.len());
        if self.established < count {
            self.first_error.get_or_insert(format!(
                "{} of {count} watches neither answered nor delivered an event",
                count - self.established
            ));
        }
        self.established
    }

    /// Waits for event `seq` on `expected` watches (up to `limit`), and returns
    /// each arrival's delay after `sent_at` plus how many never came.
    pub async fn collect(
        &mut self,
        seq: u64,
        expected: usize,
        sent_at: Instant,
        limit: Duration,
    ) -> (Vec<Duration>, usize) {
        let deadline = Instant::now() + limit;
        let mut delays = Vec::with_capacity(expected);
        while delays.len() < expected {
            match tokio::time::timeout_at(deadline, self.arrivals.recv()).await {
                Ok(Some(arrival)) if arrival.seq == seq => {
                    delays.push(arrival.at.saturating_duration_since(sent_at))
                }
                // A straggler of an earlier event: already counted as missing.
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => break,
            }
        }
        let missing = expected - delays.len();
        (delays, missing)
    }

    /// Closes every watch (their streams are reset when the tasks end).
    pub fn close(self) {
        for task in self.tasks {
            task.abort();
        }
    }
}

#[cfg(test)]
#[path = "watch/tests.rs"]
mod tests;
