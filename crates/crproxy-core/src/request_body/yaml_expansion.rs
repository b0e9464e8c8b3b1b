//! What a YAML body grows to once its aliases are replayed, found before it is
//! read.
//!
//! A YAML alias (`*name`) repeats the node its anchor names, so a small text can
//! stand for a huge document: a 64 KiB string anchored once and aliased a
//! thousand times reads as 64 MiB. The strict read builds that document, writes it
//! out as JSON and sends it, so the memory the proxy admits a read for must count
//! what the aliases add. A document whose JSON could never be accepted by the
//! target (its body limit is the same 3 MiB), or whose reading would take more
//! than a whole group/version's read budget, is refused before it is built. This
//! walk reads the parser's events only, keeping the sizes of the anchored nodes
//! and the containers still open, never a node itself. What it counts as JSON is
//! a lower bound; the JSON actually written is checked against the limit again.

use serde_saphyr::granit_parser::{Event, Parser, ScalarStyle, Tag};

use super::PARSED_NODE_BYTES;

/// The size of a document, as [`super::parse_cost`] counts a text: the JSON it
/// is written as, and the memory reading it takes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Expansion {
    /// At most the length of the JSON text: a string's own bytes; one byte for a
    /// plain scalar that reads as a number (JSON can write it shorter, as `16`
    /// for `0x10`) and for a tagged one that may be too (see [`tagged_as_text`]); two bytes per
    /// container; quotes and separators left out; nothing for what a `<<` merge
    /// key brings in (the mapping's own entries may override all of it). So a
    /// document refused for this is one whose JSON the target would refuse too.
    pub json_bytes: usize,
    /// `json_bytes` plus a parsed node's size for every node.
    pub cost: usize,
}

impl Expansion {
    fn add(&mut self, other: Expansion) {
        self.json_bytes = self.json_bytes.saturating_add(other.json_bytes);
        self.cost = self.cost.saturating_add(other.cost);
    }
}

/// Why the walk stopped.
#[derive(Debug, PartialEq, Eq)]
pub enum Stop {
    /// The document's JSON would be longer than its limit, or reading it would
    /// cost more than its limit.
    TooLarge,
    /// The text is not YAML the event parser reads (the strict read refuses it,
    /// or reads it as JSON, which has no aliases).
    Unreadable,
    /// Containers nested deeper than the strict read accepts.
    TooDeep,
}

/// Limits of a walk.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub json_bytes: usize,
    pub cost: usize,
    pub depth: usize,
}

/// The expanded size of a YAML text's documents, every alias counted as the
/// node it repeats. Stops as soon as a limit is passed.
pub fn expansion(text: &str, limits: Limits) -> Result<Expansion, Stop> {
    let mut walk = Walk::default();
    for event in Parser::new_from_str(text) {
        let (event, _) = event.map_err(|_| Stop::Unreadable)?;
        walk.event(event, limits.depth)?;
        if walk.total.json_bytes > limits.json_bytes || walk.total.cost > limits.cost {
            return Err(Stop::TooLarge);
        }
    }
    Ok(walk.total)
}

const NODE: usize = PARSED_NODE_BYTES;

/// Whether a plain scalar reads as a YAML 1.1 number (JSON may write it shorter
/// than its text). Generous: anything number-like counts, since a number counted
/// as text could make the walk refuse a body whose JSON fits.
fn reads_as_number(value: &str) -> bool {
    let unsigned = value.trim_start_matches(['+', '-']);
    let digits = unsigned.replace('_', "");
    let radix = |prefix: &str, radix: u32| {
        digits
            .strip_prefix(prefix)
            .is_some_and(|rest| !rest.is_empty() && rest.chars().all(|c| c.is_digit(radix)))
    };
    digits.parse::<f64>().is_ok()
        || radix("0x", 16)
        || radix("0o", 8)
        || radix("0b", 2)
        || matches!(unsigned.to_ascii_lowercase().as_str(), ".inf" | ".nan")
        // Sexagesimal (`1:30`), read as a number by YAML 1.1.
        || (digits.contains(':') && digits.chars().all(|c| c.is_ascii_digit() || matches!(c, ':' | '.')))
}

/// Whether a tagged scalar is counted as its own text, following how the strict
/// read (serde-saphyr 2) resolves tags. A tag that makes a string (`!!str`,
/// `!str`, the non-specific `!`) writes the text quoted: counted in full. A type
/// JSON may write shorter (`!!int 0x10` is `16`, `!null anything` is `null`, in
/// the core namespace or under the local handle) counts one byte; matched
/// generously, with any number of `!`, since one byte is always within the
/// bound. A tag the reader does not know leaves the scalar read from its text,
/// so a text that reads as a number counts one byte too.
fn tagged_as_text(tag: &Tag, value: &str) -> bool {
    let core = tag.suffix_in_namespace(CORE_SCHEMA);
    let local = tag.suffix_in_namespace("!");
    let makes_string = match (&core, &local) {
        (Some(name), _) => name.strip_prefix('!').unwrap_or(name) == "str",
        (None, Some(name)) => matches!(name.as_ref(), "" | "!" | "str" | "!str"),
        (None, None) => false,
    };
    if makes_string {
        return true;
    }
    let typed = [core, local]
        .into_iter()
        .flatten()
        .any(|name| TYPED_TAGS.contains(&name.trim_start_matches('!')));
    !typed && !reads_as_number(value)
}

/// Tag names the strict read gives a type other than a string's.
const TYPED_TAGS: [&str; 12] = [
    "int",
    "float",
    "bool",
    "null",
    "binary",
    "timestamp",
    "time",
    "degrees",
    "radians",
    "include",
    "seq",
    "map",
];

/// Whether a mapping key is a merge key: `<<` plain and untagged, or tagged
/// `!!merge` in any style, as the strict read takes it.
fn is_merge_key(value: &str, style: ScalarStyle, tag: Option<&Tag>) -> bool {
    value == "<<"
        && match tag {
            None => matches!(style, ScalarStyle::Plain),
            Some(tag) => tag
                .suffix_in_namespace(CORE_SCHEMA)
                .is_some_and(|name| name == "merge"),
        }
}

/// The namespace of YAML's own tags (`!!str` is `tag:yaml.org,2002:str`).
const CORE_SCHEMA: &str = "tag:yaml.org,2002:";

struct Open {
    anchor: usize,
    at_open: Expansion,
    /// `Some(nodes ended so far)` for a mapping.
    mapping: Option<usize>,
}

#[derive(Default)]
struct Walk {
    total: Expansion,
    /// The sizes of anchored nodes, by anchor id (ids count up from 1).
    anchored: Vec<Expansion>,
    /// Open containers: their anchor id, the total when they opened, and for a
    /// mapping how many of its keys and values have ended (a key ends at even).
    open: Vec<Open>,
    /// A `<<` merge key was read: the next node's entries may all be overridden
    /// by the mapping's own, so its JSON is not counted.
    merge_next: bool,
    /// The depth of the node being merged, and the JSON count before it.
    merging: Option<(usize, usize)>,
}

impl Walk {
    fn event(&mut self, event: Event<'_>, max_depth: usize) -> Result<(), Stop> {
        match event {
            Event::Scalar(value, style, anchor, tag) => {
                let is_key = self.at_key();
                self.node_starts();
                let merge_key = is_key && is_merge_key(&value, style, tag.as_deref());
                // Counted in full unless JSON may write it shorter than its text:
                // a number, or a tag that gives it another type.
                let string = match &tag {
                    None => !(matches!(style, ScalarStyle::Plain) && reads_as_number(&value)),
                    Some(tag) => tagged_as_text(tag, &value),
                };
                let shown = if merge_key {
                    0
                } else if string {
                    value.len()
                } else {
                    1
                };
                let node = Expansion {
                    json_bytes: shown,
                    cost: value.len() + NODE,
                };
                self.total.add(node);
                remember(&mut self.anchored, anchor, node);
                self.node_ends();
                self.merge_next |= merge_key;
            }
            Event::SequenceStart(_, anchor, _) | Event::MappingStart(_, anchor, _) => {
                if self.open.len() >= max_depth {
                    return Err(Stop::TooDeep);
                }
                let mapping = matches!(event, Event::MappingStart(..)).then_some(0);
                self.node_starts();
                self.open.push(Open {
                    anchor,
                    at_open: self.total,
                    mapping,
                });
                self.total.add(Expansion {
                    json_bytes: 2,
                    cost: 2 + NODE,
                });
            }
            Event::SequenceEnd | Event::MappingEnd => {
                let Open {
                    anchor, at_open, ..
                } = self.open.pop().ok_or(Stop::Unreadable)?;
                let node = Expansion {
                    json_bytes: self.total.json_bytes - at_open.json_bytes,
                    cost: self.total.cost - at_open.cost,
                };
                remember(&mut self.anchored, anchor, node);
                self.node_ends();
            }
            // An alias of an anchor still open (a recursive one) or unknown adds
            // nothing here; the strict read refuses it.
            Event::Alias(anchor) => {
                self.node_starts();
                if let Some(node) = self.anchored.get(anchor) {
                    self.total.add(*node);
                }
                self.node_ends();
            }
            _ => {}
        }
        Ok(())
    }

    /// Whether the next node is a key of the innermost mapping.
    fn at_key(&self) -> bool {
        self.open
            .last()
            .and_then(|open| open.mapping)
            .is_some_and(|ended| ended % 2 == 0)
    }

    fn node_starts(&mut self) {
        if std::mem::take(&mut self.merge_next) && self.merging.is_none() {
            self.merging = Some((self.open.len(), self.total.json_bytes));
        }
    }

    fn node_ends(&mut self) {
        if let Some(Some(ended)) = self.open.last_mut().map(|open| &mut open.mapping) {
            *ended += 1;
        }
        if let Some((depth, json_bytes)) = self.merging {
            if self.open.len() == depth {
                self.total.json_bytes = json_bytes;
                self.merging = None;
            }
        }
    }
}

/// Records an anchored node's size; anchor id 0 means no anchor.
fn remember(anchored: &mut Vec<Expansion>, anchor: usize, node: Expansion) {
    if anchor == 0 {
        return;
    }
    if anchored.len() <= anchor {
        anchored.resize(anchor + 1, Expansion::default());
    }
    anchored[anchor] = node;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(json_bytes: usize, depth: usize) -> Limits {
        Limits {
            json_bytes,
            cost: usize::MAX,
            depth,
        }
    }

    fn of(text: &str) -> Result<Expansion, Stop> {
        expansion(text, limits(1 << 20, 128))
    }

    #[test]
    fn an_alias_counts_as_the_node_it_repeats() {
        let once = of("a: &x [1, 2, 3]\n").expect("reads");
        let twice = of("a: &x [1, 2, 3]\nb: *x\n").expect("reads");
        let written_out = of("a: [1, 2, 3]\nb: [1, 2, 3]\n").expect("reads");
        assert_eq!(twice, written_out);
        assert!(twice.cost > once.cost);
    }

    #[test]
    fn aliases_of_aliases_multiply() {
        let text = "a: &a [x, x, x, x, x, x, x, x, x, x]\n\
                    b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n\
                    c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\n\
                    d: [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\n";
        let scalars = of(text).expect("reads").json_bytes;
        assert!(scalars > 10_000, "{scalars}");
        assert_eq!(expansion(text, limits(10_000, 128)), Err(Stop::TooLarge));
        let cost_limit = Limits {
            cost: 100_000,
            ..limits(usize::MAX, 128)
        };
        assert_eq!(expansion(text, cost_limit), Err(Stop::TooLarge));
    }

    #[test]
    fn a_redefined_anchor_repeats_its_latest_node() {
        let later = of("a: &x 1\nb: &x [1, 2, 3, 4]\nc: *x\n").expect("reads");
        let written_out = of("a: 1\nb: [1, 2, 3, 4]\nc: [1, 2, 3, 4]\n").expect("reads");
        assert_eq!(later, written_out);
    }

    #[test]
    fn the_json_size_is_never_overestimated() {
        // Each text, read strictly and written as JSON, is at least as long as
        // the walk says: numbers JSON writes shorter count one byte.
        for text in [
            "a: 0x10\nb: 0o17\nc: 0755\nd: +12\ne: 1.50\nf: .5\n",
            "a: ~\nb: yes\nc: 'quoted'\nd: \"x\\u0041\"\ne: !!str 0x10\n",
            "- &n 0x100000\n- *n\n- *n\n- [*n, *n]\n",
            "base: &b {a: 1, b: 2, c: 3}\nm: {<<: *b, a: 4, b: 5, c: 6}\nn: {<<: [*b, *b], c: 7}\n",
            "1",
            "x",
            "!8-77#-7: \n  674444444444444344444443E056",
            "--- !null kind  =\n",
            "a: !bool off\nb: !int 0x0000010\nc: !float 1.500000\nd: !str 0x10\ne: ! 12\n",
            "a: !<!!!> 0x0000000001\nb: !<!!!str> 1.000000000\n",
            "a: !<tag:yaml.org,2002:> 0x0000000001\n",
            "a: !<tag:yaml.org,2002:!null> any long text\n",
            "b: &b {xxxxxxxxxxxxxxxxxxxx: 1}\nm: {!!merge <<: *b, xxxxxxxxxxxxxxxxxxxx: 2}\n",
        ] {
            let json =
                crate::request_body::WriteBody::parse(Some("application/yaml"), text.as_bytes())
                    .expect("reads")
                    .to_bytes()
                    .len();
            let walked = of(text).expect("walks").json_bytes;
            assert!(walked <= json, "{text:?}: walked {walked}, JSON {json}");
        }
    }

    #[test]
    fn what_only_looks_like_a_number_or_a_merge_is_counted_in_full() {
        // Each aliases a 1000-byte string 20 times: at least 20 000 bytes of JSON.
        let long = "x".repeat(1000);
        for text in [
            format!("a: &a !!str \"{long}\"\nb: [{}0]\n", "*a, ".repeat(20)),
            format!("a: &a 1{long}\nb: [{}0]\n", "*a, ".repeat(20)),
            format!("a: &a \"{long}\"\nb: [{}0]\n", "<<, *a, ".repeat(20)),
            format!(
                "a: &a \"{long}\"\nm: &m {{k: *a}}\nb: [{}0]\n",
                "*m, ".repeat(20)
            ),
        ] {
            let walked = of(&text).expect("walks").json_bytes;
            assert!(walked > 20_000, "{walked}: {text:.60}");
        }
        for number in [
            "12", "-1.5e3", "0x1F", "0o17", "0b101", "1_000", ".inf", "1:30",
        ] {
            assert!(reads_as_number(number), "{number}");
        }
        for text in ["1x", "1.2.3", "0x", "12-", "-"] {
            assert!(!reads_as_number(text), "{text}");
        }
    }

    #[test]
    fn deep_nesting_and_broken_text_stop_the_walk() {
        let deep = format!("{}{}", "[".repeat(10), "]".repeat(10));
        assert!(expansion(&deep, limits(1 << 20, 10)).is_ok());
        assert_eq!(expansion(&deep, limits(1 << 20, 9)), Err(Stop::TooDeep));
        assert_eq!(of("a: [1, 2"), Err(Stop::Unreadable));
    }
}
