//! The supervisor's hand-over, against clusters that are not there: a tenant that
//! accepts connections and never answers (or answers every request with a 500), a
//! host that refuses them.

use super::*;
use crate::fake_api::{gateways_type, silent_api, unreachable_api, FakeApi};
use crproxy_core::config::sync::WriteThroughPlan;
use crproxy_core::status::status;
use crproxy_wiring::Leadership;
use serde_json::{json, Value};

fn leading(metrics: &SyncMetrics) -> bool {
    metrics
        .exposition()
        .lines()
        .any(|l| l == "vcluster_syncer_leader 1")
}

/// Waits (at most `limit`) for the supervisor task to end once its election has
/// ended, and for it to have ended without a panic.
async fn ends_with_the_election(task: tokio::task::JoinHandle<()>, limit: Duration) {
    tokio::time::timeout(limit, task)
        .await
        .expect("the supervisor ends with the election")
        .expect("the supervisor ran to its end");
}

/// A supervisor of no types with `tenant` as its tenant cluster (the host refuses
/// connections), no webhook to register and no Service to point; tests set what
/// they need.
fn supervisor(tenant: kube::Client, metrics: &Arc<SyncMetrics>) -> Supervisor {
    Supervisor {
        host: unreachable_api(),
        tenant,
        plan: SyncPlan {
            tenant: "client".into(),
            tenant_project: "default".into(),
            host_namespace: "vcluster-client".into(),
            resources: vec![],
            write_through: WriteThroughPlan {
                listen: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
                endpoint: WebhookEndpoint::Service {
                    namespace: "kube-system".into(),
                    name: "crproxy-writethrough".into(),
                    port: 443,
                },
            },
        },
        resolved: vec![],
        metrics: Arc::clone(metrics),
        resync: DEFAULT_RESYNC,
        gates: HashMap::new(),
        registration: None,
        leader_endpoint: None,
    }
}

/// A write-through webhook configuration for a supervisor to register.
fn webhook_configuration() -> serde_json::Value {
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "crproxy-writethrough-client"},
        "webhooks": [],
    })
}

/// Whether `condition` holds within `limit` (polled every 20 ms).
async fn within(limit: Duration, condition: impl Fn() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    while !condition() {
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    true
}

/// A leader that stops closes write-through at once: a review arriving while it
/// takes itself out of the Service (up to 5 s against a tenant that does not answer)
/// gets 503 instead of being accepted by a replica whose syncers are stopping, whose
/// frozen cache could then never confirm it. Its leader gauge falls at once too.
#[tokio::test]
async fn a_stopping_leader_closes_write_through_before_it_withdraws_its_endpoint() {
    let gate = Gate::new();
    let metrics = SyncMetrics::new();
    let mut supervisor = supervisor(silent_api().await, &metrics);
    supervisor.gates = HashMap::from([("gateways.example.net/v1".to_owned(), Arc::clone(&gate))]);
    supervisor.leader_endpoint = Some(LeaderEndpoint {
        namespace: "kube-system".into(),
        name: "crproxy-writethrough".into(),
        service_port: 443,
        ip: IpAddr::from([127, 0, 0, 1]),
        listen_port: 9443,
    });
    let (shutdown, shutdown_rx) = watch::channel(false);
    let _task = AbortOnDrop(tokio::spawn(
        supervisor.run(LeaderHandle::fixed(true), shutdown_rx),
    ));
    assert!(
        within(Duration::from_secs(2), || leading(&metrics)).await,
        "the supervisor never started leading"
    );
    // As the syncer does once its caches are synced.
    gate.open_term().caches_synced(
        store(&ApiResource::from_gvk_with_plural(
            &kube::core::GroupVersionKind::gvk("example.net", "v1", "Gateway"),
            "gateways",
        ))
        .0,
    );
    assert!(gate.is_synced());

    shutdown.send(true).expect("the supervisor listens");
    assert!(
        within(Duration::from_secs(1), || !gate.is_synced()).await,
        "write-through still answered 1 s after the stop (while withdrawing the endpoint)"
    );
    // Nor is it counted as the leader meanwhile: another replica may lead by now.
    assert!(
        within(Duration::from_secs(1), || !leading(&metrics)).await,
        "still counted as the leader 1 s after the stop (while withdrawing the endpoint)"
    );
}

/// A replica whose tenant refuses the write-through webhook's registration keeps
/// retrying only while it leads: once another replica has the Lease, a late
/// success would overwrite the new leader's registration (its CA and address),
/// and every tenant write of the types would fail review.
#[tokio::test]
async fn a_replica_that_lost_leadership_stops_registering_its_webhook() {
    let tenant =
        FakeApi::start(|_, _, _| (500, status(500, "InternalError", "etcd is away"))).await;
    let metrics = SyncMetrics::new();
    let mut supervisor = supervisor(tenant.client.clone(), &metrics);
    supervisor.registration = Some(webhook_configuration());
    let (lead, changes) = Leadership::channel(false);
    let (_shutdown, shutdown_rx) = watch::channel(false);
    let _task = AbortOnDrop(tokio::spawn(supervisor.lead_while(changes, shutdown_rx)));

    lead.set(true);
    assert!(
        within(Duration::from_secs(5), || tenant.received().len() >= 2).await,
        "no retried registration: {:?}",
        tenant.received()
    );
    lead.set(false);
    assert!(
        within(Duration::from_secs(2), || !leading(&metrics)).await,
        "still leading while its registration kept failing"
    );
    let attempts = tenant.received().len();
    // Past two retry intervals.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(
        tenant.received().len(),
        attempts,
        "registered again after losing leadership: {:?}",
        tenant.received()
    );
}

/// An election that ends (its channel closed, as a stop closes it) while the
/// webhook's registration keeps failing ends the supervisor; it does not take the
/// ended election for a lost leadership and start over at once, again and again.
#[tokio::test]
async fn an_election_that_ends_during_the_registration_ends_the_supervisor() {
    let tenant = FakeApi::start(|_, _, _| (500, json!({"kind": "Status", "code": 500}))).await;
    let metrics = SyncMetrics::new();
    let mut supervisor = supervisor(tenant.client.clone(), &metrics);
    supervisor.registration = Some(webhook_configuration());
    let (lead, changes) = Leadership::channel(true);
    let (_shutdown, shutdown_rx) = watch::channel(false);
    let task = tokio::spawn(supervisor.lead_while(changes, shutdown_rx));
    assert!(
        within(Duration::from_secs(5), || !tenant.received().is_empty()).await,
        "no registration attempt"
    );
    drop(lead);
    ends_with_the_election(task, Duration::from_secs(2)).await;
}

/// A supervisor (no types, a tenant that never answers) whose replica leads, once
/// it counts as the leader: the leadership's sender and the supervisor's task.
async fn leading_supervisor(
    metrics: &Arc<SyncMetrics>,
) -> (Leadership, tokio::task::JoinHandle<()>) {
    let supervisor = supervisor(silent_api().await, metrics);
    let (lead, changes) = Leadership::channel(true);
    // Never stopped: the supervisor's task ends with its leadership.
    let (shutdown, shutdown_rx) = watch::channel(false);
    let task = tokio::spawn(async move {
        supervisor.lead_while(changes, shutdown_rx).await;
        drop(shutdown);
    });
    assert!(
        within(Duration::from_secs(2), || leading(metrics)).await,
        "the supervisor never started leading"
    );
    (lead, task)
}

/// The same once the syncers run: an election that ends while this replica leads
/// ends the supervisor, which stops leading.
#[tokio::test]
async fn an_election_that_ends_while_leading_ends_the_supervisor() {
    let metrics = SyncMetrics::new();
    let (lead, task) = leading_supervisor(&metrics).await;
    drop(lead);
    ends_with_the_election(task, Duration::from_secs(2)).await;
    assert!(!leading(&metrics), "still counted as leading");
}

/// A supervisor task aborted while it leads (its runtime shutting down, say)
/// stops counting as the leader.
#[tokio::test]
async fn an_aborted_supervisor_stops_counting_as_leader() {
    let metrics = SyncMetrics::new();
    let (_lead, task) = leading_supervisor(&metrics).await;
    task.abort();
    assert!(task.await.is_err_and(|e| e.is_cancelled()), "not aborted");
    assert!(!leading(&metrics), "still counted as leading");
}

/// A reconciler of one key that answers from a script (then `Done`) and records
/// when each attempt was made.
struct Scripted {
    ty: ResolvedType,
    metrics: Arc<SyncMetrics>,
    script: std::sync::Mutex<std::collections::VecDeque<Result<Outcome, u16>>>,
    attempts: std::sync::Mutex<Vec<tokio::time::Instant>>,
}

impl Scripted {
    fn new(script: Vec<Result<Outcome, u16>>) -> Arc<Scripted> {
        Arc::new(Scripted {
            ty: gateways_type(false),
            metrics: SyncMetrics::new(),
            script: std::sync::Mutex::new(script.into()),
            attempts: Default::default(),
        })
    }

    fn attempts(&self) -> Vec<tokio::time::Instant> {
        self.attempts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

fn the_key() -> Key {
    Key {
        namespace: "team".into(),
        name: "edge".into(),
    }
}

impl Reconciler for Scripted {
    fn resource(&self) -> &ResolvedType {
        &self.ty
    }
    fn metrics(&self) -> &Arc<SyncMetrics> {
        &self.metrics
    }
    fn key_of_tenant(&self, _: &DynamicObject) -> Option<Key> {
        Some(the_key())
    }
    fn key_of_host(&self, _: &DynamicObject) -> Option<Key> {
        Some(the_key())
    }
    fn all_keys(&self) -> std::collections::BTreeSet<Key> {
        [the_key()].into()
    }
    async fn reconcile(&self, _: &Key) -> Result<Outcome, StepError> {
        self.attempts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(tokio::time::Instant::now());
        let next = self
            .script
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop_front();
        match next {
            Some(Err(NEVER_ANSWERS)) => std::future::pending().await,
            None | Some(Ok(Outcome::Done)) => Ok(Outcome::Done),
            Some(Ok(other)) => Ok(other),
            Some(Err(code)) => Err(StepError::Api(kube::Error::Api(Box::new(
                kube::core::Status::failure("refused", "Forbidden").with_code(code),
            )))),
        }
    }
}

/// A [`Scripted`] step that never finishes, as against a server that took the
/// request and went quiet.
const NEVER_ANSWERS: u16 = 0;

/// A step that never finishes gives its worker back after the step timeout and
/// is retried as a failure, counted as the host being unavailable.
#[tokio::test(start_paused = true)]
async fn a_step_without_an_answer_fails_after_the_step_timeout_and_is_retried() {
    let r = Scripted::new(vec![Err(NEVER_ANSWERS), Ok(Outcome::Done)]);
    let resync = Duration::from_secs(1000);
    let _syncer = AbortOnDrop(tokio::spawn(drive(Arc::clone(&r), vec![], vec![], resync)));
    // Paused time: the runtime jumps from timer to timer.
    for _ in 0..10 {
        if r.attempts().len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_secs(30)).await;
    }
    let attempts = r.attempts();
    assert_eq!(attempts.len(), 2, "attempts: {:?}", gaps_ms(&attempts));
    assert_eq!(
        attempts[1] - attempts[0],
        STEP_TIMEOUT + Duration::from_millis(5),
        "retried 5 ms after the step timed out"
    );
    let errors = r.metrics.exposition();
    assert!(
        errors.contains("vcluster_syncer_errors_total{")
            && errors.contains("reason=\"unavailable\""),
        "{errors}"
    );
}

/// The gaps between consecutive attempts, in milliseconds.
fn gaps_ms(attempts: &[tokio::time::Instant]) -> Vec<u128> {
    attempts
        .windows(2)
        .map(|w| (w[1] - w[0]).as_millis())
        .collect()
}

/// A key that keeps failing (a host-wide 403) is retried with growing delays, as
/// client-go's rate-limited queue does (5 ms doubling), not every 2 s; a success
/// resets it, so the next failure is retried after 5 ms again.
#[tokio::test(start_paused = true)]
async fn a_failing_key_backs_off_exponentially_and_a_success_resets_it() {
    let resync = Duration::from_secs(1000);
    let r = Scripted::new(vec![
        Err(403),
        Err(403),
        Err(422),
        Err(403),
        Err(403),
        Err(403),
        Ok(Outcome::Done),
        // After the resync looked at it again:
        Err(403),
        Err(403),
        Ok(Outcome::Done),
    ]);
    let _syncer = AbortOnDrop(tokio::spawn(drive(Arc::clone(&r), vec![], vec![], resync)));
    // Paused time: the runtime jumps from timer to timer; 10 attempts at most.
    for _ in 0..40 {
        if r.attempts().len() >= 10 {
            break;
        }
        tokio::time::sleep(Duration::from_secs(60)).await;
    }
    let attempts = r.attempts();
    assert_eq!(attempts.len(), 10, "attempts: {:?}", gaps_ms(&attempts));
    let gaps = gaps_ms(&attempts);
    assert_eq!(
        gaps[..6],
        [5, 10, 20, 40, 80, 160],
        "growing retry delays after each failure: {gaps:?}"
    );
    assert_eq!(attempts[7] - attempts[0], resync, "the resync looked again");
    assert_eq!(
        gaps[7..],
        [5, 10],
        "the success reset the backoff: {gaps:?}"
    );
}

#[test]
fn a_stand_in_stops_a_step_only_while_its_source_exists() {
    use crproxy_core::deep_objects::{TOO_DEEP_ANNOTATION, TOO_DEEP_REASON};
    let whole = Some(serde_json::json!({"metadata": {"name": "a", "annotations": {"x": "y"}}}));
    let stand_in = Some(serde_json::json!({"metadata": {"name": "a",
        "annotations": {TOO_DEEP_ANNOTATION: TOO_DEEP_REASON}}}));
    let reason = |r: Result<(), StepError>| r.map_err(|e| (e.reason(), e.to_string()));
    assert_eq!(
        reason(too_deep(("tenant", &whole), ("host", &whole))),
        Ok(())
    );
    assert_eq!(
        reason(too_deep(("tenant", &whole), ("host", &None))),
        Ok(())
    );
    for (source, counterpart, side) in [
        (&stand_in, &None, "tenant"),
        (&stand_in, &whole, "tenant"),
        (&whole, &stand_in, "host"),
    ] {
        let refused = reason(too_deep(("tenant", source), ("host", counterpart)));
        let Err((code, message)) = refused else {
            panic!("a step on a stand-in went ahead");
        };
        assert_eq!(code, "too_deep");
        assert!(
            message.starts_with(&format!("the {side} object nests deeper than 125 levels")),
            "{message}"
        );
    }
    // A counterpart left without its source is deleted on its metadata alone.
    assert_eq!(
        reason(too_deep(("tenant", &None), ("host", &stand_in))),
        Ok(())
    );
}

/// A replica that runs no sync reads the sync's Lease to tell whether a replica
/// leads: one with a holder does, a released or missing one does not. (How long
/// a record may stand still is the elector's observer's, tested there.)
#[tokio::test]
async fn the_sync_is_led_while_its_lease_has_a_holder() {
    for (holder, leads) in [(Some("a"), true), (Some(""), false), (None, false)] {
        let api = FakeApi::start(move |method: &http::Method, path: &str, _: &Value| {
            match (method, holder) {
                (&http::Method::GET, Some(holder))
                    if path.ends_with("/namespaces/kube-system/leases/crproxy-sync-client") =>
                {
                    (
                        200,
                        json!({
                            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                            "metadata": {"name": "crproxy-sync-client", "namespace": "kube-system"},
                            "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15},
                        }),
                    )
                }
                _ => crate::fake_api::not_found(),
            }
        })
        .await;
        let Retirer::WhileNoneLeads(mut lease) =
            Retirer::while_none_leads(&api.client, "client", Duration::from_secs(15))
        else {
            panic!("a retirer that reads the Lease");
        };
        let led = lease.someone_leads().await.expect("the Lease read");
        assert_eq!(led, leads, "holder {holder:?}");
        assert_eq!(api.received().len(), 1, "one read");
    }
}

/// A leader's failing set-up step is retried 1 s, 2 s, 4 s ... apart, at most 30 s.
#[test]
fn a_failing_set_up_is_retried_less_and_less_often() {
    let pauses: Vec<u64> = (0..8).map(|n| setup_retry_pause(n).as_secs()).collect();
    assert_eq!(pauses, [1, 2, 4, 8, 16, 30, 30, 30]);
    assert_eq!(setup_retry_pause(u32::MAX), Duration::from_secs(30));
}
