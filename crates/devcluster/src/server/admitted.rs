//! Where the verbs call admission webhooks ([`crate::webhook`]): the snapshot of
//! configurations, how Services are reached (as the aggregator reaches them), and
//! the request options a webhook sees. Mutating webhooks run before the object is
//! validated, validating webhooks after every other check and before storing, as
//! kube orders admission.

use super::rest::ReqCtx;
use super::State;
use crate::error::ApiError;
use crate::webhook::{self, Call, ServiceResolver, WebhookSnapshot};
use serde_json::{json, Value};
use std::sync::Arc;

/// The webhook configurations in force for one request (`None`: there are none).
pub(crate) type Webhooks = Option<Arc<WebhookSnapshot>>;

pub(crate) fn webhooks(state: &State) -> Webhooks {
    state.policy.webhooks(&state.store)
}

/// Reaches webhook Services through the aggregator's Service resolution.
struct Resolver<'a>(&'a State);

impl ServiceResolver for Resolver<'_> {
    fn service_address(&self, ns: &str, name: &str, port: u16) -> Result<(String, u16), String> {
        let aggregator = self
            .0
            .aggregator
            .get()
            .ok_or_else(|| "service resolution is not available yet".to_string())?;
        aggregator
            .service_address(ns, name, port)
            .map_err(|e| e.to_string())
    }
}

/// The `options` of the AdmissionReview: the request's Create/Update/Delete options.
fn options(ctx: &ReqCtx, operation: &str) -> Value {
    let kind = match operation {
        "CREATE" => "CreateOptions",
        "UPDATE" if ctx.attrs.verb == "patch" => "PatchOptions",
        "UPDATE" => "UpdateOptions",
        "DELETE" => "DeleteOptions",
        _ => return Value::Null,
    };
    let mut options = json!({"kind": kind, "apiVersion": "meta.k8s.io/v1"});
    if ctx.dry_run() {
        options["dryRun"] = json!(["All"]);
    }
    if operation != "DELETE" {
        options["fieldManager"] = json!(ctx.field_manager());
    }
    if operation == "DELETE" {
        if let Some(p) = ctx.q("propagationPolicy").filter(|p| !p.is_empty()) {
            options["propagationPolicy"] = json!(p);
        }
    }
    options
}

/// The request's attributes; a create names the object it creates (kube takes
/// the name from the body when the URL has none), and each delete of a
/// deletecollection names the object it deletes.
fn attributes(ctx: &ReqCtx, object: Option<&Value>) -> crate::types::RequestAttributes {
    let mut attrs = ctx.attrs.clone();
    if attrs.name.is_empty() {
        if let Some(name) = object.and_then(|o| o["metadata"]["name"].as_str()) {
            attrs.name = name.to_string();
        }
    }
    attrs
}

/// The kind webhooks see: the resource's, or autoscaling/v1 Scale for `/scale`.
fn kind_of(ctx: &ReqCtx) -> (&str, Option<(&'static str, &'static str)>) {
    if ctx.subresource == "scale" {
        ("Scale", Some(("autoscaling", "v1")))
    } else {
        (&ctx.info.kind, None)
    }
}

fn served_versions(ctx: &ReqCtx) -> Vec<String> {
    ctx.info.versions.iter().map(|v| v.name.clone()).collect()
}

/// The error for a rejection, carrying the webhooks' warnings as kube does.
fn rejected(rejection: webhook::Rejection) -> ApiError {
    let mut error = ApiError::from_status(&rejection.status);
    for warning in &rejection.warnings {
        let escaped = warning.replace('\\', "\\\\").replace('"', "\\\"");
        error = error.header("Warning", &format!("299 - \"{escaped}\""));
    }
    error
}

/// Runs the mutating webhooks on `object` (None for DELETE).
pub(crate) async fn mutate(
    state: &State,
    hooks: &Webhooks,
    ctx: &ReqCtx,
    operation: &str,
    object: &mut Option<Value>,
    old: Option<&Value>,
) -> Result<Vec<String>, ApiError> {
    let Some(snapshot) = hooks.as_deref() else {
        return Ok(Vec::new());
    };
    if snapshot.mutating.is_empty() {
        return Ok(Vec::new());
    }
    let options = options(ctx, operation);
    let versions = served_versions(ctx);
    let attrs = attributes(ctx, object.as_ref().or(old));
    let call = Call {
        operation,
        attrs: &attrs,
        kind: kind_of(ctx).0,
        kind_group_version: kind_of(ctx).1,
        served_versions: &versions,
        object: None,
        old_object: old,
        dry_run: ctx.dry_run(),
        options: &options,
    };
    webhook::mutate(snapshot, &call, object, &Resolver(state))
        .await
        .map_err(rejected)
}

/// Runs the validating webhooks for the final object (None for DELETE).
pub(crate) async fn validate(
    state: &State,
    hooks: &Webhooks,
    ctx: &ReqCtx,
    operation: &str,
    object: Option<&Value>,
    old: Option<&Value>,
) -> Result<Vec<String>, ApiError> {
    let Some(snapshot) = hooks.as_deref() else {
        return Ok(Vec::new());
    };
    if snapshot.validating.is_empty() {
        return Ok(Vec::new());
    }
    let options = options(ctx, operation);
    let versions = served_versions(ctx);
    let attrs = attributes(ctx, object.or(old));
    let call = Call {
        operation,
        attrs: &attrs,
        kind: kind_of(ctx).0,
        kind_group_version: kind_of(ctx).1,
        served_versions: &versions,
        object,
        old_object: old,
        dry_run: ctx.dry_run(),
        options: &options,
    };
    webhook::validate(snapshot, &call, &Resolver(state))
        .await
        .map_err(rejected)
}
