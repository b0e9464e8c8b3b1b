//! What a YAML body grows to once its aliases are replayed, found before it is
//! read.
//!
//! A YAML alias (`*name`) repeats the node its anchor names, so a small text can
//! stand for a huge document: a 64 KiB string anchored once and aliased a
//! thousand times reads as 64 MiB. The strict read builds that document, writes it
//! out as JSON and sends it, so the memory the proxy admits a read for must count
//! what the aliases add, and a document whose JSON could never be accepted by the
//! target (its body limit is the same 3 MiB) is refused before it is built. This
//! walk reads the parser's events only, keeping the sizes of the anchored nodes
//! and the containers still open, never a node itself.

use serde_saphyr::granit_parser::{Event, Parser, ScalarStyle};

/// The size of a document, as [`super::parse_cost`] counts a text: the JSON it
/// is written as, and the memory reading it takes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Expansion {
    /// At most the length of the JSON text: a scalar's own bytes (one byte for a
    /// plain scalar that may be a number, which JSON can write shorter, as `16`
    /// for `0x10`, and for a tagged one); two bytes per container; quotes and
    /// separators left out; nothing for what a `<<` merge key brings in. So a
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
    /// The document's JSON would be longer than `limit` bytes.
    TooLarge,
    /// The text is not YAML the event parser reads (the strict read refuses it,
    /// or reads it as JSON, which has no aliases).
    Unreadable,
    /// Containers nested deeper than the strict read accepts.
    TooDeep,
}

/// The expanded size of a YAML text's documents, every alias counted as the
/// node it repeats. Stops as soon as the JSON would pass `json_limit` bytes.
pub fn expansion(text: &str, json_limit: usize, max_depth: usize) -> Result<Expansion, Stop> {
    let mut walk = Walk::default();
    for event in Parser::new_from_str(text) {
        let (event, _) = event.map_err(|_| Stop::Unreadable)?;
        walk.event(event, max_depth)?;
        if walk.total.json_bytes > json_limit {
            return Err(Stop::TooLarge);
        }
    }
    Ok(walk.total)
}

/// One parsed node's memory, as in `parse_cost`.
const NODE: usize = 40;

#[derive(Default)]
struct Walk {
    total: Expansion,
    /// The sizes of anchored nodes, by anchor id (ids count up from 1).
    anchored: Vec<Expansion>,
    /// Open containers: their anchor id and the total when they opened.
    open: Vec<(usize, Expansion)>,
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
                self.node_starts();
                let plain = matches!(style, ScalarStyle::Plain);
                let merge_key = plain && value == "<<";
                let maybe_number = plain
                    && value
                        .starts_with(|c: char| c.is_ascii_digit() || matches!(c, '+' | '-' | '.'));
                let shown = if merge_key {
                    0
                } else if maybe_number || tag.is_some() {
                    1
                } else {
                    value.len()
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
                self.node_starts();
                self.open.push((anchor, self.total));
                self.total.add(Expansion {
                    json_bytes: 2,
                    cost: 2 + NODE,
                });
            }
            Event::SequenceEnd | Event::MappingEnd => {
                let (anchor, at_open) = self.open.pop().ok_or(Stop::Unreadable)?;
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

    fn node_starts(&mut self) {
        if std::mem::take(&mut self.merge_next) && self.merging.is_none() {
            self.merging = Some((self.open.len(), self.total.json_bytes));
        }
    }

    fn node_ends(&mut self) {
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

    fn of(text: &str) -> Result<Expansion, Stop> {
        expansion(text, 1 << 20, 128)
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
        assert_eq!(expansion(text, 10_000, 128), Err(Stop::TooLarge));
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
    fn deep_nesting_and_broken_text_stop_the_walk() {
        let deep = format!("{}{}", "[".repeat(10), "]".repeat(10));
        assert!(expansion(&deep, 1 << 20, 10).is_ok());
        assert_eq!(expansion(&deep, 1 << 20, 9), Err(Stop::TooDeep));
        assert_eq!(of("a: [1, 2"), Err(Stop::Unreadable));
    }
}
