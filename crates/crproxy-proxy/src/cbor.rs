//! Counting events in a CBOR-sequence watch stream (`application/cbor-seq`).
//!
//! Each watch event is one CBOR data item. Items may be split across body chunks
//! at any byte, so [`ItemCounter`] reads the stream as it comes, byte by byte,
//! keeping only where it is inside the current item: the containers still open,
//! the head bytes of an argument not yet complete, and how much of a string is
//! left to skip. Nothing is buffered, so a long event costs no memory and no byte
//! is looked at twice. Only item boundaries are parsed, never values: the stream
//! passes through untouched.

/// Nesting deeper than this is treated as malformed rather than followed.
const MAX_DEPTH: usize = 64;

/// The "break" byte that closes an indefinite-length string, array or map.
const BREAK: u8 = 0xff;

/// Counts complete top-level CBOR items across chunks.
#[derive(Debug, Default)]
pub struct ItemCounter {
    /// Containers (arrays, maps, tags, indefinite strings) of the current item,
    /// innermost last.
    open: Vec<Open>,
    /// A head whose argument bytes have not all arrived.
    head: Option<PartialHead>,
    /// Payload bytes of a string still to pass over; the string is an item
    /// completed when they have.
    string_left: u64,
    broken: bool,
}

/// A container of the current item, and what ends it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    /// A definite-length array or map, or a tag: how many items it still needs.
    Items(u64),
    /// An indefinite-length array or map: any items, then a break byte.
    UntilBreak,
    /// An indefinite-length string of this major type: definite-length strings
    /// of the same type only (RFC 8949, 3.2.3), then a break byte.
    Chunks(u8),
}

/// The start of a head: its major type, and the big-endian argument so far.
#[derive(Debug)]
struct PartialHead {
    major: u8,
    argument: u64,
    bytes_left: u8,
}

impl ItemCounter {
    /// Adds a chunk; returns how many items it completed. After malformed input
    /// the counter stops counting for good.
    pub fn push(&mut self, chunk: &[u8]) -> u64 {
        let mut count = 0;
        let mut rest = chunk;
        while !self.broken && !rest.is_empty() {
            if self.string_left > 0 {
                let skipped = usize::try_from(self.string_left)
                    .unwrap_or(usize::MAX)
                    .min(rest.len());
                self.string_left -= skipped as u64;
                rest = &rest[skipped..];
                if self.string_left == 0 {
                    count += self.item_done();
                }
                continue;
            }
            let byte = rest[0];
            rest = &rest[1..];
            count += match self.head.take() {
                Some(head) => self.head_byte(head, byte),
                None => self.initial_byte(byte),
            };
        }
        count
    }

    /// The first byte of an item (or a break byte): how many top-level items it
    /// completed (0 or 1).
    fn initial_byte(&mut self, byte: u8) -> u64 {
        if byte == BREAK {
            return match self.open.last() {
                Some(Open::UntilBreak | Open::Chunks(_)) => {
                    self.open.pop();
                    self.item_done()
                }
                _ => self.malformed(),
            };
        }
        let major = byte >> 5;
        let info = byte & 0x1f;
        if let Some(Open::Chunks(string)) = self.open.last() {
            if major != *string || info == 31 {
                return self.malformed();
            }
        }
        match info {
            info @ 0..=23 => self.head_complete(major, u64::from(info)),
            info @ 24..=27 => {
                self.head = Some(PartialHead {
                    major,
                    argument: 0,
                    bytes_left: 1 << (info - 24),
                });
                0
            }
            31 if major == 2 || major == 3 => self.open_container(Open::Chunks(major)),
            31 if major == 4 || major == 5 => self.open_container(Open::UntilBreak),
            _ => self.malformed(),
        }
    }

    fn head_byte(&mut self, mut head: PartialHead, byte: u8) -> u64 {
        head.argument = (head.argument << 8) | u64::from(byte);
        head.bytes_left -= 1;
        if head.bytes_left > 0 {
            self.head = Some(head);
            return 0;
        }
        self.head_complete(head.major, head.argument)
    }

    fn head_complete(&mut self, major: u8, argument: u64) -> u64 {
        match major {
            0 | 1 | 7 => self.item_done(),
            2 | 3 if argument == 0 => self.item_done(),
            2 | 3 => {
                self.string_left = argument;
                0
            }
            4 | 5 => {
                let per_entry = if major == 5 { 2 } else { 1 };
                match argument.checked_mul(per_entry) {
                    Some(0) => self.item_done(),
                    Some(items) => self.open_container(Open::Items(items)),
                    None => self.malformed(),
                }
            }
            // A tag: exactly one item follows.
            _ => self.open_container(Open::Items(1)),
        }
    }

    fn open_container(&mut self, container: Open) -> u64 {
        if self.open.len() >= MAX_DEPTH {
            return self.malformed();
        }
        self.open.push(container);
        0
    }

    /// An item ended: it fills a slot of its container, which may end in turn.
    /// Returns 1 when a top-level item ended.
    fn item_done(&mut self) -> u64 {
        loop {
            match self.open.last_mut() {
                None => return 1,
                Some(Open::UntilBreak | Open::Chunks(_)) => return 0,
                Some(Open::Items(left)) => {
                    *left -= 1;
                    if *left > 0 {
                        return 0;
                    }
                    self.open.pop();
                }
            }
        }
    }

    fn malformed(&mut self) -> u64 {
        self.broken = true;
        self.open = Vec::new();
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_string_length_near_the_maximum_is_skipped_not_an_overflow() {
        // A byte string whose 8-byte length is u64::MAX: whatever follows is its
        // payload, so nothing more is counted, and nothing is kept while waiting.
        let mut counter = ItemCounter::default();
        let item = [0x5b, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x00];
        assert_eq!(counter.push(&item), 0);
        assert_eq!(counter.push(EVENT), 0);
        assert_eq!(counter.string_left, u64::MAX - 1 - EVENT.len() as u64);
    }

    #[test]
    fn a_long_event_in_small_chunks_is_counted_once_it_ends() {
        // A 1 MiB text string, announced with a 4-byte length, then an event.
        let mut stream = vec![0x7a, 0x00, 0x10, 0x00, 0x00];
        stream.resize(stream.len() + (1 << 20), b'x');
        stream.extend_from_slice(EVENT);
        let mut counter = ItemCounter::default();
        let counts: Vec<u64> = stream.chunks(1000).map(|c| counter.push(c)).collect();
        assert_eq!(counts.iter().sum::<u64>(), 2);
        assert_eq!(counts.last(), Some(&2), "both end in the last chunk");
        assert!(counter.open.is_empty() && counter.head.is_none());
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
        // Empty strings, arrays and maps end at their head.
        check(&[&[0x40, 0x60, 0x80, 0xa0]], 4);
        // A 4-byte head split across three chunks, inside an array.
        check(&[&[0x82, 0x1a, 0x00], &[0x00, 0x01], &[0x00, 0x05]], 1);
    }

    #[test]
    fn malformed_input_stops_counting_without_panicking() {
        let mut counter = ItemCounter::default();
        assert_eq!(counter.push(&[0x1c]), 0);
        assert_eq!(counter.push(EVENT), 0);
        let mut deep = vec![0x81u8; 200];
        deep.push(0x01);
        check(&[&deep], 0);
        // A break byte outside an indefinite-length item.
        check(&[&[0x81, 0xff], EVENT], 0);
        check(&[&[0xff], EVENT], 0);
        // An indefinite-length string holds definite strings of its own type
        // only: not another indefinite one, not a text chunk in a byte string.
        check(&[&[0x5f, 0x41, 0x00, 0xff], EVENT], 2);
        check(&[&[0x7f, 0x61, b'a', 0x60, 0xff], EVENT], 2);
        check(&[&[0x5f, 0x5f, 0xff, 0xff], EVENT], 0);
        check(&[&[0x5f, 0x61, b'a', 0xff], EVENT], 0);
        check(&[&[0x7f, 0x01, 0xff], EVENT], 0);
    }

    /// Against an independent encoder: any sequence of well-formed items that
    /// ciborium writes, cut into chunks anywhere, counts as that many items.
    mod against_ciborium {
        use super::*;
        use ciborium::Value;
        use proptest::prelude::*;

        fn value() -> impl Strategy<Value = Value> {
            let leaf = prop_oneof![
                any::<i64>().prop_map(|n| Value::Integer(n.into())),
                any::<u64>().prop_map(|n| Value::Integer(n.into())),
                any::<f64>().prop_map(Value::Float),
                any::<bool>().prop_map(Value::Bool),
                Just(Value::Null),
                ".{0,40}".prop_map(Value::Text),
                // Lengths past 23, 255 and 65535 take 1-, 2- and 4-byte heads.
                prop_oneof![0usize..30, 250usize..300, 65_530usize..65_540]
                    .prop_map(|len| Value::Bytes(vec![0x5a; len])),
            ];
            leaf.prop_recursive(6, 64, 6, |inner| {
                prop_oneof![
                    prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                    prop::collection::vec((inner.clone(), inner.clone()), 0..4)
                        .prop_map(Value::Map),
                    (any::<u64>(), inner).prop_map(|(tag, v)| Value::Tag(tag, Box::new(v))),
                ]
            })
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]
            #[test]
            fn counts_what_ciborium_wrote(
                items in prop::collection::vec(value(), 1..5),
                cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..6),
            ) {
                let mut stream = Vec::new();
                for item in &items {
                    ciborium::into_writer(item, &mut stream).expect("encodes");
                }
                let mut at: Vec<usize> = cuts.iter().map(|c| c.index(stream.len() + 1)).collect();
                at.push(0);
                at.push(stream.len());
                at.sort_unstable();
                let mut counter = ItemCounter::default();
                let counted: u64 = at
                    .windows(2)
                    .map(|w| counter.push(&stream[w[0]..w[1]]))
                    .sum();
                prop_assert_eq!(counted, items.len() as u64);
                prop_assert!(counter.open.is_empty() && counter.head.is_none());
            }
        }
    }
}
