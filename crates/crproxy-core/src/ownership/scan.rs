//! The ownership scan of a named GET answer: one pass over the JSON text that
//! looks only at `kind`, `apiVersion`, `metadata.labels` and, in a `Table`, each
//! row's `object.metadata.labels`, and skips every other value without building it
//! (skipped values are still checked to be JSON). The answer of a GET is usually
//! passed on unchanged, so building the whole document only to read two labels
//! would be wasted work on every request.
//!
//! A key given twice counts with its last value, as in a parsed document.

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use std::fmt;

use super::{Owner, Visibility, OWNER_PROJECT_LABEL, OWNER_VCLUSTER_LABEL};

/// Judges a JSON named-GET answer; see [`super::response_visibility`].
pub(super) fn visibility(owner: &Owner, body: &[u8]) -> Visibility {
    // Skipped strings are not checked for UTF-8 by the scan; a parsed document
    // would refuse the answer for it, and so does this.
    if std::str::from_utf8(body).is_err() {
        return Visibility::Undecodable;
    }
    let mut json = serde_json::Deserializer::from_slice(body);
    let scanned = ObjectSeed { owner }.deserialize(&mut json);
    let Ok(Some(object)) = scanned.and_then(|s| json.end().map(|()| s)) else {
        return Visibility::Undecodable;
    };
    if object.is_table {
        let Rows::Array {
            empty,
            undecodable,
            all_owned,
        } = object.rows
        else {
            return Visibility::Undecodable;
        };
        return match (empty || undecodable, all_owned) {
            (true, _) => Visibility::Undecodable,
            (false, true) => Visibility::Owned,
            (false, false) => Visibility::NotOwned,
        };
    }
    match object.metadata {
        None => Visibility::Undecodable,
        Some(true) => Visibility::Owned,
        Some(false) => Visibility::NotOwned,
    }
}

/// What an object says about ownership.
struct Object {
    /// `kind: Table` with an `apiVersion` of `meta.k8s.io`.
    is_table: bool,
    /// `Some(owned)` when `metadata` is an object.
    metadata: Option<bool>,
    rows: Rows,
}

/// A Table's `rows`.
enum Rows {
    /// Missing, or not an array.
    Invalid,
    Array {
        empty: bool,
        /// Some row has no object with metadata to judge.
        undecodable: bool,
        all_owned: bool,
    },
}

/// Reads any value: `Some` for an object, `None` (the value skipped) otherwise.
struct ObjectSeed<'o> {
    owner: &'o Owner,
}

/// Reads a `metadata` value: `Some(owned)` for an object.
struct MetadataSeed<'o> {
    owner: &'o Owner,
}

/// Reads a `labels` value: whether it is an object carrying both labels with the
/// owner's values.
struct LabelsSeed<'o> {
    owner: &'o Owner,
}

/// Reads a `rows` value.
struct RowsSeed<'o> {
    owner: &'o Owner,
}

/// Reads one row: `Some(owned)` when it is an object whose `object` is an object
/// with `metadata` that is an object.
struct RowSeed<'o> {
    owner: &'o Owner,
}

/// Reads a key: its index among `wanted`, if it is one of them.
struct KeySeed<'k> {
    wanted: &'k [&'k str],
}

/// Reads any value: whether it is a string that `test` accepts.
struct StrSeed<F> {
    test: F,
}

/// Everything a visitor that only cares for one JSON type does with the others:
/// skip them and report `$other`.
macro_rules! skip_other_types {
    ($other:expr) => {
        fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<Self::Value, E> {
            Ok($other)
        }
        fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<Self::Value, E> {
            Ok($other)
        }
        fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<Self::Value, E> {
            Ok($other)
        }
        fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<Self::Value, E> {
            Ok($other)
        }
        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok($other)
        }
    };
}

macro_rules! skip_strings {
    ($other:expr) => {
        fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<Self::Value, E> {
            Ok($other)
        }
    };
}

macro_rules! skip_arrays {
    ($other:expr) => {
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok($other)
        }
    };
}

macro_rules! skip_objects {
    ($other:expr) => {
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
            Ok($other)
        }
    };
}

impl<'de> DeserializeSeed<'de> for ObjectSeed<'_> {
    type Value = Option<Object>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ObjectSeed<'_> {
    type Value = Option<Object>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    skip_other_types!(None);
    skip_strings!(None);
    skip_arrays!(None);
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        const KEYS: &[&str] = &["kind", "apiVersion", "metadata", "rows"];
        let owner = self.owner;
        let (mut kind_is_table, mut api_is_meta) = (false, false);
        let mut object = Object {
            is_table: false,
            metadata: None,
            rows: Rows::Invalid,
        };
        while let Some(key) = map.next_key_seed(KeySeed { wanted: KEYS })? {
            match key {
                Some(0) => {
                    kind_is_table = map.next_value_seed(StrSeed {
                        test: |s: &str| s == "Table",
                    })?
                }
                Some(1) => {
                    api_is_meta = map.next_value_seed(StrSeed {
                        test: |s: &str| s.starts_with("meta.k8s.io/"),
                    })?
                }
                Some(2) => object.metadata = map.next_value_seed(MetadataSeed { owner })?,
                Some(3) => object.rows = map.next_value_seed(RowsSeed { owner })?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        object.is_table = kind_is_table && api_is_meta;
        Ok(Some(object))
    }
}

impl<'de> DeserializeSeed<'de> for MetadataSeed<'_> {
    type Value = Option<bool>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for MetadataSeed<'_> {
    type Value = Option<bool>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    skip_other_types!(None);
    skip_strings!(None);
    skip_arrays!(None);
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut owned = false;
        while let Some(key) = map.next_key_seed(KeySeed {
            wanted: &["labels"],
        })? {
            match key {
                Some(_) => owned = map.next_value_seed(LabelsSeed { owner: self.owner })?,
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Some(owned))
    }
}

impl<'de> DeserializeSeed<'de> for LabelsSeed<'_> {
    type Value = bool;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for LabelsSeed<'_> {
    type Value = bool;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    skip_other_types!(false);
    skip_strings!(false);
    skip_arrays!(false);
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        const KEYS: &[&str] = &[OWNER_VCLUSTER_LABEL, OWNER_PROJECT_LABEL];
        let (name, project) = (self.owner.name.as_str(), self.owner.project.as_str());
        let (mut name_matches, mut project_matches) = (false, false);
        while let Some(key) = map.next_key_seed(KeySeed { wanted: KEYS })? {
            match key {
                Some(0) => {
                    name_matches = map.next_value_seed(StrSeed {
                        test: |s: &str| s == name,
                    })?
                }
                Some(_) => {
                    project_matches = map.next_value_seed(StrSeed {
                        test: |s: &str| s == project,
                    })?
                }
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(name_matches && project_matches)
    }
}

impl<'de> DeserializeSeed<'de> for RowsSeed<'_> {
    type Value = Rows;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for RowsSeed<'_> {
    type Value = Rows;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    skip_other_types!(Rows::Invalid);
    skip_strings!(Rows::Invalid);
    skip_objects!(Rows::Invalid);
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let (mut empty, mut undecodable, mut all_owned) = (true, false, true);
        while let Some(row) = seq.next_element_seed(RowSeed { owner: self.owner })? {
            empty = false;
            match row {
                None => undecodable = true,
                Some(owned) => all_owned &= owned,
            }
        }
        Ok(Rows::Array {
            empty,
            undecodable,
            all_owned,
        })
    }
}

impl<'de> DeserializeSeed<'de> for RowSeed<'_> {
    type Value = Option<bool>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for RowSeed<'_> {
    type Value = Option<bool>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    skip_other_types!(None);
    skip_strings!(None);
    skip_arrays!(None);
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut owned = None;
        while let Some(key) = map.next_key_seed(KeySeed {
            wanted: &["object"],
        })? {
            match key {
                Some(_) => {
                    owned = map
                        .next_value_seed(ObjectSeed { owner: self.owner })?
                        .and_then(|object| object.metadata)
                }
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(owned)
    }
}

impl<'de> DeserializeSeed<'de> for KeySeed<'_> {
    type Value = Option<usize>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeySeed<'_> {
    type Value = Option<usize>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object key")
    }
    fn visit_str<E: serde::de::Error>(self, key: &str) -> Result<Self::Value, E> {
        Ok(self.wanted.iter().position(|w| *w == key))
    }
}

impl<'de, F: FnOnce(&str) -> bool> DeserializeSeed<'de> for StrSeed<F> {
    type Value = bool;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, F: FnOnce(&str) -> bool> Visitor<'de> for StrSeed<F> {
    type Value = bool;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    skip_other_types!(false);
    skip_arrays!(false);
    skip_objects!(false);
    fn visit_str<E: serde::de::Error>(self, value: &str) -> Result<Self::Value, E> {
        Ok((self.test)(value))
    }
}
