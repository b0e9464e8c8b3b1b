//! The JSON watch line splitter reads a stream the target controls. However the
//! bytes are split into chunks, it must never panic and must give the lines a
//! plain split of the whole stream gives: every finished, non-blank line in
//! order, up to the first line over the limit, which ends the stream with an
//! error (a watch's TCP segments fall anywhere).

use crproxy_proxy::transport::MAX_BUFFERED_BODY;
use crproxy_proxy::watch_lines::{LineError, WatchLines};

/// The splitter's lines for `stream` in chunks of `chunk` bytes, and whether a
/// line over the limit ended them.
fn split(stream: &[u8], chunk: usize, max_line: usize) -> (Vec<Vec<u8>>, bool) {
    let mut splitter = WatchLines::new(max_line);
    let mut lines = Vec::new();
    for piece in stream.chunks(chunk) {
        splitter.push(piece);
        loop {
            match splitter.next_line() {
                Ok(Some(line)) => lines.push(line.to_vec()),
                Ok(None) => break,
                Err(LineError::TooLong { limit }) => {
                    assert_eq!(limit, max_line);
                    return (lines, true);
                }
            }
        }
    }
    assert_eq!(splitter.unfinished(), tail(stream));
    (lines, false)
}

/// The same, worked out from the whole stream at once.
fn expected(stream: &[u8], max_line: usize) -> (Vec<Vec<u8>>, bool) {
    let mut lines = Vec::new();
    let mut segments: Vec<&[u8]> = stream.split(|b| *b == b'\n').collect();
    let tail = segments.pop().unwrap_or_default();
    for segment in segments {
        if segment.len() > max_line {
            return (lines, true);
        }
        if !segment.iter().all(u8::is_ascii_whitespace) {
            lines.push(segment.to_vec());
        }
    }
    (lines, tail.len() > max_line)
}

fn tail(stream: &[u8]) -> &[u8] {
    stream.rsplit(|b| *b == b'\n').next().unwrap_or_default()
}

/// Checks one input against the properties above; a panic is a finding.
pub fn check(data: &[u8]) {
    // The first byte picks the chunk size, the second the line limit (0: the
    // cache's own), the rest is the stream.
    let [size, limit, stream @ ..] = data else {
        return;
    };
    let chunk = usize::from(*size).max(1);
    let max_line = match limit {
        0 => MAX_BUFFERED_BODY,
        n => usize::from(*n),
    };
    let whole = split(stream, stream.len().max(1), max_line);
    assert_eq!(whole, expected(stream, max_line));
    assert_eq!(split(stream, chunk, max_line), whole);
}
