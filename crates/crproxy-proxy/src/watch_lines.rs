//! Splitting a JSON watch stream into its events.
//!
//! kube-apiserver writes one JSON document per watch event and ends each with a
//! newline; newlines inside strings are escaped, so every line is one event. The
//! body arrives in chunks that may end anywhere, so [`WatchLines`] keeps the
//! unfinished tail between chunks. The stream comes from the target, so a line is
//! bounded: one longer than the limit is an error, not a growing buffer.

use bytes::{Bytes, BytesMut};

#[cfg(test)]
mod tests;

/// Why a watch stream cannot be split.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LineError {
    /// A line (finished or not) is longer than the limit the splitter was made
    /// with. The stream cannot be followed past it; the caller should end the
    /// watch and start a new one.
    #[error("watch event longer than {limit} bytes")]
    TooLong { limit: usize },
}

/// Splits watch bytes, pushed chunk by chunk, into lines.
///
/// Every byte is searched for a newline once, however small the chunks: a long
/// event arriving in many pieces costs time linear in its length.
#[derive(Debug)]
pub struct WatchLines {
    buffer: BytesMut,
    /// How many leading bytes of `buffer` are known to hold no newline.
    searched: usize,
    max_line: usize,
}

impl WatchLines {
    /// A splitter that refuses lines longer than `max_line` bytes (the newline not
    /// counted).
    pub fn new(max_line: usize) -> Self {
        Self {
            buffer: BytesMut::new(),
            searched: 0,
            max_line,
        }
    }

    /// Adds the next chunk of the stream; [`WatchLines::next_line`] then returns
    /// the lines it finished.
    pub fn push(&mut self, chunk: &[u8]) {
        self.buffer.extend_from_slice(chunk);
    }

    /// The next finished line that is not blank, without its newline; `None` when
    /// the buffered bytes hold no further finished line.
    ///
    /// The error comes where the over-long line starts, after every line before
    /// it, so the outcome does not depend on how the stream was chunked. A tail
    /// without a newline is never returned: at the end of the stream it is an
    /// event cut short (see [`WatchLines::unfinished`]). After an error the
    /// splitter keeps answering with it.
    pub fn next_line(&mut self) -> Result<Option<Bytes>, LineError> {
        loop {
            let Some(found) = memchr::memchr(b'\n', &self.buffer[self.searched..]) else {
                self.searched = self.buffer.len();
                if self.buffer.len() > self.max_line {
                    return Err(self.too_long());
                }
                return Ok(None);
            };
            let end = self.searched + found;
            if end > self.max_line {
                return Err(self.too_long());
            }
            let mut line = self.buffer.split_to(end + 1);
            self.searched = 0;
            line.truncate(end);
            if !line.iter().all(u8::is_ascii_whitespace) {
                return Ok(Some(line.freeze()));
            }
        }
    }

    /// The bytes after the last newline: the start of an event still arriving,
    /// or, once the stream has ended, one that was cut short.
    pub fn unfinished(&self) -> &[u8] {
        &self.buffer
    }

    fn too_long(&self) -> LineError {
        LineError::TooLong {
            limit: self.max_line,
        }
    }
}
