//! The few metadata fields the cache reads from watch events, list pages and
//! write answers, read with [`Skim`]: the text must be UTF-8 (kube-apiserver's
//! always is), every string borrows from it unless JSON escapes force a copy, of
//! `labels` only the two owner labels are kept, and every other value
//! (`managedFields` above all) is skipped in one pass. The cache decodes an event for every write made to a watched
//! resource, by anyone, so this is on the write path's CPU bill.
//!
//! A field that must be text and is something else, or an object that is
//! something else, makes the whole text undecodable. A key given twice counts
//! with its last value, as in a parsed document.

use std::borrow::Cow;

use crproxy_core::ownership::{Owner, OWNER_PROJECT_LABEL, OWNER_VCLUSTER_LABEL};
use crproxy_core::precondition::Pin;
use crproxy_core::skim::{Kind, Skim, SkimError};

/// Why a text from the target could not be read.
#[derive(Debug, thiserror::Error)]
pub(super) enum DecodeError {
    #[error("not UTF-8: {0}")]
    Utf8(#[from] std::str::Utf8Error),
    #[error("not readable JSON: {0}")]
    Json(#[from] SkimError),
    #[error("a watch event without a type")]
    MissingType,
}

/// One line of a watch response.
pub(super) struct Event<'a> {
    pub event_type: Cow<'a, str>,
    pub object: EventObject<'a>,
}

/// A `PartialObjectMetadata`, or the `Status` of an ERROR event.
#[derive(Default)]
pub(super) struct EventObject<'a> {
    pub metadata: ObjectMeta<'a>,
    pub message: Option<Cow<'a, str>>,
}

/// A page of a `PartialObjectMetadataList`: its own metadata and each item's.
pub(super) struct MetaList<'a> {
    pub metadata: ListMeta<'a>,
    pub items: Vec<ObjectMeta<'a>>,
}

#[derive(Default)]
pub(super) struct ListMeta<'a> {
    pub resource_version: Option<Cow<'a, str>>,
    pub continue_token: Option<Cow<'a, str>>,
}

#[derive(Default)]
pub(super) struct ObjectMeta<'a> {
    pub name: Option<Cow<'a, str>>,
    pub namespace: Option<Cow<'a, str>>,
    pub uid: Option<Cow<'a, str>>,
    pub resource_version: Option<Cow<'a, str>>,
    pub labels: OwnerLabels<'a>,
}

/// The owner labels of a `labels` object; the other labels are skipped.
#[derive(Debug, Default)]
pub(super) struct OwnerLabels<'a> {
    vcluster: Option<Cow<'a, str>>,
    project: Option<Cow<'a, str>>,
}

impl<'a> Event<'a> {
    /// Reads one watch event.
    pub fn decode(line: &'a [u8]) -> Result<Self, DecodeError> {
        let mut skim = Skim::new(std::str::from_utf8(line)?);
        let (mut event_type, mut object) = (None, EventObject::default());
        let mut entries = skim.object()?;
        while let Some(key) = entries.next_key(&mut skim)? {
            match key.as_ref() {
                "type" => event_type = Some(skim.string()?),
                "object" => object = EventObject::read(&mut skim)?,
                _ => skim.skip()?,
            }
        }
        skim.end()?;
        Ok(Event {
            event_type: event_type.ok_or(DecodeError::MissingType)?,
            object,
        })
    }
}

impl<'a> EventObject<'a> {
    fn read(skim: &mut Skim<'a>) -> Result<Self, SkimError> {
        let mut object = EventObject::default();
        let mut entries = skim.object()?;
        while let Some(key) = entries.next_key(skim)? {
            match key.as_ref() {
                "metadata" => object.metadata = ObjectMeta::read(skim)?,
                "message" => object.message = skim.optional_string()?,
                _ => skim.skip()?,
            }
        }
        Ok(object)
    }
}

impl<'a> MetaList<'a> {
    /// Reads one list page.
    pub fn decode(page: &'a [u8]) -> Result<Self, DecodeError> {
        let mut skim = Skim::new(std::str::from_utf8(page)?);
        let (mut metadata, mut items) = (ListMeta::default(), Vec::new());
        let mut entries = skim.object()?;
        while let Some(key) = entries.next_key(&mut skim)? {
            match key.as_ref() {
                "metadata" => metadata = ListMeta::read(&mut skim)?,
                "items" => {
                    items.clear();
                    let mut elements = skim.array()?;
                    while elements.next(&mut skim)? {
                        items.push(ObjectMeta::of_object(&mut skim)?);
                    }
                }
                _ => skim.skip()?,
            }
        }
        skim.end()?;
        Ok(MetaList { metadata, items })
    }
}

impl<'a> ListMeta<'a> {
    fn read(skim: &mut Skim<'a>) -> Result<Self, SkimError> {
        let mut meta = ListMeta::default();
        let mut entries = skim.object()?;
        while let Some(key) = entries.next_key(skim)? {
            match key.as_ref() {
                "resourceVersion" => meta.resource_version = skim.optional_string()?,
                "continue" => meta.continue_token = skim.optional_string()?,
                _ => skim.skip()?,
            }
        }
        Ok(meta)
    }
}

impl<'a> ObjectMeta<'a> {
    /// The metadata of a whole text that is one object (a write's answer).
    pub fn of_answer(answer: &'a [u8]) -> Result<Self, DecodeError> {
        let mut skim = Skim::new(std::str::from_utf8(answer)?);
        let meta = Self::of_object(&mut skim)?;
        skim.end()?;
        Ok(meta)
    }

    /// The `metadata` of the object that comes next.
    fn of_object(skim: &mut Skim<'a>) -> Result<Self, SkimError> {
        let mut meta = ObjectMeta::default();
        let mut entries = skim.object()?;
        while let Some(key) = entries.next_key(skim)? {
            match key.as_ref() {
                "metadata" => meta = ObjectMeta::read(skim)?,
                _ => skim.skip()?,
            }
        }
        Ok(meta)
    }

    /// A `metadata` object.
    pub fn read(skim: &mut Skim<'a>) -> Result<Self, SkimError> {
        let mut meta = ObjectMeta::default();
        let mut entries = skim.object()?;
        while let Some(key) = entries.next_key(skim)? {
            match key.as_ref() {
                "name" => meta.name = skim.optional_string()?,
                "namespace" => meta.namespace = skim.optional_string()?,
                "uid" => meta.uid = skim.optional_string()?,
                "resourceVersion" => meta.resource_version = skim.optional_string()?,
                "labels" => meta.labels = OwnerLabels::read(skim)?,
                _ => skim.skip()?,
            }
        }
        Ok(meta)
    }

    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    pub fn namespace(&self) -> Option<&str> {
        self.namespace.as_deref()
    }

    pub fn uid(&self) -> Option<&str> {
        self.uid.as_deref()
    }

    /// The pin of this state if it carries both owner labels with `owner`'s values.
    pub fn owned_pin(&self, owner: &Owner) -> Option<Pin> {
        let owned = self.labels.vcluster.as_deref() == Some(owner.name.as_str())
            && self.labels.project.as_deref() == Some(owner.project.as_str());
        let uid = self.uid()?;
        let resource_version = self.resource_version.as_deref()?;
        (owned && !uid.is_empty() && !resource_version.is_empty()).then(|| Pin {
            uid: uid.to_string(),
            resource_version: resource_version.to_string(),
        })
    }
}

impl<'a> OwnerLabels<'a> {
    /// A `labels` object; `null` counts as no labels, as in a parsed document.
    fn read(skim: &mut Skim<'a>) -> Result<Self, SkimError> {
        let mut labels = OwnerLabels::default();
        if skim.peek()? == Kind::Null {
            skim.skip()?;
            return Ok(labels);
        }
        let mut entries = skim.object()?;
        while let Some(key) = entries.next_key(skim)? {
            match key.as_ref() {
                OWNER_VCLUSTER_LABEL => labels.vcluster = Some(skim.string()?),
                OWNER_PROJECT_LABEL => labels.project = Some(skim.string()?),
                _ => skim.skip()?,
            }
        }
        Ok(labels)
    }
}
