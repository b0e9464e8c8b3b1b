//! Server-side printing: `meta.k8s.io/v1` `Table`, `PartialObjectMetadata` and
//! `PartialObjectMetadataList` responses.
//!
//! kubectl asks for `Accept: application/json;as=Table;v=v1;g=meta.k8s.io` on
//! `get` and prints the cells it receives, so the columns and the cell values
//! (including the `Age` rendering) must be the server's. Custom resources take
//! their columns from the CRD version's `additionalPrinterColumns`
//! ([`columns_for_crd_version`]); built-in resources use a fixed set per resource
//! ([`builtin_columns`]), computed as kube's printers do.

use chrono::{DateTime, Utc};
use serde_json::{json, Map, Value};

/// One column of a Table.
///
/// `json_path` is a kubectl-style JSONPath (`.spec.replicas`,
/// `.status.conditions[?(@.type=="Ready")].status`). Built-in printers that
/// compute a cell (counts, joined lists) use a path starting with `#` naming the
/// computation; those come only from [`builtin_columns`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrinterColumn {
    pub name: String,
    /// `string`, `integer`, `number`, `boolean` or `date`.
    pub type_: String,
    pub format: String,
    pub description: String,
    pub priority: i64,
    pub json_path: String,
}

/// What each row carries in `object` (query parameter `includeObject`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IncludeObject {
    /// `object: null`.
    None,
    /// A `PartialObjectMetadata` (kube's default).
    #[default]
    Metadata,
    /// The whole object.
    Object,
}

impl IncludeObject {
    /// Parses the `includeObject` query value; `None` for an unknown value so the
    /// caller can answer 400.
    pub fn parse(s: &str) -> Option<IncludeObject> {
        match s {
            "" | "Metadata" => Some(IncludeObject::Metadata),
            "None" => Some(IncludeObject::None),
            "Object" => Some(IncludeObject::Object),
            _ => None,
        }
    }
}

/// ObjectMeta's documentation of `name`, which kube uses for the Name column.
pub const NAME_DESCRIPTION: &str = "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names";

/// ObjectMeta's documentation of `creationTimestamp`, used for Age columns.
pub const CREATION_TIMESTAMP_DESCRIPTION: &str = "CreationTimestamp is a timestamp representing the server time when this object was created. It is not guaranteed to be set in happens-before order across separate operations. Clients may not set this value. It is represented in RFC3339 form and is in UTC.\n\nPopulated by the system. Read-only. Null for lists. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata";

fn col(name: &str, type_: &str, description: &str, json_path: &str) -> PrinterColumn {
    PrinterColumn {
        name: name.into(),
        type_: type_.into(),
        format: String::new(),
        description: description.into(),
        priority: 0,
        json_path: json_path.into(),
    }
}

fn name_column() -> PrinterColumn {
    PrinterColumn {
        format: "name".into(),
        ..col("Name", "string", NAME_DESCRIPTION, ".metadata.name")
    }
}

fn age_column() -> PrinterColumn {
    col("Age", "string", CREATION_TIMESTAMP_DESCRIPTION, "#age")
}

/// The columns of a CRD version (one element of `spec.versions`): Name, then its
/// `additionalPrinterColumns`, or Name and Age when it declares none.
pub fn columns_for_crd_version(version: &Value) -> Vec<PrinterColumn> {
    let mut out = vec![name_column()];
    let declared = version
        .get("additionalPrinterColumns")
        .and_then(Value::as_array)
        .filter(|a| !a.is_empty());
    let Some(declared) = declared else {
        out.push(col(
            "Age",
            "date",
            CREATION_TIMESTAMP_DESCRIPTION,
            ".metadata.creationTimestamp",
        ));
        return out;
    };
    for c in declared {
        let s = |k: &str| c.get(k).and_then(Value::as_str).unwrap_or("").to_string();
        let path = s("jsonPath");
        let description = match s("description") {
            d if d.is_empty() => {
                format!("Custom resource definition column (in JSONPath format): {path}")
            }
            d => d,
        };
        out.push(PrinterColumn {
            name: s("name"),
            type_: s("type"),
            format: s("format"),
            description,
            priority: c.get("priority").and_then(Value::as_i64).unwrap_or(0),
            json_path: path,
        });
    }
    out
}

/// Whose `/scale` subresource a Scale is: kube prints the two differently.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScaleOf {
    /// A custom resource's: apiextensions-apiserver's columns.
    CustomResource,
    /// A built-in's: kube's printer for Scale.
    BuiltIn,
}

/// The columns of a `/scale` subresource's Table. A custom resource's come from
/// apiextensions-apiserver (Desired and Available, as the CRD declares the scale
/// subresource, then Age); a built-in's from kube's printer for Scale.
pub fn scale_columns(of: ScaleOf) -> Vec<PrinterColumn> {
    if of == ScaleOf::CustomResource {
        return vec![
            name_column(),
            col(
                "Desired",
                "integer",
                "Number of desired replicas",
                ".spec.replicas",
            ),
            col(
                "Available",
                "integer",
                "Number of actual replicas",
                ".status.replicas",
            ),
            col(
                "Age",
                "date",
                CREATION_TIMESTAMP_DESCRIPTION,
                ".metadata.creationTimestamp",
            ),
        ];
    }
    vec![
        // kube's Scale printer gives its Name column no format.
        col("Name", "string", NAME_DESCRIPTION, ".metadata.name"),
        col(
            "Desired",
            "integer",
            "replicas is the desired number of instances for the scaled object.",
            ".spec.replicas",
        ),
        col(
            "Available",
            "integer",
            "replicas is the actual number of observed instances of the scaled object.",
            ".status.replicas",
        ),
        age_column(),
    ]
}

/// The columns kube-apiserver's built-in printers use for `resource` (plural,
/// lower case). Resources without a dedicated printer get Name and Age.
pub fn builtin_columns(resource: &str) -> Vec<PrinterColumn> {
    let mut out = vec![name_column()];
    let more: Vec<PrinterColumn> = match resource {
        "namespaces" => vec![
            col("Status", "string", "The status of the namespace", ".status.phase"),
            age_column(),
        ],
        "configmaps" => vec![
            col("Data", "string", "Data contains the configuration data. Each key must consist of alphanumeric characters, '-', '_' or '.'. Values with non-UTF-8 byte sequences must use the BinaryData field. The keys stored in Data must not overlap with the keys in the BinaryData field, this is enforced during validation process.", "#count:data,binaryData"),
            age_column(),
        ],
        "secrets" => vec![
            col("Type", "string", "Used to facilitate programmatic handling of secret data. More info: https://kubernetes.io/docs/concepts/configuration/secret/#secret-types", ".type"),
            col("Data", "string", "Data contains the secret data. Each key must consist of alphanumeric characters, '-', '_' or '.'. The serialized form of the secret data is a base64 encoded string, representing the arbitrary (possibly non-string) data value here. Described in https://tools.ietf.org/html/rfc4648#section-4", "#count:data"),
            age_column(),
        ],
        "leases" => vec![
            col("Holder", "string", "holderIdentity contains the identity of the holder of a current lease. If Coordinated Leader Election is used, the holder identity must be equal to the elected LeaseCandidate.metadata.name field.", "#string:.spec.holderIdentity"),
            age_column(),
        ],
        "services" => vec![
            col("Type", "string", "type determines how the Service is exposed.", ".spec.type"),
            col("Cluster-IP", "string", "clusterIP is the IP address of the service and is usually assigned randomly.", "#or-none:.spec.clusterIP"),
            col("External-IP", "string", "externalIPs is a list of IP addresses for which nodes in the cluster will also accept traffic for this service.", "#service-external-ip"),
            col("Port(s)", "string", "The list of ports that are exposed by this service.", "#service-ports"),
            age_column(),
            PrinterColumn {
                priority: 1,
                ..col("Selector", "string", "Route service traffic to pods with label keys and values matching this selector.", "#selector:.spec.selector")
            },
        ],
        "endpointslices" => vec![
            col("AddressType", "string", "addressType specifies the type of address carried by this EndpointSlice.", ".addressType"),
            col("Ports", "string", "ports specifies the list of network ports exposed by each endpoint in this slice.", "#endpointslice-ports"),
            col("Endpoints", "string", "endpoints is a list of unique endpoints in this slice.", "#endpointslice-endpoints"),
            age_column(),
        ],
        "apiservices" => vec![
            col("Service", "string", "The reference to the service that hosts this API endpoint.", "#apiservice-service"),
            col("Available", "string", "Whether this service is available.", "#apiservice-available"),
            age_column(),
        ],
        "validatingadmissionpolicies" => vec![
            col("Validations", "integer", "Validations is the number of validation rules of the policy.", "#len:.spec.validations"),
            col("ParamKind", "string", "ParamKind is the kind of the parameter resource of the policy.", "#vap-paramkind"),
            age_column(),
        ],
        "validatingadmissionpolicybindings" => vec![
            col("PolicyName", "string", "PolicyName references a ValidatingAdmissionPolicy name which the binding binds to.", ".spec.policyName"),
            col("ParamRef", "string", "ParamRef specifies the parameter resource used to configure the policy.", "#vapb-paramref"),
            age_column(),
        ],
        "validatingwebhookconfigurations" | "mutatingwebhookconfigurations" => vec![
            col("Webhooks", "integer", "Webhooks indicates the number of webhooks registered in this configuration.", "#len:.webhooks"),
            age_column(),
        ],
        "rolebindings" | "clusterrolebindings" => vec![
            col("Role", "string", "RoleRef can reference a Role in the current namespace or a ClusterRole in the global namespace.", "#roleref"),
            age_column(),
        ],
        // kube serves these through its default table convertor.
        "customresourcedefinitions" | "roles" | "clusterroles" => vec![PrinterColumn {
            format: String::new(),
            ..col("Created At", "date", CREATION_TIMESTAMP_DESCRIPTION, "#created-at")
        }],
        _ => vec![age_column()],
    };
    out.extend(more);
    out
}

/// Renders a `meta.k8s.io/v1` Table of `objects`.
///
/// `list_metadata` becomes the Table's `metadata` (`{"resourceVersion": ...}`
/// and, for lists, `continue` / `remainingItemCount`). `now` is the reference
/// point of Age cells.
pub fn render_table(
    columns: &[PrinterColumn],
    objects: &[Value],
    include: IncludeObject,
    list_metadata: Value,
    now: DateTime<Utc>,
) -> Value {
    let defs: Vec<Value> = columns
        .iter()
        .map(|c| {
            json!({
                "name": c.name,
                "type": c.type_,
                "format": c.format,
                "description": c.description,
                "priority": c.priority,
            })
        })
        .collect();
    let rows: Vec<Value> = objects
        .iter()
        .map(|o| {
            let cells: Vec<Value> = columns.iter().map(|c| cell(c, o, now)).collect();
            let object = match include {
                IncludeObject::None => Value::Null,
                IncludeObject::Metadata => partial_object_metadata(o),
                IncludeObject::Object => o.clone(),
            };
            json!({"cells": cells, "object": object})
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": list_metadata,
        "columnDefinitions": defs,
        "rows": rows,
    })
}

/// `PartialObjectMetadata` of one object (its `metadata` only).
pub fn partial_object_metadata(obj: &Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj.get("metadata").cloned().unwrap_or_else(|| json!({})),
    })
}

/// `PartialObjectMetadataList` of `items`, with `list_metadata` as its metadata.
pub fn partial_object_metadata_list(items: &[Value], list_metadata: Value) -> Value {
    json!({
        "kind": "PartialObjectMetadataList",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": list_metadata,
        "items": items.iter().map(partial_object_metadata).collect::<Vec<_>>(),
    })
}

/// kube's `duration.HumanDuration`: about two significant figures
/// (`45s`, `5m3s`, `12m`, `3h4m`, `9h`, `2d3h`, `40d`, `3y20d`, `9y`).
pub fn human_duration(d: chrono::Duration) -> String {
    let seconds = d.num_seconds();
    if seconds < -1 {
        return "<invalid>".into();
    }
    if seconds < 0 {
        return "0s".into();
    }
    if seconds < 60 * 2 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        let s = seconds % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    }
    if minutes < 60 * 3 {
        return format!("{minutes}m");
    }
    let hours = seconds / 3600;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 {
            format!("{}d", hours / 24)
        } else {
            format!("{}d{h}h", hours / 24)
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        let dy = (hours / 24) % 365;
        return if dy == 0 {
            format!("{}y", hours / 24 / 365)
        } else {
            format!("{}y{dy}d", hours / 24 / 365)
        };
    }
    format!("{}y", hours / 24 / 365)
}

/// The Age of a timestamp string as kube prints it (`<unknown>` when absent,
/// `<invalid>` when unparsable).
fn age_of(ts: Option<&Value>, now: DateTime<Utc>) -> Value {
    match ts.and_then(Value::as_str) {
        None => Value::String("<unknown>".into()),
        Some(s) => match DateTime::parse_from_rfc3339(s) {
            Ok(t) => Value::String(human_duration(now - t.with_timezone(&Utc))),
            Err(_) => Value::String("<invalid>".into()),
        },
    }
}

fn cell(c: &PrinterColumn, obj: &Value, now: DateTime<Utc>) -> Value {
    if let Some(special) = c.json_path.strip_prefix('#') {
        return builtin_cell(special, obj, now);
    }
    let Ok(results) = jsonpath(&c.json_path, obj) else {
        return Value::Null;
    };
    let Some(first) = results.into_iter().next() else {
        return Value::Null;
    };
    match c.type_.as_str() {
        "string" => Value::String(go_print(first)),
        "integer" => match first {
            Value::Number(n) => n
                .as_i64()
                .or_else(|| n.as_f64().map(|f| f as i64))
                .map_or(Value::Null, Value::from),
            _ => Value::Null,
        },
        "number" => match first {
            Value::Number(n) => n.as_f64().map_or(Value::Null, Value::from),
            _ => Value::Null,
        },
        "boolean" => match first {
            Value::Bool(b) => Value::Bool(*b),
            _ => Value::Null,
        },
        "date" => match first {
            Value::String(_) => age_of(Some(first), now),
            _ => Value::Null,
        },
        _ => Value::Null,
    }
}

fn builtin_cell(special: &str, obj: &Value, now: DateTime<Utc>) -> Value {
    let meta = obj.get("metadata");
    let spec = obj.get("spec");
    let text = |s: String| Value::String(s);
    let none_if_empty = |s: String| if s.is_empty() { "<none>".into() } else { s };
    if special == "age" {
        return age_of(meta.and_then(|m| m.get("creationTimestamp")), now);
    }
    if special == "created-at" {
        let ts = meta
            .and_then(|m| m.get("creationTimestamp"))
            .and_then(Value::as_str)
            .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
            .map(|t| {
                t.with_timezone(&Utc)
                    .format("%Y-%m-%dT%H:%M:%SZ")
                    .to_string()
            });
        return ts.map_or(Value::Null, text);
    }
    if let Some(fields) = special.strip_prefix("count:") {
        let n: usize = fields
            .split(',')
            .filter_map(|f| obj.get(f).and_then(Value::as_object).map(Map::len))
            .sum();
        return Value::from(n as i64);
    }
    if let Some(path) = special.strip_prefix("string:") {
        let v = jsonpath(path, obj)
            .ok()
            .and_then(|r| r.first().map(|v| go_print(v)));
        return text(v.unwrap_or_default());
    }
    if let Some(path) = special.strip_prefix("or-none:") {
        let v = jsonpath(path, obj)
            .ok()
            .and_then(|r| r.first().map(|v| go_print(v)));
        return text(none_if_empty(v.unwrap_or_default()));
    }
    if let Some(path) = special.strip_prefix("len:") {
        let n = jsonpath(path, obj)
            .ok()
            .and_then(|r| r.first().and_then(|v| v.as_array().map(Vec::len)))
            .unwrap_or(0);
        return Value::from(n as i64);
    }
    if let Some(path) = special.strip_prefix("selector:") {
        let sel = jsonpath(path, obj)
            .ok()
            .and_then(|r| r.first().and_then(|v| v.as_object().cloned()))
            .map(|m| {
                m.iter()
                    .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .unwrap_or_default();
        return text(none_if_empty(sel));
    }
    match special {
        "service-external-ip" => {
            let mut ips: Vec<String> = Vec::new();
            let kind = spec.and_then(|s| s.get("type")).and_then(Value::as_str);
            if kind == Some("LoadBalancer") {
                if let Some(ing) = obj
                    .pointer("/status/loadBalancer/ingress")
                    .and_then(Value::as_array)
                {
                    for i in ing {
                        if let Some(ip) = i
                            .get("ip")
                            .or_else(|| i.get("hostname"))
                            .and_then(Value::as_str)
                        {
                            ips.push(ip.into());
                        }
                    }
                }
                if ips.is_empty() {
                    ips.push("<pending>".into());
                }
            }
            if let Some(ext) = spec
                .and_then(|s| s.get("externalIPs"))
                .and_then(Value::as_array)
            {
                ips.extend(ext.iter().filter_map(Value::as_str).map(str::to_string));
            }
            if kind == Some("ExternalName") {
                if let Some(n) = spec
                    .and_then(|s| s.get("externalName"))
                    .and_then(Value::as_str)
                {
                    ips.push(n.into());
                }
            }
            text(none_if_empty(ips.join(",")))
        }
        "service-ports" => {
            let ports = spec
                .and_then(|s| s.get("ports"))
                .and_then(Value::as_array)
                .map(|ps| {
                    ps.iter()
                        .map(|p| {
                            let port = p.get("port").map(go_print).unwrap_or_default();
                            let proto = p.get("protocol").and_then(Value::as_str).unwrap_or("TCP");
                            match p.get("nodePort").and_then(Value::as_i64) {
                                Some(np) if np != 0 => format!("{port}:{np}/{proto}"),
                                _ => format!("{port}/{proto}"),
                            }
                        })
                        .collect::<Vec<_>>()
                        .join(",")
                })
                .unwrap_or_default();
            text(none_if_empty(ports))
        }
        "endpointslice-ports" => {
            let ports: Vec<String> = obj
                .get("ports")
                .and_then(Value::as_array)
                .map(|ps| {
                    ps.iter()
                        .map(|p| match p.get("port").and_then(Value::as_i64) {
                            Some(n) => n.to_string(),
                            None => "<unset>".into(),
                        })
                        .collect()
                })
                .unwrap_or_default();
            text(if ports.is_empty() {
                "<unset>".into()
            } else {
                ports.join(",")
            })
        }
        "endpointslice-endpoints" => {
            let addrs: Vec<String> = obj
                .get("endpoints")
                .and_then(Value::as_array)
                .map(|eps| {
                    eps.iter()
                        .filter_map(|e| e.get("addresses").and_then(Value::as_array))
                        .flatten()
                        .filter_map(Value::as_str)
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default();
            text(match addrs.len() {
                0 => "<unset>".into(),
                n if n > 3 => format!("{} + {} more...", addrs[..3].join(","), n - 3),
                _ => addrs.join(","),
            })
        }
        "apiservice-service" => {
            let svc = spec.and_then(|s| s.get("service"));
            text(match svc {
                Some(s) if s.is_object() => format!(
                    "{}/{}",
                    s.get("namespace").and_then(Value::as_str).unwrap_or(""),
                    s.get("name").and_then(Value::as_str).unwrap_or("")
                ),
                _ => "Local".into(),
            })
        }
        "apiservice-available" => {
            let cond = obj
                .pointer("/status/conditions")
                .and_then(Value::as_array)
                .and_then(|cs| {
                    cs.iter()
                        .find(|c| c.get("type").and_then(Value::as_str) == Some("Available"))
                });
            text(match cond {
                None => "Unknown".into(),
                Some(c) => {
                    let status = c.get("status").and_then(Value::as_str).unwrap_or("Unknown");
                    match c.get("reason").and_then(Value::as_str) {
                        Some(r) if status != "True" && !r.is_empty() => format!("{status} ({r})"),
                        _ => status.to_string(),
                    }
                }
            })
        }
        "vap-paramkind" => {
            let pk = spec
                .and_then(|s| s.get("paramKind"))
                .filter(|p| p.is_object());
            text(match pk {
                Some(p) => format!(
                    "{}/{}",
                    p.get("apiVersion").and_then(Value::as_str).unwrap_or(""),
                    p.get("kind").and_then(Value::as_str).unwrap_or("")
                ),
                None => "<unset>".into(),
            })
        }
        "vapb-paramref" => {
            let pr = spec
                .and_then(|s| s.get("paramRef"))
                .filter(|p| p.is_object());
            text(match pr {
                None => "<unset>".into(),
                Some(p) => {
                    let name = p.get("name").and_then(Value::as_str).unwrap_or("");
                    let ns = p.get("namespace").and_then(Value::as_str).unwrap_or("");
                    match (name.is_empty(), ns.is_empty()) {
                        (false, false) => format!("{ns}/{name}"),
                        (false, true) => format!("*/{name}"),
                        (true, _) => "*".into(),
                    }
                }
            })
        }
        "roleref" => {
            let r = obj.get("roleRef");
            text(format!(
                "{}/{}",
                r.and_then(|r| r.get("kind"))
                    .and_then(Value::as_str)
                    .unwrap_or(""),
                r.and_then(|r| r.get("name"))
                    .and_then(Value::as_str)
                    .unwrap_or("")
            ))
        }
        _ => Value::Null,
    }
}

/// How kube's JSONPath printer renders a value as text (Go's `fmt.Sprint`):
/// strings bare, maps as `map[k:v]`, lists as `[a b]`.
pub fn go_print(v: &Value) -> String {
    match v {
        Value::Null => "<nil>".into(),
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                i.to_string()
            } else if let Some(u) = n.as_u64() {
                u.to_string()
            } else {
                go_float_g(n.as_f64().unwrap_or(0.0))
            }
        }
        Value::Array(a) => format!("[{}]", a.iter().map(go_print).collect::<Vec<_>>().join(" ")),
        Value::Object(m) => format!(
            "map[{}]",
            m.iter()
                .map(|(k, v)| format!("{k}:{}", go_print(v)))
                .collect::<Vec<_>>()
                .join(" ")
        ),
    }
}

/// Go's `%v` for float64 (shortest representation, exponent form from 1e21).
fn go_float_g(f: f64) -> String {
    if f.fract() == 0.0 && f.abs() < 1e21 {
        format!("{}", f as i128)
    } else if f.abs() >= 1e21 || (f != 0.0 && f.abs() < 1e-4) {
        let s = format!("{f:e}");
        // Rust prints `1e21`, Go `1e+21`.
        match s.split_once('e') {
            Some((m, e)) if !e.starts_with('-') => format!("{m}e+{e:0>2}"),
            Some((m, e)) => format!("{m}e-{:0>2}", &e[1..]),
            None => s,
        }
    } else {
        format!("{f}")
    }
}

/// Why a JSONPath could not be evaluated.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum JsonPathError {
    /// The expression uses syntax outside the supported subset (fields,
    /// `['quoted']` fields, `[n]`, `[*]`, `[?(@.a.b=="v")]` / `!=`).
    #[error("unsupported JSONPath expression {0:?}")]
    Unsupported(String),
}

#[derive(Debug, Clone, PartialEq)]
enum Step {
    Field(String),
    Index(i64),
    Wildcard,
    Filter {
        path: Vec<String>,
        negate: bool,
        value: Value,
    },
}

/// Evaluates a kubectl-style JSONPath against `root` and returns the matches in
/// order. Missing keys yield no match (kube allows missing keys for columns).
pub fn jsonpath<'a>(expr: &str, root: &'a Value) -> Result<Vec<&'a Value>, JsonPathError> {
    let steps = parse_jsonpath(expr)?;
    let mut current = vec![root];
    for step in &steps {
        let mut next = Vec::new();
        for v in current {
            match step {
                Step::Field(name) => {
                    if let Some(c) = v.get(name.as_str()) {
                        next.push(c);
                    }
                }
                Step::Index(i) => {
                    if let Some(a) = v.as_array() {
                        let idx = if *i < 0 { a.len() as i64 + i } else { *i };
                        if idx >= 0 {
                            if let Some(c) = a.get(idx as usize) {
                                next.push(c);
                            }
                        }
                    }
                }
                Step::Wildcard => match v {
                    Value::Array(a) => next.extend(a.iter()),
                    Value::Object(m) => next.extend(m.values()),
                    _ => {}
                },
                Step::Filter {
                    path,
                    negate,
                    value,
                } => {
                    if let Some(a) = v.as_array() {
                        for item in a {
                            let mut cur = Some(item);
                            for p in path {
                                cur = cur.and_then(|c| c.get(p.as_str()));
                            }
                            let eq = cur.is_some_and(|c| filter_equal(c, value));
                            if eq != *negate {
                                next.push(item);
                            }
                        }
                    }
                }
            }
        }
        current = next;
    }
    Ok(current)
}

fn filter_equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        _ => a == b,
    }
}

fn parse_jsonpath(expr: &str) -> Result<Vec<Step>, JsonPathError> {
    let unsupported = || JsonPathError::Unsupported(expr.to_string());
    let mut s = expr.trim();
    if let Some(inner) = s.strip_prefix('{').and_then(|x| x.strip_suffix('}')) {
        s = inner.trim();
    }
    let s = s.strip_prefix('$').unwrap_or(s);
    let chars: Vec<char> = s.chars().collect();
    let mut i = 0;
    let mut steps = Vec::new();
    while i < chars.len() {
        match chars[i] {
            '.' => {
                i += 1;
                let start = i;
                while i < chars.len() && chars[i] != '.' && chars[i] != '[' {
                    i += 1;
                }
                let name: String = chars[start..i].iter().collect();
                if name.is_empty() {
                    if start == chars.len() {
                        break; // a lone "." means the root
                    }
                    return Err(unsupported());
                }
                if name == "*" {
                    steps.push(Step::Wildcard);
                } else {
                    steps.push(Step::Field(name));
                }
            }
            '[' => {
                let close = find_bracket_end(&chars, i).ok_or_else(unsupported)?;
                let inner: String = chars[i + 1..close].iter().collect();
                let inner = inner.trim();
                steps.push(parse_bracket(inner).ok_or_else(unsupported)?);
                i = close + 1;
            }
            _ => {
                // A leading bare field name (`metadata.name`).
                let start = i;
                while i < chars.len() && chars[i] != '.' && chars[i] != '[' {
                    i += 1;
                }
                if !steps.is_empty() {
                    return Err(unsupported());
                }
                steps.push(Step::Field(chars[start..i].iter().collect()));
            }
        }
    }
    Ok(steps)
}

fn find_bracket_end(chars: &[char], open: usize) -> Option<usize> {
    let mut quote: Option<char> = None;
    let mut depth = 0;
    for (j, &c) in chars.iter().enumerate().skip(open) {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '\'' | '"') => quote = Some(c),
            (None, '[') => depth += 1,
            (None, ']') => {
                depth -= 1;
                if depth == 0 {
                    return Some(j);
                }
            }
            _ => {}
        }
    }
    None
}

fn parse_bracket(inner: &str) -> Option<Step> {
    if inner == "*" {
        return Some(Step::Wildcard);
    }
    if let Ok(n) = inner.parse::<i64>() {
        return Some(Step::Index(n));
    }
    if let Some(q) = inner
        .strip_prefix('\'')
        .and_then(|x| x.strip_suffix('\''))
        .or_else(|| inner.strip_prefix('"').and_then(|x| x.strip_suffix('"')))
    {
        return Some(Step::Field(q.to_string()));
    }
    let f = inner.strip_prefix("?(")?.strip_suffix(')')?.trim();
    let (lhs, negate, rhs) = if let Some((l, r)) = f.split_once("==") {
        (l, false, r)
    } else if let Some((l, r)) = f.split_once("!=") {
        (l, true, r)
    } else {
        return None;
    };
    let lhs = lhs.trim().strip_prefix('@')?;
    let path: Vec<String> = lhs
        .split('.')
        .filter(|p| !p.is_empty())
        .map(str::to_string)
        .collect();
    let rhs = rhs.trim();
    let value = if let Some(s) = rhs
        .strip_prefix('"')
        .and_then(|x| x.strip_suffix('"'))
        .or_else(|| rhs.strip_prefix('\'').and_then(|x| x.strip_suffix('\'')))
    {
        Value::String(s.to_string())
    } else {
        serde_json::from_str(rhs).ok()?
    };
    Some(Step::Filter {
        path,
        negate,
        value,
    })
}

#[cfg(test)]
mod tests;
