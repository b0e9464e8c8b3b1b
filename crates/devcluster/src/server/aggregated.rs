//! Glue between the store and the aggregation layer: the [`ClusterView`] the
//! aggregator reads APIServices, Services and EndpointSlices through, the change
//! feed that wakes its controllers, and the `extension-apiserver-authentication`
//! ConfigMap that tells backends how to verify the front proxy.

use std::sync::Arc;

use serde_json::Value;
use tokio::sync::broadcast;

use super::State;
use crate::aggregation::{self, Aggregator, ClusterView};
use crate::error::ApiError;
use crate::store::{Mutation, Store};
use crproxy_core::pki::CertPem;

fn apiservices() -> (String, String) {
    ("apiregistration.k8s.io".into(), "apiservices".into())
}

fn services() -> (String, String) {
    (String::new(), "services".into())
}

fn endpoint_slices() -> (String, String) {
    ("discovery.k8s.io".into(), "endpointslices".into())
}

/// The aggregator's read (and status-write) access to the store.
struct StoreView {
    store: Arc<Store>,
    changed: broadcast::Sender<()>,
}

impl ClusterView for StoreView {
    fn apiservices(&self) -> Vec<Value> {
        let (objects, _) = self.store.list(&apiservices(), None);
        objects.iter().map(|o| (**o).clone()).collect()
    }

    fn service(&self, ns: &str, name: &str) -> Option<Value> {
        self.store.get(&services(), ns, name).map(|o| (*o).clone())
    }

    fn endpoint_slices(&self, ns: &str, service: &str) -> Vec<Value> {
        let (objects, _) = self.store.list(&endpoint_slices(), Some(ns));
        objects
            .iter()
            .filter(|o| {
                o.pointer("/metadata/labels/kubernetes.io~1service-name")
                    .and_then(Value::as_str)
                    == Some(service)
            })
            .map(|o| (**o).clone())
            .collect()
    }

    fn set_apiservice_status(&self, name: &str, status: Value) {
        let _ = self
            .store
            .mutate::<ApiError>(&apiservices(), "", name, false, |current| {
                let Some(current) = current else {
                    // Deleted meanwhile: nothing to report on.
                    return Err(ApiError::new(404, "NotFound", "gone"));
                };
                if current.get("status") == Some(&status) {
                    return Ok(Mutation::Unchanged(current.clone()));
                }
                let mut updated = (**current).clone();
                updated["status"] = status;
                Ok(Mutation::Put(updated))
            });
    }

    fn changed(&self) -> broadcast::Receiver<()> {
        self.changed.subscribe()
    }
}

/// Starts the aggregator for `state`: its view, the task that turns store events
/// into change notifications, and its availability and discovery controllers.
pub(crate) fn start(
    state: &Arc<State>,
    front_proxy_client: CertPem,
) -> Result<Arc<Aggregator>, aggregation::AggregationError> {
    let (changed, _) = broadcast::channel(64);
    let view = Arc::new(StoreView {
        store: Arc::clone(&state.store),
        changed: changed.clone(),
    });
    let aggregator = Aggregator::new(view, front_proxy_client)?;
    let mut events = state.store.subscribe();
    let mut shutdown = state.shutdown.clone();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                event = events.recv() => match event {
                    Ok(event) => {
                        let relevant = matches!(
                            (event.group.as_str(), event.resource.as_str()),
                            ("apiregistration.k8s.io", "apiservices")
                                | ("", "services")
                                | ("discovery.k8s.io", "endpointslices")
                        );
                        // Status writes by the controller itself change nothing it reads.
                        let own_status_write = event.resource == "apiservices"
                            && event.prev.as_ref().is_some_and(|prev| {
                                prev.get("spec") == event.object.get("spec")
                            });
                        if relevant && !own_status_write {
                            let _ = changed.send(());
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        let _ = changed.send(());
                    }
                    Err(broadcast::error::RecvError::Closed) => break,
                },
                _ = shutdown.wait_for(|stop| *stop) => break,
            }
        }
    });
    let controllers = aggregator.spawn_controllers();
    let mut shutdown = state.shutdown.clone();
    tokio::spawn(async move {
        let _ = shutdown.wait_for(|stop| *stop).await;
        controllers.abort();
    });
    Ok(aggregator)
}

/// Publishes (or refreshes) `kube-system/extension-apiserver-authentication`.
pub(crate) fn publish_authentication_configmap(
    state: &Arc<State>,
    front_proxy_ca_pem: &str,
    client_ca_pem: &str,
) {
    let desired = aggregation::extension_apiserver_authentication_configmap(
        front_proxy_ca_pem,
        client_ca_pem,
    );
    let gr = (String::new(), "configmaps".to_string());
    let _ = state.store.mutate::<ApiError>(
        &gr,
        "kube-system",
        "extension-apiserver-authentication",
        false,
        |current| {
            if let Some(current) = current {
                if current.get("data") == desired.get("data") {
                    return Ok(Mutation::Unchanged(current.clone()));
                }
                let mut updated = (**current).clone();
                updated["data"] = desired["data"].clone();
                return Ok(Mutation::Put(updated));
            }
            let mut created = desired.clone();
            created["metadata"]["uid"] = Value::String(super::objects::new_uid());
            created["metadata"]["creationTimestamp"] = Value::String(super::objects::now());
            Ok(Mutation::Put(created))
        },
    );
}

/// Who the namespace controller acts as when it empties aggregated resources.
fn namespace_controller() -> crate::types::UserInfo {
    crate::types::UserInfo {
        name: "system:serviceaccount:kube-system:namespace-controller".into(),
        uid: String::new(),
        groups: vec![
            "system:serviceaccounts".into(),
            "system:serviceaccounts:kube-system".into(),
            "system:authenticated".into(),
        ],
        extra: Default::default(),
    }
}

/// Deletes the objects of aggregated (APIService-served) namespaced resources in a
/// terminating namespace, as kube-controller-manager's namespace controller does:
/// list them as `PartialObjectMetadataList`, then delete them one by one. Returns
/// true once every aggregated resource reports none left; a backend that cannot
/// answer keeps the namespace terminating, as on a real cluster.
pub(crate) async fn empty_aggregated_resources(state: &Arc<State>, ns: &str) -> bool {
    let Some(aggregator) = state.aggregator.get() else {
        return true;
    };
    let user = namespace_controller();
    let mut all_gone = true;
    for group in aggregator.aggregated_discovery() {
        let group_name = group
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        for version in group["versions"].as_array().into_iter().flatten() {
            let version_name = version["version"].as_str().unwrap_or_default();
            for resource in version["resources"].as_array().into_iter().flatten() {
                let namespaced = resource["scope"] == "Namespaced";
                let verbs = resource["verbs"].as_array().cloned().unwrap_or_default();
                let can = |verb: &str| verbs.iter().any(|v| v == verb);
                if !namespaced || !can("list") || !can("delete") {
                    continue;
                }
                let plural = resource["resource"].as_str().unwrap_or_default();
                let collection =
                    format!("/apis/{group_name}/{version_name}/namespaces/{ns}/{plural}");
                let Some(route) = aggregator.route(&collection) else {
                    continue;
                };
                let list = http::Request::get(&collection)
                    .header(
                        http::header::ACCEPT,
                        "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json",
                    )
                    .body(http_body_util::Empty::<bytes::Bytes>::new());
                let Ok(list) = list else { continue };
                let response = aggregator.proxy(route.clone(), list, &user).await;
                if !response.status().is_success() {
                    all_gone = false;
                    continue;
                }
                let body = match http_body_util::BodyExt::collect(response.into_body()).await {
                    Ok(collected) => collected.to_bytes(),
                    Err(_) => {
                        all_gone = false;
                        continue;
                    }
                };
                let items: Vec<String> = serde_json::from_slice::<Value>(&body)
                    .ok()
                    .and_then(|v| v["items"].as_array().cloned())
                    .unwrap_or_default()
                    .iter()
                    .filter_map(|i| {
                        i.pointer("/metadata/name")
                            .and_then(Value::as_str)
                            .map(str::to_string)
                    })
                    .collect();
                for name in items {
                    all_gone = false;
                    let delete = http::Request::delete(format!("{collection}/{name}"))
                        .header(http::header::ACCEPT, "application/json")
                        .body(http_body_util::Empty::<bytes::Bytes>::new());
                    if let Ok(delete) = delete {
                        let _ = aggregator.proxy(route.clone(), delete, &user).await;
                    }
                }
            }
        }
    }
    all_gone
}
