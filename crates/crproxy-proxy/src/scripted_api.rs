//! An in-memory API server behind a kube-rs client, whose list answers and watch
//! streams a test hands out in order, as an API server that restarts or stalls
//! would: for the paused-time tests of the proxy's watches. It stands in for the
//! network only; the client has the same read timeout layer as the real watch
//! client, and kube-runtime's watcher runs unchanged on top.
//!
//! Used by the crate's unit tests and, through `#[path]`, by
//! `tests/integration/pool_sources.rs`, so it names only other crates.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt as _;
use http::{Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use serde_json::Value;
use tokio::sync::mpsc;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Feeds one watch: each value sent is one event (`{"type": ..., "object": ...}`);
/// dropping the sender ends the watch as the server would at its timeout.
pub type Watch = mpsc::UnboundedSender<Value>;

#[derive(Default)]
struct Queues {
    lists: VecDeque<Value>,
    watches: VecDeque<mpsc::UnboundedReceiver<Value>>,
    requests: Vec<String>,
}

/// The scripted server. Requests that find nothing queued fail as a refused
/// connection would (the server is down).
#[derive(Clone, Default)]
pub struct ScriptedApi {
    queues: Arc<Mutex<Queues>>,
}

impl ScriptedApi {
    /// Queues one list answer and the watch that follows it.
    pub fn push(&self, list: Value) -> Watch {
        self.queues.lock().expect("lock").lists.push_back(list);
        self.push_watch()
    }

    /// Queues a watch that follows no list (a resumed watch).
    pub fn push_watch(&self) -> Watch {
        let (tx, rx) = mpsc::unbounded_channel();
        self.queues.lock().expect("lock").watches.push_back(rx);
        tx
    }

    /// Every request so far, as `LIST path?query` or `WATCH path?query`.
    pub fn requests(&self) -> Vec<String> {
        self.queues.lock().expect("lock").requests.clone()
    }

    /// A kube-rs client of this server whose responses have `read_timeout`.
    pub fn client(&self, read_timeout: Duration) -> kube::Client {
        let queues = Arc::clone(&self.queues);
        let service = tower::service_fn(move |request: Request<kube::client::Body>| {
            let answer = answer(&queues, &request);
            async move { answer }
        });
        kube::Client::new(
            tower::ServiceBuilder::new()
                .layer(crproxy_kube::ReadTimeoutLayer::new(read_timeout))
                .service(service),
            "default",
        )
    }
}

fn answer(
    queues: &Mutex<Queues>,
    request: &Request<kube::client::Body>,
) -> Result<Response<BoxBody<Bytes, BoxError>>, BoxError> {
    let target = request
        .uri()
        .path_and_query()
        .map(|pq| pq.as_str().to_owned())
        .unwrap_or_default();
    let watch = request
        .uri()
        .query()
        .is_some_and(|q| q.split('&').any(|p| p == "watch=true"));
    let mut queues = queues.lock().expect("lock");
    queues
        .requests
        .push(format!("{} {target}", if watch { "WATCH" } else { "LIST" }));
    let refused = || -> BoxError {
        Box::new(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "scripted API server is down",
        ))
    };
    let body = if watch {
        let events = queues.watches.pop_front().ok_or_else(refused)?;
        let lines = tokio_stream::wrappers::UnboundedReceiverStream::new(events).map(|event| {
            let mut line = serde_json::to_vec(&event).expect("JSON value");
            line.push(b'\n');
            Ok::<_, BoxError>(Frame::data(Bytes::from(line)))
        });
        BodyExt::boxed(StreamBody::new(lines))
    } else {
        let list = queues.lists.pop_front().ok_or_else(refused)?;
        let bytes = serde_json::to_vec(&list).expect("JSON value");
        Full::new(Bytes::from(bytes))
            .map_err(|never| match never {})
            .boxed()
    };
    let mut response = Response::new(body);
    *response.status_mut() = StatusCode::OK;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        "application/json".parse().expect("header"),
    );
    Ok(response)
}

/// Lets spawned tasks run without moving paused time.
pub async fn settle() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}
