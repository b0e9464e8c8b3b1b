//! The JSON skim reader reads what a target sends (GET answers, watch events,
//! list pages). Whatever the bytes: never a panic; skipping a whole value
//! succeeds exactly when serde_json accepts the text while ignoring it, and
//! tells the nesting of the value serde_json decodes; a string
//! read is the string serde_json reads; and walking the top-level object key by
//! key gives serde_json's keys, in order.

use std::borrow::Cow;

use crproxy_core::skim::{Kind, Skim};
use serde::de::IgnoredAny;

/// Checks one input against the properties above; a panic is a finding.
pub fn check(data: &[u8]) {
    // The reader takes text; its callers check UTF-8 first.
    let Ok(data) = std::str::from_utf8(data) else {
        return;
    };
    let mut skim = Skim::new(data);
    let skipped = skim.skip().and_then(|()| skim.end()).is_ok();
    assert_eq!(skipped, serde_json::from_str::<IgnoredAny>(data).is_ok());
    // The nesting a skip tells is the decoded value's.
    if let Ok(value) = serde_json::from_str::<serde_json::Value>(data) {
        assert_eq!(Skim::new(data).skip_nesting().ok(), Some(nesting(&value)));
    }

    let mut skim = Skim::new(data);
    if let Ok(Kind::String) = skim.peek() {
        let ours = skim
            .string()
            .map(Cow::into_owned)
            .and_then(|s| skim.end().map(|()| s));
        assert_eq!(ours.ok(), serde_json::from_str::<String>(data).ok());
    }

    let mut skim = Skim::new(data);
    let walked = (|| {
        let mut keys = Vec::new();
        let mut entries = skim.object()?;
        while let Some(key) = entries.next_key(&mut skim)? {
            keys.push(key.into_owned());
            skim.skip()?;
        }
        skim.end().map(|()| keys)
    })();
    // A walk succeeds exactly when serde_json reads the text as an object, and
    // then reads the same keys.
    let parsed = serde_json::from_str::<KeysInOrder>(data).ok().map(|k| k.0);
    assert_eq!(walked.ok(), parsed);
}

/// The keys of an object in the order they come, duplicates kept.
struct KeysInOrder(Vec<String>);

impl<'de> serde::Deserialize<'de> for KeysInOrder {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Keys;
        impl<'de> serde::de::Visitor<'de> for Keys {
            type Value = KeysInOrder;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<KeysInOrder, A::Error> {
                let mut keys = Vec::new();
                while let Some((key, IgnoredAny)) = map.next_entry::<String, IgnoredAny>()? {
                    keys.push(key);
                }
                Ok(KeysInOrder(keys))
            }
        }
        d.deserialize_map(Keys)
    }
}

/// How many containers deep `value` nests (0 for a scalar).
fn nesting(value: &serde_json::Value) -> usize {
    match value {
        serde_json::Value::Array(items) => 1 + items.iter().map(nesting).max().unwrap_or(0),
        serde_json::Value::Object(members) => 1 + members.values().map(nesting).max().unwrap_or(0),
        _ => 0,
    }
}
