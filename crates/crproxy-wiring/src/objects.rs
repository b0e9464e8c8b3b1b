//! The wiring's conversations with the client API server, on kube-rs: get, create
//! and replace of whole objects, as JSON values because the wiring builds and
//! compares its objects field by field (Services, APIServices, admission policies,
//! the Lease). `DynamicObject` carries them; errors come back as
//! [`crproxy_kube::Error`] so the leader's and registrar's handling of NotFound,
//! Conflict and AlreadyExists stays as it is.

use crproxy_kube::Error;
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use serde_json::Value;

/// One kind of object in one namespace (or cluster-wide).
#[derive(Clone)]
pub(crate) struct Objects {
    api: Api<DynamicObject>,
}

impl Objects {
    /// `group` is empty for the core API; `plural` is the resource name.
    pub(crate) fn new(
        client: kube::Client,
        group: &str,
        version: &str,
        kind: &str,
        plural: &str,
        namespace: Option<&str>,
    ) -> Self {
        let api_version = if group.is_empty() {
            version.to_owned()
        } else {
            format!("{group}/{version}")
        };
        let resource = ApiResource {
            group: group.to_owned(),
            version: version.to_owned(),
            api_version,
            kind: kind.to_owned(),
            plural: plural.to_owned(),
        };
        let api = match namespace {
            Some(ns) => Api::namespaced_with(client, ns, &resource),
            None => Api::all_with(client, &resource),
        };
        Objects { api }
    }

    /// The object, or `None` when it does not exist.
    pub(crate) async fn get(&self, name: &str) -> Result<Option<Value>, Error> {
        match self.api.get_opt(name).await? {
            Some(object) => Ok(Some(to_value(&object)?)),
            None => Ok(None),
        }
    }

    /// POST; `AlreadyExists` when it exists.
    pub(crate) async fn create(&self, object: &Value) -> Result<Value, Error> {
        let created = self
            .api
            .create(&PostParams::default(), &from_value(object)?)
            .await?;
        to_value(&created)
    }

    /// PUT with the `resourceVersion` inside `object`; `Conflict` when stale.
    pub(crate) async fn replace(&self, name: &str, object: &Value) -> Result<Value, Error> {
        let replaced = self
            .api
            .replace(name, &PostParams::default(), &from_value(object)?)
            .await?;
        to_value(&replaced)
    }
}

fn to_value(object: &DynamicObject) -> Result<Value, Error> {
    serde_json::to_value(object).map_err(|e| Error::Decode(e.to_string()))
}

fn from_value(object: &Value) -> Result<DynamicObject, Error> {
    serde_json::from_value(object.clone())
        .map_err(|e| Error::Decode(format!("not a Kubernetes object: {e}")))
}
