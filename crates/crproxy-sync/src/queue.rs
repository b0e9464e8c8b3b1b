//! A keyed work queue with client-go's semantics: a key is queued at most once, a key
//! being worked on is never handed to a second worker, and a key added while it is
//! being worked on is queued again when the work is done. It remembers when a key was
//! first added, for the time-to-converge metric.
//!
//! A key whose work failed is retried with a per-key exponential backoff, as
//! client-go's rate-limited work queue does ([`BACKOFF_BASE`] doubling up to
//! [`BACKOFF_CAP`]): a persistent failure (a host-wide 403, an object the host keeps
//! refusing) costs a few requests per key and hour instead of a steady flood. The
//! backoff ends only when the work succeeds ([`WorkQueue::forget`]). A change of
//! the key's objects ([`WorkQueue::add`], fed by watch events) is looked at at once
//! but keeps the count, as client-go's `Add` does: an object that changes every few
//! seconds (a status a host controller keeps updating) must not hold a failing key
//! at the shortest delays. A periodic or relist look at every key
//! ([`WorkQueue::resync`]) leaves a backing-off key to its scheduled retry.
//!
//! The retries of all keys of a queue (one synced type) also share one token
//! bucket ([`RETRY_RATE`] per second, [`RETRY_BURST`] at once), the other half of
//! client-go's default controller rate limiter: a retry waits for the longer of its
//! key's backoff and its turn in the bucket, and never longer than [`BACKOFF_CAP`].
//! When every key fails at once (the host down, a credential revoked), the first
//! hundred retry after their backoff and the rest follow at ten a second, instead
//! of each key's few fast attempts arriving together.

use crproxy_core::locks;
use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// The first retry delay after a failure (client-go's default item backoff base).
pub const BACKOFF_BASE: Duration = Duration::from_millis(5);
/// The longest retry delay: a key failing for good is still tried every 5 minutes.
pub const BACKOFF_CAP: Duration = Duration::from_secs(300);

/// Retries per second the bucket shared by all keys refills with (client-go's
/// default overall limit).
pub const RETRY_RATE: f64 = 10.0;
/// Retries the shared bucket lets through at once.
pub const RETRY_BURST: f64 = 100.0;

/// A token bucket whose reservations may run into debt, as Go's `rate.Limiter`
/// reservations do: each retry takes a token now and waits until the bucket would
/// have held it.
struct RetryBucket {
    tokens: f64,
    updated: Instant,
}

impl RetryBucket {
    fn full(now: Instant) -> RetryBucket {
        RetryBucket {
            tokens: RETRY_BURST,
            updated: now,
        }
    }

    /// Takes one token at `now`; how long its retry waits for it. The debt stops
    /// at what [`BACKOFF_CAP`] refills: a retry superseded by a watch event keeps
    /// its token, so without a floor a type whose failures outpace the rate would
    /// push every key's turn further out for good.
    fn reserve(&mut self, now: Instant) -> Duration {
        let refilled = now.saturating_duration_since(self.updated).as_secs_f64() * RETRY_RATE;
        let floor = -RETRY_RATE * BACKOFF_CAP.as_secs_f64();
        self.tokens = ((self.tokens + refilled).min(RETRY_BURST) - 1.0).max(floor);
        self.updated = now;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / RETRY_RATE)
        }
    }
}

/// The delay before the retry that follows `failures` earlier consecutive failures
/// (0 for the first): `BACKOFF_BASE * 2^failures`, at most `BACKOFF_CAP`.
pub fn backoff(failures: u32) -> Duration {
    doubling(BACKOFF_BASE, BACKOFF_CAP, failures)
}

/// `base * 2^failures`, at most `cap`.
pub fn doubling(base: Duration, cap: Duration, failures: u32) -> Duration {
    base.checked_mul(2u32.saturating_pow(failures.min(31)))
        .map_or(cap, |d| d.min(cap))
}

pub struct WorkQueue<K> {
    inner: Mutex<Inner<K>>,
    notify: Notify,
}

struct Inner<K> {
    order: VecDeque<K>,
    /// Queued keys and when each was first added.
    queued: HashMap<K, Instant>,
    active: HashSet<K>,
    /// Keys added while active, with their first-add time.
    dirty: HashMap<K, Instant>,
    /// Keys backing off after failed work.
    failing: HashMap<K, Failing>,
    /// Numbers the scheduled retries, so that one made obsolete (the key succeeded,
    /// changed, or failed again meanwhile) is dropped when it fires.
    next_retry: u64,
    /// The turn of every retry, whichever key.
    bucket: RetryBucket,
}

struct Failing {
    /// Consecutive failures so far.
    failures: u32,
    /// The retry scheduled for the last failure.
    retry: u64,
}

impl<K: Clone + Eq + Hash + Send + 'static> WorkQueue<K> {
    pub fn new() -> Arc<WorkQueue<K>> {
        Arc::new(WorkQueue {
            inner: Mutex::new(Inner {
                order: VecDeque::new(),
                queued: HashMap::new(),
                active: HashSet::new(),
                dirty: HashMap::new(),
                failing: HashMap::new(),
                next_retry: 0,
                bucket: RetryBucket::full(Instant::now()),
            }),
            notify: Notify::new(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner<K>> {
        locks::lock(&self.inner)
    }

    /// Queues `key` now because its objects changed (a watch event): the change may
    /// be what it was waiting for. A backoff it was in keeps its count, and the
    /// retry scheduled before is dropped if this look fails again.
    pub fn add(&self, key: K) {
        self.add_since(key, Instant::now());
    }

    /// Queues `key` to be looked at again (a periodic resync, a relist), unless it is
    /// backing off: its scheduled retry looks at it.
    pub fn resync(&self, key: K) {
        if self.lock().failing.contains_key(&key) {
            return;
        }
        self.add_since(key, Instant::now());
    }

    fn add_since(&self, key: K, since: Instant) {
        let mut inner = self.lock();
        if inner.active.contains(&key) {
            inner.dirty.entry(key).or_insert(since);
            return;
        }
        if inner.queued.contains_key(&key) {
            return;
        }
        inner.queued.insert(key.clone(), since);
        inner.order.push_back(key);
        drop(inner);
        self.notify.notify_one();
    }

    /// Adds `key` after `delay`, from a background task, keeping `since` (when the
    /// change it is retried for was first seen) for the time-to-converge metric.
    pub fn add_after(self: &Arc<Self>, key: K, delay: Duration, since: Instant) {
        self.schedule(key, delay, since, None);
    }

    /// Adds `key` after `delay`; with `retry`, only if that is still the key's
    /// scheduled retry then (a success, or a later failure, makes it obsolete).
    fn schedule(self: &Arc<Self>, key: K, delay: Duration, since: Instant, retry: Option<u64>) {
        let queue = Arc::clone(self);
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let current = retry.is_none_or(|retry| {
                queue
                    .lock()
                    .failing
                    .get(&key)
                    .is_some_and(|f| f.retry == retry)
            });
            if current {
                queue.add_since(key, since);
            }
        });
    }

    /// The work on `key` failed: retries it after its backoff or its turn in the
    /// shared bucket, whichever is later, and at least `at_least`; keeps `since` as
    /// [`add_after`](Self::add_after) does. Returns the delay.
    pub fn retry_failed(self: &Arc<Self>, key: K, at_least: Duration, since: Instant) -> Duration {
        let (delay, retry) = {
            let mut inner = self.lock();
            inner.next_retry += 1;
            let retry = inner.next_retry;
            let failing = inner
                .failing
                .entry(key.clone())
                .or_insert(Failing { failures: 0, retry });
            let own = backoff(failing.failures).max(at_least);
            failing.failures = failing.failures.saturating_add(1);
            failing.retry = retry;
            let turn = inner.bucket.reserve(Instant::now());
            (own.max(turn), retry)
        };
        self.schedule(key, delay, since, Some(retry));
        delay
    }

    /// The work on `key` succeeded: its next failure starts the backoff over.
    pub fn forget(&self, key: &K) {
        self.lock().failing.remove(key);
    }

    /// The next key and when it was first added; waits while the queue is empty.
    pub async fn next(&self) -> (K, Instant) {
        loop {
            {
                let mut inner = self.lock();
                if let Some(key) = inner.order.pop_front() {
                    let since = inner.queued.remove(&key).unwrap_or_else(Instant::now);
                    inner.active.insert(key.clone());
                    if !inner.order.is_empty() {
                        // Wake another worker for the rest.
                        self.notify.notify_one();
                    }
                    return (key, since);
                }
            }
            self.notify.notified().await;
        }
    }

    /// Marks the work on `key` finished; a key added meanwhile is queued again.
    pub fn done(&self, key: &K) {
        let mut inner = self.lock();
        inner.active.remove(key);
        if let Some(since) = inner.dirty.remove(key) {
            drop(inner);
            self.add_since(key.clone(), since);
        }
    }

    /// Keys waiting (queued, or re-added while being worked on).
    pub fn depth(&self) -> usize {
        let inner = self.lock();
        inner.order.len() + inner.dirty.len()
    }
}

#[cfg(test)]
mod tests;
