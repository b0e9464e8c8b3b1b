//! The few metadata fields the cache reads from watch events, list pages and
//! write answers, decoded without copying: every string borrows from the bytes
//! the target sent unless JSON escapes force a copy, and of `labels` only the
//! two owner labels are kept. The cache decodes an event for every write made
//! to a watched resource, by anyone, so this is on the write path's CPU bill.

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::Deserialize;

use crproxy_core::ownership::{Owner, OWNER_PROJECT_LABEL, OWNER_VCLUSTER_LABEL};
use crproxy_core::precondition::Pin;

/// One line of a watch response.
#[derive(Deserialize)]
pub(super) struct Event<'a> {
    #[serde(rename = "type", borrow)]
    pub event_type: Text<'a>,
    #[serde(default, borrow)]
    pub object: EventObject<'a>,
}

/// A `PartialObjectMetadata`, or the `Status` of an ERROR event.
#[derive(Deserialize, Default)]
pub(super) struct EventObject<'a> {
    #[serde(default, borrow)]
    pub metadata: ObjectMeta<'a>,
    #[serde(borrow)]
    pub message: Option<Text<'a>>,
}

/// Any object: a list item or the answer of a write.
#[derive(Deserialize)]
pub(super) struct MetaObject<'a> {
    #[serde(default, borrow)]
    pub metadata: ObjectMeta<'a>,
}

/// A page of a `PartialObjectMetadataList`.
#[derive(Deserialize)]
pub(super) struct MetaList<'a> {
    #[serde(default, borrow)]
    pub metadata: ListMeta<'a>,
    #[serde(default, borrow)]
    pub items: Vec<MetaObject<'a>>,
}

#[derive(Deserialize, Default)]
pub(super) struct ListMeta<'a> {
    #[serde(rename = "resourceVersion", borrow)]
    pub resource_version: Option<Text<'a>>,
    #[serde(rename = "continue", borrow)]
    pub continue_token: Option<Text<'a>>,
}

#[derive(Deserialize, Default)]
pub(super) struct ObjectMeta<'a> {
    #[serde(borrow)]
    pub name: Option<Text<'a>>,
    #[serde(borrow)]
    pub namespace: Option<Text<'a>>,
    #[serde(borrow)]
    pub uid: Option<Text<'a>>,
    #[serde(rename = "resourceVersion", borrow)]
    pub resource_version: Option<Text<'a>>,
    #[serde(default, borrow)]
    pub labels: OwnerLabels<'a>,
}

impl ObjectMeta<'_> {
    pub fn name(&self) -> Option<&str> {
        self.name.as_ref().map(Text::as_str)
    }

    pub fn namespace(&self) -> Option<&str> {
        self.namespace.as_ref().map(Text::as_str)
    }

    pub fn uid(&self) -> Option<&str> {
        self.uid.as_ref().map(Text::as_str)
    }

    /// The pin of this state if it carries both owner labels with `owner`'s values.
    pub fn owned_pin(&self, owner: &Owner) -> Option<Pin> {
        let is =
            |label: &Option<Text>, value: &str| label.as_ref().map(Text::as_str) == Some(value);
        let owned =
            is(&self.labels.vcluster, &owner.name) && is(&self.labels.project, &owner.project);
        let uid = self.uid()?;
        let resource_version = self.resource_version.as_ref()?.as_str();
        (owned && !uid.is_empty() && !resource_version.is_empty()).then(|| Pin {
            uid: uid.to_string(),
            resource_version: resource_version.to_string(),
        })
    }
}

/// A JSON string, borrowed from the input unless it holds escapes.
#[derive(Debug, Default)]
pub(super) struct Text<'a>(Cow<'a, str>);

impl Text<'_> {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(TextVisitor(PhantomData))
    }
}

struct TextVisitor<'a>(PhantomData<&'a str>);

impl<'de: 'a, 'a> Visitor<'de> for TextVisitor<'a> {
    type Value = Text<'a>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string")
    }
    fn visit_borrowed_str<E: serde::de::Error>(self, s: &'de str) -> Result<Self::Value, E> {
        Ok(Text(Cow::Borrowed(s)))
    }
    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Self::Value, E> {
        Ok(Text(Cow::Owned(s.to_string())))
    }
    fn visit_string<E: serde::de::Error>(self, s: String) -> Result<Self::Value, E> {
        Ok(Text(Cow::Owned(s)))
    }
}

/// The owner labels of a `labels` object; the other labels are skipped. A key
/// given twice counts with its last value, as in a parsed document.
#[derive(Debug, Default)]
pub(super) struct OwnerLabels<'a> {
    vcluster: Option<Text<'a>>,
    project: Option<Text<'a>>,
}

impl<'de: 'a, 'a> Deserialize<'de> for OwnerLabels<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(OwnerLabelsVisitor(PhantomData))
    }
}

struct OwnerLabelsVisitor<'a>(PhantomData<&'a str>);

impl<'de: 'a, 'a> Visitor<'de> for OwnerLabelsVisitor<'a> {
    type Value = OwnerLabels<'a>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a map of labels")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut labels = OwnerLabels::default();
        while let Some(key) = map.next_key::<Text>()? {
            match key.as_str() {
                OWNER_VCLUSTER_LABEL => labels.vcluster = Some(map.next_value()?),
                OWNER_PROJECT_LABEL => labels.project = Some(map.next_value()?),
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(labels)
    }
}
