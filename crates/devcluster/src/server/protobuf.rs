//! Just enough Kubernetes protobuf to read the bodies kubectl's typed clients send
//! (`kubectl create namespace|configmap|secret|serviceaccount|role|...` always
//! encode as `application/vnd.kubernetes.protobuf`). Bodies are decoded into the
//! same JSON the JSON path would see; responses stay JSON, which every client
//! accepts. Types without a schema here are refused with 415.

use serde_json::{json, Map, Value};

/// How one field is encoded.
#[derive(Clone, Copy)]
enum F {
    Str,
    Int,
    Bool,
    Time,
    Msg(&'static [(u32, &'static str, F)]),
    RepStr,
    RepMsg(&'static [(u32, &'static str, F)]),
    MapStr,
    MapBytes,
    /// `intstr.IntOrString`: a number or a string in JSON.
    IntOrStr,
}

type Schema = &'static [(u32, &'static str, F)];

const OWNER_REF: Schema = &[
    (1, "kind", F::Str),
    (3, "name", F::Str),
    (4, "uid", F::Str),
    (5, "apiVersion", F::Str),
    (6, "controller", F::Bool),
    (7, "blockOwnerDeletion", F::Bool),
];

const OBJECT_META: Schema = &[
    (1, "name", F::Str),
    (2, "generateName", F::Str),
    (3, "namespace", F::Str),
    (5, "uid", F::Str),
    (6, "resourceVersion", F::Str),
    (7, "generation", F::Int),
    (8, "creationTimestamp", F::Time),
    (11, "labels", F::MapStr),
    (12, "annotations", F::MapStr),
    (13, "ownerReferences", F::RepMsg(OWNER_REF)),
    (14, "finalizers", F::RepStr),
];

const NAMESPACE: Schema = &[
    (1, "metadata", F::Msg(OBJECT_META)),
    (2, "spec", F::Msg(&[(1, "finalizers", F::RepStr)])),
];

const CONFIG_MAP: Schema = &[
    (1, "metadata", F::Msg(OBJECT_META)),
    (2, "data", F::MapStr),
    (3, "binaryData", F::MapBytes),
    (4, "immutable", F::Bool),
];

const SECRET: Schema = &[
    (1, "metadata", F::Msg(OBJECT_META)),
    (2, "data", F::MapBytes),
    (3, "type", F::Str),
    (4, "stringData", F::MapStr),
    (5, "immutable", F::Bool),
];

const SERVICE_ACCOUNT: Schema = &[
    (1, "metadata", F::Msg(OBJECT_META)),
    (3, "imagePullSecrets", F::RepMsg(&[(1, "name", F::Str)])),
    (4, "automountServiceAccountToken", F::Bool),
];

const POLICY_RULE: Schema = &[
    (1, "verbs", F::RepStr),
    (2, "apiGroups", F::RepStr),
    (3, "resources", F::RepStr),
    (4, "resourceNames", F::RepStr),
    (5, "nonResourceURLs", F::RepStr),
];

const ROLE: Schema = &[
    (1, "metadata", F::Msg(OBJECT_META)),
    (2, "rules", F::RepMsg(POLICY_RULE)),
];

const SUBJECT: Schema = &[
    (1, "kind", F::Str),
    (2, "apiGroup", F::Str),
    (3, "name", F::Str),
    (4, "namespace", F::Str),
];

const ROLE_BINDING: Schema = &[
    (1, "metadata", F::Msg(OBJECT_META)),
    (2, "subjects", F::RepMsg(SUBJECT)),
    (
        3,
        "roleRef",
        F::Msg(&[
            (1, "apiGroup", F::Str),
            (2, "kind", F::Str),
            (3, "name", F::Str),
        ]),
    ),
];

const RESOURCE_ATTRIBUTES: Schema = &[
    (1, "namespace", F::Str),
    (2, "verb", F::Str),
    (3, "group", F::Str),
    (4, "version", F::Str),
    (5, "resource", F::Str),
    (6, "subresource", F::Str),
    (7, "name", F::Str),
];

const NON_RESOURCE_ATTRIBUTES: Schema = &[(1, "path", F::Str), (2, "verb", F::Str)];

const SELF_SUBJECT_ACCESS_REVIEW: Schema = &[
    (1, "metadata", F::Msg(OBJECT_META)),
    (
        2,
        "spec",
        F::Msg(&[
            (1, "resourceAttributes", F::Msg(RESOURCE_ATTRIBUTES)),
            (2, "nonResourceAttributes", F::Msg(NON_RESOURCE_ATTRIBUTES)),
        ]),
    ),
];

const SUBJECT_ACCESS_REVIEW: Schema = &[
    (1, "metadata", F::Msg(OBJECT_META)),
    (
        2,
        "spec",
        F::Msg(&[
            (1, "resourceAttributes", F::Msg(RESOURCE_ATTRIBUTES)),
            (2, "nonResourceAttributes", F::Msg(NON_RESOURCE_ATTRIBUTES)),
            (3, "user", F::Str),
            (4, "groups", F::RepStr),
            (6, "uid", F::Str),
        ]),
    ),
];

const SELF_SUBJECT_RULES_REVIEW: Schema = &[
    (1, "metadata", F::Msg(OBJECT_META)),
    (2, "spec", F::Msg(&[(1, "namespace", F::Str)])),
];

const TOKEN_REVIEW: Schema = &[
    (1, "metadata", F::Msg(OBJECT_META)),
    (
        2,
        "spec",
        F::Msg(&[(1, "token", F::Str), (2, "audiences", F::RepStr)]),
    ),
];

const SELF_SUBJECT_REVIEW: Schema = &[(1, "metadata", F::Msg(OBJECT_META))];

const LABEL_SELECTOR: Schema = &[
    (1, "matchLabels", F::MapStr),
    (
        2,
        "matchExpressions",
        F::RepMsg(&[
            (1, "key", F::Str),
            (2, "operator", F::Str),
            (3, "values", F::RepStr),
        ]),
    ),
];

const SERVICE_PORT: Schema = &[
    (1, "name", F::Str),
    (2, "protocol", F::Str),
    (3, "port", F::Int),
    (4, "targetPort", F::IntOrStr),
    (5, "nodePort", F::Int),
    (6, "appProtocol", F::Str),
];

const SERVICE: Schema = &[
    (1, "metadata", F::Msg(OBJECT_META)),
    (
        2,
        "spec",
        F::Msg(&[
            (1, "ports", F::RepMsg(SERVICE_PORT)),
            (2, "selector", F::MapStr),
            (3, "clusterIP", F::Str),
            (4, "type", F::Str),
            (5, "externalIPs", F::RepStr),
            (7, "sessionAffinity", F::Str),
            (10, "externalName", F::Str),
        ]),
    ),
];

const CONTAINER: Schema = &[
    (1, "name", F::Str),
    (2, "image", F::Str),
    (3, "command", F::RepStr),
    (4, "args", F::RepStr),
    (5, "workingDir", F::Str),
    (
        6,
        "ports",
        F::RepMsg(&[
            (1, "name", F::Str),
            (2, "hostPort", F::Int),
            (3, "containerPort", F::Int),
            (4, "protocol", F::Str),
        ]),
    ),
    (
        7,
        "env",
        F::RepMsg(&[(1, "name", F::Str), (2, "value", F::Str)]),
    ),
    (14, "imagePullPolicy", F::Str),
];

const POD_TEMPLATE: Schema = &[
    (1, "metadata", F::Msg(OBJECT_META)),
    (
        2,
        "spec",
        F::Msg(&[
            (2, "containers", F::RepMsg(CONTAINER)),
            (3, "restartPolicy", F::Str),
            (7, "nodeSelector", F::MapStr),
            (8, "serviceAccountName", F::Str),
        ]),
    ),
];

const DEPLOYMENT: Schema = &[
    (1, "metadata", F::Msg(OBJECT_META)),
    (
        2,
        "spec",
        F::Msg(&[
            (1, "replicas", F::Int),
            (2, "selector", F::Msg(LABEL_SELECTOR)),
            (3, "template", F::Msg(POD_TEMPLATE)),
            (4, "strategy", F::Msg(&[(1, "type", F::Str)])),
            (5, "minReadySeconds", F::Int),
            (6, "revisionHistoryLimit", F::Int),
            (7, "paused", F::Bool),
            (9, "progressDeadlineSeconds", F::Int),
        ]),
    ),
];

fn schema_for(api_version: &str, kind: &str) -> Option<Schema> {
    Some(match (api_version, kind) {
        ("v1", "Namespace") => NAMESPACE,
        ("v1", "ConfigMap") => CONFIG_MAP,
        ("v1", "Secret") => SECRET,
        ("v1", "ServiceAccount") => SERVICE_ACCOUNT,
        ("v1", "Service") => SERVICE,
        ("apps/v1", "Deployment") => DEPLOYMENT,
        ("rbac.authorization.k8s.io/v1", "Role" | "ClusterRole") => ROLE,
        ("rbac.authorization.k8s.io/v1", "RoleBinding" | "ClusterRoleBinding") => ROLE_BINDING,
        ("authorization.k8s.io/v1", "SelfSubjectAccessReview") => SELF_SUBJECT_ACCESS_REVIEW,
        ("authorization.k8s.io/v1", "SubjectAccessReview" | "LocalSubjectAccessReview") => {
            SUBJECT_ACCESS_REVIEW
        }
        ("authorization.k8s.io/v1", "SelfSubjectRulesReview") => SELF_SUBJECT_RULES_REVIEW,
        ("authentication.k8s.io/v1", "TokenReview") => TOKEN_REVIEW,
        ("authentication.k8s.io/v1", "SelfSubjectReview") => SELF_SUBJECT_REVIEW,
        _ => return None,
    })
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn varint(&mut self) -> Option<u64> {
        let mut out = 0u64;
        for shift in (0..64).step_by(7) {
            let b = *self.buf.get(self.pos)?;
            self.pos += 1;
            out |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Some(out);
            }
        }
        None
    }

    fn bytes(&mut self) -> Option<&'a [u8]> {
        let len = usize::try_from(self.varint()?).ok()?;
        let end = self.pos.checked_add(len)?;
        let out = self.buf.get(self.pos..end)?;
        self.pos = end;
        Some(out)
    }

    /// Next `(field number, wire type)`, or None at the end.
    fn key(&mut self) -> Option<(u32, u8)> {
        if self.pos >= self.buf.len() {
            return None;
        }
        let k = self.varint()?;
        Some(((k >> 3) as u32, (k & 7) as u8))
    }

    fn skip(&mut self, wire: u8) -> Option<()> {
        match wire {
            0 => {
                self.varint()?;
            }
            1 => self.pos += 8,
            2 => {
                self.bytes()?;
            }
            5 => self.pos += 4,
            _ => return None,
        }
        (self.pos <= self.buf.len()).then_some(())
    }
}

fn string(b: &[u8]) -> Value {
    Value::String(String::from_utf8_lossy(b).into_owned())
}

fn b64(b: &[u8]) -> Value {
    use base64::Engine;
    Value::String(base64::engine::general_purpose::STANDARD.encode(b))
}

fn map_entry(b: &[u8], bytes_value: bool) -> Option<(String, Value)> {
    let mut r = Reader { buf: b, pos: 0 };
    let (mut k, mut v) = (
        String::new(),
        if bytes_value { b64(&[]) } else { json!("") },
    );
    while let Some((num, wire)) = r.key() {
        match (num, wire) {
            (1, 2) => k = String::from_utf8_lossy(r.bytes()?).into_owned(),
            (2, 2) => {
                let raw = r.bytes()?;
                v = if bytes_value { b64(raw) } else { string(raw) };
            }
            (_, w) => r.skip(w)?,
        }
    }
    Some((k, v))
}

fn int_or_string(b: &[u8]) -> Option<Value> {
    let mut r = Reader { buf: b, pos: 0 };
    let (mut is_string, mut int, mut string) = (false, 0i64, String::new());
    while let Some((num, wire)) = r.key() {
        match (num, wire) {
            (1, 0) => is_string = r.varint()? == 1,
            (2, 0) => int = r.varint()? as i64,
            (3, 2) => string = String::from_utf8_lossy(r.bytes()?).into_owned(),
            (_, w) => r.skip(w)?,
        }
    }
    Some(if is_string { json!(string) } else { json!(int) })
}

fn time(b: &[u8]) -> Option<Value> {
    let mut r = Reader { buf: b, pos: 0 };
    let mut secs = 0i64;
    while let Some((num, wire)) = r.key() {
        match (num, wire) {
            (1, 0) => secs = r.varint()? as i64,
            (_, w) => r.skip(w)?,
        }
    }
    let t = chrono::DateTime::from_timestamp(secs, 0)?;
    Some(json!(t.format("%Y-%m-%dT%H:%M:%SZ").to_string()))
}

fn message(b: &[u8], schema: Schema) -> Option<Value> {
    let mut r = Reader { buf: b, pos: 0 };
    let mut out = Map::new();
    while let Some((num, wire)) = r.key() {
        let Some((_, name, kind)) = schema.iter().find(|(n, _, _)| *n == num) else {
            r.skip(wire)?;
            continue;
        };
        let name = name.to_string();
        match (*kind, wire) {
            (F::Str, 2) => {
                // Go's JSON leaves empty strings out (omitempty); protobuf sends them.
                let v = r.bytes()?;
                if !v.is_empty() {
                    out.insert(name, string(v));
                }
            }
            (F::Int, 0) => {
                out.insert(name, json!(r.varint()? as i64));
            }
            (F::Bool, 0) => {
                out.insert(name, json!(r.varint()? != 0));
            }
            (F::Time, 2) => {
                if let Some(t) = time(r.bytes()?) {
                    out.insert(name, t);
                }
            }
            (F::Msg(s), 2) => {
                out.insert(name, message(r.bytes()?, s)?);
            }
            (F::RepStr, 2) => {
                let v = string(r.bytes()?);
                push(&mut out, name, v);
            }
            (F::RepMsg(s), 2) => {
                let v = message(r.bytes()?, s)?;
                push(&mut out, name, v);
            }
            (F::IntOrStr, 2) => {
                out.insert(name, int_or_string(r.bytes()?)?);
            }
            (F::MapStr | F::MapBytes, 2) => {
                let (k, v) = map_entry(r.bytes()?, matches!(kind, F::MapBytes))?;
                let m = out.entry(name).or_insert_with(|| json!({}));
                if let Some(m) = m.as_object_mut() {
                    m.insert(k, v);
                }
            }
            (_, w) => r.skip(w)?,
        }
    }
    Some(Value::Object(out))
}

fn push(out: &mut Map<String, Value>, name: String, v: Value) {
    let a = out.entry(name).or_insert_with(|| json!([]));
    if let Some(a) = a.as_array_mut() {
        a.push(v);
    }
}

/// Decodes a `k8s\0`-prefixed `runtime.Unknown` body into JSON, or explains why not.
pub fn decode(body: &[u8]) -> Result<Value, String> {
    let inner = body
        .strip_prefix(b"k8s\x00")
        .ok_or("missing the Kubernetes protobuf prefix")?;
    let mut r = Reader { buf: inner, pos: 0 };
    let (mut api_version, mut kind, mut raw) = (String::new(), String::new(), &[][..]);
    while let Some((num, wire)) = r.key() {
        match (num, wire) {
            (1, 2) => {
                let tm = r.bytes().ok_or("truncated type meta")?;
                let mut t = Reader { buf: tm, pos: 0 };
                while let Some((n, w)) = t.key() {
                    match (n, w) {
                        (1, 2) => {
                            api_version =
                                String::from_utf8_lossy(t.bytes().ok_or("bad")?).into_owned()
                        }
                        (2, 2) => {
                            kind = String::from_utf8_lossy(t.bytes().ok_or("bad")?).into_owned()
                        }
                        (_, w) => t.skip(w).ok_or("bad type meta")?,
                    }
                }
            }
            (2, 2) => raw = r.bytes().ok_or("truncated raw object")?,
            (_, w) => r.skip(w).ok_or("malformed envelope")?,
        }
    }
    let schema = schema_for(&api_version, &kind)
        .ok_or_else(|| format!("no protobuf support for {api_version} {kind}"))?;
    let mut obj = message(raw, schema).ok_or("malformed protobuf object")?;
    if let Some(m) = obj.as_object_mut() {
        m.insert("apiVersion".into(), json!(api_version));
        m.insert("kind".into(), json!(kind));
    }
    Ok(obj)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(num: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = vec![((num << 3) | 2) as u8, payload.len() as u8];
        out.extend_from_slice(payload);
        out
    }

    #[test]
    fn a_configmap_envelope_decodes_to_json() {
        let meta = [
            field(1, b"cm1"),
            field(11, &[field(1, b"app"), field(2, b"x")].concat()),
        ]
        .concat();
        let cm = [
            field(1, &meta),
            field(2, &[field(1, b"k"), field(2, b"v")].concat()),
        ]
        .concat();
        let type_meta = [field(1, b"v1"), field(2, b"ConfigMap")].concat();
        let body = [b"k8s\x00".to_vec(), field(1, &type_meta), field(2, &cm)].concat();
        let v = decode(&body).expect("decode");
        assert_eq!(
            v,
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": "cm1", "labels": {"app": "x"}}, "data": {"k": "v"}})
        );
        assert!(decode(b"{}").is_err());
    }

    proptest::proptest! {
        /// Bodies come from clients: no input may panic the decoder.
        #[test]
        fn arbitrary_bodies_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
            let mut body = b"k8s\x00".to_vec();
            body.extend_from_slice(&bytes);
            let _ = decode(&body);
            // Also with a valid envelope around arbitrary object bytes.
            let type_meta = [field(1, b"v1"), field(2, b"ConfigMap")].concat();
            let mut framed = b"k8s\x00".to_vec();
            framed.extend(field(1, &type_meta));
            framed.push(0x12);
            framed.push(bytes.len().min(127) as u8);
            framed.extend_from_slice(&bytes[..bytes.len().min(127)]);
            let _ = decode(&framed);
        }
    }
}
