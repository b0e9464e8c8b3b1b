//! The ownership scan of a named GET answer: one pass over the JSON text that
//! looks only at `kind`, `apiVersion`, `metadata.labels` and, in a `Table`, each
//! row's `object.metadata.labels`, and skips every other value without building it
//! (skipped values are still checked to be JSON; see [`crate::skim`]). The answer
//! of a GET is usually passed on unchanged, so building the whole document only to
//! read two labels would be wasted work on every request.
//!
//! A key given twice counts with its last value, as in a parsed document. A value
//! the scan does not read as text (a `kind` that is a number, say) is skipped like
//! any other, so a number beyond f64's range or a lone surrogate escape in it
//! does not make the answer undecodable; only the owner labels decide.

use crate::skim::{Skim, SkimError};

use super::{Owner, Visibility, OWNER_PROJECT_LABEL, OWNER_VCLUSTER_LABEL};

/// Judges a JSON named-GET answer; see [`super::response_visibility`].
pub(super) fn visibility(owner: &Owner, body: &[u8]) -> Visibility {
    // A parsed document would refuse an answer that is not UTF-8, and so does this.
    let Ok(text) = std::str::from_utf8(body) else {
        return Visibility::Undecodable;
    };
    let mut skim = Skim::new(text);
    let scanned = read_object(&mut skim, owner, Rows::read).and_then(|o| skim.end().map(|()| o));
    let Ok(Some(object)) = scanned else {
        return Visibility::Undecodable;
    };
    if object.kind_is_table && object.api_is_meta {
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
#[derive(Default)]
struct Object {
    /// `kind` is `Table`.
    kind_is_table: bool,
    /// `apiVersion` is of `meta.k8s.io`.
    api_is_meta: bool,
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

/// How an object's `rows` value is read: as a Table's rows in the answer itself,
/// skipped in a row's object (a row's rows are not the answer's).
type ReadRows = fn(&mut Skim, &Owner) -> Result<Rows, SkimError>;

/// Reads the next value: `Some` of what it says if it is an object, `None` (the
/// value skipped) otherwise.
fn read_object(
    skim: &mut Skim,
    owner: &Owner,
    read_rows: ReadRows,
) -> Result<Option<Object>, SkimError> {
    let Some(mut entries) = skim.object_or_skip()? else {
        return Ok(None);
    };
    let mut object = Object::default();
    while let Some(key) = entries.next_key(skim)? {
        match key.as_ref() {
            "kind" => object.kind_is_table = skim.string_or_skip()?.is_some_and(|s| s == "Table"),
            "apiVersion" => {
                object.api_is_meta = skim
                    .string_or_skip()?
                    .is_some_and(|s| s.starts_with("meta.k8s.io/"))
            }
            "metadata" => object.metadata = read_metadata(skim, owner)?,
            "rows" => object.rows = read_rows(skim, owner)?,
            _ => skim.skip()?,
        }
    }
    Ok(Some(object))
}

/// Reads the next value: `Some(owned)` if it is an object (owned when its
/// `labels` carry both owner labels), `None` (skipped) otherwise.
fn read_metadata(skim: &mut Skim, owner: &Owner) -> Result<Option<bool>, SkimError> {
    let Some(mut entries) = skim.object_or_skip()? else {
        return Ok(None);
    };
    let mut owned = false;
    while let Some(key) = entries.next_key(skim)? {
        match key.as_ref() {
            "labels" => owned = read_labels(skim, owner)?,
            _ => skim.skip()?,
        }
    }
    Ok(Some(owned))
}

/// Reads the next value: whether it is an object whose owner labels both have
/// the owner's values.
fn read_labels(skim: &mut Skim, owner: &Owner) -> Result<bool, SkimError> {
    let Some(mut entries) = skim.object_or_skip()? else {
        return Ok(false);
    };
    let (mut name_matches, mut project_matches) = (false, false);
    while let Some(key) = entries.next_key(skim)? {
        match key.as_ref() {
            OWNER_VCLUSTER_LABEL => {
                name_matches = skim.string_or_skip()?.is_some_and(|s| s == owner.name)
            }
            OWNER_PROJECT_LABEL => {
                project_matches = skim.string_or_skip()?.is_some_and(|s| s == owner.project)
            }
            _ => skim.skip()?,
        }
    }
    Ok(name_matches && project_matches)
}

impl Rows {
    /// Reads a Table's `rows`: each row is judged by its `object`'s metadata.
    fn read(skim: &mut Skim, owner: &Owner) -> Result<Rows, SkimError> {
        let Some(mut elements) = skim.array_or_skip()? else {
            return Ok(Rows::Invalid);
        };
        let (mut empty, mut undecodable, mut all_owned) = (true, false, true);
        while elements.next(skim)? {
            empty = false;
            match read_row(skim, owner)? {
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

    /// Skips the `rows` of a row's object.
    fn skip(skim: &mut Skim, _: &Owner) -> Result<Rows, SkimError> {
        skim.skip()?;
        Ok(Rows::Invalid)
    }
}

/// Reads a Table row: `Some(owned)` when it is an object whose `object` is an
/// object with `metadata` that is an object.
fn read_row(skim: &mut Skim, owner: &Owner) -> Result<Option<bool>, SkimError> {
    let Some(mut entries) = skim.object_or_skip()? else {
        return Ok(None);
    };
    let mut owned = None;
    while let Some(key) = entries.next_key(skim)? {
        match key.as_ref() {
            "object" => {
                owned = read_object(skim, owner, Rows::skip)?.and_then(|object| object.metadata)
            }
            _ => skim.skip()?,
        }
    }
    Ok(owned)
}
