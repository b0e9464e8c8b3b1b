//! A keyed work queue with client-go's semantics: a key is queued at most once, a key
//! being worked on is never handed to a second worker, and a key added while it is
//! being worked on is queued again when the work is done. It remembers when a key was
//! first added, for the time-to-converge metric.

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

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
}

impl<K: Clone + Eq + Hash + Send + 'static> WorkQueue<K> {
    pub fn new() -> Arc<WorkQueue<K>> {
        Arc::new(WorkQueue {
            inner: Mutex::new(Inner {
                order: VecDeque::new(),
                queued: HashMap::new(),
                active: HashSet::new(),
                dirty: HashMap::new(),
            }),
            notify: Notify::new(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner<K>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn add(&self, key: K) {
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
        let queue = Arc::clone(self);
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            queue.add_since(key, since);
        });
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
