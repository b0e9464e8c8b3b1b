//! Decoding of kube-apiserver JSON watch streams: one JSON object per line,
//! `{"type": "ADDED", "object": {...}}`.

use crate::Error;
use bytes::{Buf, BytesMut};
use serde_json::Value;

/// One watch event. `event_type` is `ADDED`, `MODIFIED`, `DELETED` or `BOOKMARK`;
/// `ERROR` events are never returned as a `WatchEvent` but as [`Error::Api`].
#[derive(Clone, Debug, PartialEq)]
pub struct WatchEvent {
    pub event_type: String,
    pub object: Value,
}

/// Longest line accepted: well above the 1.5 MiB etcd object limit, so only a broken
/// stream trips it, and a broken stream cannot make us buffer without bound.
const MAX_LINE: usize = 64 * 1024 * 1024;

/// Splits a byte stream into watch events as complete lines arrive. Public for
/// the fuzz target: the stream comes from a peer.
#[derive(Default)]
pub struct LineDecoder {
    buf: BytesMut,
}

impl LineDecoder {
    /// Adds bytes and returns every event completed by them.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<Result<WatchEvent, Error>> {
        self.buf.extend_from_slice(chunk);
        let mut out = Vec::new();
        while let Some(pos) = self.buf.iter().position(|b| *b == b'\n') {
            let line = self.buf.split_to(pos + 1);
            if let Some(ev) = decode_line(&line[..pos]) {
                out.push(ev);
            }
        }
        if self.buf.len() > MAX_LINE {
            self.buf.clear();
            out.push(Err(Error::Decode(format!(
                "watch event longer than {MAX_LINE} bytes"
            ))));
        }
        out
    }

    /// End of stream: a last event without a trailing newline still counts.
    pub fn finish(&mut self) -> Option<Result<WatchEvent, Error>> {
        let rest = self.buf.split();
        let ev = decode_line(rest.chunk());
        self.buf.clear();
        ev
    }
}

fn decode_line(line: &[u8]) -> Option<Result<WatchEvent, Error>> {
    if line.iter().all(u8::is_ascii_whitespace) {
        return None;
    }
    let mut v: Value = match serde_json::from_slice(line) {
        Ok(v) => v,
        Err(e) => return Some(Err(Error::Decode(format!("watch event is not JSON: {e}")))),
    };
    let event_type = match v.get("type").and_then(Value::as_str) {
        Some(t) => t.to_owned(),
        None => return Some(Err(Error::Decode("watch event has no \"type\"".to_owned()))),
    };
    let object = v
        .as_object_mut()
        .and_then(|o| o.remove("object"))
        .unwrap_or(Value::Null);
    if event_type == "ERROR" {
        return Some(Err(Error::from_status(object)));
    }
    Some(Ok(WatchEvent { event_type, object }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `chunks` and renders each result as `TYPE name` or `err reason`.
    fn check(chunks: &[&str], expected: &[&str]) {
        let mut d = LineDecoder::default();
        let mut got = Vec::new();
        for c in chunks {
            got.extend(d.push(c.as_bytes()));
        }
        got.extend(d.finish());
        let rendered: Vec<String> = got
            .into_iter()
            .map(|r| match r {
                Ok(ev) => format!(
                    "{} {}",
                    ev.event_type,
                    ev.object["metadata"]["name"].as_str().unwrap_or("-")
                ),
                Err(e @ Error::Api { .. }) => {
                    format!(
                        "err {} {}",
                        e.status().unwrap_or(0),
                        e.reason().unwrap_or("")
                    )
                }
                Err(e) => format!("err {e}").chars().take(20).collect(),
            })
            .collect();
        assert_eq!(rendered, expected, "chunks {chunks:?}");
    }

    #[test]
    fn lines_are_split_across_and_within_chunks() {
        check(
            &[
                r#"{"type":"ADDED","object":{"metadata":{"name":"a"}}}"#,
                "\n",
            ],
            &["ADDED a"],
        );
        check(
            &[
                r#"{"type":"ADDED","obj"#,
                r#"ect":{"metadata":{"name":"a"}}}"#,
                "\n{\"type\":\"DELETED\",\"object\":{\"metadata\":{\"name\":\"b\"}}}\n\n",
            ],
            &["ADDED a", "DELETED b"],
        );
        // No trailing newline at end of stream.
        check(
            &[r#"{"type":"BOOKMARK","object":{"metadata":{"name":"c"}}}"#],
            &["BOOKMARK c"],
        );
        check(
            &["{\"type\":\"ERROR\",\"object\":{\"kind\":\"Status\",\"code\":410,\"reason\":\"Expired\",\"message\":\"too old resource version\"}}\n"],
            &["err 410 Expired"],
        );
        check(&["not json\n"], &["err cannot decode th"]);
        check(&["  \n\r\n"], &[]);
    }
}
