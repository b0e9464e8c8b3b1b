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
use std::marker::PhantomData;

use super::{Owner, Visibility, OWNER_PROJECT_LABEL, OWNER_VCLUSTER_LABEL};

/// Judges a JSON named-GET answer; see [`super::response_visibility`].
pub(super) fn visibility(owner: &Owner, body: &[u8]) -> Visibility {
    // Skipped strings are not checked for UTF-8 by the scan; a parsed document
    // would refuse the answer for it, and so does this.
    if std::str::from_utf8(body).is_err() {
        return Visibility::Undecodable;
    }
    let mut json = serde_json::Deserializer::from_slice(body);
    let scanned = object_only::<ObjectFields>(owner).deserialize(&mut json);
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
#[derive(Default)]
enum Rows {
    /// Missing, or not an array.
    #[default]
    Invalid,
    Array {
        empty: bool,
        /// Some row has no object with metadata to judge.
        undecodable: bool,
        all_owned: bool,
    },
}

/// One level of JSON object the scan looks into: the keys it reads, what it
/// keeps of their values, and what it makes of them at the object's end.
/// [`ObjectOnly`] walks the object and skips everything else.
trait Fields: Default {
    type Value;
    /// The keys whose values [`Fields::read`] reads.
    const KEYS: &'static [&'static str];
    /// Reads the value of `KEYS[key]`, the next value in `map`.
    fn read<'de, A: MapAccess<'de>>(
        &mut self,
        owner: &Owner,
        key: usize,
        map: &mut A,
    ) -> Result<(), A::Error>;
    /// What the object said, once it has ended.
    fn finish(self) -> Self::Value;
}

/// Reads any value: `Some` of what `F` makes of it when it is an object, `None`
/// (the value skipped) otherwise.
struct ObjectOnly<'o, F> {
    owner: &'o Owner,
    fields: PhantomData<F>,
}

/// Reads any value as `F` if it is an object.
fn object_only<F>(owner: &Owner) -> ObjectOnly<'_, F> {
    ObjectOnly {
        owner,
        fields: PhantomData,
    }
}

/// A document or a Table row's `object`.
#[derive(Default)]
struct ObjectFields {
    kind_is_table: bool,
    api_is_meta: bool,
    metadata: Option<bool>,
    rows: Rows,
}

impl Fields for ObjectFields {
    type Value = Object;
    const KEYS: &'static [&'static str] = &["kind", "apiVersion", "metadata", "rows"];
    fn read<'de, A: MapAccess<'de>>(
        &mut self,
        owner: &Owner,
        key: usize,
        map: &mut A,
    ) -> Result<(), A::Error> {
        match key {
            0 => self.kind_is_table = map.next_value_seed(StrSeed(|s: &str| s == "Table"))?,
            1 => {
                self.api_is_meta =
                    map.next_value_seed(StrSeed(|s: &str| s.starts_with("meta.k8s.io/")))?
            }
            2 => self.metadata = map.next_value_seed(object_only::<MetadataFields>(owner))?,
            _ => self.rows = map.next_value_seed(RowsSeed { owner })?,
        }
        Ok(())
    }
    fn finish(self) -> Object {
        Object {
            is_table: self.kind_is_table && self.api_is_meta,
            metadata: self.metadata,
            rows: self.rows,
        }
    }
}

/// A `metadata` object: whether its `labels` carry both owner labels.
#[derive(Default)]
struct MetadataFields {
    owned: bool,
}

impl Fields for MetadataFields {
    type Value = bool;
    const KEYS: &'static [&'static str] = &["labels"];
    fn read<'de, A: MapAccess<'de>>(
        &mut self,
        owner: &Owner,
        _: usize,
        map: &mut A,
    ) -> Result<(), A::Error> {
        let labels = map.next_value_seed(object_only::<LabelsFields>(owner))?;
        self.owned = labels.unwrap_or(false);
        Ok(())
    }
    fn finish(self) -> bool {
        self.owned
    }
}

/// A `labels` object: whether both owner labels have the owner's values.
#[derive(Default)]
struct LabelsFields {
    name_matches: bool,
    project_matches: bool,
}

impl Fields for LabelsFields {
    type Value = bool;
    const KEYS: &'static [&'static str] = &[OWNER_VCLUSTER_LABEL, OWNER_PROJECT_LABEL];
    fn read<'de, A: MapAccess<'de>>(
        &mut self,
        owner: &Owner,
        key: usize,
        map: &mut A,
    ) -> Result<(), A::Error> {
        match key {
            0 => self.name_matches = map.next_value_seed(StrSeed(|s: &str| s == owner.name))?,
            _ => {
                self.project_matches = map.next_value_seed(StrSeed(|s: &str| s == owner.project))?
            }
        }
        Ok(())
    }
    fn finish(self) -> bool {
        self.name_matches && self.project_matches
    }
}

/// A Table row: `Some(owned)` when its `object` is an object with `metadata`
/// that is an object.
#[derive(Default)]
struct RowFields {
    owned: Option<bool>,
}

impl Fields for RowFields {
    type Value = Option<bool>;
    const KEYS: &'static [&'static str] = &["object"];
    fn read<'de, A: MapAccess<'de>>(
        &mut self,
        owner: &Owner,
        _: usize,
        map: &mut A,
    ) -> Result<(), A::Error> {
        let object = map.next_value_seed(object_only::<ObjectFields>(owner))?;
        self.owned = object.and_then(|object| object.metadata);
        Ok(())
    }
    fn finish(self) -> Option<bool> {
        self.owned
    }
}

/// Reads a `rows` value.
struct RowsSeed<'o> {
    owner: &'o Owner,
}

/// Reads a key: its index among `wanted`, if it is one of them.
struct KeySeed<'k> {
    wanted: &'k [&'k str],
}

/// Reads any value: whether it is a string the function accepts.
struct StrSeed<F>(F);

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

impl<'de, F: Fields> DeserializeSeed<'de> for ObjectOnly<'_, F> {
    type Value = Option<F::Value>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, F: Fields> Visitor<'de> for ObjectOnly<'_, F> {
    type Value = Option<F::Value>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    skip_other_types!(None);
    skip_strings!(None);
    skip_arrays!(None);
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut fields = F::default();
        while let Some(key) = map.next_key_seed(KeySeed { wanted: F::KEYS })? {
            match key {
                Some(key) => fields.read(self.owner, key, &mut map)?,
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Some(fields.finish()))
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
        while let Some(row) = seq.next_element_seed(object_only::<RowFields>(self.owner))? {
            empty = false;
            match row.flatten() {
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
        Ok((self.0)(value))
    }
}
