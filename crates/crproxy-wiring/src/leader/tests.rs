//! The election state machine against an in-memory Lease store with kube's optimistic
//! concurrency, under paused tokio time.

use super::*;
use std::sync::atomic::{AtomicBool, Ordering};

const SECOND: Duration = Duration::from_secs(1);

#[derive(Default)]
struct Store {
    lease: Option<Value>,
    rv: u64,
    /// `who op outcome` for every write.
    writes: Vec<String>,
}

/// One replica's view of the shared store; `cut` simulates a partition of that replica.
#[derive(Clone)]
struct View {
    who: &'static str,
    store: Arc<Mutex<Store>>,
    cut: Arc<AtomicBool>,
    /// Time a GET spends in flight before the store reads the object (a slow link).
    read_delay: Duration,
}

fn api(status: u16, reason: &str) -> Error {
    Error::Api {
        status,
        reason: reason.to_owned(),
        message: reason.to_owned(),
        body: Value::Null,
    }
}

impl View {
    fn check_cut(&self) -> Result<(), Error> {
        if self.cut.load(Ordering::SeqCst) {
            return Err(Error::Transport("partitioned".into()));
        }
        Ok(())
    }
    fn lock(&self) -> std::sync::MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl LeaseStore for View {
    async fn get(&self) -> Result<Option<Value>, Error> {
        self.check_cut()?;
        tokio::time::sleep(self.read_delay).await;
        let v = self.lock().lease.clone();
        // Let the other replica run between our read and our write, so both can read
        // the same resourceVersion and the store has to arbitrate.
        tokio::time::sleep(Duration::from_millis(10)).await;
        Ok(v)
    }

    async fn create(&self, mut lease: Value) -> Result<Value, Error> {
        self.check_cut()?;
        let mut st = self.lock();
        if st.lease.is_some() {
            st.writes.push(format!("{} create AlreadyExists", self.who));
            return Err(api(409, "AlreadyExists"));
        }
        st.rv += 1;
        lease["metadata"]["resourceVersion"] = json!(st.rv.to_string());
        st.lease = Some(lease.clone());
        st.writes.push(format!("{} create ok", self.who));
        Ok(lease)
    }

    async fn replace(&self, mut lease: Value) -> Result<Value, Error> {
        self.check_cut()?;
        let mut st = self.lock();
        let current_rv = st
            .lease
            .as_ref()
            .map(|l| l["metadata"]["resourceVersion"].clone());
        if current_rv != Some(lease["metadata"]["resourceVersion"].clone()) {
            st.writes.push(format!("{} replace Conflict", self.who));
            return Err(api(409, "Conflict"));
        }
        st.rv += 1;
        lease["metadata"]["resourceVersion"] = json!(st.rv.to_string());
        st.lease = Some(lease.clone());
        st.writes.push(format!(
            "{} replace ok holder={}",
            self.who,
            lease["spec"]["holderIdentity"].as_str().unwrap_or("?")
        ));
        Ok(lease)
    }
}

fn config(identity: &str) -> LeaseConfig {
    LeaseConfig {
        lease_duration: 15 * SECOND,
        renew_interval: 5 * SECOND,
        retry_interval: 2 * SECOND,
        ..LeaseConfig::new("kube-system", "crproxy-leader", identity)
    }
}

struct Cluster {
    store: Arc<Mutex<Store>>,
    views: Vec<View>,
}

impl Cluster {
    fn new(initial: Option<Value>) -> Self {
        let store = Arc::new(Mutex::new(Store {
            lease: initial,
            rv: 1,
            writes: Vec::new(),
        }));
        let views = ["a", "b"]
            .into_iter()
            .map(|who| View {
                who,
                store: store.clone(),
                cut: Arc::new(AtomicBool::new(false)),
                read_delay: Duration::ZERO,
            })
            .collect();
        Cluster { store, views }
    }
    fn spawn(&self, i: usize) -> LeaderHandle {
        LeaderElector::spawn_with(self.views[i].clone(), config(self.views[i].who))
    }
    fn spawn_with(&self, i: usize, cfg: LeaseConfig) -> LeaderHandle {
        LeaderElector::spawn_with(self.views[i].clone(), cfg)
    }
    fn writes(&self) -> Vec<String> {
        self.store
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .writes
            .clone()
    }
    fn spec(&self) -> Value {
        self.store
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .lease
            .as_ref()
            .map(|l| l["spec"].clone())
            .unwrap_or(Value::Null)
    }
}

/// (elapsed ms, who, leader)
type ChangeLog = Arc<Mutex<Vec<(u128, &'static str, bool)>>>;

/// Records every leadership change of the handles.
fn monitor(handles: &[(&'static str, &LeaderHandle)]) -> ChangeLog {
    let log = Arc::new(Mutex::new(Vec::new()));
    let t0 = Instant::now();
    for (who, h) in handles {
        let mut rx = h.changes();
        let (who, log) = (*who, log.clone());
        tokio::spawn(async move {
            while rx.changed().await.is_ok() {
                let v = rx.leading();
                log.lock().unwrap_or_else(|p| p.into_inner()).push((
                    t0.elapsed().as_millis(),
                    who,
                    v,
                ));
            }
        });
    }
    log
}

/// Never two leaders at once: replays the change log.
fn assert_exclusive(log: &[(u128, &str, bool)]) {
    let mut leaders: Vec<&str> = Vec::new();
    for (t, who, leader) in log {
        if *leader {
            assert!(
                leaders.is_empty(),
                "at {t} ms {who} leads while {leaders:?} do: {log:?}"
            );
            leaders.push(who);
        } else {
            leaders.retain(|l| l != who);
        }
    }
}

fn leaders(hs: &[&LeaderHandle]) -> usize {
    hs.iter().filter(|h| h.is_leader()).count()
}

#[tokio::test(start_paused = true)]
async fn two_replicas_race_for_a_free_lease_and_exactly_one_wins() {
    let free = json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "crproxy-leader", "namespace": "kube-system", "resourceVersion": "1"},
        "spec": {"holderIdentity": "", "leaseTransitions": 4}
    });
    let c = Cluster::new(Some(free));
    let (a, b) = (c.spawn(0), c.spawn(1));
    tokio::time::sleep(SECOND).await;
    assert_eq!(leaders(&[&a, &b]), 1);
    let writes = c.writes();
    assert!(
        writes.iter().any(|w| w.ends_with("replace Conflict")),
        "both read the same resourceVersion, one write must conflict: {writes:?}"
    );
    let spec = c.spec();
    let winner = if a.is_leader() { "a" } else { "b" };
    assert_eq!(spec["holderIdentity"], winner);
    assert_eq!(spec["leaseTransitions"], 5);
    assert_eq!(spec["leaseDurationSeconds"], 15);
    assert_eq!(spec["acquireTime"], spec["renewTime"]);

    // The loser keeps following while the winner renews.
    tokio::time::sleep(60 * SECOND).await;
    assert_eq!(leaders(&[&a, &b]), 1);
    assert_eq!(c.spec()["holderIdentity"], winner);
    assert_eq!(
        c.spec()["leaseTransitions"],
        5,
        "renewals are not transitions"
    );
}

#[tokio::test(start_paused = true)]
async fn creating_a_missing_lease_is_a_race_too() {
    let c = Cluster::new(None);
    let (a, b) = (c.spawn(0), c.spawn(1));
    tokio::time::sleep(SECOND).await;
    assert_eq!(leaders(&[&a, &b]), 1);
    let writes = c.writes();
    assert_eq!(
        writes.iter().filter(|w| w.ends_with("create ok")).count(),
        1,
        "{writes:?}"
    );
    assert!(
        writes.iter().any(|w| w.ends_with("create AlreadyExists")),
        "{writes:?}"
    );
    assert_eq!(c.spec()["leaseTransitions"], 0);
}

#[tokio::test(start_paused = true)]
async fn a_partitioned_leader_steps_down_before_the_other_takes_over() {
    let c = Cluster::new(None);
    let a = c.spawn(0);
    tokio::time::sleep(SECOND).await;
    assert!(a.is_leader());
    let b = c.spawn(1);
    let log = monitor(&[("a", &a), ("b", &b)]);
    tokio::time::sleep(10 * SECOND).await;
    assert!(a.is_leader() && !b.is_leader());

    // a stops renewing: its writes no longer arrive.
    c.views[0].cut.store(true, Ordering::SeqCst);
    let cut_at = Instant::now();
    // a's last successful renew was at most one renew interval before the cut; it
    // must keep leading until that renew's deadline and b must not take over sooner.
    tokio::time::sleep(9 * SECOND).await;
    assert!(
        !b.is_leader(),
        "b took over before the lease could have expired"
    );
    let mut a_down = None;
    let mut b_up = None;
    for _ in 0..400 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if a_down.is_none() && !a.is_leader() {
            a_down = Some(cut_at.elapsed());
        }
        if b_up.is_none() && b.is_leader() {
            b_up = Some(cut_at.elapsed());
        }
        if a_down.is_some() && b_up.is_some() {
            break;
        }
    }
    let (a_down, b_up) = (a_down.expect("a stepped down"), b_up.expect("b took over"));
    assert!(a_down <= 15 * SECOND, "a led past its lease: {a_down:?}");
    assert!(
        b_up >= a_down,
        "b ({b_up:?}) before a stepped down ({a_down:?})"
    );
    assert!(
        b_up <= 15 * SECOND + 2 * SECOND + SECOND,
        "b too slow: {b_up:?}"
    );
    assert_eq!(c.spec()["holderIdentity"], "b");
    assert_eq!(c.spec()["leaseTransitions"], 1);

    // Healing the partition does not make a leader again: the lease is b's.
    c.views[0].cut.store(false, Ordering::SeqCst);
    tokio::time::sleep(30 * SECOND).await;
    assert!(!a.is_leader() && b.is_leader());
    assert_exclusive(&log.lock().unwrap_or_else(|p| p.into_inner()));
}

#[tokio::test(start_paused = true)]
async fn a_slow_read_does_not_backdate_the_observation() {
    // b's GETs spend 1.9 s in flight before the store answers, so a's renewals land
    // while b's request is on its way. b must time the record from when it saw it,
    // whatever the phase of b's attempts relative to a's renewals.
    for offset_ms in (0u64..2000).step_by(100) {
        let mut c = Cluster::new(None);
        c.views[1].read_delay = Duration::from_millis(1900);
        let a = c.spawn(0);
        tokio::time::sleep(SECOND + Duration::from_millis(offset_ms)).await;
        let b = c.spawn_with(
            1,
            LeaseConfig {
                retry_interval: Duration::from_millis(100),
                ..config("b")
            },
        );
        let log = monitor(&[("a", &a), ("b", &b)]);
        tokio::time::sleep(11 * SECOND).await;
        c.views[0].cut.store(true, Ordering::SeqCst);
        tokio::time::sleep(30 * SECOND).await;
        assert!(b.is_leader(), "offset {offset_ms}");
        assert_exclusive(&log.lock().unwrap_or_else(|p| p.into_inner()));
    }
}

#[tokio::test(start_paused = true)]
async fn release_hands_over_within_one_retry_interval() {
    let c = Cluster::new(None);
    let a = c.spawn(0);
    tokio::time::sleep(SECOND).await;
    let b = c.spawn(1);
    tokio::time::sleep(3 * SECOND).await;
    assert!(a.is_leader() && !b.is_leader());
    let a2 = a.clone();
    a.release().await;
    assert!(!a2.is_leader(), "released handle clones see the step-down");
    assert_eq!(c.spec()["holderIdentity"], "");
    let released = Instant::now();
    let mut rx = b.changes();
    tokio::time::timeout(3 * SECOND, rx.wait_until(true))
        .await
        .expect("b leads within a retry interval")
        .expect("open");
    assert!(released.elapsed() <= 2 * SECOND + Duration::from_millis(100));
    assert_eq!(c.spec()["holderIdentity"], "b");
    // The closed loop: a's channel ends.
    let mut rx = a2.changes();
    rx.leading();
    assert!(rx.changed().await.is_err());
}

#[tokio::test(start_paused = true)]
async fn dropping_every_handle_releases_the_lease() {
    let c = Cluster::new(None);
    let a = c.spawn(0);
    tokio::time::sleep(SECOND).await;
    assert!(a.is_leader());
    let mut rx = a.changes();
    drop(a);
    tokio::time::timeout(SECOND, async { while rx.changed().await.is_ok() {} })
        .await
        .expect("loop ended");
    assert_eq!(c.spec()["holderIdentity"], "");
}

/// However an election ends, its channel closes at "not leading": a consumer
/// waiting for leadership to come must not find a stale "leading" in a closed
/// channel and start its leader's work again (the supervisor and the registrar
/// rely on it).
#[tokio::test(start_paused = true)]
async fn an_ended_election_closes_its_channel_at_not_leading() {
    async fn closes_at_not_leading(mut rx: LeadershipChanges, how: &str) {
        tokio::time::timeout(SECOND, async { while rx.changed().await.is_ok() {} })
            .await
            .unwrap_or_else(|_| panic!("{how}: the channel stays open"));
        assert!(!rx.leading(), "{how}: closed at leading");
    }

    // A leader aborted as a crashed process would be: nothing releases the Lease.
    let c = Cluster::new(None);
    let a = c.spawn(0);
    tokio::time::sleep(SECOND).await;
    assert!(a.is_leader());
    let rx = a.changes();
    a.abort();
    closes_at_not_leading(rx, "aborted").await;

    // A fixed leader whose last handle goes.
    let fixed = LeaderHandle::fixed(true);
    let rx = fixed.changes();
    drop(fixed);
    closes_at_not_leading(rx, "fixed").await;
}

#[tokio::test(start_paused = true)]
async fn a_crashed_holder_blocks_takeover_for_the_whole_duration() {
    // Lease held by a process we never see renew; we must wait lease_duration from
    // our first observation, whatever its renewTime says.
    let held = json!({
        "metadata": {"name": "crproxy-leader", "namespace": "kube-system", "resourceVersion": "1"},
        "spec": {"holderIdentity": "ghost", "leaseDurationSeconds": 15, "renewTime": "2000-01-01T00:00:00.000000Z"}
    });
    let c = Cluster::new(Some(held));
    let b = c.spawn(1);
    tokio::time::sleep(14 * SECOND).await;
    assert!(!b.is_leader());
    tokio::time::sleep(4 * SECOND).await;
    assert!(b.is_leader());
    assert_eq!(c.spec()["leaseTransitions"], 1);
}

#[test]
fn micro_time_format() {
    let t = DateTime::parse_from_rfc3339("2024-01-02T03:04:05.123456789Z")
        .expect("time")
        .with_timezone(&Utc);
    assert_eq!(micro_time(t), "2024-01-02T03:04:05.123456Z");
    let t = DateTime::parse_from_rfc3339("2024-01-02T03:04:05Z")
        .expect("time")
        .with_timezone(&Utc);
    assert_eq!(micro_time(t), "2024-01-02T03:04:05.000000Z");
}

/// A Lease's holder is alive while its record moves: judged from when this
/// process first read the record as it is, for the Lease's own duration (the
/// caller's when it names none). Released, missing or standing still: no holder.
#[test]
fn a_lease_holder_is_live_until_its_record_stands_still_for_its_duration() {
    let lease = |holder: &str, renewed: &str, seconds: Option<u64>| {
        let mut spec = json!({"holderIdentity": holder, "renewTime": renewed});
        if let Some(s) = seconds {
            spec["leaseDurationSeconds"] = json!(s);
        }
        json!({"kind": "Lease", "spec": spec})
    };
    let fallback = 10 * SECOND;
    let t0 = Instant::now();
    let mut seen = LeaseObserver::default();
    assert_eq!(seen.live_holder(fallback, t0), None, "nothing read");
    seen.observe(None, t0);
    assert_eq!(seen.live_holder(fallback, t0), None, "no Lease");

    seen.observe(Some(&lease("a", "r1", Some(15))), t0);
    assert_eq!(seen.live_holder(fallback, t0), Some("a"), "first read");
    // Read again unchanged: the first read's time stands.
    seen.observe(Some(&lease("a", "r1", Some(15))), t0 + 14 * SECOND);
    assert_eq!(seen.live_holder(fallback, t0 + 14 * SECOND), Some("a"));
    assert_eq!(
        seen.live_holder(fallback, t0 + 15 * SECOND),
        None,
        "stood still for its own 15 s, not the caller's 10"
    );
    seen.observe(Some(&lease("a", "r2", Some(15))), t0 + 16 * SECOND);
    assert_eq!(
        seen.live_holder(fallback, t0 + 30 * SECOND),
        Some("a"),
        "renewed: counted from the new record"
    );
    seen.observe(Some(&lease("b", "r3", None)), t0 + 31 * SECOND);
    assert_eq!(seen.live_holder(fallback, t0 + 40 * SECOND), Some("b"));
    assert_eq!(
        seen.live_holder(fallback, t0 + 41 * SECOND),
        None,
        "no duration written: the caller's"
    );
    seen.observe(Some(&lease("", "r4", Some(15))), t0 + 42 * SECOND);
    assert_eq!(
        seen.live_holder(fallback, t0 + 42 * SECOND),
        None,
        "released"
    );
    seen.observe(Some(&json!({"kind": "Lease"})), t0 + 43 * SECOND);
    assert_eq!(
        seen.live_holder(fallback, t0 + 43 * SECOND),
        None,
        "no spec"
    );
    seen.observe(Some(&lease("c", "r5", Some(15))), t0 + 44 * SECOND);
    seen.observe(None, t0 + 45 * SECOND);
    assert_eq!(
        seen.live_holder(fallback, t0 + 45 * SECOND),
        None,
        "deleted"
    );
}
