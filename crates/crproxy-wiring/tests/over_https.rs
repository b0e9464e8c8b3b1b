//! Leader election and registration against a devcluster: real TLS, real JSON, real
//! 409s and real admission. Real time (paused time cannot drive real sockets), so
//! durations are short and every wait is bounded; the paused-time state machine
//! tests are in src/leader/tests.rs.
//!
//! What the wiring wrote is observed the way an operator would: objects read back,
//! and watches opened before the action ([`WriteLog`]). An unavailable API server is
//! its listener stopped and started again on the same port.

use anyhow::{Context as _, Result};
use crproxy_kube::{Auth, ClusterConfig};
use crproxy_wiring::{
    register_all, spawn_registrar, spawn_wiring, LeaderElector, LeaderHandle, LeaseConfig,
    RegistrarConfig, Registration,
};
use futures_util::StreamExt as _;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, WatchParams,
};
use kube::core::{GroupVersionKind, WatchEvent};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use test_support::TestCluster;
use tokio::task::JoinHandle;

const LEASE_NAME: &str = "crproxy-leader";
const APISERVICE: &str = "v1.example.com";
const SERVICE: &str = "proxy-example-com-v1";

fn lease_config(identity: &str) -> LeaseConfig {
    LeaseConfig {
        lease_duration: Duration::from_secs(2),
        renew_interval: Duration::from_millis(300),
        retry_interval: Duration::from_millis(100),
        ..LeaseConfig::new("kube-system", LEASE_NAME, identity)
    }
}

/// The admin identity of `cluster`, reached at `addr`.
fn cluster_config(cluster: &TestCluster, addr: SocketAddr) -> Result<ClusterConfig> {
    let mut config = ClusterConfig::new(format!("https://{addr}").parse()?);
    config.ca_pem = Some(cluster.cluster.ca_pem().into_bytes());
    config.auth = Auth::Token(cluster.cluster.admin_token());
    Ok(config)
}

/// A kube-rs client built the way `crproxy run` builds the wiring's client.
fn client_at(cluster: &TestCluster, addr: SocketAddr) -> Result<kube::Client> {
    let config = cluster_config(cluster, addr)?;
    let credentials = config.credentials()?;
    Ok(crproxy_kube::kube_client_without_retries(
        &config,
        credentials,
        "default",
    )?)
}

fn kube_client(cluster: &TestCluster) -> Result<kube::Client> {
    client_at(cluster, cluster.cluster.addr())
}

fn resource(group: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, "v1", kind), plural)
}

fn leases(client: &kube::Client) -> Api<DynamicObject> {
    let lease = resource("coordination.k8s.io", "Lease", "leases");
    Api::namespaced_with(client.clone(), "kube-system", &lease)
}

fn apiservices(client: &kube::Client) -> Api<DynamicObject> {
    Api::all_with(
        client.clone(),
        &resource("apiregistration.k8s.io", "APIService", "apiservices"),
    )
}

fn services(client: &kube::Client) -> Api<DynamicObject> {
    Api::namespaced_with(
        client.clone(),
        "kube-system",
        &resource("", "Service", "services"),
    )
}

/// Every kind the registrar writes.
fn registration_apis(client: &kube::Client) -> Vec<Api<DynamicObject>> {
    let admission = "admissionregistration.k8s.io";
    vec![
        Api::all_with(
            client.clone(),
            &resource(
                admission,
                "ValidatingAdmissionPolicy",
                "validatingadmissionpolicies",
            ),
        ),
        Api::all_with(
            client.clone(),
            &resource(
                admission,
                "ValidatingAdmissionPolicyBinding",
                "validatingadmissionpolicybindings",
            ),
        ),
        services(client),
        apiservices(client),
    ]
}

/// The object as JSON, with the API server's own bookkeeping.
async fn object(api: &Api<DynamicObject>, name: &str) -> Result<Value> {
    let object = api.get(name).await.with_context(|| format!("get {name}"))?;
    Ok(serde_json::to_value(object)?)
}

/// `(kind name, uid)` of every object of `apis`: the same uids later mean nothing
/// was deleted and created again.
async fn uids(apis: &[Api<DynamicObject>]) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for api in apis {
        for item in api.list(&ListParams::default()).await? {
            let name = item.metadata.name.unwrap_or_default();
            let uid = item.metadata.uid.unwrap_or_default();
            out.insert(format!("{}/{name}", api.resource_url()), uid);
        }
    }
    Ok(out)
}

fn resource_version(object: &Value) -> u64 {
    object["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|rv| rv.parse().ok())
        .unwrap_or(0)
}

/// What a writer did to one object, as a watch saw it.
#[derive(Clone, Debug)]
struct Write {
    /// `ADDED`, `MODIFIED` or `DELETED`.
    event: &'static str,
    object: Value,
}

impl Write {
    fn summary(&self) -> String {
        format!(
            "{} {} {}",
            self.event,
            self.object["kind"].as_str().unwrap_or("?"),
            self.object["metadata"]["name"].as_str().unwrap_or("?")
        )
    }
}

/// The fields a client writes: everything but the status and the server's
/// bookkeeping. devcluster's aggregator keeps APIService status current on its own,
/// which is not a write of the wiring's.
fn written_part(object: &Value) -> Value {
    let mut out = object.clone();
    if let Some(map) = out.as_object_mut() {
        map.remove("status");
    }
    if let Some(meta) = out["metadata"].as_object_mut() {
        meta.remove("resourceVersion");
        meta.remove("managedFields");
    }
    out
}

#[derive(Default)]
struct Seen {
    writes: Vec<(u64, Write)>,
    /// The highest resourceVersion each watch has delivered (or listed).
    progress: Vec<u64>,
}

/// Watches opened before an action, recording every change to what clients write
/// (creations, deletions, and modifications of anything but status), in the order
/// the API server committed them. devcluster's resourceVersions are one counter
/// across all resources, so sorting by them orders writes across kinds.
struct WriteLog {
    apis: Vec<Api<DynamicObject>>,
    seen: Arc<Mutex<Seen>>,
    tasks: Vec<JoinHandle<()>>,
}

impl WriteLog {
    async fn start(apis: Vec<Api<DynamicObject>>) -> Result<WriteLog> {
        let seen = Arc::new(Mutex::new(Seen {
            writes: Vec::new(),
            progress: vec![0; apis.len()],
        }));
        let mut tasks = Vec::new();
        for (index, api) in apis.iter().enumerate() {
            let list = api.list(&ListParams::default()).await?;
            let from = list.metadata.resource_version.clone().unwrap_or_default();
            let mut last: BTreeMap<String, Value> = BTreeMap::new();
            for item in list {
                let item = serde_json::to_value(item)?;
                let name = item["metadata"]["name"].as_str().unwrap_or("").to_owned();
                last.insert(name, written_part(&item));
            }
            seen.lock()
                .map_err(|_| anyhow::anyhow!("poisoned"))?
                .progress[index] = from.parse().unwrap_or(0);
            let events = api.watch(&WatchParams::default(), &from).await?;
            let seen = Arc::clone(&seen);
            tasks.push(tokio::spawn(async move {
                let mut events = std::pin::pin!(events);
                // Ends with the watch (server-side timeout) or the abort in Drop.
                while let Some(Ok(event)) = events.next().await {
                    let (kind, object) = match event {
                        WatchEvent::Added(o) => ("ADDED", o),
                        WatchEvent::Modified(o) => ("MODIFIED", o),
                        WatchEvent::Deleted(o) => ("DELETED", o),
                        WatchEvent::Bookmark(_) | WatchEvent::Error(_) => continue,
                    };
                    let Ok(object) = serde_json::to_value(object) else {
                        continue;
                    };
                    let name = object["metadata"]["name"].as_str().unwrap_or("").to_owned();
                    let written = written_part(&object);
                    let changed = match kind {
                        "DELETED" => {
                            last.remove(&name);
                            true
                        }
                        _ => last.insert(name, written.clone()).as_ref() != Some(&written),
                    };
                    let Ok(mut seen) = seen.lock() else { return };
                    let rv = resource_version(&object);
                    seen.progress[index] = seen.progress[index].max(rv);
                    if changed {
                        seen.writes.push((
                            rv,
                            Write {
                                event: kind,
                                object,
                            },
                        ));
                    }
                }
            }));
        }
        Ok(WriteLog { apis, seen, tasks })
    }

    /// The writes since the last call, in commit order, once every watch has
    /// delivered everything that is stored now.
    async fn take(&self) -> Result<Vec<Write>> {
        let mut stored = Vec::new();
        for api in &self.apis {
            let list = api.list(&ListParams::default()).await?;
            let newest = list
                .items
                .iter()
                .filter_map(|i| i.metadata.resource_version.as_deref())
                .filter_map(|rv| rv.parse::<u64>().ok())
                .max()
                .unwrap_or(0);
            stored.push(newest);
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            {
                let mut seen = self.seen.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
                if seen
                    .progress
                    .iter()
                    .zip(&stored)
                    .all(|(seen, want)| seen >= want)
                {
                    let mut writes = std::mem::take(&mut seen.writes);
                    writes.sort_by_key(|(rv, _)| *rv);
                    return Ok(writes.into_iter().map(|(_, w)| w).collect());
                }
            }
            anyhow::ensure!(Instant::now() < deadline, "the watches fell behind");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn take_summaries(&self) -> Result<Vec<String>> {
        Ok(self.take().await?.iter().map(Write::summary).collect())
    }
}

impl Drop for WriteLog {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

async fn wait_leader(h: &LeaderHandle, within: Duration) -> Result<Duration> {
    let t0 = Instant::now();
    let mut rx = h.changes();
    tokio::time::timeout(within, rx.wait_until(true))
        .await
        .context("no leadership in time")?
        .context("election ended")?;
    Ok(t0.elapsed())
}

/// Polls `check` every 20 ms for at most 5 s.
async fn eventually(what: &str, mut check: impl AsyncFnMut() -> Result<bool>) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !check().await? {
        anyhow::ensure!(Instant::now() < deadline, "{what}: not within 5 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

#[tokio::test]
async fn election_over_the_wire() -> Result<()> {
    let cluster = test_support::devcluster("election").await;
    let admin = kube_client(&cluster)?;
    let leases = leases(&admin);
    let log = WriteLog::start(vec![leases.clone()]).await?;
    let a = LeaderElector::spawn(kube_client(&cluster)?, lease_config("replica-a"));
    wait_leader(&a, Duration::from_secs(5)).await?;
    let b = LeaderElector::spawn(kube_client(&cluster)?, lease_config("replica-b"));
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(a.is_leader() && !b.is_leader());

    let lease = object(&leases, LEASE_NAME).await?;
    let spec = &lease["spec"];
    assert_eq!(lease["apiVersion"], "coordination.k8s.io/v1");
    assert_eq!(lease["kind"], "Lease");
    assert_eq!(spec["holderIdentity"], "replica-a");
    assert_eq!(spec["leaseDurationSeconds"], 2);
    assert_eq!(spec["leaseTransitions"], 0);
    for field in ["renewTime", "acquireTime"] {
        let t = spec[field].as_str().context("time")?;
        assert!(
            t.len() == 27 && t.ends_with('Z') && t.as_bytes()[19] == b'.',
            "{field} is a MicroTime: {t}"
        );
    }
    assert_ne!(spec["renewTime"], spec["acquireTime"], "a renewed");
    // One Lease, created once and then renewed in place by a alone: b only reads
    // while a holds it.
    let writes = log.take().await?;
    let summaries: Vec<String> = writes.iter().map(Write::summary).collect();
    assert_eq!(
        summaries.first().map(String::as_str),
        Some("ADDED Lease crproxy-leader")
    );
    assert!(summaries.len() >= 2, "{summaries:?}");
    for write in &writes[1..] {
        assert_eq!(write.summary(), "MODIFIED Lease crproxy-leader");
        assert_eq!(write.object["spec"]["holderIdentity"], "replica-a");
        assert_eq!(write.object["metadata"]["uid"], lease["metadata"]["uid"]);
    }

    // a crashes: it neither renews nor releases. b waits out the lease.
    let crashed = Instant::now();
    a.abort();
    let took = wait_leader(&b, Duration::from_secs(6)).await?;
    assert!(
        crashed.elapsed() >= Duration::from_millis(1500),
        "b took over {took:?} after the crash, before the 2 s lease could expire"
    );
    let spec = object(&leases, LEASE_NAME).await?["spec"].clone();
    assert_eq!(
        (
            spec["holderIdentity"].clone(),
            spec["leaseTransitions"].clone()
        ),
        (json!("replica-b"), json!(1))
    );

    // A clean shutdown hands over within a retry interval or so.
    let c = LeaderElector::spawn(kube_client(&cluster)?, lease_config("replica-c"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!c.is_leader());
    let released = Instant::now();
    b.release().await;
    wait_leader(&c, Duration::from_secs(2)).await?;
    assert!(
        released.elapsed() < Duration::from_secs(1),
        "{:?}",
        released.elapsed()
    );
    assert_eq!(
        object(&leases, LEASE_NAME).await?["spec"]["leaseTransitions"],
        2
    );
    c.release().await;
    let lease_now = object(&leases, LEASE_NAME).await?;
    assert_eq!(lease_now["spec"]["holderIdentity"], "");
    assert_eq!(
        lease_now["metadata"]["uid"], lease["metadata"]["uid"],
        "the Lease is never deleted"
    );
    assert!(
        log.take_summaries()
            .await?
            .iter()
            .all(|w| w == "MODIFIED Lease crproxy-leader"),
        "only updates after the first create"
    );
    Ok(())
}

#[tokio::test]
async fn a_leader_that_cannot_renew_steps_down() -> Result<()> {
    let cluster = test_support::devcluster("stepdown").await;
    let a = LeaderElector::spawn(kube_client(&cluster)?, lease_config("replica-a"));
    wait_leader(&a, Duration::from_secs(5)).await?;
    let addr = cluster.cluster.addr();
    cluster.cluster.stop_listener(addr)?;
    let down = Instant::now();
    let mut rx = a.changes();
    tokio::time::timeout(Duration::from_secs(4), rx.wait_until(false))
        .await
        .context("still leading without renewals")??;
    let after = down.elapsed();
    assert!(
        after >= Duration::from_millis(1500) && after <= Duration::from_millis(2800),
        "stepped down {after:?} after renewals began failing (lease 2 s)"
    );
    // The API server is back on the same port (the client's address).
    cluster.cluster.add_listener(addr.port()).await?;
    wait_leader(&a, Duration::from_secs(3)).await?;
    Ok(())
}

fn regs() -> Vec<Registration> {
    vec![
        Registration {
            group: "example.com".into(),
            version: "v1".into(),
            port: 9100,
        },
        Registration {
            group: "stable.example.io".into(),
            version: "v1beta1".into(),
            port: 9101,
        },
    ]
}

#[tokio::test]
async fn registration_creates_repairs_and_never_deletes() -> Result<()> {
    let cluster = test_support::devcluster("register").await;
    let client = kube_client(&cluster)?;
    let apis = registration_apis(&client);
    let log = WriteLog::start(registration_apis(&client)).await?;
    let (apiservices, services) = (apiservices(&client), services(&client));
    let cfg = RegistrarConfig::local(b"CA PEM".to_vec());
    register_all(&client, &cfg, &regs()).await?;
    // The policy protects the objects from the start, and each Service exists
    // before the APIService that points at it.
    assert_eq!(
        log.take_summaries().await?,
        [
            "ADDED ValidatingAdmissionPolicy vcluster-protected-apiservices",
            "ADDED ValidatingAdmissionPolicyBinding vcluster-protected-resource-proxy",
            "ADDED Service proxy-example-com-v1",
            "ADDED APIService v1.example.com",
            "ADDED Service proxy-stable-example-io-v1beta1",
            "ADDED APIService v1beta1.stable.example.io",
        ]
    );
    let created = uids(&apis).await?;
    let api = object(&apiservices, "v1beta1.stable.example.io").await?;
    assert_eq!(
        api["spec"]["service"]["name"],
        "proxy-stable-example-io-v1beta1"
    );
    assert_eq!(api["spec"]["service"]["port"], 9101);
    assert_eq!(api["spec"]["caBundle"], "Q0EgUEVN");
    let svc = object(&services, SERVICE).await?;
    assert_eq!(svc["spec"]["externalName"], "localhost");
    assert_eq!(
        svc["metadata"]["labels"]["vcluster.loft.sh/protected"],
        "resource-proxy"
    );

    // Up to date: a second pass changes nothing. (An update that changes nothing is
    // not committed, by devcluster as by kube-apiserver, so no other client could
    // tell a no-op write from a read.)
    register_all(&client, &cfg, &regs()).await?;
    assert_eq!(log.take_summaries().await?, Vec::<String>::new());

    // Someone strips the label and changes the CA; the service gets a foreign label.
    let edit = PatchParams::default();
    apiservices
        .patch(
            APISERVICE,
            &edit,
            &Patch::Merge(json!({"metadata": {"labels": null}, "spec": {"caBundle": "b3RoZXI="}})),
        )
        .await?;
    services
        .patch(
            SERVICE,
            &edit,
            &Patch::Merge(json!({"metadata": {"labels": {"team": "platform"}}})),
        )
        .await?;
    assert_eq!(
        log.take_summaries().await?,
        [
            "MODIFIED APIService v1.example.com",
            "MODIFIED Service proxy-example-com-v1"
        ]
    );
    register_all(&client, &cfg, &regs()).await?;
    assert_eq!(
        log.take_summaries().await?,
        ["MODIFIED APIService v1.example.com"],
        "only the drifted APIService is repaired; a foreign label is not drift"
    );
    let api = object(&apiservices, APISERVICE).await?;
    assert_eq!(api["spec"]["caBundle"], "Q0EgUEVN");
    assert_eq!(
        api["metadata"]["labels"]["vcluster.loft.sh/protected"],
        "resource-proxy"
    );
    assert_eq!(
        object(&services, SERVICE).await?["metadata"]["labels"]["team"],
        "platform"
    );

    // A match condition that never holds would switch the protection off while
    // every field of ours is still there: drift, repaired.
    let policies = &apis[0];
    let policy = "vcluster-protected-apiservices";
    policies
        .patch(
            policy,
            &edit,
            &Patch::Merge(
                json!({"spec": {"matchConditions": [{"name": "off", "expression": "false"}]}}),
            ),
        )
        .await?;
    assert_eq!(
        log.take_summaries().await?,
        ["MODIFIED ValidatingAdmissionPolicy vcluster-protected-apiservices"]
    );
    register_all(&client, &cfg, &regs()).await?;
    assert_eq!(
        log.take_summaries().await?,
        ["MODIFIED ValidatingAdmissionPolicy vcluster-protected-apiservices"]
    );
    assert!(object(policies, policy).await?["spec"]
        .get("matchConditions")
        .is_none());

    // Dropping a group/version from the config leaves its objects alone.
    register_all(&client, &cfg, &regs()[..1]).await?;
    assert_eq!(log.take_summaries().await?, Vec::<String>::new());
    object(&apiservices, "v1beta1.stable.example.io").await?;

    // A failing API server is reported, naming the object.
    let addr = cluster.cluster.addr();
    cluster.cluster.stop_listener(addr)?;
    let err = register_all(&client, &cfg, &regs())
        .await
        .expect_err("unavailable");
    assert!(err.to_string().contains("6 objects failed"), "{err}");
    cluster.cluster.add_listener(addr.port()).await?;
    assert_eq!(uids(&apis).await?, created, "never deletes");
    assert_eq!(log.take_summaries().await?, Vec::<String>::new());
    Ok(())
}

/// A configured group/version whose APIService the client's API server serves
/// itself (a built-in group like `v1.apps`, or a CRD's group): the registrar
/// leaves the APIService exactly as it is, writes no Service for it, and reports
/// it on every pass; once the group is no longer the client's, it registers.
#[tokio::test]
async fn the_clients_own_apiservices_are_never_taken_over() -> Result<()> {
    let cluster = test_support::devcluster("register-local").await;
    let client = kube_client(&cluster)?;
    let apiservices = apiservices(&client);
    let local = |name: &str, group: &str, version: &str, labels: Value| -> Result<DynamicObject> {
        Ok(serde_json::from_value(json!({
            "apiVersion": "apiregistration.k8s.io/v1",
            "kind": "APIService",
            "metadata": {"name": name, "labels": labels},
            "spec": {"group": group, "version": version,
                     "groupPriorityMinimum": 17800, "versionPriority": 15},
        }))?)
    };
    // As kube-aggregator registers v1.apps: local, automanaged.
    apiservices
        .create(
            &Default::default(),
            &local(
                APISERVICE,
                "example.com",
                "v1",
                json!({"kube-aggregator.kubernetes.io/automanaged": "onstart"}),
            )?,
        )
        .await?;
    // Local without the label (made by hand).
    apiservices
        .create(
            &Default::default(),
            &local(
                "v1beta1.stable.example.io",
                "stable.example.io",
                "v1beta1",
                json!({}),
            )?,
        )
        .await?;
    let before = [
        written_part(&object(&apiservices, APISERVICE).await?),
        written_part(&object(&apiservices, "v1beta1.stable.example.io").await?),
    ];
    let log = WriteLog::start(registration_apis(&client)).await?;
    let cfg = RegistrarConfig::local(b"CA PEM".to_vec());
    for pass in 0..2 {
        let err = register_all(&client, &cfg, &regs())
            .await
            .expect_err("the client's own APIServices are refused");
        let text = err.to_string();
        assert!(text.starts_with("2 objects failed"), "pass {pass}: {text}");
        assert!(
            text.contains(&format!(
                "not registering APIService \"{APISERVICE}\": it is labelled \
                 kube-aggregator.kubernetes.io/automanaged"
            )),
            "pass {pass}: {text}"
        );
        let after = [
            written_part(&object(&apiservices, APISERVICE).await?),
            written_part(&object(&apiservices, "v1beta1.stable.example.io").await?),
        ];
        assert_eq!(after, before, "pass {pass}: left exactly as they were");
    }
    assert_eq!(
        log.take_summaries().await?,
        [
            "ADDED ValidatingAdmissionPolicy vcluster-protected-apiservices",
            "ADDED ValidatingAdmissionPolicyBinding vcluster-protected-resource-proxy",
        ],
        "no Service for a group/version the client serves"
    );
    let err = register_all(&client, &cfg, &regs()[1..])
        .await
        .expect_err("refused");
    assert_eq!(
        err.to_string(),
        "not registering APIService \"v1beta1.stable.example.io\": it has no spec.service: \
         the client's API server serves this group/version itself (a built-in group or a \
         CRD); crproxy never takes over a group/version the client cluster serves: remove it \
         from experimental.proxy.customResources"
    );

    // The group stops being the client's (its CRD was deleted): the next pass
    // registers the proxy.
    apiservices
        .delete(APISERVICE, &DeleteParams::default())
        .await?;
    log.take_summaries().await?;
    register_all(&client, &cfg, &regs()[..1]).await?;
    assert_eq!(
        log.take_summaries().await?,
        [
            "ADDED Service proxy-example-com-v1",
            "ADDED APIService v1.example.com"
        ]
    );
    Ok(())
}

/// A Service that has the name of a registration's Service and is not crproxy's is
/// left as it is, and so is the APIService that would route to it, pass after
/// pass; one that is crproxy's by its APIService (its labels edited by hand) is
/// repaired.
#[tokio::test]
async fn another_services_name_is_never_taken_over() -> Result<()> {
    let cluster = test_support::devcluster("register-service").await;
    let client = kube_client(&cluster)?;
    let services = services(&client);
    let foreign: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": SERVICE, "namespace": "kube-system", "labels": {"app": "theirs"}},
        "spec": {"type": "ExternalName", "externalName": "theirs.example"},
    }))?;
    services.create(&Default::default(), &foreign).await?;
    let before = written_part(&object(&services, SERVICE).await?);
    let log = WriteLog::start(registration_apis(&client)).await?;
    let cfg = RegistrarConfig::local(b"CA PEM".to_vec());
    for pass in 0..2 {
        let err = register_all(&client, &cfg, &regs()[..1])
            .await
            .expect_err("another's Service is refused");
        assert_eq!(
            err.to_string(),
            format!(
                "not registering Service \"kube-system/{SERVICE}\": it exists and is not \
                 crproxy's (no label vcluster.loft.sh/protected=resource-proxy, and no \
                 APIService of crproxy's routes to it); crproxy never takes over another's \
                 Service: rename or delete it"
            ),
            "pass {pass}"
        );
        assert_eq!(
            written_part(&object(&services, SERVICE).await?),
            before,
            "pass {pass}: left exactly as it was"
        );
    }
    assert_eq!(
        log.take_summaries().await?,
        [
            "ADDED ValidatingAdmissionPolicy vcluster-protected-apiservices",
            "ADDED ValidatingAdmissionPolicyBinding vcluster-protected-resource-proxy",
        ],
        "neither the Service nor an APIService routed to it is written"
    );

    // Gone, it is registered; its labels then removed by hand, the APIService
    // (still crproxy's) vouches for it and it is repaired.
    services.delete(SERVICE, &DeleteParams::default()).await?;
    register_all(&client, &cfg, &regs()[..1]).await?;
    let unlabel = json!({"metadata": {"labels": null}});
    services
        .patch(SERVICE, &Default::default(), &Patch::Merge(&unlabel))
        .await?;
    log.take_summaries().await?;
    register_all(&client, &cfg, &regs()[..1]).await?;
    let repaired = object(&services, SERVICE).await?;
    assert_eq!(
        repaired["metadata"]["labels"]["vcluster.loft.sh/protected"], "resource-proxy",
        "{repaired}"
    );
    Ok(())
}

#[tokio::test]
async fn only_the_leader_registers() -> Result<()> {
    let cluster = test_support::devcluster("leader-only").await;
    let admin = kube_client(&cluster)?;
    let cfg = RegistrarConfig::local(b"CA".to_vec());
    // The follower talks through a relay: not even a read may reach the server.
    let relay = test_support::relay::Relay::start(cluster.cluster.addr()).await;
    let follower = spawn_registrar(
        client_at(&cluster, relay.addr)?,
        cfg.clone(),
        regs(),
        LeaderHandle::fixed(false),
        Duration::from_millis(100),
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(relay.connections(), 0, "a follower touches nothing");
    assert!(apiservices(&admin).get_opt(APISERVICE).await?.is_none());
    follower.abort();

    let leader = LeaderElector::spawn(kube_client(&cluster)?, lease_config("replica-a"));
    let registrar = spawn_registrar(
        kube_client(&cluster)?,
        cfg,
        regs(),
        leader.clone(),
        Duration::from_millis(200),
    );
    wait_leader(&leader, Duration::from_secs(5)).await?;
    let apiservices = apiservices(&admin);
    eventually("registered on leadership gain", async || {
        Ok(apiservices.get_opt(APISERVICE).await?.is_some())
    })
    .await?;
    // Repair on the interval: a deleted Service comes back. The protection policy
    // refuses to delete a labelled Service, so the label goes first, as an operator
    // removing it on purpose would do.
    let services = services(&admin);
    let old_uid = object(&services, SERVICE).await?["metadata"]["uid"]
        .as_str()
        .context("uid")?
        .to_owned();
    services
        .patch(
            SERVICE,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": null}})),
        )
        .await?;
    services.delete(SERVICE, &DeleteParams::default()).await?;
    eventually("the Service repaired", async || {
        Ok(services
            .get_opt(SERVICE)
            .await?
            .is_some_and(|s| s.metadata.uid.as_deref() != Some(old_uid.as_str())))
    })
    .await?;
    // Releasing leadership ends the registrar with the election.
    leader.release().await;
    tokio::time::timeout(Duration::from_secs(2), registrar)
        .await
        .context("registrar outlived the election")??;
    Ok(())
}

#[tokio::test]
async fn wiring_stops_registering_before_it_releases() -> Result<()> {
    let cluster = test_support::devcluster("stop").await;
    let admin = kube_client(&cluster)?;
    let wiring = spawn_wiring(
        kube_client(&cluster)?,
        lease_config("replica-a"),
        RegistrarConfig::local(b"CA".to_vec()),
        regs(),
        Duration::from_millis(100),
    );
    wait_leader(wiring.leader(), Duration::from_secs(5)).await?;
    let apiservices = apiservices(&admin);
    eventually("registered", async || {
        Ok(apiservices.get_opt(APISERVICE).await?.is_some())
    })
    .await?;
    wiring.stop().await;
    let leases = leases(&admin);
    assert_eq!(
        object(&leases, LEASE_NAME).await?["spec"]["holderIdentity"],
        ""
    );
    // Nothing runs after stop: drift stays unrepaired and the free Lease untaken
    // for three registration intervals.
    let mut apis = registration_apis(&admin);
    apis.push(leases);
    let log = WriteLog::start(apis).await?;
    apiservices
        .patch(
            APISERVICE,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"service": {"port": 1}}})),
        )
        .await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        log.take_summaries().await?,
        ["MODIFIED APIService v1.example.com"],
        "nothing runs after stop"
    );
    Ok(())
}
