//! Response bodies read so that one object nested too deeply cannot fail a whole
//! list or watch: such an object reaches kube-rs as its stand-in (see
//! [`crproxy_core::deep_objects`]).
//!
//! A GET's JSON answer is gathered whole (kube-rs reads it whole anyway) and
//! rewritten when it needs to be; a watch's answer is passed on line by line, as
//! each event completes. Everything else is passed on as it comes.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::header::CONTENT_TYPE;
use http::{Method, Response};
use http_body::{Body, Frame, SizeHint};

use crproxy_core::{deep_objects, request};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How an answer's body is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reading {
    AsItComes,
    Whole,
    Lines,
}

/// `response` with a body that replaces too-deep objects, for a request of
/// `method` to `path_and_query`.
pub fn guard<B>(
    method: &Method,
    path_and_query: &str,
    response: Response<B>,
) -> Response<StandInBody<B>> {
    let is_json = response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    let reading = if *method != Method::GET || !response.status().is_success() || !is_json {
        Reading::AsItComes
    } else if is_watch(path_and_query) {
        Reading::Lines
    } else {
        Reading::Whole
    };
    response.map(|inner| StandInBody {
        inner,
        reading,
        pending: BytesMut::new(),
        ended: false,
    })
}

/// Whether a request's query asks for a watch, as kube reads its `watch`
/// parameter.
fn is_watch(path_and_query: &str) -> bool {
    let query = path_and_query.split_once('?').map(|(_, query)| query);
    request::query_pairs(query)
        .iter()
        .any(|(name, value)| name == "watch" && request::query_bool(value))
}

/// A response body that hands on too-deep objects as their stand-ins.
#[derive(Debug)]
pub struct StandInBody<B> {
    inner: B,
    reading: Reading,
    /// Read and not yet handed on: the whole answer so far, or the start of a
    /// watch event whose line has not ended.
    pending: BytesMut,
    ended: bool,
}

impl<B> StandInBody<B> {
    /// The complete lines of `pending` (through its last newline), each event
    /// rewritten if it must be; the rest stays pending.
    fn complete_lines(&mut self) -> Option<Bytes> {
        let last = self.pending.iter().rposition(|&b| b == b'\n')?;
        let lines = self.pending.split_to(last + 1).freeze();
        Some(rewrite_lines(lines))
    }
}

/// Each newline-ended line of `lines` as it came, or its rewritten event.
fn rewrite_lines(lines: Bytes) -> Bytes {
    let Ok(text) = std::str::from_utf8(&lines) else {
        return lines;
    };
    let mut rewritten: Option<String> = None;
    let mut copied = 0;
    for line in text.split_inclusive('\n') {
        let start = line.as_ptr() as usize - text.as_ptr() as usize;
        if let Some(event) = deep_objects::rewrite_event(line.trim_end()) {
            let out = rewritten.get_or_insert_with(|| String::with_capacity(text.len()));
            out.push_str(&text[copied..start]);
            out.push_str(&event);
            out.push('\n');
            copied = start + line.len();
        }
    }
    match rewritten {
        None => lines,
        Some(mut out) => {
            out.push_str(&text[copied..]);
            Bytes::from(out)
        }
    }
}

/// A whole answer as it came, or rewritten.
fn rewrite_whole(answer: Bytes) -> Bytes {
    std::str::from_utf8(&answer)
        .ok()
        .and_then(deep_objects::rewrite_answer)
        .map_or(answer, Bytes::from)
}

impl<B> Body for StandInBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if this.reading == Reading::AsItComes {
            return Pin::new(&mut this.inner)
                .poll_frame(cx)
                .map(|frame| frame.map(|f| f.map_err(Into::into)));
        }
        loop {
            if this.ended {
                if this.pending.is_empty() {
                    return Poll::Ready(None);
                }
                let rest = std::mem::take(&mut this.pending).freeze();
                let rest = match this.reading {
                    Reading::Whole => rewrite_whole(rest),
                    _ => rewrite_lines(rest),
                };
                return Poll::Ready(Some(Ok(Frame::data(rest))));
            }
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => this.ended = true,
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e.into()))),
                Poll::Ready(Some(Ok(frame))) => {
                    // kube-apiserver sends no trailers on these answers; any other
                    // frame is dropped rather than reordered before the data.
                    let Ok(data) = frame.into_data() else {
                        continue;
                    };
                    this.pending.extend_from_slice(&data);
                    if this.reading == Reading::Lines {
                        if let Some(lines) = this.complete_lines() {
                            return Poll::Ready(Some(Ok(Frame::data(lines))));
                        }
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self.reading {
            Reading::AsItComes => self.inner.is_end_stream(),
            _ => self.ended && self.pending.is_empty(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self.reading {
            Reading::AsItComes => self.inner.size_hint(),
            // A rewrite changes the length.
            _ => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests;
