//! Where the request pipeline calls into the modules other helpers own (selectors,
//! schema validation, patch semantics, managedFields). Until those land, the
//! simple stand-ins here keep the server usable; each function is the one place to
//! switch over.

use super::http as h;
use super::objects as o;
use super::rest::ReqCtx;
use crate::error::{ApiError, Cause};
use crate::registry::ResourceInfo;
use crate::schema::objectmeta;
use serde_json::{json, Value};

// ---------- selectors ----------

/// Label selectors: the one parser shared with the proxy.
pub use crproxy_core::selector::LabelSelector;

/// Parses a label selector into kube's 400 message on error.
pub fn parse_label_selector(s: &str) -> Result<LabelSelector, String> {
    LabelSelector::parse(s).map_err(|e| e.message().to_string())
}

/// Field selector terms `(field, equal?, value)`.
pub fn parse_field_selector(s: &str) -> Result<Vec<(String, bool, String)>, String> {
    let sel =
        crproxy_core::selector::FieldSelector::parse(s).map_err(|e| e.message().to_string())?;
    Ok(sel
        .requirements()
        .iter()
        .map(|r| (r.field.clone(), !r.negated, r.value.clone()))
        .collect())
}

// ---------- patches ----------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatchKind {
    Merge,
    Json,
    Strategic,
    Apply,
}

impl PatchKind {
    pub fn from_content_type(ct: &str, is_cr: bool) -> Result<Self, ApiError> {
        let accepted = if is_cr {
            "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"
        } else {
            "application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json, application/apply-patch+yaml"
        };
        match ct {
            "application/merge-patch+json" => Ok(PatchKind::Merge),
            "application/json-patch+json" => Ok(PatchKind::Json),
            "application/strategic-merge-patch+json" if !is_cr => Ok(PatchKind::Strategic),
            "application/apply-patch+yaml" => Ok(PatchKind::Apply),
            _ => Err(ApiError::unsupported_media_type(accepted)),
        }
    }
}

fn patch_error(e: crate::patch::PatchError) -> ApiError {
    ApiError::from_status(&e.status())
}

fn decode_patch(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))
}

/// The applied configuration of a server-side apply, minus what the endpoint may
/// not change (status through the main resource; everything but status through
/// `/status`), as kube's strategies reset it before tracking ownership.
pub fn applied_config(ctx: &ReqCtx, body: &[u8]) -> Result<Value, ApiError> {
    let mut applied = h::decode_yaml(body)
        .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?;
    if let Some(m) = applied.as_object_mut() {
        match ctx.subresource.as_str() {
            "status" => {
                m.retain(|k, _| matches!(k.as_str(), "apiVersion" | "kind" | "metadata" | "status"))
            }
            _ if ctx.info.has_status(&ctx.version) => {
                m.remove("status");
            }
            _ => {}
        }
    }
    Ok(applied)
}

fn schema_of(ctx: &ReqCtx) -> Option<std::sync::Arc<crate::schema::StructuralSchema>> {
    ctx.info
        .version(&ctx.version)
        .and_then(|v| v.structural.clone())
}

fn subresource(ctx: &ReqCtx) -> Option<&str> {
    (!ctx.subresource.is_empty()).then_some(ctx.subresource.as_str())
}

/// Server-side apply of `body` onto `live` (None: create).
pub fn server_side_apply(
    ctx: &ReqCtx,
    live: Option<&Value>,
    body: &[u8],
) -> Result<Value, ApiError> {
    let applied = applied_config(ctx, body)?;
    check_applied_metadata(ctx, &applied)?;
    let schema = schema_of(ctx);
    let manager = ctx.field_manager();
    let api_version = ctx.api_version();
    let now = super::objects::now();
    let opts = crate::patch::ApplyOptions {
        manager: &manager,
        force: ctx.q("force").is_some_and(|f| f == "true"),
        api_version: &api_version,
        subresource: subresource(ctx),
        now: &now,
        schema: schema.as_deref(),
    };
    crate::patch::apply_with(live, &applied, &opts).map_err(|e| match e {
        crate::patch::ApplyError::Conflicts(c) => {
            ApiError::from_status(&crate::patch::apply_conflict_status(&c))
        }
        crate::patch::ApplyError::NotAnObject => {
            ApiError::bad_request("the applied configuration must be an object")
        }
    })
}

/// kube's patcher refuses an apply whose configuration names a uid when there is
/// no object to apply it to (409, "uid mismatch"), before any admission: a uid
/// says which incarnation the apply is meant for, and a missing object is none.
/// (A resourceVersion does not stop an apply from creating.)
pub fn refuse_uid_without_object(ctx: &ReqCtx, applied: &Value) -> Result<(), ApiError> {
    match applied["metadata"]["uid"]
        .as_str()
        .filter(|uid| !uid.is_empty())
    {
        None => Ok(()),
        Some(uid) => Err(ApiError::conflict(
            &ctx.info.group,
            &ctx.info.resource,
            &ctx.name,
            &uid_mismatch(uid),
        )),
    }
}

/// Why kube's patcher refuses an apply naming `uid` when there is no object.
pub fn uid_mismatch(uid: &str) -> String {
    format!(
        "uid mismatch: the provided object specified uid {uid}, and no existing object was found"
    )
}

/// Applies a patch body to the current object (in the requested version).
pub fn apply_patch(
    ctx: &ReqCtx,
    kind: PatchKind,
    current: &Value,
    body: &[u8],
) -> Result<Value, ApiError> {
    let mut doc = current.clone();
    match kind {
        PatchKind::Merge => crate::patch::merge_patch(&mut doc, &decode_patch(body)?),
        PatchKind::Strategic => {
            crate::patch::strategic_merge_patch(&mut doc, &decode_patch(body)?, &ctx.info.kind)
                .map_err(patch_error)?
        }
        PatchKind::Json => {
            crate::patch::json_patch(&mut doc, &decode_patch(body)?).map_err(patch_error)?
        }
        PatchKind::Apply => return server_side_apply(ctx, Some(current), body),
    }
    check_patched_metadata(ctx, &mut doc)?;
    Ok(doc)
}

// ---------- custom resource metadata ----------

/// A custom resource body as kube's decoder reads it on create and update: its
/// `metadata` must decode into ObjectMeta, else 400 `<Kind> in version "<v>"
/// cannot be handled as a <Kind>: json: cannot unmarshal ...` (kube's
/// `transformDecodeError`, naming the kind and version the body gives). Null label
/// and annotation values come out as "".
pub fn decode_metadata(ctx: &ReqCtx, obj: &mut Value) -> Result<(), ApiError> {
    if !ctx.info.is_crd() {
        return Ok(());
    }
    if let Some(err) = objectmeta::decode_error(obj) {
        let named = |key: &str| {
            obj.get(key)
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
        };
        let kind = named("kind").unwrap_or(&ctx.info.kind);
        let version = named("apiVersion")
            .map(|av| av.split_once('/').map_or(av, |(_, v)| v))
            .unwrap_or(&ctx.version);
        return Err(ApiError::bad_request(format!(
            "{kind} in version {} cannot be handled as a {}: {err}",
            crate::schema::go_quote(version),
            ctx.info.kind
        )));
    }
    objectmeta::normalize(obj);
    Ok(())
}

/// A merge or JSON patch of a custom resource whose result kube cannot decode
/// fails with 422 on the field `patch`, showing the whole patched object (kube's
/// `jsonPatcher.applyPatchToCurrentObject`).
fn check_patched_metadata(ctx: &ReqCtx, patched: &mut Value) -> Result<(), ApiError> {
    if !ctx.info.is_crd() {
        return Ok(());
    }
    if let Some(err) = objectmeta::decode_error(patched) {
        return Err(ApiError::invalid(
            "",
            "",
            "",
            vec![Cause::new(
                "FieldValueInvalid",
                format!(
                    "Invalid value: {}: {err}",
                    objectmeta::patched_value(patched)
                ),
                "patch",
            )],
        ));
    }
    objectmeta::normalize(patched);
    Ok(())
}

/// An applied configuration whose metadata maps do not type-check fails kube's
/// typed conversion in the field manager: a 500 without a reason (the error is
/// not a Status), `failed to create typed patch object (<ns>/<name>; <gvk>): ...`.
fn check_applied_metadata(ctx: &ReqCtx, applied: &Value) -> Result<(), ApiError> {
    if !ctx.info.is_crd() {
        return Ok(());
    }
    let errors = objectmeta::apply_errors(applied);
    if errors.is_empty() {
        return Ok(());
    }
    let text = |v: Option<&Value>| v.and_then(Value::as_str).unwrap_or("").to_string();
    let meta = applied.get("metadata").filter(|m| m.is_object());
    let (namespace, name) = (
        text(meta.and_then(|m| m.get("namespace"))),
        text(meta.and_then(|m| m.get("name"))),
    );
    let api_version = text(applied.get("apiVersion"));
    let (group, version) = api_version
        .split_once('/')
        .unwrap_or(("", api_version.as_str()));
    let kind = text(applied.get("kind"));
    Err(ApiError::new(
        500,
        "",
        format!(
            "failed to create typed patch object ({namespace}/{name}; {group}/{version}, Kind={kind}): {}",
            objectmeta::join_apply_errors(&errors)
        ),
    ))
}

// ---------- defaults, validation, managedFields ----------

/// Defaults kube's scheme applies while decoding what a create or an update
/// sends, or a patch makes (before managedFields are computed, so the writer
/// owns them).
pub fn scheme_defaults(info: &ResourceInfo, obj: &mut Value) {
    let Some(m) = obj.as_object_mut() else { return };
    match (info.group.as_str(), info.resource.as_str()) {
        ("apps", "deployments") => {
            // apps/v1's SetDefaults_Deployment: replicas unset (or null) are 1.
            let spec = m.entry("spec").or_insert(Value::Null);
            if spec.is_null() {
                *spec = json!({});
            }
            if let Some(spec) = spec.as_object_mut() {
                if spec.get("replicas").is_none_or(Value::is_null) {
                    spec.insert("replicas".into(), json!(1));
                }
            }
        }
        ("", "namespaces") => {
            // SetDefaults_Namespace labels only a namespace with a name (one
            // made by generateName is labelled once it has one).
            let name = m
                .get("metadata")
                .and_then(|x| x.get("name"))
                .filter(|name| name.as_str().is_some_and(|name| !name.is_empty()))
                .cloned();
            let Some(name) = name else { return };
            if let Some(meta) = m.get_mut("metadata").and_then(Value::as_object_mut) {
                let labels = meta.entry("labels").or_insert_with(|| json!({}));
                if let Some(l) = labels.as_object_mut() {
                    l.insert("kubernetes.io/metadata.name".into(), name);
                }
            }
        }
        ("", "secrets")
            if m.get("type")
                .and_then(Value::as_str)
                .is_none_or(str::is_empty) =>
        {
            m.insert("type".into(), json!("Opaque"));
        }
        ("", "services") => service_defaults(m),
        ("apiregistration.k8s.io", "apiservices") => {
            if let Some(service) = m
                .get_mut("spec")
                .and_then(|s| s.get_mut("service"))
                .and_then(Value::as_object_mut)
            {
                service.entry("port").or_insert_with(|| json!(443));
            }
        }
        ("admissionregistration.k8s.io", "validatingwebhookconfigurations") => {
            crate::webhook::apply_defaults(obj, false)
        }
        ("admissionregistration.k8s.io", "mutatingwebhookconfigurations") => {
            crate::webhook::apply_defaults(obj, true)
        }
        ("apiextensions.k8s.io", "customresourcedefinitions") => {
            if let Some(spec) = m.get_mut("spec").and_then(Value::as_object_mut) {
                spec.entry("conversion")
                    .or_insert_with(|| json!({"strategy": "None"}));
            }
        }
        _ => {}
    }
}

/// core/v1's `SetDefaults_Service` (kube's `pkg/apis/core/v1/defaults.go`).
/// Go decodes an absent field, a JSON null and (for a plain string) "" alike,
/// so each counts as unset here. By type:
/// - every type, ExternalName included: `sessionAffinity` None (which also
///   drops `sessionAffinityConfig`; ClientIP without a timeout gets the
///   10800 s one), `type` ClusterIP, and per port `protocol` TCP and a
///   `targetPort` of 0 or "" made the port;
/// - externally reachable ones (`service.ExternallyAccessible` in
///   `pkg/api/v1/service/util.go`: LoadBalancer, NodePort, or ClusterIP with
///   `externalIPs`): `externalTrafficPolicy` Cluster;
/// - ClusterIP, NodePort and LoadBalancer only (not ExternalName):
///   `internalTrafficPolicy` Cluster;
/// - LoadBalancer: `allocateLoadBalancerNodePorts` true, and `ipMode` VIP on
///   every status ingress with an IP (the LoadBalancerIPMode gate is on by
///   default in 1.32).
fn service_defaults(m: &mut serde_json::Map<String, Value>) {
    fn unset(v: Option<&Value>) -> bool {
        v.is_none_or(|v| v.is_null() || v.as_str() == Some(""))
    }
    fn absent(v: Option<&Value>) -> bool {
        v.is_none_or(Value::is_null)
    }
    let spec = m.entry("spec").or_insert(Value::Null);
    if spec.is_null() {
        *spec = json!({});
    }
    let Some(spec) = spec.as_object_mut() else {
        return;
    };
    if unset(spec.get("sessionAffinity")) {
        spec.insert("sessionAffinity".into(), json!("None"));
    }
    match spec.get("sessionAffinity").and_then(Value::as_str) {
        Some("None") => {
            spec.remove("sessionAffinityConfig");
        }
        Some("ClientIP")
            if absent(
                spec.get("sessionAffinityConfig")
                    .and_then(|c| c.get("clientIP"))
                    .and_then(|c| c.get("timeoutSeconds")),
            ) =>
        {
            spec.insert(
                "sessionAffinityConfig".into(),
                json!({"clientIP": {"timeoutSeconds": 10800}}),
            );
        }
        _ => {}
    }
    if unset(spec.get("type")) {
        spec.insert("type".into(), json!("ClusterIP"));
    }
    if let Some(ports) = spec.get_mut("ports").and_then(Value::as_array_mut) {
        for p in ports.iter_mut().filter_map(Value::as_object_mut) {
            if unset(p.get("protocol")) {
                p.insert("protocol".into(), json!("TCP"));
            }
            let target = p.get("targetPort");
            if unset(target) || target.and_then(Value::as_i64) == Some(0) {
                let port = p.get("port").filter(|v| v.is_i64()).cloned();
                p.insert("targetPort".into(), port.unwrap_or(json!(0)));
            }
        }
    }
    let ty = spec
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let external_ips = spec
        .get("externalIPs")
        .and_then(Value::as_array)
        .is_some_and(|ips| !ips.is_empty());
    let externally_accessible =
        matches!(ty.as_str(), "LoadBalancer" | "NodePort") || (ty == "ClusterIP" && external_ips);
    if externally_accessible && unset(spec.get("externalTrafficPolicy")) {
        spec.insert("externalTrafficPolicy".into(), json!("Cluster"));
    }
    if matches!(ty.as_str(), "ClusterIP" | "NodePort" | "LoadBalancer")
        && absent(spec.get("internalTrafficPolicy"))
    {
        spec.insert("internalTrafficPolicy".into(), json!("Cluster"));
    }
    if ty != "LoadBalancer" {
        return;
    }
    if absent(spec.get("allocateLoadBalancerNodePorts")) {
        spec.insert("allocateLoadBalancerNodePorts".into(), json!(true));
    }
    let ingress = m
        .get_mut("status")
        .and_then(|s| s.get_mut("loadBalancer"))
        .and_then(|l| l.get_mut("ingress"))
        .and_then(Value::as_array_mut);
    for ing in ingress
        .into_iter()
        .flatten()
        .filter_map(Value::as_object_mut)
    {
        if !unset(ing.get("ip")) && absent(ing.get("ipMode")) {
            ing.insert("ipMode".into(), json!("VIP"));
        }
    }
}

/// What kube's registry strategies set on create (not owned by the writer).
pub fn prepare_for_create(info: &ResourceInfo, obj: &mut Value) {
    let Some(m) = obj.as_object_mut() else { return };
    match (info.group.as_str(), info.resource.as_str()) {
        ("", "namespaces") => {
            m.insert("spec".into(), json!({"finalizers": ["kubernetes"]}));
            m.insert("status".into(), json!({"phase": "Active"}));
        }
        ("apiextensions.k8s.io", "customresourcedefinitions") => {
            crate::crd::defaults_on_create(obj);
        }
        ("", "services") => allocate_cluster_ip(m),
        _ => {}
    }
}

/// What kube's update strategies keep from the stored object (a Service keeps
/// its allocated cluster IPs when an update leaves them out; a namespace its
/// spec.finalizers, which only /finalize changes: kube's
/// namespaceStrategy.PrepareForUpdate).
pub fn prepare_for_update(info: &ResourceInfo, current: &Value, new: &mut Value) {
    if info.group == "apiextensions.k8s.io" && info.resource == "customresourcedefinitions" {
        record_stored_version(new);
        return;
    }
    if info.is_namespace() {
        let stored = current.pointer("/spec/finalizers").cloned();
        o::set_namespace_finalizers(new, stored);
        return;
    }
    if !(info.group.is_empty() && info.resource == "services") {
        return;
    }
    let Some(spec) = new.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    for key in ["clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy"] {
        if spec.get(key).is_none() {
            if let Some(v) = current.get("spec").and_then(|s| s.get(key)) {
                spec.insert(key.into(), v.clone());
            }
        }
    }
}

/// A CRD's `status.storedVersions` gains its (new) storage version, as kube's
/// strategy records every version objects may have been stored in.
fn record_stored_version(crd: &mut Value) {
    let storage = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .and_then(|vs| {
            vs.iter()
                .find(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
        })
        .and_then(|v| v.get("name"))
        .cloned();
    let (Some(storage), Some(m)) = (storage, crd.as_object_mut()) else {
        return;
    };
    let status = m.entry("status").or_insert_with(|| json!({}));
    let Some(status) = status.as_object_mut() else {
        return;
    };
    let stored = status.entry("storedVersions").or_insert_with(|| json!([]));
    if let Some(a) = stored.as_array_mut() {
        if !a.contains(&storage) {
            a.push(storage);
        }
    }
}

/// Gives a Service a cluster IP from 10.96.0.0/16 (derived from its uid: unique
/// enough for a development cluster, which routes nothing to it), as kube's
/// allocator does for every type but ExternalName.
fn allocate_cluster_ip(m: &mut serde_json::Map<String, Value>) {
    let uid = m
        .get("metadata")
        .and_then(|x| x.get("uid"))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let Some(spec) = m.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    if spec.get("type") == Some(&json!("ExternalName")) {
        return;
    }
    let ip = match spec.get("clusterIP").and_then(Value::as_str) {
        Some(ip) if !ip.is_empty() => ip.to_string(),
        _ => {
            let h = uid
                .bytes()
                .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)));
            format!("10.96.{}.{}", (h >> 8) & 0xff, (h & 0xff).max(1))
        }
    };
    spec.insert("clusterIP".into(), json!(ip));
    spec.insert("clusterIPs".into(), json!([ip]));
    if ip != "None" {
        spec.insert("ipFamilies".into(), json!(["IPv4"]));
        spec.insert("ipFamilyPolicy".into(), json!("SingleStack"));
    }
}

/// Validates (and prunes) an object about to be stored. Returns warnings.
pub fn validate(
    ctx: &ReqCtx,
    obj: &mut Value,
    _old: Option<&Value>,
) -> Result<Vec<String>, ApiError> {
    let info = &ctx.info;
    let name = crate::store::meta_str(obj, "name").to_string();
    let meta_causes = metadata_causes(obj);
    if !meta_causes.is_empty() {
        return Err(ApiError::invalid(
            &info.group,
            &info.kind,
            &name,
            meta_causes,
        ));
    }
    let mut warnings = Vec::new();
    if let Some(schema) = info
        .version(&ctx.version)
        .and_then(|v| v.structural.clone())
    {
        let unknown = schema.prune(obj);
        if !unknown.is_empty() {
            match ctx.q("fieldValidation").unwrap_or("Warn") {
                "Strict" => {
                    return Err(ApiError::from_status(
                        &crate::schema::strict_decoding_error(&info.kind, &ctx.version, &unknown),
                    ))
                }
                "Ignore" => {}
                _ => warnings.extend(unknown.iter().map(|f| format!("unknown field {f:?}"))),
            }
        }
        schema.apply_defaults(obj);
        let mut causes = schema.validate(obj);
        if let Some(scale) = info.scale(&ctx.version) {
            let checked = if ctx.subresource == "status" {
                super::scale::Checked::StatusOnly
            } else {
                super::scale::Checked::SpecAndStatus
            };
            causes.extend(super::scale::custom_resource_causes(obj, scale, checked));
        }
        if !causes.is_empty() {
            return Err(ApiError::from_status(&crate::schema::invalid_status(
                &info.kind,
                &info.group,
                &name,
                &causes,
            )));
        }
    }
    let mut causes = Vec::new();
    match (info.group.as_str(), info.resource.as_str()) {
        ("coordination.k8s.io", "leases") => {
            if let Some(d) = obj
                .get("spec")
                .and_then(|s| s.get("leaseDurationSeconds"))
                .and_then(Value::as_i64)
            {
                if d <= 0 {
                    causes.push(Cause::new(
                        "FieldValueInvalid",
                        format!("Invalid value: {d}: must be greater than 0"),
                        "spec.leaseDurationSeconds",
                    ));
                }
            }
        }
        ("apiextensions.k8s.io", "customresourcedefinitions") => {
            causes.extend(crate::crd::validate(obj));
        }
        ("apiregistration.k8s.io", "apiservices") => causes.extend(validate_apiservice(obj)),
        ("rbac.authorization.k8s.io", "rolebindings" | "clusterrolebindings") => {
            let kinds: &[&str] = if info.resource == "rolebindings" {
                &["Role", "ClusterRole"]
            } else {
                &["ClusterRole"]
            };
            let role_ref = obj.get("roleRef").cloned().unwrap_or_else(|| json!({}));
            let kind = role_ref.get("kind").and_then(Value::as_str).unwrap_or("");
            if !kinds.contains(&kind) {
                let supported: Vec<String> = kinds.iter().map(|k| format!("{k:?}")).collect();
                causes.push(Cause::new(
                    "FieldValueNotSupported",
                    format!(
                        "Unsupported value: {kind:?}: supported values: {}",
                        supported.join(", ")
                    ),
                    "roleRef.kind",
                ));
            }
            if role_ref
                .get("name")
                .and_then(Value::as_str)
                .is_none_or(str::is_empty)
            {
                causes.push(Cause::new(
                    "FieldValueRequired",
                    "Required value",
                    "roleRef.name",
                ));
            }
        }
        ("admissionregistration.k8s.io", "validatingadmissionpolicies") => {
            causes.extend(validate_admission_policy(obj));
        }
        ("admissionregistration.k8s.io", "validatingwebhookconfigurations") => {
            causes.extend(crate::webhook::validate_configuration(obj, false));
        }
        ("admissionregistration.k8s.io", "mutatingwebhookconfigurations") => {
            causes.extend(crate::webhook::validate_configuration(obj, true));
        }
        ("admissionregistration.k8s.io", "validatingadmissionpolicybindings") => {
            let spec = obj.get("spec").cloned().unwrap_or_else(|| json!({}));
            if spec
                .get("policyName")
                .and_then(Value::as_str)
                .is_none_or(str::is_empty)
            {
                causes.push(Cause::new(
                    "FieldValueRequired",
                    "Required value",
                    "spec.policyName",
                ));
            }
            if spec
                .get("validationActions")
                .and_then(Value::as_array)
                .is_none_or(Vec::is_empty)
            {
                causes.push(Cause::new(
                    "FieldValueRequired",
                    "Required value: at least one validation action is required",
                    "spec.validationActions",
                ));
            }
        }
        ("", "services") => {
            let spec = obj.get("spec").cloned().unwrap_or_else(|| json!({}));
            let ty = spec
                .get("type")
                .and_then(Value::as_str)
                .unwrap_or("ClusterIP");
            let headless = spec.get("clusterIP").and_then(Value::as_str) == Some("None");
            let no_ports = spec
                .get("ports")
                .and_then(Value::as_array)
                .is_none_or(Vec::is_empty);
            if ty == "ExternalName" {
                if spec
                    .get("externalName")
                    .and_then(Value::as_str)
                    .is_none_or(str::is_empty)
                {
                    causes.push(Cause::new(
                        "FieldValueRequired",
                        "Required value",
                        "spec.externalName",
                    ));
                }
            } else if no_ports && !headless {
                causes.push(Cause::new(
                    "FieldValueRequired",
                    "Required value",
                    "spec.ports",
                ));
            }
        }
        _ => {}
    }
    if !causes.is_empty() {
        return Err(ApiError::invalid(&info.group, &info.kind, &name, causes));
    }
    Ok(warnings)
}

/// kube's ObjectMeta checks on labels and annotations (every kind).
fn metadata_causes(obj: &Value) -> Vec<Cause> {
    use crproxy_core::selector::{label_value_errors, qualified_name_errors};
    let mut causes = Vec::new();
    let map = |key: &str| {
        obj.get("metadata")
            .and_then(|m| m.get(key))
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default()
    };
    let invalid = |field: &str, value: &str, msg: String| {
        Cause::new(
            "FieldValueInvalid",
            format!("Invalid value: {value:?}: {msg}"),
            field,
        )
    };
    for (k, v) in map("labels") {
        for e in qualified_name_errors(&k) {
            causes.push(invalid("metadata.labels", &k, e));
        }
        for e in label_value_errors(v.as_str().unwrap_or("")) {
            causes.push(invalid("metadata.labels", v.as_str().unwrap_or(""), e));
        }
    }
    for (k, _) in map("annotations") {
        for e in qualified_name_errors(&k.to_ascii_lowercase()) {
            causes.push(invalid("metadata.annotations", &k, e));
        }
    }
    causes
}

/// The parts of kube's ValidatingAdmissionPolicy validation a client trips most:
/// match constraints present, at least one validation or audit annotation, and
/// CEL expressions that compile.
fn validate_admission_policy(obj: &Value) -> Vec<Cause> {
    let spec = obj.get("spec").cloned().unwrap_or_else(|| json!({}));
    let mut causes = Vec::new();
    if spec.get("matchConstraints").is_none_or(Value::is_null) {
        causes.push(Cause::new(
            "FieldValueRequired",
            "Required value",
            "spec.matchConstraints",
        ));
    }
    let validations = spec
        .get("validations")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let audits = spec
        .get("auditAnnotations")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    if validations.is_empty() && audits == 0 {
        causes.push(Cause::new(
            "FieldValueRequired",
            "Required value: validations or auditAnnotations must contain at least one item",
            "spec.validations",
        ));
    }
    let mut check = |expr: Option<&str>, field: String| {
        let Some(expr) = expr else {
            causes.push(Cause::new("FieldValueRequired", "Required value", field));
            return;
        };
        if let Err(e) = cel::Program::compile(expr) {
            let detail = e.to_string().lines().next().unwrap_or("").to_string();
            causes.push(Cause::new(
                "FieldValueInvalid",
                format!("Invalid value: {expr:?}: compilation failed: {detail}"),
                field,
            ));
        }
    };
    for (i, v) in validations.iter().enumerate() {
        check(
            v.get("expression").and_then(Value::as_str),
            format!("spec.validations[{i}].expression"),
        );
    }
    for (i, c) in spec
        .get("matchConditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        check(
            c.get("expression").and_then(Value::as_str),
            format!("spec.matchConditions[{i}].expression"),
        );
    }
    causes
}

/// kube-aggregator's APIService validation (the checks a client can trip).
fn validate_apiservice(obj: &Value) -> Vec<Cause> {
    let spec = obj.get("spec").cloned().unwrap_or_else(|| json!({}));
    let text = |k: &str| {
        spec.get(k)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let (group, version) = (text("group"), text("version"));
    let mut causes = Vec::new();
    let name = crate::store::meta_str(obj, "name");
    let required = format!("{version}.{group}");
    if name != required {
        causes.push(Cause::new(
            "FieldValueInvalid",
            format!(
                "Invalid value: {name:?}: must be `spec.version+\".\"+spec.group`: {required:?}"
            ),
            "metadata.name",
        ));
    }
    if group.is_empty() && version != "v1" {
        causes.push(Cause::new(
            "FieldValueRequired",
            "Required value: only v1 may have an empty group and it better be legacy kube",
            "spec.group",
        ));
    }
    let int = |k: &str| spec.get(k).and_then(Value::as_i64).unwrap_or(0);
    for (field, max) in [("groupPriorityMinimum", 20000), ("versionPriority", 1000)] {
        let v = int(field);
        if v <= 0 || v > max {
            causes.push(Cause::new(
                "FieldValueInvalid",
                format!("Invalid value: {v}: must be positive and less than {max}"),
                format!("spec.{field}"),
            ));
        }
    }
    let insecure = spec.get("insecureSkipTLSVerify").and_then(Value::as_bool) == Some(true);
    let ca_len = text("caBundle").len();
    match spec.get("service").filter(|s| !s.is_null()) {
        None => {
            if ca_len > 0 {
                causes.push(Cause::new(
                    "FieldValueInvalid",
                    format!("Invalid value: \"{ca_len} bytes\": local APIServices may not have a caBundle"),
                    "spec.caBundle",
                ));
            }
            if insecure {
                causes.push(Cause::new(
                    "FieldValueInvalid",
                    "Invalid value: true: local APIServices may not have insecureSkipTLSVerify",
                    "spec.insecureSkipTLSVerify",
                ));
            }
        }
        Some(service) => {
            for key in ["namespace", "name"] {
                if service
                    .get(key)
                    .and_then(Value::as_str)
                    .is_none_or(str::is_empty)
                {
                    causes.push(Cause::new(
                        "FieldValueRequired",
                        "Required value",
                        format!("spec.service.{key}"),
                    ));
                }
            }
            if insecure && ca_len > 0 {
                causes.push(Cause::new(
                    "FieldValueInvalid",
                    "Invalid value: true: may not be true if caBundle is present",
                    "spec.insecureSkipTLSVerify",
                ));
            }
        }
    }
    causes
}

/// Runs ValidatingAdmissionPolicies (when any exist) for a write. Returns their
/// warnings, or the denial.
pub fn admit(
    snapshot: Option<&crate::admission::AdmissionSnapshot>,
    ctx: &ReqCtx,
    operation: &str,
    object: Option<&Value>,
    old: Option<&Value>,
) -> Result<Vec<String>, ApiError> {
    let Some(snapshot) = snapshot else {
        return Ok(Vec::new());
    };
    let req = crate::admission::AdmissionRequest {
        operation,
        attrs: &ctx.attrs,
        kind: (&ctx.info.group, &ctx.version, &ctx.info.kind),
        object,
        old_object: old,
    };
    crate::admission::validate(snapshot, &req).map_err(|s| ApiError::from_status(&s))
}

/// Records the writer in managedFields for an Update operation (apply requests
/// have their ownership computed by the apply itself).
pub fn managed_fields_update(ctx: &ReqCtx, old: Option<&Value>, new: &mut Value, sub: &str) {
    if super::http::content_type(&ctx.headers) == "application/apply-patch+yaml" {
        return;
    }
    let schema = schema_of(ctx);
    let manager = ctx.field_manager();
    let api_version = ctx.api_version();
    let now = super::objects::now();
    crate::patch::update_managed_fields_with(
        old,
        new,
        &crate::patch::UpdateOptions {
            manager: &manager,
            operation: "Update",
            api_version: &api_version,
            subresource: (!sub.is_empty()).then_some(sub),
            now: &now,
            schema: schema.as_deref(),
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deployment_s_replicas_default_to_one() {
        let registry = crate::registry::Registry::new();
        let deployments = registry.get("apps", "deployments").expect("deployments");
        let check = |mut deployment: Value, replicas: Value| {
            let sent = deployment.clone();
            scheme_defaults(&deployments, &mut deployment);
            assert_eq!(deployment["spec"]["replicas"], replicas, "{sent}");
        };
        check(json!({"metadata": {"name": "d"}}), json!(1));
        check(json!({"spec": null}), json!(1));
        check(
            json!({"spec": {"replicas": null, "paused": true}}),
            json!(1),
        );
        check(json!({"spec": {"replicas": 0}}), json!(0));
        check(json!({"spec": {"replicas": 3}}), json!(3));
    }

    #[test]
    fn services_are_defaulted_per_type_as_kube_defaults_them() {
        let registry = crate::registry::Registry::new();
        let services = registry.get("", "services").expect("services");
        let check = |mut service: Value, expected: Value| {
            let sent = service.clone();
            scheme_defaults(&services, &mut service);
            assert_eq!(service, expected, "{sent}");
        };
        // ExternalName: a session affinity, no traffic policy.
        check(
            json!({"spec": {"type": "ExternalName", "externalName": "example.com"}}),
            json!({"spec": {"type": "ExternalName", "externalName": "example.com",
                            "sessionAffinity": "None"}}),
        );
        // No type is ClusterIP; ports get a protocol and their port as target.
        check(
            json!({"spec": {"ports": [{"port": 80}, {"port": 81, "targetPort": "http"}]}}),
            json!({"spec": {"type": "ClusterIP", "sessionAffinity": "None",
                            "internalTrafficPolicy": "Cluster",
                            "ports": [{"port": 80, "protocol": "TCP", "targetPort": 80},
                                      {"port": 81, "protocol": "TCP", "targetPort": "http"}]}}),
        );
        // Null and "" are unset, as Go decodes them; a target port of 0 too.
        check(
            json!({"spec": null}),
            json!({"spec": {"type": "ClusterIP", "sessionAffinity": "None",
                            "internalTrafficPolicy": "Cluster"}}),
        );
        check(
            json!({"spec": {"type": "", "sessionAffinity": null, "internalTrafficPolicy": null,
                            "ports": [{"port": 80, "targetPort": 0, "protocol": ""},
                                      {"port": 81, "targetPort": ""}]}}),
            json!({"spec": {"type": "ClusterIP", "sessionAffinity": "None",
                            "internalTrafficPolicy": "Cluster",
                            "ports": [{"port": 80, "targetPort": 80, "protocol": "TCP"},
                                      {"port": 81, "targetPort": 81, "protocol": "TCP"}]}}),
        );
        // A ClusterIP with external IPs is reachable from outside.
        check(
            json!({"spec": {"type": "ClusterIP", "externalIPs": ["192.0.2.1"]}}),
            json!({"spec": {"type": "ClusterIP", "externalIPs": ["192.0.2.1"],
                            "sessionAffinity": "None", "externalTrafficPolicy": "Cluster",
                            "internalTrafficPolicy": "Cluster"}}),
        );
        check(
            json!({"spec": {"type": "NodePort", "internalTrafficPolicy": "Local"}}),
            json!({"spec": {"type": "NodePort", "sessionAffinity": "None",
                            "externalTrafficPolicy": "Cluster",
                            "internalTrafficPolicy": "Local"}}),
        );
        check(
            json!({"spec": {"type": "LoadBalancer", "externalTrafficPolicy": "Local"},
                   "status": {"loadBalancer": {"ingress": [
                       {"ip": "192.0.2.2"}, {"hostname": "lb.example.com"},
                       {"ip": "192.0.2.3", "ipMode": "Proxy"}]}}}),
            json!({"spec": {"type": "LoadBalancer", "sessionAffinity": "None",
                            "externalTrafficPolicy": "Local",
                            "internalTrafficPolicy": "Cluster",
                            "allocateLoadBalancerNodePorts": true},
                   "status": {"loadBalancer": {"ingress": [
                       {"ip": "192.0.2.2", "ipMode": "VIP"}, {"hostname": "lb.example.com"},
                       {"ip": "192.0.2.3", "ipMode": "Proxy"}]}}}),
        );
        // Session affinity: None drops a config; ClientIP gets a timeout.
        let timeout = |seconds: u32| json!({"clientIP": {"timeoutSeconds": seconds}});
        check(
            json!({"spec": {"type": "ExternalName", "sessionAffinityConfig": timeout(60)}}),
            json!({"spec": {"type": "ExternalName", "sessionAffinity": "None"}}),
        );
        check(
            json!({"spec": {"type": "ExternalName", "sessionAffinity": "ClientIP",
                            "sessionAffinityConfig": {"clientIP": {}}}}),
            json!({"spec": {"type": "ExternalName", "sessionAffinity": "ClientIP",
                            "sessionAffinityConfig": timeout(10800)}}),
        );
        check(
            json!({"spec": {"type": "ExternalName", "sessionAffinity": "ClientIP",
                            "sessionAffinityConfig": timeout(60)}}),
            json!({"spec": {"type": "ExternalName", "sessionAffinity": "ClientIP",
                            "sessionAffinityConfig": timeout(60)}}),
        );
    }

    #[test]
    fn a_new_storage_version_is_recorded_once() {
        let mut crd = json!({
            "spec": {"versions": [{"name": "v1", "storage": false}, {"name": "v2", "storage": true}]},
            "status": {"storedVersions": ["v1"]},
        });
        record_stored_version(&mut crd);
        record_stored_version(&mut crd);
        assert_eq!(crd["status"]["storedVersions"], json!(["v1", "v2"]));
    }

    #[test]
    fn apiservices_are_validated_like_kube_aggregator() {
        let good = json!({"metadata": {"name": "v1.example.com"}, "spec": {
            "group": "example.com", "version": "v1", "groupPriorityMinimum": 1000,
            "versionPriority": 15, "service": {"namespace": "kube-system", "name": "p"},
            "caBundle": "Zm9v"}});
        assert!(validate_apiservice(&good).is_empty());
        let bad = json!({"metadata": {"name": "v2.example.com"}, "spec": {
            "group": "example.com", "version": "v1", "groupPriorityMinimum": 0,
            "versionPriority": 15, "service": {"namespace": "kube-system"},
            "insecureSkipTLSVerify": true, "caBundle": "Zm9v"}});
        let fields: Vec<String> = validate_apiservice(&bad)
            .into_iter()
            .map(|c| c.field)
            .collect();
        assert_eq!(
            fields,
            vec![
                "metadata.name",
                "spec.groupPriorityMinimum",
                "spec.service.name",
                "spec.insecureSkipTLSVerify"
            ]
        );
    }

    #[test]
    fn admission_policies_need_constraints_and_compiling_expressions() {
        let good = json!({"spec": {"matchConstraints": {"resourceRules": []},
            "validations": [{"expression": "object.metadata.name != 'x'"}]}});
        assert!(validate_admission_policy(&good).is_empty());
        let bad = json!({"spec": {"validations": [{"expression": "object.("}]}});
        let fields: Vec<String> = validate_admission_policy(&bad)
            .into_iter()
            .map(|c| c.field)
            .collect();
        assert_eq!(
            fields,
            vec!["spec.matchConstraints", "spec.validations[0].expression"]
        );
    }

    #[test]
    fn labels_and_annotations_must_be_valid() {
        let ok = json!({"metadata": {"labels": {"app.kubernetes.io/name": "x", "empty": ""},
            "annotations": {"example.com/Note": "anything at all"}}});
        assert!(metadata_causes(&ok).is_empty());
        let bad = json!({"metadata": {"labels": {"bad key": "v", "k": "bad value!"}}});
        let causes = metadata_causes(&bad);
        assert_eq!(causes.len(), 2, "{causes:?}");
        assert!(causes.iter().all(|c| c.field == "metadata.labels"));
        assert!(
            causes[1]
                .message
                .starts_with("Invalid value: \"bad value!\": a valid label must be"),
            "{causes:?}"
        );
    }

    #[test]
    fn field_selectors_parse() {
        assert_eq!(
            parse_field_selector("metadata.name=x,metadata.namespace!=y").expect("ok"),
            vec![
                ("metadata.name".to_string(), true, "x".to_string()),
                ("metadata.namespace".to_string(), false, "y".to_string())
            ]
        );
        assert_eq!(
            parse_field_selector("metadata.name").expect_err("bad"),
            "invalid selector: 'metadata.name'; can't understand 'metadata.name'"
        );
    }
}
