//! The verbs of a stored resource: get, list, create, update, patch, delete,
//! deletecollection, and the status and scale subresources.

use super::admitted;
use super::http::{self as h, Body, Output};
use super::objects::{self as o, metadata_mut};
use super::output;
use super::scale;
use super::seams;
use super::State;
use crate::error::{qualified, ApiError, Cause, Details};
use crate::registry::{GroupResource, ResourceInfo, ScaleSpec};
use crate::store::{meta_str, Mutation, Written};
use crate::types::UserInfo;
use base64::Engine;
use bytes::Bytes;
use http::{HeaderMap, Response};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::Arc;

/// One resource request, parsed.
#[derive(Clone)]
pub struct ReqCtx {
    pub info: Arc<ResourceInfo>,
    pub version: String,
    pub namespace: String,
    pub name: String,
    pub subresource: String,
    pub query: HashMap<String, String>,
    pub output: Output,
    pub user: UserInfo,
    /// The authorized request attributes (admission needs them).
    pub attrs: crate::types::RequestAttributes,
    pub headers: HeaderMap,
}

impl ReqCtx {
    pub fn gr(&self) -> GroupResource {
        (self.info.group.clone(), self.info.resource.clone())
    }

    pub fn api_version(&self) -> String {
        self.info.api_version(&self.version)
    }

    pub fn storage_api_version(&self) -> String {
        self.info.api_version(self.info.storage_version())
    }

    pub fn dry_run(&self) -> bool {
        self.query.get("dryRun").is_some_and(|v| v == "All")
    }

    /// `includeObject` of Table requests (kube's default: metadata only). Any
    /// other value is kube's 400, which it gives only when it turns what it read
    /// into the Table: after a read has found the object, or a list its items.
    pub fn include_object(&self) -> Result<crate::table::IncludeObject, ApiError> {
        let value = self.q("includeObject").unwrap_or("");
        crate::table::IncludeObject::parse(value).ok_or_else(|| {
            ApiError::bad_request(format!(
                "Unable to convert to Table as requested: includeObject: Invalid value: {}: \
                 must be 'Metadata', 'Object', 'None', or empty",
                crproxy_core::go_text::quoted(value)
            ))
        })
    }

    pub fn q(&self, key: &str) -> Option<&str> {
        self.query.get(key).map(String::as_str)
    }

    /// The store namespace key ("" for cluster-scoped resources).
    pub fn ns(&self) -> &str {
        if self.info.namespaced {
            &self.namespace
        } else {
            ""
        }
    }

    /// `fieldManager`, or the program name of the User-Agent, as kube defaults it.
    pub fn field_manager(&self) -> String {
        if let Some(m) = self.q("fieldManager").filter(|m| !m.is_empty()) {
            return m.to_string();
        }
        let ua = self
            .headers
            .get(http::header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        crate::patch::manager_from_user_agent(ua)
    }

    pub fn warnings(&self) -> Vec<String> {
        self.info
            .version(&self.version)
            .and_then(|v| v.deprecation_warning.clone())
            .into_iter()
            .collect()
    }

    fn not_found(&self) -> ApiError {
        ApiError::not_found(&self.info.group, &self.info.resource, &self.name)
    }
}

type Resp = Result<Response<Body>, ApiError>;

fn respond(ctx: &ReqCtx, status: u16, obj: &Value, extra_warnings: &[String]) -> Response<Body> {
    let mut resp = match ctx.output {
        Output::Table => match ctx.include_object() {
            Ok(include) => {
                let table = output::table(
                    &ctx.info,
                    &ctx.version,
                    &[Arc::new(obj.clone())],
                    json!({"resourceVersion": meta_str(obj, "resourceVersion")}),
                    include,
                );
                h::object_response(status, &table, ctx.output)
            }
            Err(e) => h::error_response(&e),
        },
        // kube reads a custom resource as an unstructured object, which passes
        // for a list until its items are looked for, after the read.
        Output::PartialObjectMetadataList if ctx.info.is_crd() => {
            h::error_response(&ApiError::new(500, "", "content is not a list"))
        }
        // A built-in object is typed: not a list, which kube says before anything.
        Output::PartialObjectMetadataList => h::error_response(&not_a_list(&ctx.info.go_type())),
        Output::PartialObjectMetadata => {
            h::object_response(status, &output::partial(obj), ctx.output)
        }
        // Already in the requested version: the stored object as it is.
        _ if obj.get("apiVersion").and_then(Value::as_str) == Some(&ctx.api_version()) => {
            h::object_response(status, obj, ctx.output)
        }
        _ => h::object_response(
            status,
            &output::convert(obj, &ctx.api_version()),
            ctx.output,
        ),
    };
    // kube writes the warnings it has recorded on every answer, a failed one too.
    let mut warnings = ctx.warnings();
    warnings.extend_from_slice(extra_warnings);
    h::add_warnings(&mut resp, &warnings);
    resp
}

/// kube's 406 for a one-object media type (`as=PartialObjectMetadata`) asked of
/// a list; `go_type` is the list's Go type.
fn a_list(go_type: &str) -> ApiError {
    ApiError::new(
        406,
        "NotAcceptable",
        format!(
            "you requested PartialObjectMetadata, but the requested object is a list ({go_type})"
        ),
    )
}

/// kube's 406 for a list media type (`as=PartialObjectMetadataList`) asked of
/// one object; `go_type` is the object's Go type.
fn not_a_list(go_type: &str) -> ApiError {
    ApiError::new(
        406,
        "NotAcceptable",
        format!(
            "you requested PartialObjectMetadataList, but the requested object is not a list ({go_type})"
        ),
    )
}

/// Parses `resourceVersion` as kube does (500 without a reason when malformed).
pub fn parse_rv(v: Option<&str>) -> Result<Option<u64>, ApiError> {
    match v {
        None | Some("") => Ok(None),
        Some(s) => s.parse::<u64>().map(Some).map_err(|_| {
            ApiError::new(
                500,
                "",
                format!("resourceVersion: Invalid value: {s:?}: strconv.ParseUint: parsing {s:?}: invalid syntax"),
            )
        }),
    }
}

// ---------- get ----------

pub fn get(state: &State, ctx: &ReqCtx) -> Resp {
    parse_rv(ctx.q("resourceVersion"))?;
    let obj = state
        .store
        .get(&ctx.gr(), ctx.ns(), &ctx.name)
        .ok_or_else(|| ctx.not_found())?;
    match ctx.subresource.as_str() {
        "" | "status" => Ok(respond(ctx, 200, &obj, &[])),
        "scale" => Ok(respond_scale(ctx, &scale_of(ctx, &obj)?)),
        _ => Err(ApiError::resource_not_found()),
    }
}

// ---------- list ----------

/// Label and field selectors of a list or watch.
pub struct Selectors {
    pub label: seams::LabelSelector,
    pub fields: Vec<(String, bool, String)>,
}

impl Selectors {
    pub fn parse(ctx: &ReqCtx) -> Result<Self, ApiError> {
        let label = seams::parse_label_selector(ctx.q("labelSelector").unwrap_or(""))
            .map_err(ApiError::bad_request)?;
        let mut fields = Vec::new();
        for req in seams::parse_field_selector(ctx.q("fieldSelector").unwrap_or(""))
            .map_err(ApiError::bad_request)?
        {
            let (field, eq, value) = req;
            if field != "metadata.name" && field != "metadata.namespace" {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {field}"
                )));
            }
            fields.push((field, eq, value));
        }
        Ok(Selectors { label, fields })
    }

    pub fn is_empty(&self) -> bool {
        self.label.is_empty() && self.fields.is_empty()
    }

    pub fn matches(&self, obj: &Value) -> bool {
        if !self.label.matches_json(crate::store::labels(obj)) {
            return false;
        }
        self.fields.iter().all(|(field, eq, value)| {
            let actual = match field.as_str() {
                "metadata.name" => meta_str(obj, "name"),
                _ => meta_str(obj, "namespace"),
            };
            (actual == value) == *eq
        })
    }
}

fn encode_continue(rv: u64, start: &str) -> String {
    let token = json!({"v": "meta.k8s.io/v1", "rv": rv, "start": start});
    base64::engine::general_purpose::STANDARD.encode(token.to_string())
}

fn decode_continue(token: &str) -> Result<(u64, String), ApiError> {
    let bad = || {
        ApiError::bad_request("continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)")
    };
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(token)
        .or_else(|_| base64::engine::general_purpose::URL_SAFE.decode(token))
        .map_err(|_| bad())?;
    let v: Value = serde_json::from_slice(&bytes).map_err(|_| bad())?;
    let rv = v.get("rv").and_then(Value::as_u64).ok_or_else(bad)?;
    let start = v
        .get("start")
        .and_then(Value::as_str)
        .ok_or_else(bad)?
        .to_string();
    Ok((rv, start))
}

/// kube's 422 for a list option its ListOptions validation forbids.
fn forbidden_list_option(field: &str, message: &str) -> ApiError {
    ApiError::invalid(
        "meta.k8s.io",
        "ListOptions",
        "",
        vec![Cause::new(
            "FieldValueForbidden",
            format!("Forbidden: {message}"),
            field,
        )],
    )
}

/// Validates `resourceVersion`/`resourceVersionMatch` of a list and waits (up to
/// 3 s, as kube) for a future resourceVersion.
pub async fn check_list_rv(state: &State, ctx: &ReqCtx) -> Result<(), ApiError> {
    let rv = parse_rv(ctx.q("resourceVersion"))?;
    let matching = ctx.q("resourceVersionMatch").unwrap_or("");
    if !matching.is_empty() && rv.is_none() {
        return Err(forbidden_list_option(
            "resourceVersionMatch",
            "resourceVersionMatch is forbidden unless resourceVersion is provided",
        ));
    }
    // kube's ListOptions validation: initial events belong to a watch.
    if ctx.q("sendInitialEvents").is_some() {
        return Err(forbidden_list_option(
            "sendInitialEvents",
            "sendInitialEvents is forbidden for list",
        ));
    }
    let Some(rv) = rv else { return Ok(()) };
    if matching == "Exact" && rv < state.store.current_rv() {
        return Err(ApiError::new(
            410,
            "Expired",
            "The resourceVersion for the provided list is too old.",
        ));
    }
    if rv > state.store.current_rv() {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(3);
        let mut rx = state.store.subscribe();
        while state.store.current_rv() < rv {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Ok(_)) | Ok(Err(tokio::sync::broadcast::error::RecvError::Lagged(_))) => {}
                _ => break,
            }
        }
        let current = state.store.current_rv();
        if current < rv {
            return Err(too_large_rv(rv, current));
        }
    }
    Ok(())
}

pub fn too_large_rv(rv: u64, current: u64) -> ApiError {
    let mut e = ApiError::new(
        504,
        "Timeout",
        format!("Timeout: Too large resource version: {rv}, current: {current}"),
    )
    .header("Retry-After", "1");
    let mut details = Details {
        causes: vec![Cause::new(
            "ResourceVersionTooLarge",
            "Too large resource version",
            "",
        )],
        ..Default::default()
    }
    .to_map();
    details.insert("retryAfterSeconds".into(), json!(1));
    e.details = Some(details);
    e
}

pub async fn list(state: &State, ctx: &ReqCtx) -> Resp {
    let selectors = Selectors::parse(ctx)?;
    check_list_rv(state, ctx).await?;
    let ns = if ctx.info.namespaced && !ctx.namespace.is_empty() {
        Some(ctx.namespace.as_str())
    } else {
        None
    };
    let (all, mut rv) = state.store.list(&ctx.gr(), ns);
    let mut start_key: Option<String> = None;
    if let Some(token) = ctx.q("continue").filter(|t| !t.is_empty()) {
        let (token_rv, start) = decode_continue(token)?;
        rv = token_rv;
        start_key = Some(start);
    }
    let key_of = |o: &Value| -> String {
        if ns.is_some() || !ctx.info.namespaced {
            meta_str(o, "name").to_string()
        } else {
            format!("{}/{}", meta_str(o, "namespace"), meta_str(o, "name"))
        }
    };
    let limit: usize = ctx
        .q("limit")
        .and_then(|l| l.parse::<usize>().ok())
        .unwrap_or(0);
    let mut items: Vec<Arc<Value>> = Vec::new();
    let mut cont = String::new();
    let mut remaining = None;
    let mut iter = all
        .iter()
        .filter(|o| match &start_key {
            // The token's start is the last key plus NUL: the first key after it.
            Some(start) => key_of(o).as_str() >= start.as_str(),
            None => true,
        })
        .filter(|o| selectors.matches(o));
    for obj in iter.by_ref() {
        items.push(obj.clone());
        if limit > 0 && items.len() >= limit {
            break;
        }
    }
    if limit > 0 && items.len() >= limit {
        let rest = iter.count();
        if rest > 0 {
            if let Some(last) = items.last() {
                cont = encode_continue(rv, &format!("{}\u{0}", key_of(last)));
            }
            if selectors.is_empty() {
                remaining = Some(rest);
            }
        }
    }
    let mut meta = output::list_metadata(rv, &cont, remaining);
    // Typed (built-in) lists omit an empty continue; unstructured CR lists send "".
    if cont.is_empty() && !ctx.info.is_crd() {
        if let Some(m) = meta.as_object_mut() {
            m.remove("continue");
        }
    }
    let mut resp = match ctx.output {
        Output::Table => {
            let mut tm = serde_json::Map::new();
            if !cont.is_empty() {
                tm.insert("continue".into(), json!(cont));
            }
            if let Some(r) = remaining {
                tm.insert("remainingItemCount".into(), json!(r));
            }
            tm.insert("resourceVersion".into(), json!(rv.to_string()));
            let t = output::table(
                &ctx.info,
                &ctx.version,
                &items,
                Value::Object(tm),
                ctx.include_object()?,
            );
            h::json_response(200, &t)
        }
        // kube turns what it read into the asked-for kind only after the read.
        Output::PartialObjectMetadata => h::error_response(&a_list(&ctx.info.go_list_type())),
        Output::PartialObjectMetadataList => {
            let mut meta = meta;
            if cont.is_empty() {
                if let Some(m) = meta.as_object_mut() {
                    m.remove("continue");
                }
            }
            h::json_response(200, &output::partial_list(&items, meta))
        }
        Output::Yaml => h::object_response(
            200,
            &output::list_value(&ctx.api_version(), &ctx.info.list_kind, &items, meta),
            Output::Yaml,
        ),
        _ => {
            let bytes = output::list_bytes(&ctx.api_version(), &ctx.info.list_kind, &items, &meta);
            let mut r = Response::new(h::full(Bytes::from(bytes)));
            r.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/json"),
            );
            r
        }
    };
    h::add_warnings(&mut resp, &ctx.warnings());
    Ok(resp)
}

// ---------- create ----------

/// Checks apiVersion/kind of a body against the resource.
fn check_type(
    ctx: &ReqCtx,
    obj: &mut Value,
    kind: &str,
    api_version: &str,
) -> Result<(), ApiError> {
    let Some(m) = obj.as_object_mut() else {
        return Err(ApiError::bad_request(format!(
            "the object provided is unrecognized (must be of type {kind})"
        )));
    };
    match m.get("apiVersion").and_then(Value::as_str) {
        Some(v) if v != api_version => {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({v}) does not match the expected API version ({api_version})"
            )))
        }
        Some(_) => {}
        None => {
            m.insert("apiVersion".into(), json!(api_version));
        }
    }
    match m.get("kind").and_then(Value::as_str) {
        Some(k) if k != kind => {
            return Err(ApiError::bad_request(format!(
                "the kind in the data ({k}) does not match the expected kind ({kind})"
            )))
        }
        Some(_) => {}
        None => {
            m.insert("kind".into(), json!(kind));
        }
    }
    let _ = ctx;
    Ok(())
}

/// The namespace of a new namespaced object must exist and not be terminating.
pub fn check_namespace(state: &State, ctx: &ReqCtx, name: &str) -> Result<(), ApiError> {
    if !ctx.info.namespaced {
        return Ok(());
    }
    let ns_gr = (String::new(), "namespaces".to_string());
    let Some(ns) = state.store.get(&ns_gr, "", &ctx.namespace) else {
        return Err(ApiError::not_found("", "namespaces", &ctx.namespace));
    };
    if o::is_deleting(&ns) {
        return Err(ApiError::from_status(
            &crproxy_core::status::namespace_terminating(
                &ctx.info.resource,
                &ctx.info.group,
                name,
                &ctx.namespace,
            ),
        ));
    }
    Ok(())
}

fn decode(ctx: &ReqCtx, body: &[u8]) -> Result<Value, ApiError> {
    let format = h::body_format(&ctx.headers)?;
    h::decode_body(body, format, &ctx.info.kind)
}

/// Fills in everything a new object gets from the server, runs the mutating
/// webhooks, validates it, and returns it with the warnings to send.
pub async fn prepare_create(
    state: &State,
    ctx: &ReqCtx,
    obj: Value,
    url_name: Option<&str>,
    hooks: &admitted::Webhooks,
) -> Result<(Value, Vec<String>), ApiError> {
    let mut object = Some(new_object(ctx, obj, url_name)?);
    let mut warnings = admitted::mutate(state, hooks, ctx, "CREATE", &mut object, None).await?;
    let mut obj =
        object.ok_or_else(|| ApiError::internal("a mutating webhook removed the object"))?;
    warnings.extend(seams::validate(ctx, &mut obj, None)?);
    seams::managed_fields_update(ctx, None, &mut obj, "");
    seams::prepare_for_create(&ctx.info, &mut obj);
    Ok((obj, warnings))
}

/// The new object with everything the server fills in before admission.
fn new_object(ctx: &ReqCtx, mut obj: Value, url_name: Option<&str>) -> Result<Value, ApiError> {
    let info = &ctx.info;
    check_type(ctx, &mut obj, &info.kind, &ctx.api_version())?;
    let storage_av = ctx.storage_api_version();
    if let Some(m) = obj.as_object_mut() {
        m.insert("apiVersion".into(), json!(storage_av));
    }
    let Some(meta) = metadata_mut(&mut obj) else {
        return Err(ApiError::bad_request("metadata must be an object"));
    };
    if info.namespaced {
        match meta.get("namespace").and_then(Value::as_str) {
            Some(ns) if !ns.is_empty() && ns != ctx.namespace => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ))
            }
            _ => {
                meta.insert("namespace".into(), json!(ctx.namespace));
            }
        }
    } else {
        meta.remove("namespace");
    }
    let mut name = meta
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    if let Some(url) = url_name {
        if name.is_empty() {
            name = url.to_string();
        } else if name != url {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({name}) does not match the name on the URL ({url})"
            )));
        }
    }
    if name.is_empty() {
        if let Some(prefix) = meta
            .get("generateName")
            .and_then(Value::as_str)
            .filter(|p| !p.is_empty())
        {
            name = o::generate_name(prefix);
        }
    }
    if name.is_empty() {
        return Err(ApiError::invalid(
            &info.group,
            &info.kind,
            "",
            vec![Cause::new(
                "FieldValueRequired",
                "Required value: name or generateName is required",
                "metadata.name",
            )],
        ));
    }
    let errs = o::name_errors(info, &name);
    if !errs.is_empty() {
        let causes = errs
            .into_iter()
            .map(|e| {
                Cause::new(
                    "FieldValueInvalid",
                    format!("Invalid value: {name:?}: {e}"),
                    "metadata.name",
                )
            })
            .collect();
        return Err(ApiError::invalid(&info.group, &info.kind, &name, causes));
    }
    meta.insert("name".into(), json!(name));
    meta.insert("uid".into(), json!(o::new_uid()));
    meta.insert("creationTimestamp".into(), json!(o::now()));
    meta.remove("resourceVersion");
    meta.remove("deletionTimestamp");
    meta.remove("deletionGracePeriodSeconds");
    meta.remove("selfLink");
    if info.has_generation || info.is_crd() {
        meta.insert("generation".into(), json!(1));
    } else {
        meta.remove("generation");
    }
    if info.is_crd() && info.has_status(&ctx.version) {
        if let Some(m) = obj.as_object_mut() {
            m.remove("status");
        }
    }
    // kube's order: scheme defaults, mutating admission, validation, field
    // manager, then the strategy's own changes (which managedFields therefore do
    // not claim).
    seams::scheme_defaults(info, &mut obj);
    Ok(obj)
}

pub async fn create(state: &Arc<State>, ctx: &ReqCtx, body: &[u8], url_name: Option<&str>) -> Resp {
    let mut obj = decode(ctx, body)?;
    seams::decode_metadata(ctx, &mut obj)?;
    let hooks = admitted::webhooks(state);
    // kube's admission names a create by its name, else its generateName (the
    // name is generated later), else "Unknown".
    let admitted_name = [
        url_name.unwrap_or_default(),
        meta_str(&obj, "name"),
        meta_str(&obj, "generateName"),
    ]
    .into_iter()
    .find(|name| !name.is_empty())
    .unwrap_or("Unknown")
    .to_string();
    if hooks.is_some() {
        // kube's namespace lifecycle check runs before the webhooks: a create in a
        // missing or terminating namespace never reaches them.
        check_namespace(state, ctx, &admitted_name)?;
    }
    // Read before the create's own fields replace it; refused only where kube's
    // storage refuses it, after admission.
    let body_version = meta_str(&obj, "resourceVersion").to_string();
    let (obj, mut warnings) = prepare_create(state, ctx, obj, url_name, &hooks).await?;
    let adm = state.policy.admission(&state.store);
    warnings.extend(seams::admit(
        adm.as_deref(),
        ctx,
        "CREATE",
        Some(&obj),
        None,
    )?);
    check_namespace(state, ctx, &admitted_name)?;
    warnings.extend(admitted::validate(state, &hooks, ctx, "CREATE", Some(&obj), None).await?);
    if !ctx.dry_run() {
        refuse_resource_version_on_create(&body_version)?;
    }
    let written = insert_new(state, ctx, obj)?;
    super::hooks::after_write(state, ctx, &written);
    let mut obj = (*written.object).clone();
    if ctx.dry_run() {
        if let Some(m) = metadata_mut(&mut obj) {
            m.remove("resourceVersion");
        }
    }
    Ok(respond(ctx, 201, &obj, &warnings))
}

/// kube's storage refuses to create an object whose body carries a resourceVersion
/// it reads as a positive number, after admission and before it looks for an
/// existing object. The error is not a Status in kube's code, so the caller gets a
/// 500 with no reason. A dry run never reaches that check, and a value that is not
/// a number (or is 0) is dropped silently.
fn refuse_resource_version_on_create(body_version: &str) -> Result<(), ApiError> {
    // Go's ParseUint takes digits only; Rust's parse also takes a leading `+`.
    let digits = !body_version.is_empty() && body_version.bytes().all(|b| b.is_ascii_digit());
    match body_version.parse::<u64>() {
        Ok(version) if digits && version != 0 => Err(ApiError::new(
            500,
            "",
            "resourceVersion should not be set on objects to be created",
        )),
        _ => Ok(()),
    }
}

fn insert_new(state: &State, ctx: &ReqCtx, obj: Value) -> Result<Written, ApiError> {
    let name = meta_str(&obj, "name").to_string();
    let info = &ctx.info;
    state
        .store
        .mutate(&ctx.gr(), ctx.ns(), &name, ctx.dry_run(), |cur| {
            if cur.is_some() {
                return Err(ApiError::already_exists(&info.group, &info.resource, &name));
            }
            Ok(Mutation::Put(obj))
        })
}

// ---------- update ----------

/// Where kube-apiserver (etcd prefix `/registry`) stores an object: a custom
/// resource under its group and plural, a built-in under its plural, but for
/// the few built-ins kube stores under older names.
fn storage_key(info: &ResourceInfo, namespace: &str, name: &str) -> String {
    let prefix = if info.is_crd() {
        format!("{}/{}", info.group, info.resource)
    } else {
        match (info.group.as_str(), info.resource.as_str()) {
            ("", "replicationcontrollers") => "controllers".to_string(),
            ("", "services") => "services/specs".to_string(),
            ("", "endpoints") => "services/endpoints".to_string(),
            ("", "nodes") => "minions".to_string(),
            ("networking.k8s.io", "ingresses") => "ingress".to_string(),
            (_, resource) => resource.to_string(),
        }
    };
    match namespace {
        "" => format!("/registry/{prefix}/{name}"),
        namespace => format!("/registry/{prefix}/{namespace}/{name}"),
    }
}

/// kube's answer to a uid precondition the stored object does not meet: its
/// storage checks the precondition and the registry wraps the storage error,
/// which carries the object's etcd key, as a 409.
fn uid_precondition_failed(ctx: &ReqCtx, uid: &str, current_uid: &str) -> ApiError {
    let why = format!(
        "StorageError: invalid object, Code: 4, Key: {}, ResourceVersion: 0, AdditionalErrorMsg: Precondition failed: UID in precondition: {uid}, UID in object meta: {current_uid}",
        storage_key(&ctx.info, &ctx.namespace, &ctx.name),
    );
    ApiError::conflict(&ctx.info.group, &ctx.info.resource, &ctx.name, &why)
}

/// Finishes an update of `current` into `new` under the store lock: conflicts,
/// server-owned fields, generation, finalizer completion, validation.
fn commit_update(
    ctx: &ReqCtx,
    current: &Arc<Value>,
    mut new: Value,
    subresource: &str,
    require_rv: bool,
    adm: Option<&crate::admission::AdmissionSnapshot>,
) -> Result<(Mutation, Vec<String>), ApiError> {
    let info = &ctx.info;
    // kube-apiserver reads a uid in a PUT body as a precondition (409), checked
    // before anything else; a patch that changes the uid fails validation (422)
    // after the resourceVersion check. Either way the uid never changes.
    let body_uid = meta_str(&new, "uid").to_string();
    let current_uid = meta_str(current, "uid");
    let uid_changes = !body_uid.is_empty() && body_uid != current_uid;
    if uid_changes && require_rv {
        return Err(uid_precondition_failed(ctx, &body_uid, current_uid));
    }
    let body_rv = meta_str(&new, "resourceVersion").to_string();
    if body_rv.is_empty() {
        if require_rv && !info.unconditional_update {
            return Err(ApiError::invalid(
                &info.group,
                &info.resource,
                &ctx.name,
                vec![Cause::new(
                    "FieldValueInvalid",
                    "Invalid value: 0x0: must be specified for an update",
                    "metadata.resourceVersion",
                )],
            ));
        }
    } else if body_rv != meta_str(current, "resourceVersion") {
        return Err(ApiError::conflict_modified(
            &info.group,
            &info.resource,
            &ctx.name,
        ));
    }
    if uid_changes {
        return Err(ApiError::invalid(
            &info.group,
            &info.kind,
            &ctx.name,
            vec![Cause::new(
                "FieldValueInvalid",
                format!("Invalid value: {body_uid:?}: field is immutable"),
                "metadata.uid",
            )],
        ));
    }
    if let Some(m) = new.as_object_mut() {
        m.insert("apiVersion".into(), json!(ctx.storage_api_version()));
        m.insert("kind".into(), json!(info.kind));
    }
    match subresource {
        "status" => {
            // Only status changes through /status. The request's metadata stays
            // until managedFields are computed (kube credits label edits sent to
            // /status to the status manager although it drops them).
            let status = new.get("status").cloned();
            let request_meta = new.get("metadata").cloned();
            let mut merged = (**current).clone();
            if let Some(m) = merged.as_object_mut() {
                match status {
                    Some(s) => m.insert("status".into(), s),
                    None => m.remove("status"),
                };
                if let Some(meta) = request_meta {
                    m.insert("metadata".into(), meta);
                }
            }
            new = merged;
        }
        _ if info.has_status(&ctx.version) => {
            // The main resource ignores status changes (in a version with a
            // status subresource; in one without, status is written with the rest).
            if let Some(m) = new.as_object_mut() {
                match current.get("status") {
                    Some(s) => m.insert("status".into(), s.clone()),
                    None => m.remove("status"),
                };
            }
        }
        _ => {}
    }
    o::prepare_update(info, &ctx.version, current, &mut new)?;
    seams::prepare_for_update(info, current, &mut new);
    let mut warnings = seams::validate(ctx, &mut new, Some(current))?;
    warnings.extend(seams::admit(adm, ctx, "UPDATE", Some(&new), Some(current))?);
    seams::managed_fields_update(ctx, Some(current), &mut new, subresource);
    if subresource == "status" {
        // Everything in metadata but the new ownership comes from the stored object.
        let managed = new.pointer("/metadata/managedFields").cloned();
        let mut meta = current
            .get("metadata")
            .cloned()
            .unwrap_or_else(|| json!({}));
        if let (Some(mf), Some(m)) = (managed, meta.as_object_mut()) {
            m.insert("managedFields".into(), mf);
        }
        if let Some(m) = new.as_object_mut() {
            m.insert("metadata".into(), meta);
        }
    }
    // An object being deleted goes once an update leaves it no finalizers.
    if o::may_go(&new, info.is_namespace()) {
        return Ok((Mutation::DeleteFinal(new), warnings));
    }
    if o::same_object(current, &new) {
        return Ok((Mutation::Unchanged(current.clone()), warnings));
    }
    Ok((Mutation::Put(new), warnings))
}

/// How often an update admitted by webhooks is recomputed when the object
/// changed while the webhooks were called.
const ADMITTED_UPDATE_ATTEMPTS: usize = 5;

/// Updates the object to what `build` makes of the current one, through
/// mutating webhooks, [`commit_update`] and validating webhooks. Webhooks are
/// called outside the store lock, so the result is stored only if nobody wrote
/// the object meanwhile (else everything is recomputed, as kube retries).
async fn update_admitted(
    state: &Arc<State>,
    ctx: &ReqCtx,
    require_rv: bool,
    build: impl Fn(&Arc<Value>) -> Result<Value, ApiError>,
) -> Result<(Written, Vec<String>), ApiError> {
    let sub = ctx.subresource.clone();
    let adm = state.policy.admission(&state.store);
    let hooks = admitted::webhooks(state);
    // kube defaults what an update sends, or a patch makes, as it decodes it:
    // before the webhooks see it.
    let build = |cur: &Arc<Value>| {
        let mut new = build(cur)?;
        seams::scheme_defaults(&ctx.info, &mut new);
        Ok::<_, ApiError>(new)
    };
    if hooks.is_none() {
        let mut warnings = Vec::new();
        let written = state.store.mutate_optimistic(
            &ctx.gr(),
            ctx.ns(),
            &ctx.name,
            ctx.dry_run(),
            |cur| {
                let Some(cur) = cur else {
                    return Err(ctx.not_found());
                };
                let (m, w) =
                    commit_update(ctx, cur, build(cur)?, &sub, require_rv, adm.as_deref())?;
                warnings = w;
                Ok(m)
            },
        )?;
        return Ok((written, warnings));
    }
    for _ in 0..ADMITTED_UPDATE_ATTEMPTS {
        let current = state
            .store
            .get(&ctx.gr(), ctx.ns(), &ctx.name)
            .ok_or_else(|| ctx.not_found())?;
        let mut object = Some(build(&current)?);
        let mut warnings =
            admitted::mutate(state, &hooks, ctx, "UPDATE", &mut object, Some(&current)).await?;
        let new =
            object.ok_or_else(|| ApiError::internal("a mutating webhook removed the object"))?;
        let (decision, w) = commit_update(ctx, &current, new, &sub, require_rv, adm.as_deref())?;
        warnings.extend(w);
        let admitted_object = match &decision {
            Mutation::Put(o) | Mutation::DeleteFinal(o) => Some(o),
            Mutation::Unchanged(o) => Some(&**o),
            Mutation::Delete => None,
        };
        warnings.extend(
            admitted::validate(
                state,
                &hooks,
                ctx,
                "UPDATE",
                admitted_object,
                Some(&current),
            )
            .await?,
        );
        let stored = state.store.mutate_if_unchanged(
            &ctx.gr(),
            ctx.ns(),
            &ctx.name,
            ctx.dry_run(),
            &current,
            decision,
        );
        if let Some(written) = stored {
            return Ok((written, warnings));
        }
    }
    Err(ApiError::conflict_modified(
        &ctx.info.group,
        &ctx.info.resource,
        &ctx.name,
    ))
}

pub async fn update(state: &Arc<State>, ctx: &ReqCtx, body: &[u8]) -> Resp {
    let mut obj = decode(ctx, body)?;
    if ctx.subresource == "scale" {
        check_type(ctx, &mut obj, "Scale", "autoscaling/v1")?;
        hold_scale_to_request(ctx, &mut obj)?;
        return update_scale(state, ctx, ScaleChange::Replace(obj)).await;
    }
    seams::decode_metadata(ctx, &mut obj)?;
    check_type(ctx, &mut obj, &ctx.info.kind, &ctx.api_version())?;
    if !matches!(ctx.subresource.as_str(), "" | "status" | "finalize") {
        return Err(ApiError::resource_not_found());
    }
    check_name(ctx, &obj)?;
    let body_ns = meta_str(&obj, "namespace");
    if ctx.info.namespaced && !body_ns.is_empty() && body_ns != ctx.namespace {
        return Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    if ctx.subresource == "finalize" {
        return super::hooks::finalize_namespace(state, ctx, obj);
    }
    let (written, warnings) = update_admitted(state, ctx, true, |_| Ok(obj.clone())).await?;
    super::hooks::after_write(state, ctx, &written);
    Ok(respond(ctx, 200, &written.object, &warnings))
}

// ---------- patch ----------

pub async fn patch(state: &Arc<State>, ctx: &ReqCtx, body: &[u8]) -> Resp {
    let ct = h::content_type(&ctx.headers);
    let kind = seams::PatchKind::from_content_type(&ct, ctx.info.is_crd())?;
    if kind == seams::PatchKind::Apply && ctx.q("fieldManager").is_none_or(str::is_empty) {
        return Err(ApiError::invalid(
            "meta.k8s.io",
            "PatchOptions",
            "",
            vec![Cause::new(
                "FieldValueRequired",
                "Required value: is required for apply patch",
                "fieldManager",
            )],
        ));
    }
    if ctx.subresource == "scale" {
        return update_scale(state, ctx, ScaleChange::Patch(kind, body.to_vec())).await;
    }
    if !matches!(ctx.subresource.as_str(), "" | "status") {
        return Err(ApiError::resource_not_found());
    }
    // Apply to a missing object creates it.
    if kind == seams::PatchKind::Apply
        && state.store.get(&ctx.gr(), ctx.ns(), &ctx.name).is_none()
        && ctx.subresource.is_empty()
    {
        let mut applied = seams::server_side_apply(ctx, None, body)?;
        // kube checks the configuration's kind and version before the uid.
        check_type(ctx, &mut applied, &ctx.info.kind, &ctx.api_version())?;
        seams::refuse_uid_without_object(ctx, &applied)?;
        let hooks = admitted::webhooks(state);
        let (obj, mut warnings) =
            prepare_create(state, ctx, applied, Some(&ctx.name), &hooks).await?;
        let adm = state.policy.admission(&state.store);
        warnings.extend(seams::admit(
            adm.as_deref(),
            ctx,
            "CREATE",
            Some(&obj),
            None,
        )?);
        check_namespace(state, ctx, &ctx.name)?;
        warnings.extend(admitted::validate(state, &hooks, ctx, "CREATE", Some(&obj), None).await?);
        match insert_new(state, ctx, obj) {
            Ok(written) => {
                super::hooks::after_write(state, ctx, &written);
                return Ok(respond(ctx, 201, &written.object, &warnings));
            }
            // Lost a race with another creator: patch the winner instead.
            Err(e) if e.code == 409 => {}
            Err(e) => return Err(e),
        }
    }
    let (written, warnings) = update_admitted(state, ctx, false, |cur| {
        let as_requested = output::convert(cur, &ctx.api_version());
        let mut patched = seams::apply_patch(ctx, kind, &as_requested, body)?;
        // As kube's patcher checks what the patch made.
        check_name(ctx, &patched)?;
        // A patch that does not mention resourceVersion is unconditional.
        if meta_str(&patched, "resourceVersion").is_empty() {
            if let Some(m) = metadata_mut(&mut patched) {
                m.insert(
                    "resourceVersion".into(),
                    json!(meta_str(cur, "resourceVersion")),
                );
            }
        }
        Ok(patched)
    })
    .await?;
    super::hooks::after_write(state, ctx, &written);
    Ok(respond(ctx, 200, &written.object, &warnings))
}

// ---------- scale ----------

enum ScaleChange {
    Replace(Value),
    Patch(seams::PatchKind, Vec<u8>),
}

/// The Scale of `obj` as kube's registry makes it (`scaleFromCustomResource`,
/// `scaleFromDeployment`), and whether `obj` has spec replicas. A field of the
/// wrong type is the accessor's error, and a built-in's selector kube cannot
/// read is `LabelSelectorAsSelector`'s. kube's handlers answer the accessor's
/// as 500 `Unknown`; the selector's is `unreadable_selector`'s answer (a
/// write's is `Unknown` too, a GET's a 400: [`scale_of`]).
fn scale_from(
    ctx: &ReqCtx,
    obj: &Value,
    unreadable_selector: fn(String) -> ApiError,
) -> Result<(Value, bool), ApiError> {
    let Some(spec) = ctx.info.scale(&ctx.version) else {
        return Err(ApiError::resource_not_found());
    };
    let meta = obj.get("metadata").cloned().unwrap_or_else(|| json!({}));
    let pick = |k: &str| meta.get(k).cloned();
    let mut m = serde_json::Map::new();
    for k in [
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "creationTimestamp",
    ] {
        if let Some(v) = pick(k) {
            m.insert(k.into(), v);
        }
    }
    let spec_replicas =
        scale::nested_int64(obj, &spec.spec_replicas_path).map_err(ApiError::unknown)?;
    let status_replicas =
        scale::nested_int64(obj, &spec.status_replicas_path).map_err(ApiError::unknown)?;
    let selector = if !ctx.info.is_crd() {
        Some(scale::builtin_selector(obj).map_err(unreadable_selector)?)
    } else {
        match spec.label_selector_path.as_deref() {
            Some(path) if !path.is_empty() => {
                scale::nested_string(obj, path).map_err(ApiError::unknown)?
            }
            _ => None,
        }
    };
    // A built-in's replicas are always set (defaulted); only a custom
    // resource can lack them.
    let found = spec_replicas.is_some() || !ctx.info.is_crd();
    // kube puts the int64s in the Scale's int32 fields as Go converts them:
    // wrapped, not refused.
    let mut status = serde_json::Map::new();
    status.insert(
        "replicas".into(),
        json!(status_replicas.unwrap_or_default() as i32),
    );
    if let Some(sel) = selector.filter(|s| !s.is_empty()) {
        status.insert("selector".into(), json!(sel));
    }
    // autoscaling/v1's ScaleSpec.replicas is `omitempty` (ScaleStatus's is not).
    let mut scale_spec = serde_json::Map::new();
    let replicas = spec_replicas.unwrap_or_default() as i32;
    if replicas != 0 {
        scale_spec.insert("replicas".into(), json!(replicas));
    }
    let scale = json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": m,
        "spec": scale_spec,
        "status": status,
    });
    Ok((scale, found))
}

/// The Scale a GET answers: kube's `ScaleREST.Get` refuses a custom resource
/// without spec replicas with an internal error, and a built-in whose selector
/// it cannot read with a 400 (kube's validation keeps such a selector out of
/// storage; devcluster does not check a Deployment's spec).
fn scale_of(ctx: &ReqCtx, obj: &Value) -> Result<Value, ApiError> {
    let (scale, found) = scale_from(ctx, obj, ApiError::bad_request)?;
    if !found {
        return Err(ApiError::internal_error(&format!(
            "the spec replicas field {} does not exist",
            quoted_spec_replicas_path(ctx)
        )));
    }
    Ok(scale)
}

/// A Scale answered (200) as the request asked for it. kube's handlers turn the
/// Scale into a Table or PartialObjectMetadata as they turn any object: with the
/// scale columns (a custom resource's scale scope has its own table convertor;
/// a built-in's printer has one for Scale), and a list media type is a 406
/// naming the Scale's Go type.
fn respond_scale(ctx: &ReqCtx, scale: &Value) -> Response<Body> {
    match ctx.output {
        Output::Table => match ctx.include_object() {
            Ok(include) => h::json_response(200, &output::scale_table(&ctx.info, scale, include)),
            Err(e) => h::error_response(&e),
        },
        Output::PartialObjectMetadata => h::json_response(200, &output::partial(scale)),
        Output::PartialObjectMetadataList => {
            // A custom resource's Scale is autoscaling/v1's; a built-in's the internal one.
            let go_type = if ctx.info.is_crd() {
                "*v1.Scale"
            } else {
                "*autoscaling.Scale"
            };
            h::error_response(&not_a_list(go_type))
        }
        _ => h::object_response(200, scale, ctx.output),
    }
}

/// The Scale the change asks for: the one sent, or the patch applied to `scale`
/// (and then held to the request, as kube's patcher does after patching).
fn requested_scale(ctx: &ReqCtx, change: &ScaleChange, scale: &Value) -> Result<Value, ApiError> {
    match change {
        ScaleChange::Replace(v) => Ok(v.clone()),
        ScaleChange::Patch(kind, body) => {
            let mut patched = seams::apply_patch(ctx, *kind, scale, body)?;
            hold_scale_to_request(ctx, &mut patched)?;
            Ok(patched)
        }
    }
}

/// kube's handlers hold the Scale a PUT sends, or a patch makes, to the
/// request before the registry sees it: `EnsureObjectNamespaceMatchesRequestNamespace`
/// gives it the request's namespace when it has none (and takes a cluster-scoped
/// one's away), then `checkName` refuses another namespace or name with a 400.
fn hold_scale_to_request(ctx: &ReqCtx, scale: &mut Value) -> Result<(), ApiError> {
    let namespace = meta_str(scale, "namespace").to_string();
    if !ctx.info.namespaced {
        if let Some(meta) = scale.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.remove("namespace");
        }
    } else if namespace.is_empty() {
        if let Some(meta) = metadata_mut(scale) {
            meta.insert("namespace".into(), json!(ctx.namespace));
        }
    } else if namespace != ctx.namespace {
        return Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    check_name(ctx, scale)
}

/// kube's `checkName` of what a PUT sends or a patch makes: the object must
/// name itself, and by the URL's name.
fn check_name(ctx: &ReqCtx, obj: &Value) -> Result<(), ApiError> {
    let name = meta_str(obj, "name");
    if name.is_empty() {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({} based on URL) was undeterminable: name must be provided",
            ctx.name
        )));
    }
    if name != ctx.name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({name}) does not match the name on the URL ({})",
            ctx.name
        )));
    }
    Ok(())
}

/// The smallest int32: how kube's `scaleUpdatedObjectInfo` marks the Scale a
/// write starts from when the custom resource has no spec replicas.
const UNSET_REPLICAS: i32 = i32::MIN;

/// The Scale a write to `/scale` starts from (a patch applies to it), and the
/// one kube's validation compares with (spec replicas absent read as 0).
fn scale_for_write(ctx: &ReqCtx, current: &Value) -> Result<(Value, Value), ApiError> {
    let (scale, found) = scale_from(ctx, current, ApiError::unknown)?;
    let mut start = scale.clone();
    if !found {
        if let Some(spec) = start.get_mut("spec").and_then(Value::as_object_mut) {
            spec.insert("replicas".into(), json!(UNSET_REPLICAS));
        }
    }
    Ok((start, scale))
}

/// kube refuses a write that leaves the mark of absent spec replicas: the
/// custom resource would still have none.
fn refuse_unset_replicas(ctx: &ReqCtx, new_scale: &Value) -> Result<(), ApiError> {
    let replicas = new_scale.pointer("/spec/replicas").and_then(Value::as_i64);
    if replicas != Some(i64::from(UNSET_REPLICAS)) {
        return Ok(());
    }
    Err(ApiError::bad_request(format!(
        "the spec replicas field {} cannot be empty",
        quoted_spec_replicas_path(ctx)
    )))
}

/// The custom resource's spec replicas path as kube's messages quote it.
fn quoted_spec_replicas_path(ctx: &ReqCtx) -> String {
    let path = ctx
        .info
        .scale(&ctx.version)
        .map(|s| s.spec_replicas_path.as_str())
        .unwrap_or_default();
    crate::schema::go_quote(path)
}

/// What kube refuses of the Scale a write asks for, in kube's order: replicas
/// left unset, a built-in Scale's validation, a stale resourceVersion.
fn check_new_scale(ctx: &ReqCtx, current: &Value, new_scale: &Value) -> Result<(), ApiError> {
    refuse_unset_replicas(ctx, new_scale)?;
    validate_builtin_scale(ctx, new_scale)?;
    check_scale_version(ctx, current, new_scale)
}

/// kube's registry for a built-in's Scale validates the changed Scale
/// (`ValidateScale`: its metadata, replicas of at least 0) before writing, so
/// a refusal is the Scale's 422 rather than the object's. A custom resource's
/// replicas are checked with the object (`ValidateScaleSpec`, in
/// [`seams::validate`]).
fn validate_builtin_scale(ctx: &ReqCtx, new_scale: &Value) -> Result<(), ApiError> {
    if ctx.info.is_crd() {
        return Ok(());
    }
    let causes = scale::builtin_scale_causes(new_scale);
    if causes.is_empty() {
        return Ok(());
    }
    Err(ApiError::from_status(&crate::schema::invalid_status(
        "Scale",
        "autoscaling",
        &ctx.name,
        &causes,
    )))
}

/// A resourceVersion in the changed Scale, sent or patched in, is a
/// precondition on the stored object (kube sets it on the custom resource it
/// writes, so a stale one is the registry's 409).
fn check_scale_version(ctx: &ReqCtx, current: &Value, new_scale: &Value) -> Result<(), ApiError> {
    let rv = meta_str(new_scale, "resourceVersion");
    if !rv.is_empty() && rv != meta_str(current, "resourceVersion") {
        return Err(ApiError::conflict_modified(
            &ctx.info.group,
            &ctx.info.resource,
            &ctx.name,
        ));
    }
    Ok(())
}

/// A uid in a PUT's Scale is a precondition on the stored object: kube's
/// `scaleUpdatedObjectInfo.Preconditions` passes the request's on to storage
/// (a patch carries none), which checks it before the Scale is worked out, so
/// before any other refusal. The Scale itself never writes a uid.
fn check_scale_uid(ctx: &ReqCtx, change: &ScaleChange, current: &Value) -> Result<(), ApiError> {
    let ScaleChange::Replace(scale) = change else {
        return Ok(());
    };
    let (uid, current_uid) = (meta_str(scale, "uid"), meta_str(current, "uid"));
    if uid.is_empty() || uid == current_uid {
        return Ok(());
    }
    Err(uid_precondition_failed(ctx, uid, current_uid))
}

/// The stored object with the Scale's replicas written to it.
fn scaled(spec: &ScaleSpec, current: &Value, scale: &Value) -> Value {
    let replicas = scale
        .get("spec")
        .and_then(|s| s.get("replicas"))
        .cloned()
        .unwrap_or(json!(0));
    let mut new = current.clone();
    o::set_path(&mut new, &spec.spec_replicas_path, replicas);
    new
}

async fn update_scale(state: &Arc<State>, ctx: &ReqCtx, change: ScaleChange) -> Resp {
    let Some(spec) = ctx.info.scale(&ctx.version).cloned() else {
        return Err(ApiError::resource_not_found());
    };
    let adm = state.policy.admission(&state.store);
    let hooks = admitted::webhooks(state);
    if hooks.is_none() {
        let written = state.store.mutate_optimistic(
            &ctx.gr(),
            ctx.ns(),
            &ctx.name,
            ctx.dry_run(),
            |cur| {
                let Some(cur) = cur else {
                    return Err(ctx.not_found());
                };
                check_scale_uid(ctx, &change, cur)?;
                let (start, _) = scale_for_write(ctx, cur)?;
                let new_scale = requested_scale(ctx, &change, &start)?;
                check_new_scale(ctx, cur, &new_scale)?;
                let new = scaled(&spec, cur, &new_scale);
                let (m, _) = commit_update(ctx, cur, new, "scale", false, adm.as_deref())?;
                Ok(m)
            },
        )?;
        return Ok(respond_scale(
            ctx,
            &scale_from(ctx, &written.object, ApiError::unknown)?.0,
        ));
    }
    // Webhooks see the Scale (autoscaling/v1), as kube sends it for `<resource>/scale`.
    for _ in 0..ADMITTED_UPDATE_ATTEMPTS {
        let current = state
            .store
            .get(&ctx.gr(), ctx.ns(), &ctx.name)
            .ok_or_else(|| ctx.not_found())?;
        check_scale_uid(ctx, &change, &current)?;
        // Mutating webhooks see the Scale the write started from, validating
        // ones the stored object's (kube's toScaleUpdateValidation).
        let (start, old_scale) = scale_for_write(ctx, &current)?;
        let mut object = Some(requested_scale(ctx, &change, &start)?);
        let mut warnings =
            admitted::mutate(state, &hooks, ctx, "UPDATE", &mut object, Some(&start)).await?;
        let new_scale =
            object.ok_or_else(|| ApiError::internal("a mutating webhook removed the object"))?;
        check_new_scale(ctx, &current, &new_scale)?;
        let new = scaled(&spec, &current, &new_scale);
        let (decision, _) = commit_update(ctx, &current, new, "scale", false, adm.as_deref())?;
        warnings.extend(
            admitted::validate(
                state,
                &hooks,
                ctx,
                "UPDATE",
                Some(&new_scale),
                Some(&old_scale),
            )
            .await?,
        );
        let stored = state.store.mutate_if_unchanged(
            &ctx.gr(),
            ctx.ns(),
            &ctx.name,
            ctx.dry_run(),
            &current,
            decision,
        );
        if let Some(written) = stored {
            let mut resp =
                respond_scale(ctx, &scale_from(ctx, &written.object, ApiError::unknown)?.0);
            h::add_warnings(&mut resp, &warnings);
            return Ok(resp);
        }
    }
    Err(ApiError::conflict_modified(
        &ctx.info.group,
        &ctx.info.resource,
        &ctx.name,
    ))
}

// ---------- delete ----------

/// DeleteOptions as kube reads them: from the body, or from the query when the
/// body is empty (never both).
#[derive(Default)]
pub struct DeleteOptions {
    pub uid: Option<String>,
    pub rv: Option<String>,
    pub propagation: String,
    /// `dryRun: ["All"]`.
    pub dry_run: bool,
}

pub fn delete_options(ctx: &ReqCtx, body: &[u8]) -> Result<DeleteOptions, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        let orphan = ctx
            .q("orphanDependents")
            .is_some_and(crproxy_core::request::query_bool);
        let propagation = match orphan {
            true => "Orphan",
            false => ctx.q("propagationPolicy").unwrap_or(""),
        };
        let dry_run: Vec<&str> = ctx.q("dryRun").into_iter().collect();
        // kube reads a query's uid and resourceVersion as preconditions, unless
        // empty.
        let precondition = |name| {
            ctx.q(name)
                .filter(|value| !value.is_empty())
                .map(str::to_string)
        };
        return Ok(DeleteOptions {
            uid: precondition("uid"),
            rv: precondition("resourceVersion"),
            propagation: propagation.to_string(),
            dry_run: dry_run_of(&dry_run)?,
        });
    }
    let v = h::decode_body(body, h::body_format(&ctx.headers)?, "DeleteOptions")?;
    // kube decodes dryRun as a list of strings; anything else does not decode.
    let dry_run: Vec<&str> = match v.get("dryRun") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(values)) if values.iter().all(Value::is_string) => {
            values.iter().filter_map(Value::as_str).collect()
        }
        Some(other) => {
            return Err(ApiError::new(
                400,
                "BadRequest",
                format!("DeleteOptions.dryRun must be a list of strings, not {other}"),
            ))
        }
    };
    let mut opts = DeleteOptions {
        dry_run: dry_run_of(&dry_run)?,
        ..Default::default()
    };
    if let Some(p) = v.get("preconditions") {
        opts.uid = p.get("uid").and_then(Value::as_str).map(str::to_string);
        opts.rv = p
            .get("resourceVersion")
            .and_then(Value::as_str)
            .map(str::to_string);
    }
    if let Some(p) = v.get("propagationPolicy").and_then(Value::as_str) {
        opts.propagation = p.to_string();
    }
    if v.get("orphanDependents").and_then(Value::as_bool) == Some(true) {
        opts.propagation = "Orphan".into();
    }
    Ok(opts)
}

/// Whether `dryRun` asks for a dry run; kube's validation knows only `All`, and
/// refuses the whole list in one cause (Go's `%#v` of it) when another is there.
fn dry_run_of(values: &[&str]) -> Result<bool, ApiError> {
    if values.iter().any(|value| *value != "All") {
        let quoted: Vec<String> = values.iter().map(|value| format!("{value:?}")).collect();
        let cause = Cause::new(
            "FieldValueNotSupported",
            format!(
                "Unsupported value: []string{{{}}}: supported values: \"All\"",
                quoted.join(", ")
            ),
            "dryRun",
        );
        return Err(ApiError::invalid(
            "meta.k8s.io",
            "DeleteOptions",
            "",
            vec![cause],
        ));
    }
    Ok(!values.is_empty())
}

/// `ctx` as the delete's decoded options describe it: admission, the store and
/// what follows a deletion read the dry run and the propagation policy from the
/// request, and kube takes them from the body when there is one.
fn with_delete_options(ctx: &ReqCtx, opts: &DeleteOptions) -> ReqCtx {
    let mut ctx = ctx.clone();
    ctx.query.remove("dryRun");
    ctx.query.remove("propagationPolicy");
    if opts.dry_run {
        ctx.query.insert("dryRun".into(), "All".into());
    }
    if !opts.propagation.is_empty() {
        ctx.query
            .insert("propagationPolicy".into(), opts.propagation.clone());
    }
    ctx
}

/// Deletes one object (or marks it, when finalizers hold it). Returns the store
/// outcome.
pub fn delete_one(
    state: &State,
    ctx: &ReqCtx,
    name: &str,
    opts: &DeleteOptions,
) -> Result<Written, ApiError> {
    let info = &ctx.info;
    // kube's namespace lifecycle admission protects the system namespaces.
    if info.is_namespace() && matches!(name, "default" | "kube-system" | "kube-public") {
        return Err(ApiError::new(
            403,
            "Forbidden",
            format!("namespaces \"{name}\" is forbidden: this namespace may not be deleted"),
        )
        .with_details(Details {
            name,
            kind: "namespaces",
            ..Default::default()
        }));
    }
    let adm = state.policy.admission(&state.store);
    state
        .store
        .mutate_optimistic(&ctx.gr(), ctx.ns(), name, ctx.dry_run(), |cur| {
            let Some(cur) = cur else {
                return Err(ApiError::not_found(&info.group, &info.resource, name));
            };
            seams::admit(adm.as_deref(), ctx, "DELETE", None, Some(cur))?;
            let precondition = |what: &str, want: &str, have: &str, tail: &str| {
                ApiError::new(
                    409,
                    "Conflict",
                    format!(
                        "Operation cannot be fulfilled on {} \"{name}\": the {what} in the precondition ({want}) does not match the {what} in record ({have}). {tail}",
                        qualified(&info.kind, &info.group)
                    ),
                )
                .with_details(Details {
                    name,
                    group: &info.group,
                    kind: &info.kind,
                    ..Default::default()
                })
            };
            if let Some(uid) = &opts.uid {
                let have = meta_str(cur, "uid");
                if uid != have {
                    return Err(precondition(
                        "UID",
                        uid,
                        have,
                        "The object might have been deleted and then recreated",
                    ));
                }
            }
            if let Some(rv) = &opts.rv {
                let have = meta_str(cur, "resourceVersion");
                if rv != have {
                    return Err(precondition(
                        "ResourceVersion",
                        rv,
                        have,
                        "The object might have been modified",
                    ));
                }
            }
            let extra_finalizer = match opts.propagation.as_str() {
                "Foreground" => Some("foregroundDeletion"),
                "Orphan" => Some("orphan"),
                _ => None,
            };
            let namespace = info.is_namespace();
            if !namespace && !o::has_finalizers(cur) && extra_finalizer.is_none() {
                return Ok(Mutation::Delete);
            }
            if o::is_deleting(cur) {
                return Ok(Mutation::Unchanged(cur.clone()));
            }
            let mut new = (**cur).clone();
            if let Some(meta) = metadata_mut(&mut new) {
                meta.insert("deletionTimestamp".into(), json!(o::now()));
                meta.insert("deletionGracePeriodSeconds".into(), json!(0));
                if let Some(f) = extra_finalizer {
                    let list = meta
                        .entry("finalizers")
                        .or_insert_with(|| json!([]));
                    if let Some(a) = list.as_array_mut() {
                        if !a.iter().any(|v| v == f) {
                            a.push(json!(f));
                        }
                    }
                }
                if info.has_generation || info.is_crd() {
                    let g = meta.get("generation").and_then(Value::as_i64).unwrap_or(1);
                    meta.insert("generation".into(), json!(g + 1));
                }
            }
            if namespace {
                if let Some(meta) = metadata_mut(&mut new) {
                    meta.remove("deletionGracePeriodSeconds");
                }
                if let Some(m) = new.as_object_mut() {
                    m.insert("status".into(), json!({"phase": "Terminating"}));
                }
            }
            Ok(Mutation::Put(new))
        })
}

/// Calls the webhooks for deleting `name` (the stored object is `oldObject`).
async fn admit_delete(
    state: &Arc<State>,
    ctx: &ReqCtx,
    hooks: &admitted::Webhooks,
    name: &str,
) -> Result<Vec<String>, ApiError> {
    if hooks.is_none() {
        return Ok(Vec::new());
    }
    let Some(current) = state.store.get(&ctx.gr(), ctx.ns(), name) else {
        return Err(ApiError::not_found(
            &ctx.info.group,
            &ctx.info.resource,
            name,
        ));
    };
    let mut none = None;
    let mut warnings =
        admitted::mutate(state, hooks, ctx, "DELETE", &mut none, Some(&current)).await?;
    warnings.extend(admitted::validate(state, hooks, ctx, "DELETE", None, Some(&current)).await?);
    Ok(warnings)
}

pub async fn delete(state: &Arc<State>, ctx: &ReqCtx, body: &[u8]) -> Resp {
    if !ctx.subresource.is_empty() {
        return Err(ApiError::method_not_allowed());
    }
    let opts = delete_options(ctx, body)?;
    let ctx = &with_delete_options(ctx, &opts);
    let hooks = admitted::webhooks(state);
    let warnings = admit_delete(state, ctx, &hooks, &ctx.name).await?;
    let written = delete_one(state, ctx, &ctx.name, &opts)?;
    super::hooks::after_write(state, ctx, &written);
    if written.deleted {
        let uid = meta_str(&written.object, "uid");
        let status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": Details {
                name: &ctx.name,
                group: &ctx.info.group,
                kind: &ctx.info.resource,
                uid,
                ..Default::default()
            }.to_map(),
        });
        let mut resp = h::json_response(200, &status);
        let mut all = ctx.warnings();
        all.extend(warnings);
        h::add_warnings(&mut resp, &all);
        return Ok(resp);
    }
    Ok(respond(ctx, 200, &written.object, &warnings))
}

pub async fn delete_collection(state: &Arc<State>, ctx: &ReqCtx, body: &[u8]) -> Resp {
    let selectors = Selectors::parse(ctx)?;
    let opts = delete_options(ctx, body)?;
    let ctx = &with_delete_options(ctx, &opts);
    let ns = if ctx.info.namespaced && !ctx.namespace.is_empty() {
        Some(ctx.namespace.as_str())
    } else {
        None
    };
    // The answer carries the resourceVersion of the list the deletions started from.
    let (items, rv) = state.store.list(&ctx.gr(), ns);
    let hooks = admitted::webhooks(state);
    let mut out = Vec::new();
    for obj in items.iter().filter(|o| selectors.matches(o)) {
        let name = meta_str(obj, "name").to_string();
        let sub = ReqCtx {
            namespace: meta_str(obj, "namespace").to_string(),
            name: name.clone(),
            subresource: String::new(),
            ..ctx.clone()
        };
        match admit_delete(state, &sub, &hooks, &name).await {
            Ok(_) => {}
            Err(e) if e.code == 404 => continue,
            Err(e) => return Err(e),
        }
        match delete_one(state, &sub, &name, &opts) {
            Ok(w) => {
                super::hooks::after_write(state, &sub, &w);
                out.push(Arc::new((**obj).clone()));
            }
            Err(e) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    let body = output::list_value(
        &ctx.api_version(),
        &ctx.info.list_kind,
        &out,
        output::list_metadata(rv, "", None),
    );
    Ok(h::object_response(200, &body, Output::Json))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::Registry;

    #[test]
    fn storage_keys_are_kubes_etcd_keys() {
        let registry = Registry::new();
        let key = |group: &str, resource: &str, namespace: &str| {
            let info = registry.get(group, resource).expect("a built-in");
            storage_key(&info, namespace, "a")
        };
        assert_eq!(key("", "configmaps", "demo"), "/registry/configmaps/demo/a");
        assert_eq!(
            key("", "services", "demo"),
            "/registry/services/specs/demo/a"
        );
        assert_eq!(
            key("", "endpoints", "demo"),
            "/registry/services/endpoints/demo/a"
        );
        assert_eq!(
            key("apps", "deployments", "demo"),
            "/registry/deployments/demo/a"
        );
        assert_eq!(key("", "namespaces", ""), "/registry/namespaces/a");
    }
}
