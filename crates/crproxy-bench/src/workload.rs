//! The requests of each scenario, as [`Workload`]s for the closed-loop driver.
//!
//! Every path works on the same kind of object (a small `Widget` of the
//! `example.com/v1` resource the dev environment proxies), each in its own
//! namespace or name range so paths never see each other's writes. Bodies sent
//! directly or through nginx carry ownership labels themselves (another client's,
//! see `bench::elsewhere`), so the target stores objects of the same shape
//! whichever path wrote them; through crproxy they carry none and the proxy
//! stamps its client's, as it would for a real caller.

use bytes::Bytes;
use http::{Method, Request};
use serde_json::{json, Value};

use crproxy_core::ownership::{OWNER_PROJECT_LABEL, OWNER_VCLUSTER_LABEL};

use crate::driver::{Body, DriverError, Endpoint, Exchange, Workload};

pub const GROUP: &str = "example.com";
pub const VERSION: &str = "v1";
pub const PLURAL: &str = "widgets";
const JSON: &str = "application/json";
const MERGE_PATCH: &str = "application/merge-patch+json";

/// The client the objects belong to, as the dev environment names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    pub name: String,
    pub project: String,
}

/// `/apis/example.com/v1/namespaces/<ns>/widgets`.
pub fn collection_path(namespace: &str) -> String {
    format!("/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}")
}

/// `/apis/example.com/v1/namespaces/<ns>/widgets/<name>`.
pub fn object_path(namespace: &str, name: &str) -> String {
    format!("{}/{name}", collection_path(namespace))
}

/// A small Widget. `owner` stamps the ownership labels; `resource_version` makes it
/// an update body.
pub fn widget(
    namespace: &str,
    name: &str,
    n: usize,
    owner: Option<&Owner>,
    resource_version: Option<&str>,
) -> Value {
    let mut metadata = json!({"name": name, "namespace": namespace});
    if let Some(owner) = owner {
        metadata["labels"] = json!({
            OWNER_VCLUSTER_LABEL: owner.name,
            OWNER_PROJECT_LABEL: owner.project,
        });
    }
    if let Some(rv) = resource_version {
        metadata["resourceVersion"] = json!(rv);
    }
    json!({
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "kind": "Widget",
        "metadata": metadata,
        "spec": {"size": 3, "color": "blue", "n": n},
    })
}

fn body(value: &Value) -> Option<(&'static str, Bytes)> {
    Some((JSON, Bytes::from(value.to_string())))
}

/// GET of one path (an object or a list), again and again; the body is read to
/// its end and dropped.
pub struct ReadPath {
    pub path: String,
    /// For lists: an answer smaller than this many bytes is an error (the size
    /// stands for the number of objects, as the body is not kept).
    pub min_bytes: u64,
}

impl Workload for ReadPath {
    type State = ();
    fn request(
        &self,
        endpoint: &Endpoint,
        _: usize,
        _: usize,
        _: &mut (),
    ) -> Result<Request<Body>, DriverError> {
        endpoint.request(Method::GET, &self.path, None)
    }
    fn observe(&self, _: &mut (), exchange: &Exchange) -> bool {
        exchange.status.is_success() && exchange.bytes >= self.min_bytes
    }
}

/// The `seq`-th of the objects a numbered workload works through.
fn numbered(prefix: &str, seq: usize) -> String {
    format!("{prefix}-{seq}")
}

/// A JSON merge patch of one object's `spec.n`.
fn merge_patch(
    endpoint: &Endpoint,
    namespace: &str,
    name: &str,
    seq: usize,
) -> Result<Request<Body>, DriverError> {
    let patch = json!({"spec": {"n": seq}});
    endpoint.request(
        Method::PATCH,
        &object_path(namespace, name),
        Some((MERGE_PATCH, Bytes::from(patch.to_string()))),
    )
}

/// POST of new objects named `<prefix>-<seq>`.
pub struct CreateObjects {
    pub namespace: String,
    pub prefix: String,
    pub owner: Option<Owner>,
}

impl Workload for CreateObjects {
    type State = ();
    fn request(
        &self,
        endpoint: &Endpoint,
        _: usize,
        seq: usize,
        _: &mut (),
    ) -> Result<Request<Body>, DriverError> {
        let name = numbered(&self.prefix, seq);
        let object = widget(&self.namespace, &name, seq, self.owner.as_ref(), None);
        endpoint.request(
            Method::POST,
            &collection_path(&self.namespace),
            body(&object),
        )
    }
}

/// DELETE of the objects a [`CreateObjects`] with the same prefix made.
pub struct DeleteObjects {
    pub namespace: String,
    pub prefix: String,
}

impl Workload for DeleteObjects {
    type State = ();
    fn request(
        &self,
        endpoint: &Endpoint,
        _: usize,
        seq: usize,
        _: &mut (),
    ) -> Result<Request<Body>, DriverError> {
        let name = numbered(&self.prefix, seq);
        endpoint.request(Method::DELETE, &object_path(&self.namespace, &name), None)
    }
}

/// One object per worker and the resourceVersion its next update must carry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owned {
    pub name: String,
    pub resource_version: String,
}

/// PUT of each worker's own object, carrying the resourceVersion of its last
/// answer (custom resources refuse unconditional updates).
pub struct UpdateObjects {
    pub namespace: String,
    pub owner: Option<Owner>,
}

impl Workload for UpdateObjects {
    type State = Owned;
    fn request(
        &self,
        endpoint: &Endpoint,
        _: usize,
        seq: usize,
        state: &mut Owned,
    ) -> Result<Request<Body>, DriverError> {
        let object = widget(
            &self.namespace,
            &state.name,
            seq,
            self.owner.as_ref(),
            Some(&state.resource_version),
        );
        endpoint.request(
            Method::PUT,
            &object_path(&self.namespace, &state.name),
            body(&object),
        )
    }
    fn keep_body(&self) -> bool {
        true
    }
    fn observe(&self, state: &mut Owned, exchange: &Exchange) -> bool {
        if !exchange.status.is_success() {
            return false;
        }
        match exchange.body.as_deref().and_then(resource_version) {
            Some(rv) => {
                state.resource_version = rv;
                true
            }
            None => false,
        }
    }
}

/// `metadata.resourceVersion` of a JSON object.
pub fn resource_version(bytes: &[u8]) -> Option<String> {
    let value: Value = serde_json::from_slice(bytes).ok()?;
    value
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .map(str::to_string)
}

/// JSON merge patch of each worker's own object.
pub struct PatchObjects {
    pub namespace: String,
}

impl Workload for PatchObjects {
    type State = String;
    fn request(
        &self,
        endpoint: &Endpoint,
        _: usize,
        seq: usize,
        name: &mut String,
    ) -> Result<Request<Body>, DriverError> {
        merge_patch(endpoint, &self.namespace, name, seq)
    }
}

/// JSON merge patch of objects named `<prefix>-<seq>`, one per request, all
/// created before the timed part (so an ownership cache knows them already).
pub struct PatchNamed {
    pub namespace: String,
    pub prefix: String,
}

impl Workload for PatchNamed {
    type State = ();
    fn request(
        &self,
        endpoint: &Endpoint,
        _: usize,
        seq: usize,
        _: &mut (),
    ) -> Result<Request<Body>, DriverError> {
        merge_patch(endpoint, &self.namespace, &numbered(&self.prefix, seq), seq)
    }
}

#[cfg(test)]
#[path = "workload/tests.rs"]
mod tests;
