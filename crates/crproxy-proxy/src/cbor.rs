//! Counting events in a CBOR-sequence watch stream (`application/cbor-seq`).
//!
//! Each watch event is one CBOR data item. Items may be split across body chunks,
//! so [`ItemCounter`] keeps the unfinished tail and reports how many complete
//! items each chunk finished. Only item boundaries are parsed, never values: the
//! stream passes through untouched.

/// Nesting deeper than this is treated as malformed rather than recursed into.
const MAX_DEPTH: usize = 64;

/// Counts complete CBOR items across chunks.
#[derive(Debug, Default)]
pub struct ItemCounter {
    pending: Vec<u8>,
    broken: bool,
}

impl ItemCounter {
    /// Adds a chunk; returns how many items it completed. After malformed input
    /// the counter stops counting (and stops buffering) for good.
    pub fn push(&mut self, chunk: &[u8]) -> u64 {
        if self.broken {
            return 0;
        }
        self.pending.extend_from_slice(chunk);
        let mut count = 0;
        let mut offset = 0;
        loop {
            match item_len(&self.pending[offset..], 0) {
                Scan::Complete(len) => {
                    offset += len;
                    count += 1;
                }
                Scan::Incomplete => break,
                Scan::Malformed => {
                    self.broken = true;
                    self.pending = Vec::new();
                    return count;
                }
            }
        }
        self.pending.drain(..offset);
        count
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Scan {
    Complete(usize),
    Incomplete,
    Malformed,
}

/// The length of the first complete item in `buf`.
fn item_len(buf: &[u8], depth: usize) -> Scan {
    if depth > MAX_DEPTH {
        return Scan::Malformed;
    }
    let Some(&initial) = buf.first() else {
        return Scan::Incomplete;
    };
    let major = initial >> 5;
    let info = initial & 0x1f;
    let (argument, head) = match info {
        0..=23 => (u64::from(info), 1),
        24..=27 => {
            let size = 1usize << (info - 24);
            let Some(bytes) = buf.get(1..1 + size) else {
                return Scan::Incomplete;
            };
            let value = bytes.iter().fold(0u64, |acc, b| (acc << 8) | u64::from(*b));
            (value, 1 + size)
        }
        31 => return indefinite(buf, major, depth),
        _ => return Scan::Malformed,
    };
    match major {
        0 | 1 | 7 => Scan::Complete(head),
        // A length near usize::MAX must not wrap around into a small one (found by
        // the cbor_counter fuzz target): no real event is that long.
        2 | 3 => match usize::try_from(argument)
            .ok()
            .and_then(|len| head.checked_add(len))
        {
            Some(end) if buf.len() >= end => Scan::Complete(end),
            Some(_) => Scan::Incomplete,
            None => Scan::Malformed,
        },
        4 | 5 => {
            let per_entry = if major == 5 { 2 } else { 1 };
            let Some(items) = argument.checked_mul(per_entry) else {
                return Scan::Malformed;
            };
            sequence(buf, head, Some(items), depth)
        }
        6 => sequence(buf, head, Some(1), depth),
        _ => Scan::Malformed,
    }
}

/// Items of an indefinite-length string, array or map, up to the break byte.
fn indefinite(buf: &[u8], major: u8, depth: usize) -> Scan {
    match major {
        2..=5 => sequence(buf, 1, None, depth),
        _ => Scan::Malformed,
    }
}

/// `count` items (or items up to a break when `None`) starting at `offset`.
fn sequence(buf: &[u8], mut offset: usize, count: Option<u64>, depth: usize) -> Scan {
    let mut seen = 0u64;
    loop {
        if count == Some(seen) {
            return Scan::Complete(offset);
        }
        let Some(&next) = buf.get(offset) else {
            return Scan::Incomplete;
        };
        if count.is_none() && next == 0xff {
            return Scan::Complete(offset + 1);
        }
        match item_len(&buf[offset..], depth + 1) {
            Scan::Complete(len) => offset += len,
            other => return other,
        }
        seen += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_string_length_near_the_maximum_is_malformed_not_an_overflow() {
        // A byte string whose 8-byte length is u64::MAX.
        let mut counter = ItemCounter::default();
        let item = [0x5b, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x00];
        assert_eq!(counter.push(&item), 0);
        assert_eq!(counter.push(&[0x01]), 0, "the counter stopped for good");
    }

    // {"type": "ADDED", "object": {"a": 1}} as CBOR.
    const EVENT: &[u8] = &[
        0xa2, 0x64, b't', b'y', b'p', b'e', 0x65, b'A', b'D', b'D', b'E', b'D', 0x66, b'o', b'b',
        b'j', b'e', b'c', b't', 0xa1, 0x61, b'a', 0x01,
    ];

    fn check(chunks: &[&[u8]], expected: u64) {
        let mut counter = ItemCounter::default();
        let total: u64 = chunks.iter().map(|c| counter.push(c)).sum();
        assert_eq!(total, expected, "{chunks:?}");
    }

    #[test]
    fn whole_and_split_events_are_counted_once() {
        check(&[EVENT], 1);
        check(&[&[EVENT, EVENT].concat()], 2);
        let (head, tail) = EVENT.split_at(7);
        check(&[head, tail], 1);
        let bytes = [EVENT, EVENT, EVENT].concat();
        let chunks: Vec<&[u8]> = bytes.chunks(1).collect();
        check(&chunks, 3);
    }

    #[test]
    fn indefinite_lengths_tags_and_wide_heads() {
        // Indefinite map {"a": [_ 1, 2]} then a tagged 8-byte integer.
        check(&[&[0xbf, 0x61, b'a', 0x9f, 0x01, 0x02, 0xff, 0xff]], 1);
        check(&[&[0xc1, 0x1b, 0, 0, 0, 0, 0, 0, 0, 1]], 1);
        // A byte string whose 2-byte length arrives first.
        check(&[&[0x59, 0x00, 0x03], &[1, 2], &[3]], 1);
    }

    #[test]
    fn malformed_input_stops_counting_without_panicking() {
        let mut counter = ItemCounter::default();
        assert_eq!(counter.push(&[0x1c]), 0);
        assert_eq!(counter.push(EVENT), 0);
        let mut deep = vec![0x81u8; 200];
        deep.push(0x01);
        check(&[&deep], 0);
    }
}
