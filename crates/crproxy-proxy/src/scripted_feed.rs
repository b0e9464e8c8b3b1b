//! A [`WatchFeed`] whose list answers and watch streams a test hands out in order,
//! as an API server that restarts or stalls would, for the list-then-watch loops'
//! paused-time tests.

use std::sync::{Arc, Mutex};

use crproxy_kube::{Error as KubeError, WatchEvent};
use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use serde_json::Value;
use tokio::sync::mpsc;

use crate::sources::WatchFeed;

pub type Events = mpsc::UnboundedSender<Result<WatchEvent, KubeError>>;
type EventStream = mpsc::UnboundedReceiver<Result<WatchEvent, KubeError>>;

#[derive(Clone, Default)]
pub struct Script {
    lists: Arc<Mutex<Vec<Value>>>,
    watches: Arc<Mutex<Vec<EventStream>>>,
    requests: Arc<Mutex<Vec<String>>>,
}

impl Script {
    /// Queues one list answer and the watch that follows it; the returned sender
    /// feeds that watch, and dropping it closes the watch.
    pub fn push(&self, list: Value) -> Events {
        self.lists.lock().expect("lock").push(list);
        let (tx, rx) = mpsc::unbounded_channel();
        self.watches.lock().expect("lock").push(rx);
        tx
    }

    /// Queues a watch that follows no list (a resumed watch).
    pub fn push_watch(&self) -> Events {
        let (tx, rx) = mpsc::unbounded_channel();
        self.watches.lock().expect("lock").push(rx);
        tx
    }

    /// Every request so far, as `LIST path` or `WATCH path`.
    pub fn requests(&self) -> Vec<String> {
        self.requests.lock().expect("lock").clone()
    }
}

impl WatchFeed for Script {
    fn list<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Value, KubeError>> {
        self.requests
            .lock()
            .expect("lock")
            .push(format!("LIST {path}"));
        let next = {
            let mut lists = self.lists.lock().expect("lock");
            (!lists.is_empty()).then(|| lists.remove(0))
        };
        // Nothing queued: the server is down.
        Box::pin(async move { next.ok_or_else(|| KubeError::Transport("server down".into())) })
    }

    fn watch<'a>(
        &'a self,
        path: &'a str,
    ) -> BoxFuture<'a, Result<BoxStream<'static, Result<WatchEvent, KubeError>>, KubeError>> {
        self.requests
            .lock()
            .expect("lock")
            .push(format!("WATCH {path}"));
        let next = {
            let mut watches = self.watches.lock().expect("lock");
            (!watches.is_empty()).then(|| watches.remove(0))
        };
        Box::pin(async move {
            let rx = next.ok_or_else(|| KubeError::Transport("server down".into()))?;
            Ok(tokio_stream::wrappers::UnboundedReceiverStream::new(rx).boxed())
        })
    }
}

/// A watch event of `kind` carrying `object`.
pub fn event(kind: &str, object: Value) -> Result<WatchEvent, KubeError> {
    Ok(WatchEvent {
        event_type: kind.into(),
        object,
    })
}
