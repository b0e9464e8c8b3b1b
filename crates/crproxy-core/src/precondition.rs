//! Pinning a mutation to the object the ownership check saw.
//!
//! In owned mode the proxy GETs an object, confirms the client owns it, then sends
//! the PUT, PATCH or DELETE. Between the two, the object could be deleted and
//! recreated by someone else under the same name. Stamping the checked uid into the
//! mutation makes the target refuse it in that case (kube-apiserver treats a uid in an
//! update body, a failing JSON-patch `test`, and DeleteOptions preconditions as
//! preconditions), so the mutation can never land on a different object.

use serde_json::{json, Map, Value};

use crate::ownership::BodyType;

/// The body could not be amended with the precondition.
#[derive(Debug, thiserror::Error)]
pub enum PreconditionError {
    /// The body is not JSON (or YAML for apply) of the expected shape.
    #[error("request body cannot carry a uid precondition: {0}")]
    Unparsable(String),
}

/// Adds `uid` as a precondition to a PUT or PATCH body of the given type.
pub fn pin_write(
    body_type: BodyType,
    body: &[u8],
    uid: &str,
) -> Result<Vec<u8>, PreconditionError> {
    match body_type {
        BodyType::JsonPatch => {
            let mut ops: Vec<Value> = serde_json::from_slice(body)
                .map_err(|e| PreconditionError::Unparsable(e.to_string()))?;
            ops.insert(
                0,
                json!({"op": "test", "path": "/metadata/uid", "value": uid}),
            );
            serde_json::to_vec(&ops).map_err(|e| PreconditionError::Unparsable(e.to_string()))
        }
        BodyType::ApplyPatchYaml | BodyType::Yaml => {
            let mut value: Value = serde_saphyr::from_slice(body)
                .map_err(|e| PreconditionError::Unparsable(e.to_string()))?;
            set_uid(&mut value, uid)?;
            serde_json::to_vec(&value).map_err(|e| PreconditionError::Unparsable(e.to_string()))
        }
        BodyType::Json | BodyType::MergePatch | BodyType::StrategicMergePatch => {
            let mut value: Value = serde_json::from_slice(body)
                .map_err(|e| PreconditionError::Unparsable(e.to_string()))?;
            set_uid(&mut value, uid)?;
            serde_json::to_vec(&value).map_err(|e| PreconditionError::Unparsable(e.to_string()))
        }
    }
}

fn set_uid(value: &mut Value, uid: &str) -> Result<(), PreconditionError> {
    let object = value
        .as_object_mut()
        .ok_or_else(|| PreconditionError::Unparsable("body is not an object".into()))?;
    let metadata = object
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    if metadata.is_null() {
        *metadata = Value::Object(Map::new());
    }
    let metadata = metadata
        .as_object_mut()
        .ok_or_else(|| PreconditionError::Unparsable("metadata is not an object".into()))?;
    metadata.insert("uid".into(), Value::String(uid.into()));
    Ok(())
}

/// A DeleteOptions body carrying the caller's options plus the uid precondition.
/// An empty caller body is allowed (kubectl usually sends one, raw clients may not).
pub fn pin_delete(body: &[u8], uid: &str) -> Result<Vec<u8>, PreconditionError> {
    let mut options: Value = if body.iter().all(u8::is_ascii_whitespace) {
        json!({"kind": "DeleteOptions", "apiVersion": "v1"})
    } else {
        serde_json::from_slice(body).map_err(|e| PreconditionError::Unparsable(e.to_string()))?
    };
    let object = options
        .as_object_mut()
        .ok_or_else(|| PreconditionError::Unparsable("DeleteOptions is not an object".into()))?;
    let preconditions = object
        .entry("preconditions")
        .or_insert_with(|| Value::Object(Map::new()));
    if preconditions.is_null() {
        *preconditions = Value::Object(Map::new());
    }
    let preconditions = preconditions
        .as_object_mut()
        .ok_or_else(|| PreconditionError::Unparsable("preconditions is not an object".into()))?;
    preconditions.insert("uid".into(), Value::String(uid.into()));
    serde_json::to_vec(&options).map_err(|e| PreconditionError::Unparsable(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(bytes: Vec<u8>) -> Value {
        serde_json::from_slice(&bytes).expect("json")
    }

    #[test]
    fn json_patch_gets_a_leading_uid_test() {
        let out = pin_write(
            BodyType::JsonPatch,
            br#"[{"op":"replace","path":"/spec/a","value":1}]"#,
            "u1",
        )
        .expect("pin");
        assert_eq!(
            parsed(out),
            json!([{"op":"test","path":"/metadata/uid","value":"u1"},{"op":"replace","path":"/spec/a","value":1}])
        );
    }

    #[test]
    fn object_bodies_get_metadata_uid_overriding_the_callers() {
        for body_type in [
            BodyType::Json,
            BodyType::MergePatch,
            BodyType::StrategicMergePatch,
        ] {
            let out = pin_write(
                body_type,
                br#"{"metadata":{"uid":"evil","name":"a"}}"#,
                "u1",
            )
            .expect("pin");
            assert_eq!(parsed(out), json!({"metadata":{"uid":"u1","name":"a"}}));
        }
        let out = pin_write(
            BodyType::MergePatch,
            br#"{"metadata":null,"spec":{}}"#,
            "u1",
        )
        .expect("pin");
        assert_eq!(parsed(out), json!({"metadata":{"uid":"u1"},"spec":{}}));
    }

    #[test]
    fn apply_yaml_is_rewritten_as_json() {
        let out = pin_write(
            BodyType::ApplyPatchYaml,
            b"apiVersion: v1\nkind: X\nmetadata:\n  name: a\n",
            "u1",
        )
        .expect("pin");
        assert_eq!(parsed(out)["metadata"], json!({"name":"a","uid":"u1"}));
    }

    #[test]
    fn delete_options_keep_the_callers_fields() {
        let out = pin_delete(
            br#"{"propagationPolicy":"Foreground","preconditions":{"resourceVersion":"5"}}"#,
            "u1",
        )
        .expect("pin");
        assert_eq!(
            parsed(out),
            json!({"propagationPolicy":"Foreground","preconditions":{"resourceVersion":"5","uid":"u1"}})
        );
        let empty = pin_delete(b"", "u1").expect("pin");
        assert_eq!(parsed(empty)["preconditions"]["uid"], "u1");
    }

    #[test]
    fn garbage_is_refused() {
        assert!(pin_write(BodyType::Json, b"\x00\x01", "u").is_err());
        assert!(pin_delete(b"[1]", "u").is_err());
    }
}
