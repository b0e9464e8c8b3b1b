//! A read timeout for HTTP responses: how long a response may keep its reader
//! waiting, for its head and then between two frames of its body.
//!
//! A watch whose connection stalls without closing (a half-dead NAT entry, a
//! proxy that stops forwarding) never ends by itself. kube-runtime's watcher
//! quietly reconnects after such a silence, so its users never learn that what
//! they served meanwhile may have been stale. Under this timeout the silence
//! becomes an error on the watch stream instead, which the watcher passes on.
//! Choose it above the server-side lifetime of the watches the client makes (the
//! server ends a healthy watch within that lifetime), or quiet watches fail too.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

use crate::Error;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Wraps a service so that its responses fail with [`Error::Timeout`] when the head
/// or the next body frame does not arrive within the limit.
#[derive(Clone, Copy, Debug)]
pub struct ReadTimeoutLayer {
    limit: Duration,
}

impl ReadTimeoutLayer {
    /// A read timeout of `limit`.
    pub fn new(limit: Duration) -> Self {
        Self { limit }
    }
}

impl<S> tower::Layer<S> for ReadTimeoutLayer {
    type Service = ReadTimeout<S>;

    fn layer(&self, inner: S) -> ReadTimeout<S> {
        ReadTimeout {
            inner,
            limit: self.limit,
        }
    }
}

/// The service made by [`ReadTimeoutLayer`].
#[derive(Clone, Debug)]
pub struct ReadTimeout<S> {
    inner: S,
    limit: Duration,
}

impl<S, ReqBody, ResBody> tower::Service<Request<ReqBody>> for ReadTimeout<S>
where
    S: tower::Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    ResBody: Body + Unpin,
{
    type Response = Response<IdleTimeoutBody<ResBody>>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let limit = self.limit;
        let response = self.inner.call(request);
        Box::pin(async move {
            match tokio::time::timeout(limit, response).await {
                Ok(Ok(response)) => Ok(response.map(|body| IdleTimeoutBody::new(body, limit))),
                Ok(Err(e)) => Err(e.into()),
                Err(_) => Err(
                    Box::new(Error::Timeout(format!("no response within {limit:?}"))) as BoxError,
                ),
            }
        })
    }
}

/// A response body that fails with [`Error::Timeout`] when no frame arrives within
/// the limit after the head or the previous frame; after that failure it ends.
#[derive(Debug)]
pub struct IdleTimeoutBody<B> {
    inner: B,
    limit: Duration,
    deadline: Pin<Box<Sleep>>,
    expired: bool,
}

impl<B> IdleTimeoutBody<B> {
    fn new(inner: B, limit: Duration) -> Self {
        Self {
            inner,
            limit,
            deadline: Box::pin(tokio::time::sleep(limit)),
            expired: false,
        }
    }
}

impl<B> Body for IdleTimeoutBody<B>
where
    B: Body + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = B::Data;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, BoxError>>> {
        let this = &mut *self;
        if this.expired {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                let next = Instant::now() + this.limit;
                this.deadline.as_mut().reset(next);
                Poll::Ready(frame.map(|f| f.map_err(Into::into)))
            }
            Poll::Pending => match this.deadline.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    this.expired = true;
                    Poll::Ready(Some(Err(Box::new(Error::Timeout(format!(
                        "nothing read from the response for {:?}",
                        this.limit
                    ))))))
                }
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.expired || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http_body_util::{BodyExt, StreamBody};
    use tokio::sync::mpsc;
    use tower::{Layer, Service, ServiceExt};

    type Chunk = Result<Frame<Bytes>, std::convert::Infallible>;
    type Chunks = mpsc::UnboundedSender<Chunk>;
    type Streamed = StreamBody<tokio_stream::wrappers::UnboundedReceiverStream<Chunk>>;

    /// A service whose one response streams what the test sends, or never
    /// answers when `answer` is false.
    fn service(
        answer: bool,
    ) -> (
        impl tower::Service<
            Request<()>,
            Response = Response<Streamed>,
            Error = BoxError,
            Future = impl Send,
        >,
        Chunks,
    ) {
        let (tx, rx) = mpsc::unbounded_channel();
        let body = std::sync::Mutex::new(Some(rx));
        let svc = tower::service_fn(move |_: Request<()>| {
            let rx = body.lock().expect("lock").take().expect("one request");
            async move {
                if !answer {
                    std::future::pending::<()>().await;
                }
                Ok::<_, BoxError>(Response::new(StreamBody::new(
                    tokio_stream::wrappers::UnboundedReceiverStream::new(rx),
                )))
            }
        });
        (svc, tx)
    }

    fn is_timeout(e: &BoxError) -> bool {
        matches!(e.downcast_ref::<Error>(), Some(Error::Timeout(_)))
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_keeps_sending_is_read_to_its_end_and_silence_fails_it() {
        let limit = Duration::from_secs(10);
        let (svc, chunks) = service(true);
        let mut svc = ReadTimeoutLayer::new(limit).layer(svc);
        let response = svc
            .ready()
            .await
            .expect("ready")
            .call(Request::new(()))
            .await
            .expect("head");
        let mut body = response.into_body();
        // Frames 9 s apart: never idle for the limit.
        for i in 0..3u8 {
            tokio::time::sleep(Duration::from_secs(9)).await;
            chunks
                .send(Ok(Frame::data(Bytes::from(vec![i]))))
                .expect("send");
            let frame = body.frame().await.expect("frame").expect("ok");
            assert_eq!(frame.into_data().expect("data"), Bytes::from(vec![i]));
        }
        // Then silence, the sender still open: an error, then the end.
        let started = Instant::now();
        let error = body.frame().await.expect("an error").expect_err("timeout");
        assert!(is_timeout(&error), "{error}");
        assert_eq!(started.elapsed(), limit);
        assert!(body.frame().await.is_none());
        drop(chunks);

        // A body that ends in time ends normally.
        let (svc, chunks) = service(true);
        let mut svc = ReadTimeoutLayer::new(limit).layer(svc);
        let response = svc.call(Request::new(())).await.expect("head");
        drop(chunks);
        assert!(response.into_body().frame().await.is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_response_head_that_never_comes_is_a_timeout() {
        let (svc, _chunks) = service(false);
        let mut svc = ReadTimeoutLayer::new(Duration::from_secs(10)).layer(svc);
        let error = svc.call(Request::new(())).await.expect_err("timeout");
        assert!(is_timeout(&error), "{error}");
    }
}
