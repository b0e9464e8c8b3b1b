//! OpenAPI documents: the `/openapi/v3` index, per group-version v3 documents
//! and a swagger 2.0 `/openapi/v2` document.
//!
//! Two kubectl features read these:
//! * `kubectl explain` (v3): finds the resource's path under
//!   `/apis/<g>/<v>/[namespaces/{namespace}/]<plural>`, takes the
//!   `x-kubernetes-group-version-kind` of one of its operations, then the
//!   `components.schemas` entry listing that GVK and walks its properties.
//! * `kubectl apply/create --validate=strict`: checks that the PATCH operation of
//!   the kind's path offers the `fieldValidation` query parameter, and if so
//!   leaves validation to the server.
//!
//! So every resource gets list/item paths with operations tagged by GVK, a schema
//! tagged by GVK, and the shared `meta/v1` schemas those reference.

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Response, StatusCode};
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha512};

pub mod v2_protobuf;

/// One resource to publish (a CRD version or a built-in resource).
#[derive(Clone, Debug, PartialEq)]
pub struct CrdResource {
    /// API group; empty for the core group.
    pub group: String,
    pub version: String,
    pub kind: String,
    pub list_kind: String,
    pub plural: String,
    pub singular: String,
    pub namespaced: bool,
    /// `schema.openAPIV3Schema`, or None for a resource published without one
    /// (it then accepts any fields).
    pub schema: Option<Value>,
}

impl CrdResource {
    /// One resource per served version of a CustomResourceDefinition object.
    pub fn from_crd(crd: &Value) -> Vec<CrdResource> {
        let spec = crd.get("spec");
        let s = |path: &str| {
            spec.and_then(|v| v.pointer(path))
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        let kind = s("/names/kind");
        let list_kind = match s("/names/listKind") {
            l if l.is_empty() => format!("{kind}List"),
            l => l,
        };
        let singular = match s("/names/singular") {
            l if l.is_empty() => kind.to_lowercase(),
            l => l,
        };
        let versions = spec
            .and_then(|v| v.get("versions"))
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        versions
            .iter()
            .filter(|v| v.get("served").and_then(Value::as_bool).unwrap_or(false))
            .map(|v| CrdResource {
                group: s("/group"),
                version: v
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
                kind: kind.clone(),
                list_kind: list_kind.clone(),
                plural: s("/names/plural"),
                singular: singular.clone(),
                namespaced: s("/scope") != "Cluster",
                schema: v.pointer("/schema/openAPIV3Schema").cloned(),
            })
            .collect()
    }
}

/// A minimal schema for the built-in kinds devcluster serves, so that `kubectl
/// explain` has something to show for them. Only the commonly used fields are
/// described; everything else is still accepted by the server. None for kinds
/// not covered. Publication only: these schemas list a subset of each kind's
/// fields, so never prune or validate built-in objects with them.
pub fn builtin_schema(group: &str, version: &str, kind: &str) -> Option<Value> {
    let s = |d: &str| json!({"description": d, "type": "string"});
    let i = |d: &str| json!({"description": d, "type": "integer", "format": "int32"});
    let b = |d: &str| json!({"description": d, "type": "boolean"});
    let t = |d: &str| json!({"description": d, "type": "string", "format": "date-time"});
    let smap = |d: &str| json!({"description": d, "type": "object", "additionalProperties": {"type": "string", "default": ""}});
    let strings = |d: &str| json!({"description": d, "type": "array", "items": {"type": "string", "default": ""}, "x-kubernetes-list-type": "atomic"});
    let obj =
        |d: &str, props: Value| json!({"description": d, "type": "object", "properties": props});
    let conditions = json!({
        "description": "Current service state of the object.",
        "type": "array",
        "items": {"type": "object", "required": ["type", "status"], "properties": {
            "type": s("Type of the condition."),
            "status": s("Status of the condition: True, False or Unknown."),
            "reason": s("A one-word CamelCase reason for the last transition."),
            "message": s("A human-readable message about the last transition."),
            "lastTransitionTime": t("When the condition last changed status."),
        }},
        "x-kubernetes-list-map-keys": ["type"],
        "x-kubernetes-list-type": "map",
    });
    let schema = match (group, version, kind) {
        ("", "v1", "Namespace") => obj(
            "Namespace provides a scope for names.",
            json!({
                "spec": obj("Spec defines the behavior of the namespace.", json!({
                    "finalizers": strings("Values that must be removed before the namespace is deleted.")})),
                "status": obj("Status describes the current status of the namespace.", json!({
                    "phase": s("Phase of the namespace: Active or Terminating."),
                    "conditions": conditions})),
            }),
        ),
        ("", "v1", "ConfigMap") => obj(
            "ConfigMap holds configuration data for pods to consume.",
            json!({
                "data": smap("Configuration data; keys are alphanumeric, '-', '_' or '.'."),
                "binaryData": {"description": "Binary configuration data, base64 encoded.", "type": "object",
                               "additionalProperties": {"type": "string", "format": "byte"}},
                "immutable": b("If true, the data cannot be changed after creation."),
            }),
        ),
        ("", "v1", "Secret") => obj(
            "Secret holds secret data of a certain type.",
            json!({
                "data": {"description": "Secret data, base64 encoded.", "type": "object",
                         "additionalProperties": {"type": "string", "format": "byte"}},
                "stringData": smap("Write-only convenience field: merged into data on write."),
                "type": s("Used to facilitate programmatic handling of secret data."),
                "immutable": b("If true, the data cannot be changed after creation."),
            }),
        ),
        ("", "v1", "ServiceAccount") => obj(
            "ServiceAccount binds together a name understood by users and other principals.",
            json!({"automountServiceAccountToken": b("Whether pods using this account get a token mounted automatically.")}),
        ),
        ("", "v1", "Service") => obj(
            "Service is a named abstraction of a software service.",
            json!({
                "spec": obj("Spec defines the behavior of the service.", json!({
                    "type": s("How the service is exposed: ClusterIP, NodePort, LoadBalancer or ExternalName."),
                    "clusterIP": s("The IP address of the service."),
                    "externalName": s("The external reference for ExternalName services."),
                    "selector": smap("Routes traffic to pods whose labels match."),
                    "ports": {"description": "The ports exposed by the service.", "type": "array",
                              "items": obj("A port of the service.", json!({
                                  "name": s("Name of the port."),
                                  "port": i("The port the service exposes."),
                                  "targetPort": {"description": "Number or name of the port on the pods.", "x-kubernetes-int-or-string": true},
                                  "protocol": s("TCP, UDP or SCTP."),
                                  "nodePort": i("The port on each node, for NodePort and LoadBalancer services."),
                                  "appProtocol": s("The application protocol of the port.")})),
                              "x-kubernetes-list-map-keys": ["port", "protocol"],
                              "x-kubernetes-list-type": "map"},
                })),
                "status": obj("Most recently observed status of the service.", json!({
                    "loadBalancer": obj("The load balancer, if any.", json!({}))})),
            }),
        ),
        ("coordination.k8s.io", "v1", "Lease") => obj(
            "Lease defines a lease concept.",
            json!({
                "spec": obj("Spec contains the specification of the Lease.", json!({
                    "holderIdentity": s("The identity of the holder of the current lease."),
                    "leaseDurationSeconds": i("Seconds candidates wait before acquiring an unrenewed lease."),
                    "acquireTime": {"description": "When the current lease was acquired.", "type": "string", "format": "date-time"},
                    "renewTime": {"description": "When the current holder last renewed the lease.", "type": "string", "format": "date-time"},
                    "leaseTransitions": i("How many times the lease changed holders."),
                })),
            }),
        ),
        ("discovery.k8s.io", "v1", "EndpointSlice") => obj(
            "EndpointSlice represents a subset of the endpoints that implement a service.",
            json!({
                "addressType": s("The type of address carried: IPv4, IPv6 or FQDN."),
                "endpoints": {"description": "The endpoints in this slice.", "type": "array", "x-kubernetes-list-type": "atomic",
                              "items": obj("One endpoint.", json!({
                                  "addresses": strings("The addresses of this endpoint."),
                                  "conditions": obj("The current conditions of the endpoint.", json!({
                                      "ready": b("Whether the endpoint is ready."),
                                      "serving": b("Whether the endpoint is serving."),
                                      "terminating": b("Whether the endpoint is terminating.")})),
                                  "hostname": s("Hostname of this endpoint."),
                                  "nodeName": s("The node hosting this endpoint.")}))},
                "ports": {"description": "The network ports exposed by each endpoint.", "type": "array", "x-kubernetes-list-type": "atomic",
                          "items": obj("A port.", json!({
                              "name": s("Name of the port."),
                              "port": i("The port number."),
                              "protocol": s("TCP, UDP or SCTP."),
                              "appProtocol": s("The application protocol.")}))},
            }),
        ),
        ("apiregistration.k8s.io", "v1", "APIService") => obj(
            "APIService represents a server for a particular GroupVersion.",
            json!({
                "spec": obj("Spec contains information for locating and communicating with a server.", json!({
                    "group": s("The API group name this server hosts."),
                    "version": s("The API version this server hosts."),
                    "service": obj("A reference to the service of this API server; empty for local APIs.", json!({
                        "namespace": s("Namespace of the service."),
                        "name": s("Name of the service."),
                        "port": i("Port of the service, 443 by default.")})),
                    "caBundle": {"description": "PEM encoded CA bundle to validate the server's certificate.", "type": "string", "format": "byte"},
                    "insecureSkipTLSVerify": b("Disables TLS certificate verification; strongly discouraged."),
                    "groupPriorityMinimum": i("Priority of this group among all groups."),
                    "versionPriority": i("Priority of this version within its group."),
                })),
                "status": obj("Status contains derived information about the API server.", json!({"conditions": conditions})),
            }),
        ),
        ("admissionregistration.k8s.io", "v1", "ValidatingAdmissionPolicy") => obj(
            "ValidatingAdmissionPolicy describes CEL validations applied to requests.",
            json!({
                "spec": obj("Spec of the policy.", json!({
                    "failurePolicy": s("What to do when the policy fails to evaluate: Fail or Ignore."),
                    "matchConstraints": obj("Which requests the policy applies to.", json!({})),
                    "validations": {"description": "CEL expressions that must hold.", "type": "array", "x-kubernetes-list-type": "atomic",
                                    "items": obj("One validation.", json!({
                                        "expression": s("The CEL expression."),
                                        "message": s("The message when the expression is false."),
                                        "reason": s("The reason returned to the client.")}))},
                })),
            }),
        ),
        ("admissionregistration.k8s.io", "v1", "ValidatingAdmissionPolicyBinding") => obj(
            "ValidatingAdmissionPolicyBinding binds a policy to parametrized resources.",
            json!({
                "spec": obj("Spec of the binding.", json!({
                    "policyName": s("The policy this binding binds."),
                    "validationActions": strings("How failed validations are enforced: Deny, Warn or Audit."),
                })),
            }),
        ),
        ("admissionregistration.k8s.io", "v1", "ValidatingWebhookConfiguration") => obj(
            "ValidatingWebhookConfiguration describes webhooks that accept or reject an object without changing it.",
            json!({"webhooks": webhooks_schema(false)}),
        ),
        ("admissionregistration.k8s.io", "v1", "MutatingWebhookConfiguration") => obj(
            "MutatingWebhookConfiguration describes webhooks that accept or reject and may change an object.",
            json!({"webhooks": webhooks_schema(true)}),
        ),
        _ => return None,
    };
    Some(schema)
}

/// `webhooks` of a Validating- or MutatingWebhookConfiguration.
fn webhooks_schema(mutating: bool) -> Value {
    let s = |d: &str| json!({"description": d, "type": "string"});
    let i = |d: &str| json!({"description": d, "type": "integer", "format": "int32"});
    let strings = |d: &str| json!({"description": d, "type": "array", "items": {"type": "string", "default": ""}, "x-kubernetes-list-type": "atomic"});
    let obj =
        |d: &str, props: Value| json!({"description": d, "type": "object", "properties": props});
    let selector = |d: &str| {
        obj(
            d,
            json!({
                "matchLabels": {"description": "Labels that must be present with these values.", "type": "object",
                                "additionalProperties": {"type": "string", "default": ""}},
                "matchExpressions": {"description": "Label requirements, ANDed.", "type": "array", "x-kubernetes-list-type": "atomic",
                                     "items": obj("A label requirement.", json!({
                                         "key": s("The label key."),
                                         "operator": s("In, NotIn, Exists or DoesNotExist."),
                                         "values": strings("The values for In and NotIn.")}))},
            }),
        )
    };
    let mut hook = json!({
        "name": s("The name of the admission webhook, fully qualified (e.g. imagepolicy.kubernetes.io)."),
        "clientConfig": obj("How to reach the webhook.", json!({
            "url": s("The https URL of the webhook; exactly one of url or service."),
            "service": obj("A reference to the service of the webhook.", json!({
                "namespace": s("Namespace of the service."),
                "name": s("Name of the service."),
                "path": s("URL path requests are sent to."),
                "port": i("Port of the service, 443 by default.")})),
            "caBundle": {"description": "PEM encoded CA bundle to validate the webhook's server certificate.", "type": "string", "format": "byte"}})),
        "rules": {"description": "The operations and resources the webhook cares about.", "type": "array", "x-kubernetes-list-type": "atomic",
                  "items": obj("A rule.", json!({
                      "operations": strings("CREATE, UPDATE, DELETE, CONNECT or *."),
                      "apiGroups": strings("API groups; * is all."),
                      "apiVersions": strings("API versions; * is all."),
                      "resources": strings("Resources, 'r/sub' for subresources; * is all."),
                      "scope": s("Cluster, Namespaced or *.")}))},
        "failurePolicy": s("What happens when the webhook cannot be called: Ignore or Fail (default)."),
        "matchPolicy": s("Exact or Equivalent (default): whether other versions of a matched resource are sent too."),
        "namespaceSelector": selector("Which namespaces' objects are sent to the webhook."),
        "objectSelector": selector("Which objects, by their labels, are sent to the webhook."),
        "sideEffects": s("None or NoneOnDryRun: whether calling the webhook changes anything elsewhere."),
        "timeoutSeconds": i("Seconds to wait for the webhook, 1 to 30 (default 10)."),
        "admissionReviewVersions": strings("AdmissionReview versions the webhook accepts, in order of preference."),
        "matchConditions": {"description": "CEL conditions that must all hold for the webhook to be called.", "type": "array",
                            "x-kubernetes-list-map-keys": ["name"], "x-kubernetes-list-type": "map",
                            "items": obj("A condition.", json!({
                                "name": s("Identifies the condition."),
                                "expression": s("The CEL expression.")}))},
    });
    if mutating {
        hook["reinvocationPolicy"] = s("Never (default) or IfNeeded.");
    }
    json!({"description": "The webhooks and the resources and operations they affect.", "type": "array",
           "x-kubernetes-list-map-keys": ["name"], "x-kubernetes-list-type": "map",
           "items": obj("One admission webhook.", hook)})
}

/// The `/openapi/v3` index. `group_versions` pairs a path such as
/// `apis/stable.example.io/v1` or `api/v1` with the hash of its document (any
/// string that changes when the document does; kubectl uses it for caching).
/// kube serves this with `Content-Type: text/plain; charset=utf-8`.
pub fn v3_index(group_versions: &[(String, String)]) -> Value {
    let mut paths = Map::new();
    for (path, hash) in group_versions {
        let path = path.trim_start_matches('/');
        paths.insert(
            path.to_string(),
            json!({"serverRelativeURL": format!("/openapi/v3/{path}?hash={hash}")}),
        );
    }
    json!({ "paths": Value::Object(paths) })
}

/// A hash for [`v3_index`]: upper-case hex SHA-512 of the serialized document,
/// the form kube uses.
pub fn document_hash(document: &Value) -> String {
    use sha2::{Digest, Sha512};
    let digest = Sha512::digest(document.to_string().as_bytes());
    digest.iter().map(|b| format!("{b:02X}")).collect()
}

/// The index path of a group-version: `api/v1` for the core group,
/// `apis/<group>/<version>` otherwise.
pub fn group_version_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// The components/definitions key of a kind, as kube names it: reversed group
/// for custom resources (`io.example.stable.v1.CronTab`), `io.k8s.api.<g>` for
/// built-in groups (`io.k8s.api.coordination.v1.Lease`, `io.k8s.api.core.v1.Namespace`).
pub fn schema_name(group: &str, version: &str, kind: &str) -> String {
    let prefix = match group {
        "" => "io.k8s.api.core".to_string(),
        "apiextensions.k8s.io" => "io.k8s.apiextensions-apiserver.pkg.apis.apiextensions".into(),
        "apiregistration.k8s.io" => "io.k8s.kube-aggregator.pkg.apis.apiregistration".into(),
        g if !g.contains('.') => format!("io.k8s.api.{g}"),
        g if g.ends_with(".k8s.io") => {
            format!(
                "io.k8s.api.{}",
                g.trim_end_matches(".k8s.io").replace('.', "")
            )
        }
        g => g.split('.').rev().collect::<Vec<_>>().join("."),
    };
    format!("{prefix}.{version}.{kind}")
}

const META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1";

const API_VERSION_DESCRIPTION: &str = "APIVersion defines the versioned schema of this representation of an object. Servers should convert recognized schemas to the latest internal value, and may reject unrecognized values. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#resources";
const KIND_DESCRIPTION: &str = "Kind is a string value representing the REST resource this object represents. Servers may infer this from the endpoint the client submits requests to. Cannot be updated. In CamelCase. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds";
const METADATA_DESCRIPTION: &str = "Standard object's metadata. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata";
const LIST_METADATA_DESCRIPTION: &str = "Standard list metadata. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds";

fn gvk(group: &str, version: &str, kind: &str) -> Value {
    json!({"group": group, "kind": kind, "version": version})
}

fn reference(v3: bool, name: &str) -> Value {
    let base = if v3 {
        "#/components/schemas/"
    } else {
        "#/definitions/"
    };
    json!({ "$ref": format!("{base}{name}") })
}

/// The published schema of a resource's kind: its CRD schema with the standard
/// `apiVersion`, `kind` and `metadata` members and the GVK extension.
fn kind_schema(r: &CrdResource, v3: bool) -> Value {
    let mut schema = match &r.schema {
        Some(Value::Object(m)) => m.clone(),
        _ => {
            let mut m = Map::new();
            m.insert("type".into(), json!("object"));
            m.insert("x-kubernetes-preserve-unknown-fields".into(), json!(true));
            m
        }
    };
    let props = schema.entry("properties").or_insert_with(|| json!({}));
    if let Some(p) = props.as_object_mut() {
        p.insert(
            "apiVersion".into(),
            json!({"description": API_VERSION_DESCRIPTION, "type": "string"}),
        );
        p.insert(
            "kind".into(),
            json!({"description": KIND_DESCRIPTION, "type": "string"}),
        );
        let meta_ref = reference(v3, &format!("{META}.ObjectMeta"));
        let meta = if v3 {
            json!({"description": METADATA_DESCRIPTION, "allOf": [meta_ref]})
        } else {
            let mut m = meta_ref;
            m["description"] = json!(METADATA_DESCRIPTION);
            m
        };
        p.insert("metadata".into(), meta);
    }
    schema.insert(
        "x-kubernetes-group-version-kind".into(),
        json!([gvk(&r.group, &r.version, &r.kind)]),
    );
    if v3 {
        schema.insert("x-kubernetes-selectable-fields".into(), json!([]));
    }
    let mut out = Value::Object(schema);
    if !v3 {
        rewrite_for_v2(&mut out);
    }
    out
}

/// Swagger 2.0 has no `nullable` and references definitions instead of
/// components.
fn rewrite_for_v2(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.remove("nullable");
            if let Some(Value::String(r)) = m.get_mut("$ref") {
                *r = r.replace("#/components/schemas/", "#/definitions/");
            }
            for c in m.values_mut() {
                rewrite_for_v2(c);
            }
        }
        Value::Array(a) => a.iter_mut().for_each(rewrite_for_v2),
        _ => {}
    }
}

fn list_schema(r: &CrdResource, v3: bool) -> Value {
    let list_meta = reference(v3, &format!("{META}.ListMeta"));
    let meta = if v3 {
        json!({"description": LIST_METADATA_DESCRIPTION, "allOf": [list_meta]})
    } else {
        let mut m = list_meta;
        m["description"] = json!(LIST_METADATA_DESCRIPTION);
        m
    };
    json!({
        "description": format!("{} is a list of {}", r.list_kind, r.kind),
        "type": "object",
        "required": ["items"],
        "properties": {
            "apiVersion": {"description": API_VERSION_DESCRIPTION, "type": "string"},
            "items": {
                "description": format!("List of {}. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md", r.plural),
                "type": "array",
                "items": reference(v3, &schema_name(&r.group, &r.version, &r.kind)),
            },
            "kind": {"description": KIND_DESCRIPTION, "type": "string"},
            "metadata": meta,
        },
        "x-kubernetes-group-version-kind": [gvk(&r.group, &r.version, &r.list_kind)],
    })
}

/// Minimal shared `meta/v1` schemas: enough for explain to describe `metadata`
/// and for clients that resolve every reference.
fn meta_schemas(v3: bool) -> Vec<(String, Value)> {
    let s = |d: &str| json!({"description": d, "type": "string"});
    let time = json!({"description": "Time is a wrapper around time.Time which supports correct marshaling to YAML and JSON.", "type": "string", "format": "date-time"});
    let string_map = |d: &str| json!({"description": d, "type": "object", "additionalProperties": {"type": "string", "default": ""}});
    let owner = json!({
        "description": "OwnerReference contains enough information to let you identify an owning object.",
        "type": "object",
        "required": ["apiVersion", "kind", "name", "uid"],
        "properties": {
            "apiVersion": s("API version of the referent."),
            "blockOwnerDeletion": {"description": "If true, the owner cannot be deleted from storage before this reference is removed (foreground deletion).", "type": "boolean"},
            "controller": {"description": "If true, this reference points to the managing controller.", "type": "boolean"},
            "kind": s("Kind of the referent."),
            "name": s("Name of the referent."),
            "uid": s("UID of the referent."),
        },
        "x-kubernetes-map-type": "atomic",
    });
    let managed = json!({
        "description": "ManagedFieldsEntry is a workflow-id, a FieldSet and the group version of the resource that the fieldset applies to.",
        "type": "object",
        "properties": {
            "apiVersion": s("APIVersion defines the version of this resource that this field set applies to."),
            "fieldsType": s("FieldsType is the discriminator for the different fields format and version. There is currently only one possible value: \"FieldsV1\""),
            "fieldsV1": {"description": "FieldsV1 holds the first JSON version format as described in the \"FieldsV1\" type.", "type": "object"},
            "manager": s("Manager is an identifier of the workflow managing these fields."),
            "operation": s("Operation is the type of operation which lead to this ManagedFieldsEntry being created. The only valid values for this field are 'Apply' and 'Update'."),
            "subresource": s("Subresource is the name of the subresource used to update that object, or empty string if the object was updated through the main resource."),
            "time": time.clone(),
        },
    });
    let object_meta = json!({
        "description": "ObjectMeta is metadata that all persisted resources must have, which includes all objects users must create.",
        "type": "object",
        "properties": {
            "annotations": string_map("Annotations is an unstructured key value map stored with a resource that may be set by external tools to store and retrieve arbitrary metadata."),
            "creationTimestamp": time.clone(),
            "deletionGracePeriodSeconds": {"description": "Number of seconds allowed for this object to gracefully terminate before it will be removed from the system.", "type": "integer", "format": "int64"},
            "deletionTimestamp": time.clone(),
            "finalizers": {"description": "Must be empty before the object is deleted from the registry.", "type": "array", "items": {"type": "string", "default": ""}, "x-kubernetes-list-type": "set", "x-kubernetes-patch-strategy": "merge"},
            "generateName": s("GenerateName is an optional prefix, used by the server, to generate a unique name ONLY IF the Name field has not been provided."),
            "generation": {"description": "A sequence number representing a specific generation of the desired state.", "type": "integer", "format": "int64"},
            "labels": string_map("Map of string keys and values that can be used to organize and categorize (scope and select) objects."),
            "managedFields": {"description": "ManagedFields maps workflow-id and version to the set of fields that are managed by that workflow.", "type": "array", "items": reference(v3, &format!("{META}.ManagedFieldsEntry")), "x-kubernetes-list-type": "atomic"},
            "name": s("Name must be unique within a namespace."),
            "namespace": s("Namespace defines the space within which each name must be unique."),
            "ownerReferences": {"description": "List of objects depended by this object.", "type": "array", "items": reference(v3, &format!("{META}.OwnerReference")), "x-kubernetes-list-map-keys": ["uid"], "x-kubernetes-list-type": "map", "x-kubernetes-patch-merge-key": "uid", "x-kubernetes-patch-strategy": "merge"},
            "resourceVersion": s("An opaque value that represents the internal version of this object."),
            "selfLink": s("Deprecated: selfLink is a legacy read-only field that is no longer populated by the system."),
            "uid": s("UID is the unique in time and space value for this object."),
        },
    });
    let list_meta = json!({
        "description": "ListMeta describes metadata that synthetic resources must have, including lists and various status objects.",
        "type": "object",
        "properties": {
            "continue": s("continue may be set if the user set a limit on the number of items returned."),
            "remainingItemCount": {"description": "remainingItemCount is the number of subsequent items in the list which are not included in this list response.", "type": "integer", "format": "int64"},
            "resourceVersion": s("String that identifies the server's internal version of this object."),
            "selfLink": s("Deprecated: selfLink is a legacy read-only field that is no longer populated by the system."),
        },
    });
    let status = json!({
        "description": "Status is a return value for calls that don't return other objects.",
        "type": "object",
        "properties": {
            "apiVersion": {"description": API_VERSION_DESCRIPTION, "type": "string"},
            "code": {"description": "Suggested HTTP return code for this status, 0 if not set.", "type": "integer", "format": "int32"},
            "details": {"description": "Extended data associated with the reason.", "type": "object", "x-kubernetes-preserve-unknown-fields": true},
            "kind": {"description": KIND_DESCRIPTION, "type": "string"},
            "message": s("A human-readable description of the status of this operation."),
            "metadata": reference(v3, &format!("{META}.ListMeta")),
            "reason": s("A machine-readable description of why this operation is in the \"Failure\" status."),
            "status": s("Status of the operation. One of: \"Success\" or \"Failure\"."),
        },
        "x-kubernetes-group-version-kind": [gvk("", "v1", "Status")],
    });
    let patch = json!({"description": "Patch is provided to give a concrete name and type to the Kubernetes PATCH request body.", "type": "object"});
    let delete_options = json!({
        "description": "DeleteOptions may be provided when deleting an API object.",
        "type": "object",
        "properties": {
            "apiVersion": {"description": API_VERSION_DESCRIPTION, "type": "string"},
            "dryRun": {"description": "When present, indicates that modifications should not be persisted.", "type": "array", "items": {"type": "string", "default": ""}, "x-kubernetes-list-type": "atomic"},
            "gracePeriodSeconds": {"description": "The duration in seconds before the object should be deleted.", "type": "integer", "format": "int64"},
            "kind": {"description": KIND_DESCRIPTION, "type": "string"},
            "propagationPolicy": s("Whether and how garbage collection will be performed: 'Orphan', 'Background' or 'Foreground'."),
        },
    });
    let mut out = vec![
        (format!("{META}.DeleteOptions"), delete_options),
        (format!("{META}.ListMeta"), list_meta),
        (format!("{META}.ManagedFieldsEntry"), managed),
        (format!("{META}.ObjectMeta"), object_meta),
        (format!("{META}.OwnerReference"), owner),
        (format!("{META}.Patch"), patch),
        (format!("{META}.Status"), status),
    ];
    if !v3 {
        for (_, s) in out.iter_mut() {
            rewrite_for_v2(s);
        }
    }
    out
}

fn query_param(v3: bool, name: &str, description: &str, type_: &str) -> Value {
    if v3 {
        json!({"name": name, "in": "query", "description": description,
               "schema": {"type": type_, "uniqueItems": true}})
    } else {
        json!({"uniqueItems": true, "type": type_, "description": description,
               "name": name, "in": "query"})
    }
}

fn path_param(v3: bool, name: &str, description: &str) -> Value {
    if v3 {
        json!({"name": name, "in": "path", "description": description, "required": true,
               "schema": {"type": "string", "uniqueItems": true}})
    } else {
        json!({"uniqueItems": true, "type": "string", "description": description,
               "name": name, "in": "path", "required": true})
    }
}

const DRY_RUN: &str = "When present, indicates that modifications should not be persisted. An invalid or unrecognized dryRun directive will result in an error response and no further processing of the request. Valid values are: - All: all dry run stages will be processed";
const FIELD_MANAGER: &str = "fieldManager is a name associated with the actor or entity that is making these changes. The value must be less than or 128 characters long, and only contain printable characters, as defined by https://golang.org/pkg/unicode/#IsPrint.";
const FIELD_VALIDATION: &str = "fieldValidation instructs the server on how to handle objects in the request (POST/PUT/PATCH) containing unknown or duplicate fields. Valid values are: - Ignore - Warn (the default) - Strict";

/// Operation tag and id stem: `stableExampleIo_v1`, `StableExampleIoV1`.
fn tag_parts(group: &str, version: &str) -> (String, String) {
    let mut camel = String::new();
    let mut upper = false;
    for (i, c) in group.chars().enumerate() {
        if c == '.' || c == '-' {
            upper = true;
        } else if upper {
            camel.extend(c.to_uppercase());
            upper = false;
        } else if i == 0 {
            camel.extend(c.to_lowercase());
        } else {
            camel.push(c);
        }
    }
    if group.is_empty() {
        camel = "core".into();
    }
    let tag = format!("{camel}_{version}");
    let mut stem: String = camel.chars().take(1).flat_map(char::to_uppercase).collect();
    stem.extend(camel.chars().skip(1));
    let mut v = version.chars();
    if let Some(f) = v.next() {
        stem.extend(f.to_uppercase());
        stem.extend(v);
    }
    (tag, stem)
}

/// One operation of a path.
struct Op<'a> {
    /// `x-kubernetes-action`: get, list, post, put, patch, delete, deletecollection.
    action: &'a str,
    /// HTTP method in lower case.
    verb: &'a str,
    description: String,
    /// Schema name of the response body.
    response: &'a str,
    params: Vec<Value>,
    /// Whether a request body is taken.
    body: bool,
    /// `operationId`, as kube forms it.
    id: String,
}

fn operation(v3: bool, r: &CrdResource, o: Op) -> Value {
    let tag = tag_parts(&r.group, &r.version).0;
    let Op {
        action,
        verb,
        description,
        response: response_kind,
        params,
        body,
        id: op_id,
    } = o;
    let resp_ref = reference(v3, response_kind);
    let mut op = Map::new();
    op.insert("tags".into(), json!([tag]));
    op.insert("description".into(), json!(description));
    op.insert("operationId".into(), json!(op_id));
    if !params.is_empty() {
        op.insert("parameters".into(), Value::Array(params));
    }
    if v3 {
        if body {
            let body_ref = if verb == "patch" {
                reference(true, &format!("{META}.Patch"))
            } else {
                resp_ref.clone()
            };
            let content: Map<String, Value> = if verb == "patch" {
                [
                    "application/apply-patch+yaml",
                    "application/json-patch+json",
                    "application/merge-patch+json",
                ]
                .iter()
                .map(|ct| (ct.to_string(), json!({"schema": body_ref.clone()})))
                .collect()
            } else {
                [("*/*".to_string(), json!({"schema": body_ref}))]
                    .into_iter()
                    .collect()
            };
            op.insert(
                "requestBody".into(),
                json!({"content": content, "required": true}),
            );
        }
        op.insert(
            "responses".into(),
            json!({
                "200": {"description": "OK", "content": {
                    "application/json": {"schema": resp_ref.clone()},
                    "application/yaml": {"schema": resp_ref},
                }},
                "401": {"description": "Unauthorized"},
            }),
        );
    } else {
        if body {
            let body_ref = if verb == "patch" {
                reference(false, &format!("{META}.Patch"))
            } else {
                resp_ref.clone()
            };
            let params = op
                .entry("parameters")
                .or_insert_with(|| Value::Array(Vec::new()));
            if let Value::Array(p) = params {
                p.insert(
                    0,
                    json!({"name": "body", "in": "body", "required": true, "schema": body_ref}),
                );
            }
        }
        op.insert(
            "responses".into(),
            json!({"200": {"description": "OK", "schema": resp_ref}, "401": {"description": "Unauthorized"}}),
        );
    }
    op.insert("x-kubernetes-action".into(), json!(action));
    op.insert(
        "x-kubernetes-group-version-kind".into(),
        gvk(&r.group, &r.version, &r.kind),
    );
    Value::Object(op)
}

fn resource_paths(r: &CrdResource, v3: bool) -> Vec<(String, Value)> {
    let prefix = format!("/{}", group_version_path(&r.group, &r.version));
    let ns = if r.namespaced {
        "/namespaces/{namespace}"
    } else {
        ""
    };
    let kind_name = schema_name(&r.group, &r.version, &r.kind);
    let list_name = schema_name(&r.group, &r.version, &r.list_kind);
    let status_name = format!("{META}.Status");
    let write_params = |force: bool| {
        let mut p = vec![
            query_param(v3, "dryRun", DRY_RUN, "string"),
            query_param(v3, "fieldManager", FIELD_MANAGER, "string"),
            query_param(v3, "fieldValidation", FIELD_VALIDATION, "string"),
        ];
        if force {
            p.push(query_param(
                v3,
                "force",
                "Force is going to \"force\" Apply requests. It means user will re-acquire conflicting fields owned by other people.",
                "boolean",
            ));
        }
        p
    };
    let mut common = Vec::new();
    if r.namespaced {
        common.push(path_param(
            v3,
            "namespace",
            "object name and auth scope, such as for teams and projects",
        ));
    }
    common.push(query_param(
        v3,
        "pretty",
        "If 'true', then the output is pretty printed.",
        "string",
    ));
    let list_params = vec![
        query_param(v3, "labelSelector", "A selector to restrict the list of returned objects by their labels. Defaults to everything.", "string"),
        query_param(v3, "fieldSelector", "A selector to restrict the list of returned objects by their fields. Defaults to everything.", "string"),
        query_param(v3, "limit", "limit is a maximum number of responses to return for a list call.", "integer"),
        query_param(v3, "continue", "The continue option should be set when retrieving more results from the server.", "string"),
        query_param(v3, "resourceVersion", "resourceVersion sets a constraint on what resource versions a request may be served from.", "string"),
        query_param(v3, "watch", "Watch for changes to the described resources and return them as a stream of add, update, and remove notifications.", "boolean"),
    ];

    let (_, stem) = tag_parts(&r.group, &r.version);
    let scope = if r.namespaced { "Namespaced" } else { "" };
    let kind = &r.kind;
    let op = |action: &'static str,
              verb: &'static str,
              description: String,
              response: &str,
              params: Vec<Value>,
              body: bool,
              id: String| {
        operation(
            v3,
            r,
            Op {
                action,
                verb,
                description,
                response,
                params,
                body,
                id,
            },
        )
    };

    let mut collection = Map::new();
    collection.insert("parameters".into(), Value::Array(common.clone()));
    collection.insert(
        "get".into(),
        op(
            "list",
            "get",
            format!("list or watch objects of kind {kind}"),
            &list_name,
            list_params.clone(),
            false,
            format!("list{stem}{scope}{kind}"),
        ),
    );
    collection.insert(
        "post".into(),
        op(
            "post",
            "post",
            format!("create a {kind}"),
            &kind_name,
            write_params(false),
            true,
            format!("create{stem}{scope}{kind}"),
        ),
    );
    collection.insert(
        "delete".into(),
        op(
            "deletecollection",
            "delete",
            format!("delete collection of {kind}"),
            &status_name,
            vec![],
            false,
            format!("delete{stem}Collection{scope}{kind}"),
        ),
    );

    let mut item_common = vec![path_param(v3, "name", &format!("name of the {kind}"))];
    item_common.extend(common);
    let mut item = Map::new();
    item.insert("parameters".into(), Value::Array(item_common));
    item.insert(
        "get".into(),
        op(
            "get",
            "get",
            format!("read the specified {kind}"),
            &kind_name,
            vec![],
            false,
            format!("read{stem}{scope}{kind}"),
        ),
    );
    item.insert(
        "put".into(),
        op(
            "put",
            "put",
            format!("replace the specified {kind}"),
            &kind_name,
            write_params(false),
            true,
            format!("replace{stem}{scope}{kind}"),
        ),
    );
    item.insert(
        "patch".into(),
        op(
            "patch",
            "patch",
            format!("partially update the specified {kind}"),
            &kind_name,
            write_params(true),
            true,
            format!("patch{stem}{scope}{kind}"),
        ),
    );
    item.insert(
        "delete".into(),
        op(
            "delete",
            "delete",
            format!("delete a {kind}"),
            &status_name,
            vec![],
            false,
            format!("delete{stem}{scope}{kind}"),
        ),
    );

    let mut out = vec![
        (
            format!("{prefix}{ns}/{}", r.plural),
            Value::Object(collection),
        ),
        (
            format!("{prefix}{ns}/{}/{{name}}", r.plural),
            Value::Object(item),
        ),
    ];
    if r.namespaced {
        let mut all = Map::new();
        all.insert(
            "get".into(),
            op(
                "list",
                "get",
                format!("list or watch objects of kind {kind}"),
                &list_name,
                list_params,
                false,
                format!("list{stem}{kind}ForAllNamespaces"),
            ),
        );
        out.push((format!("{prefix}/{}", r.plural), Value::Object(all)));
    }
    out
}

/// The `/openapi/v3/apis/<group>/<version>` (or `/openapi/v3/api/v1`) document
/// for `resources` of one group-version.
pub fn v3_group_version(group: &str, version: &str, resources: &[CrdResource]) -> Value {
    let mut paths = Map::new();
    let mut schemas = Map::new();
    for r in resources
        .iter()
        .filter(|r| r.group == group && r.version == version)
    {
        for (p, item) in resource_paths(r, true) {
            paths.insert(p, item);
        }
        schemas.insert(schema_name(group, version, &r.kind), kind_schema(r, true));
        schemas.insert(
            schema_name(group, version, &r.list_kind),
            list_schema(r, true),
        );
    }
    for (name, s) in meta_schemas(true) {
        schemas.insert(name, s);
    }
    let title = if group.ends_with(".k8s.io") || !group.contains('.') {
        "Kubernetes"
    } else {
        "Kubernetes CRD Swagger"
    };
    json!({
        "openapi": "3.0.0",
        "info": {"title": title, "version": "v0.1.0"},
        "paths": paths,
        "components": {"schemas": schemas},
    })
}

/// The swagger 2.0 document of `/openapi/v2` for the `resources` that have a
/// schema.
///
/// Resources without a schema are left out on purpose: client-side `kubectl
/// apply` builds strategic merge patches for built-in kinds from this document
/// when it lists them, and a schema-less entry would make every list atomic.
/// Absent, kubectl uses the patch strategies compiled into it. (The v3 PATCH
/// operations never offer strategic merge patch for the same reason.)
pub fn v2_document(resources: &[CrdResource]) -> Value {
    let mut paths = Map::new();
    let mut definitions = Map::new();
    for r in resources.iter().filter(|r| r.schema.is_some()) {
        for (p, item) in resource_paths(r, false) {
            paths.insert(p, item);
        }
        definitions.insert(
            schema_name(&r.group, &r.version, &r.kind),
            kind_schema(r, false),
        );
        definitions.insert(schema_name(&r.group, &r.version, &r.list_kind), {
            let mut l = list_schema(r, false);
            rewrite_for_v2(&mut l);
            l
        });
    }
    for (name, s) in meta_schemas(false) {
        definitions.insert(name, s);
    }
    json!({
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": "v1.32.0"},
        "paths": paths,
        "definitions": definitions,
    })
}

/// The content type of the protobuf `/openapi/v2` answer.
pub const V2_PROTOBUF: &str = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf";

/// The forms `/openapi/v2` is served in, in the order kube-openapi tries them
/// for each `Accept` clause: JSON, then protobuf under its deprecated and its
/// current subtype (client-go still asks for the deprecated one).
const V2_FORMS: [(&str, bool); 3] = [
    ("json", false),
    ("com.github.proto-openapi.spec.v2@v1.0+protobuf", true),
    ("com.github.proto-openapi.spec.v2.v1.0+protobuf", true),
];

/// `/openapi/v2` negotiated as kube-openapi does: the `Accept` clauses sorted by
/// quality and then specificity, the first that names a served form wins (no
/// header means `*/*`, so JSON); none → 406. The `ETag` is the SHA-512 of the
/// JSON form whichever form is sent, and a matching `If-None-Match` gets 304.
pub fn v2_response(document: &Value, request: &HeaderMap) -> Response<Bytes> {
    let json = document.to_string().into_bytes();
    let etag = format!("\"{}\"", hex_upper(&Sha512::digest(&json)));
    let accept = request
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.trim().is_empty())
        .unwrap_or("*/*");
    let mut response = Response::new(Bytes::new());
    response
        .headers_mut()
        .insert(header::VARY, HeaderValue::from_static("Accept"));
    let Some(protobuf) = v2_form(accept) else {
        *response.status_mut() = StatusCode::NOT_ACCEPTABLE;
        return response;
    };
    let body = if protobuf {
        match v2_protobuf::encode_document(document) {
            Ok(bytes) => bytes,
            Err(err) => {
                tracing::error!(error = %err, "Error in OpenAPI handler");
                *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                return response;
            }
        }
    } else {
        json
    };
    if let Ok(value) = HeaderValue::from_str(&etag) {
        response.headers_mut().insert(header::ETAG, value);
    }
    let unchanged = request
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|tag| tag.trim().trim_start_matches("W/"))
        .any(|tag| tag == "*" || tag == etag);
    if unchanged {
        *response.status_mut() = StatusCode::NOT_MODIFIED;
        return response;
    }
    let content_type = if protobuf {
        V2_PROTOBUF
    } else {
        "application/json"
    };
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    *response.body_mut() = Bytes::from(body);
    response
}

/// Which form an `Accept` header selects: `Some(true)` for protobuf,
/// `Some(false)` for JSON, None when it names neither.
fn v2_form(accept: &str) -> Option<bool> {
    let mut clauses: Vec<(f64, &str, &str)> = accept
        .split(',')
        .filter_map(|clause| {
            let mut parts = clause.split(';');
            let range = parts.next()?.trim();
            if range.is_empty() {
                return None;
            }
            let quality = parts
                .filter_map(|p| p.trim().strip_prefix("q="))
                .find_map(|q| q.trim().parse::<f64>().ok())
                .unwrap_or(1.0);
            let (kind, subtype) = range.split_once('/').unwrap_or((range, "*"));
            Some((quality, kind.trim(), subtype.trim()))
        })
        .collect();
    // Highest quality first; at equal quality a concrete type before `*`.
    clauses.sort_by(|a, b| {
        b.0.total_cmp(&a.0)
            .then((a.1 == "*").cmp(&(b.1 == "*")))
            .then((a.2 == "*").cmp(&(b.2 == "*")))
    });
    clauses.iter().find_map(|(_, kind, subtype)| {
        if *kind != "application" && *kind != "*" {
            return None;
        }
        V2_FORMS
            .iter()
            .find(|(served, _)| *subtype == "*" || subtype == served)
            .map(|(_, protobuf)| *protobuf)
    })
}

fn hex_upper(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02X}")).collect()
}

#[cfg(test)]
mod tests;
