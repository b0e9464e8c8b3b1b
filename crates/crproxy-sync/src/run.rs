//! Start-up and the syncer loops: resolve every type, then, while this replica leads,
//! one syncer per type: two reflectors (tenant and host) feed a work queue of keys,
//! and a few workers reconcile them.

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use crproxy_core::config::sync::{Direction, SyncPlan, WebhookEndpoint};
use crproxy_kube::ClusterAccess;
use crproxy_wiring::{LeaderHandle, LeadershipChanges, LeaseObserver};
use futures_util::StreamExt;
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::ApiResource;
use kube::runtime::reflector::{self, store::Writer, Store};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::crd::{self, ResolvedType};
use crate::from_host::FromHost;
use crate::queue::WorkQueue;
use crate::to_host::{self, ToHost};
use crate::writethrough::{self, Gate, WebhookServer, WriteThrough};
use crate::{SyncError, SyncMetrics};

/// Concurrent reconciles per synced type.
const WORKERS: usize = 4;
/// How often every object is looked at again even without a change, so anything a
/// watch missed still converges.
pub const DEFAULT_RESYNC: Duration = Duration::from_secs(60);
/// How long one step of a key may take. A step is a few requests, each normally
/// well under a second; a server that accepts a request and never answers would
/// otherwise hold a worker for good (the sync's clients time out only connecting),
/// and with every worker held the type stops syncing without a word.
const STEP_TIMEOUT: Duration = Duration::from_secs(60);

/// A tenant-side object key: namespace (empty for cluster-scoped) and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    pub namespace: String,
    pub name: String,
}

/// What a reconcile asks for next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Both sides agree (as far as this step goes).
    Done,
    /// Look again after a while (a cache was behind, or a step follows).
    Requeue(Duration),
}

/// Why a reconcile step failed; `reason` is the metric label.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    #[error(transparent)]
    Api(#[from] kube::Error),
    /// The host object under the mirror's name belongs to someone else.
    #[error("the host object under this name does not belong to this tenant object")]
    Foreign,
    #[error("encoding an object: {0}")]
    Encode(String),
    /// The object on this side nests too deeply to be read whole: only its
    /// stand-in is (see `crproxy_core::deep_objects`). It and its counterpart
    /// are left as they are.
    #[error("the {0} object nests deeper than {max} levels; it is not synced until it nests less", max = crproxy_core::deep_objects::MAX_OBJECT_NESTING)]
    TooDeep(&'static str),
    /// The tenant object names another object in a `patches` field whose host
    /// name is ambiguous: nothing is written until the tenant object changes.
    #[error(transparent)]
    AmbiguousReference(#[from] crate::to_host::AmbiguousReference),
    /// The step had no answer within this long: a server that took a request and
    /// went quiet. What it did so far is read again by the retry.
    #[error("no answer within {0:?}")]
    Stalled(Duration),
}

impl StepError {
    pub fn reason(&self) -> &'static str {
        match self {
            StepError::Api(kube::Error::Api(s)) => match s.code {
                409 => "conflict",
                404 => "not_found",
                401 | 403 => "forbidden",
                400 | 422 => "invalid",
                _ => "api_error",
            },
            StepError::Api(_) | StepError::Stalled(_) => "unavailable",
            StepError::Foreign => "foreign_object",
            StepError::Encode(_) => "encode",
            StepError::TooDeep(_) => "too_deep",
            StepError::AmbiguousReference(_) => "invalid",
        }
    }

    /// The shortest wait before a retry; the key's backoff ([`crate::queue`]) may be
    /// longer. A foreign object is not ours to fix: it changes only when someone
    /// renames or removes it, so it is looked at rarely from the start; nor is an
    /// object nested too deeply or naming an object ambiguously, which its next
    /// change brings back at once.
    fn min_retry_after(&self) -> Duration {
        match self {
            StepError::Foreign | StepError::TooDeep(_) | StepError::AmbiguousReference(_) => {
                Duration::from_secs(30)
            }
            _ => Duration::ZERO,
        }
    }
}

/// Refuses a step that would take content from a stand-in: an object nested too
/// deeply to be read whole (see [`StepError::TooDeep`]). While the source object
/// (the tenant's toHost, the host's fromHost) exists, neither it nor its
/// counterpart may be one. A counterpart left without its source is only ever
/// deleted, which its metadata is enough for.
pub fn too_deep(
    source: (&'static str, &Option<serde_json::Value>),
    counterpart: (&'static str, &Option<serde_json::Value>),
) -> Result<(), StepError> {
    if source.1.is_none() {
        return Ok(());
    }
    for (side, object) in [source, counterpart] {
        if object
            .as_ref()
            .is_some_and(crproxy_core::deep_objects::is_stand_in)
        {
            return Err(StepError::TooDeep(side));
        }
    }
    Ok(())
}

/// One synced type's reconcile logic; the loops around it are shared.
pub trait Reconciler: Send + Sync + 'static {
    fn resource(&self) -> &ResolvedType;
    fn metrics(&self) -> &Arc<SyncMetrics>;
    /// The key a tenant object's change affects.
    fn key_of_tenant(&self, object: &DynamicObject) -> Option<Key>;
    /// The key a host object's change affects (`None`: not ours to sync).
    fn key_of_host(&self, object: &DynamicObject) -> Option<Key>;
    /// Both caches are synced (write-through may start answering).
    fn caches_synced(&self) {}
    /// The host watch delivered a DELETED event for `object`: the host removed it
    /// while this syncer watched (a relist that no longer shows an object is not
    /// such an event).
    fn host_deleted(&self, _object: &DynamicObject) {}
    /// The host watch delivered `object` as added, changed or listed: whatever
    /// [`Reconciler::host_deleted`] noted of it is not (or no longer) true. A
    /// label-filtered watch also says DELETED when an object stops matching its
    /// selector, and ADDED when it matches again.
    fn host_seen(&self, _object: &DynamicObject) {}
    /// Every key either cache knows, and every key the reconciler keeps something
    /// for (so that what it keeps goes once both sides are gone), each once: a
    /// key queued twice while a worker holds it is reconciled twice.
    fn all_keys(&self) -> BTreeSet<Key>;
    fn reconcile(&self, key: &Key) -> impl Future<Output = Result<Outcome, StepError>> + Send;
}

#[derive(Clone, Copy)]
enum Side {
    Tenant,
    Host,
}

/// Everything [`start`] needs.
pub struct SyncOptions {
    pub plan: SyncPlan,
    /// The host cluster, as `sync.host.kubeconfig`'s identity.
    pub host: ClusterAccess,
    /// The tenant cluster (the client cluster), as crproxy's identity there.
    pub tenant: ClusterAccess,
    /// Syncers run only while this says so.
    pub leader: LeaderHandle,
    pub metrics: Arc<SyncMetrics>,
    pub resync: Duration,
    /// How long an accepted write-through may take to appear in the tenant before
    /// its host write is undone ([`writethrough::CONFIRM_WITHIN`] in production).
    pub write_through_confirm: Duration,
    /// This replica's address in the tenant's network (its Pod IP, `POD_IP` from the
    /// downward API): when the tenant reaches the webhook through a Service, the
    /// leader points the Service's EndpointSlice at it. Required for that form.
    pub pod_ip: Option<IpAddr>,
}

/// The running sync.
pub struct SyncHandle {
    shutdown: watch::Sender<bool>,
    task: JoinHandle<()>,
    leader: LeaderHandle,
    /// The resolved types, in plan order.
    pub resolved: Vec<ResolvedType>,
    /// The write-through webhook, when a toHost type is aggregated.
    pub webhook: Option<WebhookServer>,
    gates: Vec<Arc<Gate>>,
}

impl SyncHandle {
    /// Stops every syncer, waits for it, and hands the Lease on so a standby takes
    /// over at once.
    pub async fn stop(self) {
        let _ = self.shutdown.send(true);
        let _ = self.task.await;
        self.leader.release().await;
    }

    /// Stops at once without releasing the Lease, as a crashed process would: a
    /// standby takes over only when the Lease expires.
    pub fn crash(self) {
        self.task.abort();
        self.leader.abort();
    }

    /// Whether write-through answers on this replica: every toHost aggregated type's
    /// syncer has synced its caches (true when there is none).
    pub fn write_through_ready(&self) -> bool {
        self.gates.iter().all(|g| g.is_synced())
    }

    /// Whether this replica is syncing (it leads).
    pub fn is_leader(&self) -> bool {
        self.leader.is_leader()
    }
}

/// Connects to both clusters, resolves every type (failing with one line naming the
/// first type the host does not serve), then syncs while `options.leader` leads.
pub async fn start(options: SyncOptions) -> Result<SyncHandle, SyncError> {
    let host = options
        .host
        .kube_client()
        .map_err(SyncError::cluster("host"))?;
    let tenant = (options.tenant.kube_client()).map_err(SyncError::cluster("tenant"))?;
    let mut resolved = Vec::new();
    for resource in &options.plan.resources {
        let ty = crd::resolve(&host, &tenant, resource).await?;
        tracing::info!(
            resource = %resource.key,
            direction = resource.direction.as_str(),
            served_by = if ty.aggregated { "aggregated-apiserver" } else { "crd" },
            kind = %ty.api.kind,
            version = %ty.api.version,
            status_subresource = ty.status_subresource,
            "resolved synced type against the host"
        );
        options.metrics.resolved(
            &resource.key,
            resource.direction.as_str(),
            &ty.api.kind,
            &ty.api.version,
            ty.aggregated,
        );
        resolved.push(ty);
    }
    if resolved
        .iter()
        .any(|t| t.resource.direction == Direction::ToHost)
    {
        let namespace = &options.plan.host_namespace;
        ensure_namespace(&host, namespace)
            .await
            .map_err(SyncError::api(format!(
                "creating namespace {namespace} on the host"
            )))?;
    }
    let gates: HashMap<String, Arc<Gate>> = resolved
        .iter()
        .filter(|t| t.aggregated && t.resource.direction == Direction::ToHost)
        .map(|t| (t.resource.key.clone(), Gate::new()))
        .collect();
    let webhook = if gates.is_empty() {
        None
    } else {
        if matches!(
            options.plan.write_through.endpoint,
            WebhookEndpoint::Service { .. }
        ) && options.pod_ip.is_none()
        {
            return Err(SyncError::WriteThrough(
                "sync.writeThrough.service: the leader points the Service at its own Pod IP; set POD_IP from the downward API (deploy/ does)".into(),
            ));
        }
        let write_through = Arc::new(WriteThrough {
            tenant: options.plan.tenant.clone(),
            tenant_project: options.plan.tenant_project.clone(),
            host_namespace: options.plan.host_namespace.clone(),
            host: (options.host.kube_client_without_retries())
                .map_err(SyncError::cluster("host"))?,
            tenant_client: tenant.clone(),
            types: writethrough::types_by_resource(
                resolved
                    .iter()
                    .filter_map(|t| Some((t.clone(), Arc::clone(gates.get(&t.resource.key)?)))),
            ),
            metrics: Arc::clone(&options.metrics),
            in_flight: Arc::new(Semaphore::new(writethrough::MAX_IN_FLIGHT)),
            waiting: Arc::new(Semaphore::new(writethrough::MAX_WAITING)),
            timeout: writethrough::DECIDE_WITHIN,
            confirm_within: options.write_through_confirm,
        });
        let write_through_plan = &options.plan.write_through;
        let hosts: Vec<String> = write_through_plan
            .endpoint
            .server_name()
            .into_iter()
            .collect();
        let server = WebhookServer::start(write_through_plan.listen, &hosts, write_through)
            .await
            .map_err(|e| SyncError::WriteThrough(e.to_string()))?;
        tracing::info!(addr = %server.addr, "write-through webhook listening");
        Some(server)
    };
    let registration = webhook.as_ref().map(|w| {
        let types: Vec<ResolvedType> = resolved
            .iter()
            .filter(|t| gates.contains_key(&t.resource.key))
            .cloned()
            .collect();
        let client_config = writethrough::client_config(
            &options.plan.write_through.endpoint,
            w.addr,
            &w.review_path,
            &w.ca_pem,
        );
        writethrough::webhook_configuration(&options.plan.tenant, &client_config, &types)
    });
    if let Some(configuration) = &registration {
        // Before the generated types are used: without the configuration a tenant
        // write would skip the host's validation. Only created when missing, or
        // given the webhooks of types it lacks: the leader replaces it with its
        // own address once elected, and a replica starting later must not take
        // the leader's webhooks over.
        writethrough::register_if_missing(&tenant, configuration)
            .await
            .map_err(SyncError::api(
                "registering the write-through webhook in the tenant",
            ))?;
    }
    let handle_gates: Vec<Arc<Gate>> = gates.values().cloned().collect();
    let (shutdown, shutdown_rx) = watch::channel(false);
    let leader_endpoint = match (
        &options.plan.write_through.endpoint,
        options.pod_ip,
        &webhook,
    ) {
        (
            WebhookEndpoint::Service {
                namespace,
                name,
                port,
            },
            Some(ip),
            Some(server),
        ) => Some(LeaderEndpoint {
            namespace: namespace.clone(),
            name: name.clone(),
            service_port: *port,
            ip,
            listen_port: server.addr.port(),
        }),
        _ => None,
    };
    let supervisor = Supervisor {
        host,
        tenant,
        plan: options.plan,
        resolved: resolved.clone(),
        metrics: options.metrics,
        resync: options.resync,
        gates,
        registration,
        leader_endpoint,
    };
    let task = tokio::spawn(supervisor.run(options.leader.clone(), shutdown_rx));
    Ok(SyncHandle {
        shutdown,
        task,
        leader: options.leader,
        resolved,
        webhook,
        gates: handle_gates,
    })
}

/// How often a leader looks at its registration again.
const REGISTRATION_RECHECK: Duration = Duration::from_secs(15);

/// The pause before a leader's next try at its set-up (the webhook's registration,
/// the write-through Service's endpoint) after `failures` failed ones: 1 s
/// doubling to 30 s, so a set-up that cannot work (a Service without the
/// configured port) is not retried and logged every second of the term.
fn setup_retry_pause(failures: u32) -> Duration {
    crate::queue::doubling(Duration::from_secs(1), Duration::from_secs(30), failures)
}

/// While this replica leads: every [`REGISTRATION_RECHECK`], puts back the
/// leader's registration, or webhooks of it, that someone removed or changed
/// (another replica's cleanup, an administrator). Webhooks it does not have are
/// left (a starting replica's of a newly synced type). Failures are logged and
/// looked at again at the next recheck.
async fn keep_registered(tenant: &kube::Client, configuration: &serde_json::Value) {
    loop {
        tokio::time::sleep(REGISTRATION_RECHECK).await;
        if let Err(e) = writethrough::keep_leaders_registration(tenant, configuration).await {
            tracing::warn!(error = %e, "checking the write-through webhook's registration in the tenant failed; retrying");
        }
    }
}

/// Who decides that the write-through registration goes.
pub(crate) enum Retirer {
    /// The sync's leader, whose configuration writes no type through.
    Leader,
    /// A replica that runs no sync (no entry enabled, or no `sync` section): only
    /// when no replica leads the sync. While one leads (during a rolling update
    /// from a configuration that synced, an old replica may), the registration
    /// is its to keep or remove; once none does, nothing else would remove it.
    WhileNoneLeads(Box<SyncLease>),
}

/// The sync's Lease, and what a replica that runs no sync saw of it.
pub(crate) struct SyncLease {
    leases: Api<DynamicObject>,
    name: String,
    /// Judged as a standby elector judges whether the Lease is held.
    observer: LeaseObserver,
    /// A Lease that names no duration of its own lasts this long.
    lease_duration: Duration,
}

impl SyncLease {
    /// Whether some replica leads the sync, by a read of its Lease now.
    async fn someone_leads(&mut self) -> Result<bool, kube::Error> {
        let found = self.leases.get_opt(&self.name).await?;
        let lease = found.as_ref().map(|l| &l.data);
        let now = Instant::now();
        self.observer.observe(lease, now);
        Ok(self
            .observer
            .live_holder(self.lease_duration, now)
            .is_some())
    }
}

impl Retirer {
    /// For a replica that runs no sync, of tenant `tenant_name`, whose leases
    /// last `lease_duration`.
    pub(crate) fn while_none_leads(
        tenant: &kube::Client,
        tenant_name: &str,
        lease_duration: Duration,
    ) -> Retirer {
        let leases = ApiResource::from_gvk_with_plural(
            &kube::core::GroupVersionKind::gvk("coordination.k8s.io", "v1", "Lease"),
            "leases",
        );
        Retirer::WhileNoneLeads(Box::new(SyncLease {
            leases: Api::namespaced_with(
                tenant.clone(),
                crproxy_core::names::LEASE_NAMESPACE,
                &leases,
            ),
            name: crproxy_core::names::sync_lease_name(tenant_name),
            observer: LeaseObserver::default(),
            lease_duration,
        }))
    }

    /// Whether the registration may go now.
    async fn may_retire(&mut self) -> Result<bool, kube::Error> {
        match self {
            Retirer::Leader => Ok(true),
            Retirer::WhileNoneLeads(lease) => Ok(!lease.someone_leads().await?),
        }
    }
}

/// Keeps the write-through registration of tenant `tenant_name` removed, as
/// `retirer` may: looks every `every`, reads the registration before it judges
/// and deletes it as read (one written after the judgement is a newer version,
/// which the pinned delete leaves, and a leader re-checks its own). A left
/// registration refuses every tenant write of the types it names. Failures are
/// logged (at warn when `warn`: a sync is configured) and looked at again; a
/// tenant that forbids it is said once and looked at every 5 minutes (rights may
/// come later, a RoleBinding applied after the Pod). Runs until aborted.
pub(crate) async fn keep_retired(
    tenant: &kube::Client,
    tenant_name: &str,
    every: Duration,
    mut retirer: Retirer,
    warn: bool,
) {
    let configuration = writethrough::configuration_name(tenant_name);
    let mut told_forbidden = false;
    loop {
        let checked = match writethrough::registration(tenant, tenant_name).await {
            Ok(None) => Ok(false),
            Ok(Some(current)) => match retirer.may_retire().await {
                Ok(true) => writethrough::retire_read(tenant, &current).await,
                other => other.map(|_| false),
            },
            Err(e) => Err(e),
        };
        let mut pause = every;
        match checked {
            Ok(true) => {
                tracing::info!(configuration = %configuration, "removed the write-through webhook from the tenant: no aggregated toHost type is synced");
            }
            Ok(false) => {}
            Err(e) if to_host::is_code(&e, 401) || to_host::is_code(&e, 403) => {
                if warn && !told_forbidden {
                    tracing::warn!(error = %e, configuration = %configuration, "cannot check the tenant for a write-through webhook; one left behind refuses tenant writes of the types it names until it is deleted");
                } else {
                    tracing::debug!(error = %e, configuration = %configuration, "cannot check the tenant for a write-through webhook");
                }
                told_forbidden = true;
                pause = pause.max(FORBIDDEN_PAUSE);
            }
            Err(e) if warn => {
                tracing::warn!(error = %e, configuration = %configuration, "checking the tenant for a write-through webhook failed; retrying");
            }
            Err(e) => {
                tracing::debug!(error = %e, configuration = %configuration, "checking the tenant for a write-through webhook failed; retrying");
            }
        }
        tokio::time::sleep(pause).await;
    }
}

/// How long a replica waits before looking again at a tenant that forbade it.
const FORBIDDEN_PAUSE: Duration = Duration::from_secs(300);

/// Creates namespace `name` unless it exists.
pub(crate) async fn ensure_namespace(client: &kube::Client, name: &str) -> Result<(), kube::Error> {
    let namespaces = ApiResource::from_gvk_with_plural(
        &kube::core::GroupVersionKind::gvk("", "v1", "Namespace"),
        "namespaces",
    );
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &namespaces);
    if api.get_opt(name).await?.is_some() {
        return Ok(());
    }
    match api
        .create(
            &PostParams::default(),
            &DynamicObject::new(name, &namespaces),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if to_host::is_code(&e, 409) => Ok(()),
        Err(e) => Err(e),
    }
}

struct Supervisor {
    host: kube::Client,
    tenant: kube::Client,
    plan: SyncPlan,
    resolved: Vec<ResolvedType>,
    metrics: Arc<SyncMetrics>,
    resync: Duration,
    /// By resource key: the write-through gates of toHost aggregated types.
    gates: HashMap<String, Arc<Gate>>,
    /// The ValidatingWebhookConfiguration the leader keeps registered; `None`
    /// when no type is written through, and the leader removes any left behind.
    registration: Option<serde_json::Value>,
    /// With a Service as the way in: where the leader points it.
    leader_endpoint: Option<LeaderEndpoint>,
}

/// The write-through Service and this replica's address behind it.
#[derive(Clone)]
struct LeaderEndpoint {
    namespace: String,
    name: String,
    service_port: u16,
    ip: IpAddr,
    listen_port: u16,
}

impl LeaderEndpoint {
    /// How long a stopping leader tries to take itself out of the Service: a stop
    /// must not hang on an unreachable tenant API server.
    const WITHDRAW_TIMEOUT: Duration = Duration::from_secs(5);

    /// Best effort: a failure only means reviews keep going to this replica (and
    /// fail there) until the next leader points the Service at itself.
    async fn withdraw(&self, tenant: &kube::Client) {
        let withdrawn = tokio::time::timeout(
            Self::WITHDRAW_TIMEOUT,
            writethrough::withdraw_leader_endpoint(
                tenant,
                &self.namespace,
                &self.name,
                self.ip,
                self.listen_port,
            ),
        )
        .await;
        let service = format!("{}/{}", self.namespace, self.name);
        match withdrawn {
            Ok(Ok(true)) => {
                tracing::info!(service = %service, "the write-through Service no longer leads to this replica")
            }
            Ok(Ok(false)) => {}
            Ok(Err(error)) => {
                tracing::warn!(error = %error, service = %service, "taking this replica out of the write-through Service failed")
            }
            Err(_) => {
                tracing::warn!(service = %service, "taking this replica out of the write-through Service timed out")
            }
        }
    }
}

/// How the registration of the write-through webhook by a new leader ended.
enum Registration {
    Done,
    /// Leadership went first: another replica registers its own.
    LostLeadership,
    ShuttingDown,
}

impl Supervisor {
    async fn run(self, leader: LeaderHandle, shutdown: watch::Receiver<bool>) {
        // The handle is held for as long as the supervisor runs: dropping the last
        // clone would end the election.
        self.lead_while(leader.changes(), shutdown).await;
        drop(leader);
    }

    /// Runs the syncers while `changes` says this replica leads, until `shutdown`
    /// or until the election ends.
    async fn lead_while(self, mut changes: LeadershipChanges, mut shutdown: watch::Receiver<bool>) {
        loop {
            // Wait to lead (or to stop). An ended election closes the channel at
            // "not leading" (crproxy_wiring::Leadership), which ends this wait.
            tokio::select! {
                r = changes.wait_until(true) => if r.is_err() { return },
                _ = shutdown.wait_for(|s| *s) => return,
            }
            tracing::info!(types = self.resolved.len(), "elected: starting syncers");
            // 1 until this term ends, whichever way (lost during the registration,
            // a shutdown, this task aborted).
            let leading = self.metrics.leading();
            // Registered or removed only while this replica leads: a replica that
            // lost the Lease while the tenant was out of its reach would otherwise
            // overwrite (or remove) the new leader's registration once the tenant
            // answered again.
            // The task that keeps the registration as this term wants it.
            let keeping: AbortOnDrop;
            if let Some(configuration) = &self.registration {
                // Until it is registered, tenant writes of the types are not
                // written through.
                let registration = tokio::select! {
                    done = self.register_webhook(configuration, &mut shutdown) => done,
                    // Leadership lost, or the election ended.
                    _ = changes.wait_until(false) => Registration::LostLeadership,
                };
                match registration {
                    Registration::Done => {}
                    Registration::ShuttingDown => return,
                    Registration::LostLeadership => {
                        tracing::info!("lost leadership before the write-through webhook was registered: syncers not started");
                        continue;
                    }
                }
                // Looked at again while this replica leads, and made whole if a
                // webhook (or the registration) went missing: a replica that
                // judged the Lease free just before this term began may have
                // deleted it.
                let (tenant, configuration) = (self.tenant.clone(), configuration.clone());
                keeping = AbortOnDrop(tokio::spawn(async move {
                    keep_registered(&tenant, &configuration).await;
                }));
            } else {
                // No type is written through: a configuration an earlier
                // configuration's leader registered would refuse every tenant
                // write of its types. Its removal holds up no syncer.
                let (tenant, name) = (self.tenant.clone(), self.plan.tenant.clone());
                keeping = AbortOnDrop(tokio::spawn(async move {
                    keep_retired(&tenant, &name, REGISTRATION_RECHECK, Retirer::Leader, true).await;
                }));
            }
            // Published only once the registration carries this replica's CA, so the
            // Service never leads to a replica the tenant would not trust. The syncers
            // start meanwhile; until their caches sync the answer is 503.
            let publishing = self.leader_endpoint.clone().map(|e| {
                let tenant = self.tenant.clone();
                AbortOnDrop(tokio::spawn(async move {
                    let mut attempt = 0u32;
                    while let Err(err) = writethrough::publish_leader_endpoint(
                        &tenant, &e.namespace, &e.name, e.service_port, e.ip, e.listen_port,
                    )
                    .await
                    {
                        tracing::warn!(error = %err, attempt = attempt + 1, service = %e.name, "pointing the write-through Service at this replica failed; retrying");
                        tokio::time::sleep(setup_retry_pause(attempt)).await;
                        attempt += 1;
                    }
                    tracing::info!(service = %format!("{}/{}", e.namespace, e.name), address = %e.ip, port = e.listen_port, "the write-through Service now leads to this replica");
                }))
            });
            let tasks: Vec<AbortOnDrop> = self
                .resolved
                .iter()
                .map(|ty| AbortOnDrop(self.spawn_syncer(ty)))
                .collect();
            let stop = tokio::select! {
                // Leadership lost, or the election ended.
                _ = changes.wait_until(false) => false,
                _ = shutdown.wait_for(|s| *s) => true,
            };
            // Not the leader from here on: another replica may already be, and the
            // endpoint's withdrawal below takes up to 5 s.
            drop(leading);
            // Write-through closes first (new reviews get 503): a review accepted
            // from here on would be confirmed against a cache that no longer moves
            // once its syncer stops, and withdrawing the endpoint takes up to 5 s.
            for gate in self.gates.values() {
                gate.close();
            }
            // Dropping aborts every syncer (and, through theirs, their watchers and
            // workers), also when this task itself is aborted.
            drop(tasks);
            drop(publishing);
            drop(keeping);
            if let Some(endpoint) = &self.leader_endpoint {
                endpoint.withdraw(&self.tenant).await;
            }
            if stop {
                return;
            }
            tracing::info!("lost leadership: syncers stopped");
        }
    }

    /// Registers the write-through webhook in the tenant, retrying
    /// ([`setup_retry_pause`]) until it is registered or `shutdown` says stop.
    async fn register_webhook(
        &self,
        configuration: &serde_json::Value,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Registration {
        let mut attempt = 0u32;
        while let Err(e) = writethrough::register(&self.tenant, configuration).await {
            tracing::warn!(error = %e, attempt = attempt + 1, "registering the write-through webhook in the tenant failed; retrying");
            let pause = setup_retry_pause(attempt);
            attempt += 1;
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = shutdown.wait_for(|s| *s) => return Registration::ShuttingDown,
            }
        }
        Registration::Done
    }

    fn spawn_syncer(&self, ty: &ResolvedType) -> JoinHandle<()> {
        let metrics = Arc::clone(&self.metrics);
        match ty.resource.direction {
            Direction::ToHost => {
                let (tenant_store, tenant_writer) = store(&ty.api);
                let (host_store, host_writer) = store(&ty.api);
                let r = Arc::new(ToHost {
                    ty: ty.clone(),
                    tenant: self.plan.tenant.clone(),
                    tenant_project: self.plan.tenant_project.clone(),
                    host_namespace: self.plan.host_namespace.clone(),
                    tenant_client: self.tenant.clone(),
                    host_client: self.host.clone(),
                    tenant_store,
                    host_store,
                    metrics,
                    gate: self.gates.get(&ty.resource.key).map(Gate::open_term),
                    observed_host_deletes: Default::default(),
                    last_writes: Default::default(),
                });
                let tenant_api = Api::all_with(self.tenant.clone(), &ty.api);
                let host_api =
                    Api::namespaced_with(self.host.clone(), &self.plan.host_namespace, &ty.api);
                let host_config =
                    watcher::Config::default().labels(&to_host::host_selector(&self.plan.tenant));
                let watches = vec![
                    (
                        tenant_api,
                        watcher::Config::default(),
                        tenant_writer,
                        Side::Tenant,
                    ),
                    (host_api, host_config, host_writer, Side::Host),
                ];
                let stores = vec![r.tenant_store.clone(), r.host_store.clone()];
                tokio::spawn(drive(r, watches, stores, self.resync))
            }
            Direction::FromHost => {
                let (tenant_store, tenant_writer) = store(&ty.api);
                let tenant_api = Api::all_with(self.tenant.clone(), &ty.api);
                let mut watches = vec![(
                    tenant_api,
                    watcher::Config::default(),
                    tenant_writer,
                    Side::Tenant,
                )];
                let mut stores = vec![tenant_store.clone()];
                let mut host_stores = Vec::new();
                for namespace in FromHost::host_namespaces(&ty.resource) {
                    let (s, w) = store(&ty.api);
                    let api = match &namespace {
                        Some(ns) => Api::namespaced_with(self.host.clone(), ns, &ty.api),
                        None => Api::all_with(self.host.clone(), &ty.api),
                    };
                    watches.push((api, watcher::Config::default(), w, Side::Host));
                    stores.push(s.clone());
                    host_stores.push((namespace, s));
                }
                let r = Arc::new(FromHost {
                    ty: ty.clone(),
                    tenant_client: self.tenant.clone(),
                    host_client: self.host.clone(),
                    tenant_store,
                    host_stores,
                    metrics,
                });
                tokio::spawn(drive(r, watches, stores, self.resync))
            }
        }
    }
}

fn store(api: &ApiResource) -> (Store<DynamicObject>, Writer<DynamicObject>) {
    let writer = Writer::new(api.clone());
    (writer.as_reader(), writer)
}

type Watch = (
    Api<DynamicObject>,
    watcher::Config,
    Writer<DynamicObject>,
    Side,
);

/// Runs one syncer until aborted: reflectors feed the queue, workers drain it.
async fn drive<R: Reconciler>(
    r: Arc<R>,
    watches: Vec<Watch>,
    stores: Vec<Store<DynamicObject>>,
    resync: Duration,
) {
    let queue: Arc<WorkQueue<Key>> = WorkQueue::new();
    let mut tasks = Vec::new();
    for (api, config, writer, side) in watches {
        let r = Arc::clone(&r);
        let queue = Arc::clone(&queue);
        tasks.push(AbortOnDrop(tokio::spawn(async move {
            let stream = reflector::reflector(writer, watcher::watcher(api, config)).default_backoff();
            futures_util::pin_mut!(stream);
            while let Some(event) = stream.next().await {
                match (side, &event) {
                    (Side::Host, Ok(Event::Delete(o))) => r.host_deleted(o),
                    (Side::Host, Ok(Event::Apply(o) | Event::InitApply(o))) => r.host_seen(o),
                    _ => {}
                }
                let key_of = |o: &DynamicObject| match side {
                    Side::Tenant => r.key_of_tenant(o),
                    Side::Host => r.key_of_host(o),
                };
                match event {
                    // A change: handled at once, even by a key backing off (the change
                    // may be the fix it waits for).
                    Ok(Event::Apply(o) | Event::Delete(o)) => {
                        if let Some(key) = key_of(&o) {
                            queue.add(key);
                        }
                    }
                    // A relist reports what is there, changed or not: a key backing off
                    // keeps waiting for its retry.
                    Ok(Event::InitApply(o)) => {
                        if let Some(key) = key_of(&o) {
                            queue.resync(key);
                        }
                    }
                    // A relist may have dropped objects deleted meanwhile without an
                    // event: look at everything again.
                    Ok(Event::InitDone) => {
                        for key in r.all_keys() {
                            queue.resync(key);
                        }
                    }
                    Ok(Event::Init) => {}
                    Err(e) => {
                        let ty = r.resource();
                        tracing::warn!(resource = %ty.resource.key, direction = ty.direction(), error = %e, "watch failed; retrying");
                    }
                }
            }
        })));
    }
    for s in &stores {
        if s.wait_until_ready().await.is_err() {
            return;
        }
    }
    let ty = r.resource().clone();
    tracing::info!(resource = %ty.resource.key, direction = ty.direction(), "caches synced; syncing");
    r.caches_synced();
    for key in r.all_keys() {
        queue.add(key);
    }
    for _ in 0..WORKERS {
        let r = Arc::clone(&r);
        let queue = Arc::clone(&queue);
        tasks.push(AbortOnDrop(tokio::spawn(async move {
            let ty = r.resource().clone();
            let metrics_key = ty.resource.key.clone();
            loop {
                let (key, since) = queue.next().await;
                let metrics = Arc::clone(r.metrics());
                let result = tokio::time::timeout(STEP_TIMEOUT, r.reconcile(&key))
                    .await
                    .unwrap_or(Err(StepError::Stalled(STEP_TIMEOUT)));
                if result.is_ok() {
                    // The step worked: a failure of a later one starts the backoff over.
                    queue.forget(&key);
                }
                match result {
                    Ok(Outcome::Done) => {
                        metrics.converged(&metrics_key, ty.direction(), since.elapsed().as_secs_f64());
                    }
                    Ok(Outcome::Requeue(after)) => {
                        queue.add_after(key.clone(), after, since);
                    }
                    Err(e) => {
                        metrics.error(&metrics_key, ty.direction(), e.reason());
                        let delay = queue.retry_failed(key.clone(), e.min_retry_after(), since);
                        if !matches!(e, StepError::Foreign) {
                            tracing::warn!(resource = %metrics_key, direction = ty.direction(), object = %format!("{}/{}", key.namespace, key.name), reason = e.reason(), error = %e, retry_in = ?delay, "sync failed; retrying");
                        }
                    }
                }
                queue.done(&key);
                metrics.queue_depth(&metrics_key, ty.direction(), queue.depth());
            }
        })));
    }
    loop {
        tokio::time::sleep(resync).await;
        for key in r.all_keys() {
            queue.resync(key);
        }
    }
}

/// Aborts the task when dropped, so aborting [`drive`] ends its watchers and workers.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests;
