//! One benchmark run: bring the system up, seed the target, measure every scenario
//! on every path, measure crproxy's memory, and build the report.
//!
//! Paths are interleaved round by round (direct, crproxy, nginx, direct, ...), so
//! slow drift on the machine (another process, thermal state) spreads over all
//! columns instead of landing on one.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use http::Method;
use serde_json::{json, Value};
use tokio::time::Instant;

use crate::aggregated::{self, AggregationLayer};
use crate::child::{self, ChildProxy};
use crproxy_core::exposition;
use crproxy_core::ownership::{OWNER_PROJECT_LABEL, OWNER_VCLUSTER_LABEL};

use crate::driver::{self, closed_loop, Endpoint, Identity, Protocol, Sender, Workload};
use crate::nginx::{self, Nginx};
use crate::report::{self, paired_round_ratios, CacheEventCost, MemoryFigure, Report, Row};
use crate::rss;
use crate::stats::{micros_each, RoundStats, Summary};
use crate::watch::{WatchSet, PRIME_SEQ};
use crate::workload::{
    collection_path, object_path, resource_version, widget, CreateObjects, DeleteObjects, Owned,
    Owner, PatchNamed, PatchObjects, ReadPath, UpdateObjects,
};

/// How to run.
#[derive(Clone, Debug)]
pub struct Options {
    /// A short run: fewer rounds and requests, smaller memory phases.
    pub quick: bool,
    /// Where the JSON report goes.
    pub out: PathBuf,
    pub protocol: Protocol,
    /// The `crproxy` binary to run as a child; default: next to this executable.
    pub proxy_binary: Option<PathBuf>,
    /// Measure the dev environment's in-process proxy instead of a child process
    /// (no separate memory or CPU figures then).
    pub in_process: bool,
    pub skip_nginx: bool,
    /// Run only scenarios whose name contains this; the memory phase counts as
    /// a scenario named [`MEMORY_PHASE`].
    pub only: Option<String>,
    pub skip_memory: bool,
    /// Leave out the comparison through a client cluster's aggregation layer.
    pub skip_aggregator: bool,
    /// The crproxy child's tokio worker threads; `None` leaves its default.
    pub proxy_worker_threads: Option<NonZeroUsize>,
    /// Measured rounds per scenario; `None` leaves the plan's.
    pub rounds: Option<NonZeroUsize>,
}

/// The name `--only` matches to run the memory phase (idle watches, large
/// lists), alone with `--only memory`.
pub const MEMORY_PHASE: &str = "memory";

impl Options {
    /// Whether `--only` leaves the scenario of this name in.
    fn wants(&self, scenario: &str) -> bool {
        self.only
            .as_deref()
            .is_none_or(|only| scenario.contains(only))
    }

    fn wants_memory_phase(&self) -> bool {
        !self.skip_memory && self.wants(MEMORY_PHASE)
    }
}

impl Default for Options {
    fn default() -> Self {
        Self {
            quick: false,
            out: default_out(),
            protocol: Protocol::Http2,
            proxy_binary: None,
            in_process: false,
            skip_nginx: false,
            only: None,
            skip_memory: false,
            skip_aggregator: false,
            proxy_worker_threads: None,
            rounds: None,
        }
    }
}

/// `<workspace>/target/crproxy-bench.json`, wherever the command runs from
/// (`cargo bench` runs in the package directory).
pub fn default_out() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let workspace = manifest.parent().and_then(Path::parent).unwrap_or(manifest);
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace.join("target"));
    target.join("crproxy-bench.json")
}

/// Sizes of a run.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Plan {
    pub rounds: usize,
    pub concurrency: Vec<usize>,
    /// Requests per round for single-object verbs that make or need an object
    /// per request (create, DELETE, the seeded rows): what a round makes stays
    /// under crproxy's ownership cache limit.
    pub requests: usize,
    /// Requests per round for GET, and for the PUT and merge PATCH of each
    /// worker's own object, which need no object per request. A round of 800
    /// GETs at 16 workers took some 40 ms, and the ratio of a crproxy round to
    /// the nginx round beside it ranged from 0.58x to 1.84x in one run: a
    /// scheduler hiccup was a quarter of such a round. These rounds take a few
    /// hundred ms at 16 and 64 workers.
    pub get_requests: usize,
    pub own_object_write_requests: usize,
    /// Requests per round for the small and the large list.
    pub small_list_requests: usize,
    pub large_list_requests: usize,
    pub small_list: usize,
    pub large_list: usize,
    /// Watch counts, and events per round for each.
    pub watches: Vec<(usize, usize)>,
    pub idle_watches: usize,
    /// Object counts of the two lists whose peak RSS is compared.
    pub memory_lists: (usize, usize),
    /// Cap on one round of one path.
    pub round_limit_secs: u64,
}

/// Requests each worker sends before the measured rounds, at least. A proxy's
/// pool of connections to the target grows while requests find every connection
/// busy. With one request a worker, crproxy still dialled 17 and 26 times inside
/// the measured rounds of `get` at 64 workers in two runs (a TLS handshake each,
/// charged to its CPU per request); with four, 2 and 8; with eight, once in each.
/// The report notes the dials that still fall inside the rounds.
const WARMUP_PER_WORKER: usize = 8;

impl Plan {
    pub fn new(quick: bool) -> Self {
        if quick {
            Self {
                rounds: 2,
                concurrency: vec![1, 16, 64],
                requests: 300,
                get_requests: 1200,
                own_object_write_requests: 600,
                small_list_requests: 100,
                large_list_requests: 8,
                small_list: 100,
                large_list: 10_000,
                watches: vec![(1, 15), (1000, 3)],
                idle_watches: 10_000,
                memory_lists: (10_000, 30_000),
                round_limit_secs: 30,
            }
        } else {
            Self {
                rounds: 5,
                concurrency: vec![1, 16, 64],
                requests: 800,
                get_requests: 4000,
                own_object_write_requests: 2000,
                small_list_requests: 200,
                large_list_requests: 16,
                small_list: 100,
                large_list: 10_000,
                watches: vec![(1, 40), (1000, 6)],
                idle_watches: 10_000,
                memory_lists: (10_000, 100_000),
                round_limit_secs: 60,
            }
        }
    }

    /// The plan `options` ask for: quick or full, with their round count if given.
    fn of(options: &Options) -> Self {
        let mut plan = Self::new(options.quick);
        if let Some(rounds) = options.rounds {
            plan.rounds = rounds.get();
        }
        plan
    }

    fn limit(&self) -> Duration {
        Duration::from_secs(self.round_limit_secs)
    }

    /// At least two requests per worker, so every worker is measured.
    fn count(&self, base: usize, concurrency: usize) -> usize {
        base.max(2 * concurrency)
    }

    /// A fifth of a round, and at least [`WARMUP_PER_WORKER`] requests a worker.
    fn warmup(&self, base: usize, concurrency: usize) -> usize {
        (base / 5).max(WARMUP_PER_WORKER * concurrency)
    }

    /// The requests of a row with `base` requests per round at `concurrency`.
    fn counts(&self, base: usize, concurrency: usize) -> Counts {
        Counts {
            total: self.count(base, concurrency),
            warmup: self.warmup(base, concurrency),
        }
    }

    /// [`Plan::counts`] for lists, whose warm-up is kept short (two per worker):
    /// each large list is expensive.
    fn list_counts(&self, base: usize, concurrency: usize) -> Counts {
        let counts = self.counts(base, concurrency);
        Counts {
            warmup: counts.warmup.min(2 * concurrency),
            ..counts
        }
    }
}

const NS_GET: &str = "bench-get";
const NS_RW: &str = "bench-rw";
const NS_WATCH: &str = "bench-watch";
const NS_IDLE: &str = "bench-idle";
const NS_BIG: &str = "bench-list-big";
/// Objects created before the timed part for `patch (seeded)` and
/// `delete (seeded)`, which each patch, then delete, every one of them once.
const NS_SEEDED: &str = "bench-seeded";
/// Objects written directly on the target to price crproxy's cache events.
const NS_EVENTS: &str = "bench-events";

/// The names a seeded scenario works through in one phase (`tag` = `warm` or
/// `r<round>`) on one lane at concurrency `c`: `<prefix>-0` .. `<prefix>-<count-1>`.
fn seeded_prefix(lane: &str, c: usize, tag: &str) -> String {
    format!("s-{lane}-{c}-{tag}")
}

/// Every object the seeded patch and delete go through at concurrency `c`, on
/// every lane: the warm-up's and each round's.
fn seeded_names(plan: &Plan, lanes: &[&str], c: usize) -> Vec<String> {
    let mut names = Vec::new();
    for lane in lanes {
        let phases = std::iter::once(("warm".to_string(), plan.warmup(plan.requests, c)))
            .chain((0..plan.rounds).map(|r| (format!("r{r}"), plan.count(plan.requests, c))));
        for (tag, count) in phases {
            let prefix = seeded_prefix(lane, c, &tag);
            names.extend((0..count).map(|i| format!("{prefix}-{i}")));
        }
    }
    names
}

fn list_ns(n: usize) -> String {
    format!("bench-list-{n}")
}

/// The report column a lane's figures go to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Column {
    Direct,
    Crproxy,
    Nginx,
}

/// One way to the target.
struct Lane {
    /// Unique among all lanes of the run: logs, notes and object names.
    name: &'static str,
    column: Column,
    endpoint: Arc<Endpoint>,
    /// The process whose CPU is charged to this path, when it is a separate one.
    pid: Option<u32>,
    /// That process's metrics listener, when it is a crproxy child: its dials
    /// inside the measured rounds are counted from it.
    metrics: Option<SocketAddr>,
}

impl Lane {
    /// The ownership labels this lane's request bodies carry: none through
    /// crproxy, which stamps those of `client`, its own; [`elsewhere`]'s on the
    /// paths it is compared with.
    fn body_owner(&self, client: &Owner) -> Option<Owner> {
        match self.column {
            Column::Crproxy => None,
            Column::Direct | Column::Nginx => Some(elsewhere(client)),
        }
    }

    /// Whose labels the objects this lane writes end up with.
    fn objects_owner(&self, client: &Owner) -> Owner {
        self.body_owner(client).unwrap_or_else(|| client.clone())
    }
}

/// The owner of what the direct and nginx paths write: another client than the
/// crproxy child's. The child's ownership cache watches only its own client's
/// objects; were the other paths' objects its client's too, each of their writes
/// would cost the target an event for that watch and the child the reading of
/// it, on the CPUs their rounds run on, and the comparison would charge
/// crproxy's cache to nginx. The objects are the same size either way.
fn elsewhere(client: &Owner) -> Owner {
    Owner {
        name: format!("{}-elsewhere", client.name),
        project: client.project.clone(),
    }
}

/// One object per worker of `lane` at concurrency `c`: `<kind>-<lane>-<c>-<worker>`.
fn worker_names(kind: &str, lane: &Lane, c: usize) -> Vec<String> {
    (0..c)
        .map(|w| format!("{kind}-{}-{c}-{w}", lane.name))
        .collect()
}

/// Requests one lane sends for one row: a warm-up, then `total` per round.
#[derive(Clone, Copy, Debug)]
struct Counts {
    total: usize,
    warmup: usize,
}

/// What one scenario row produced, plus errors worth a note.
struct Measured {
    summary: Option<Summary>,
    /// Failed requests, including rounds where nothing succeeded.
    errors: u64,
    cpu_us: Option<f64>,
    first_error: Option<String>,
    /// Dials crproxy made to the target inside the measured rounds (0 where not
    /// counted).
    dials: u64,
    /// The machine's CPU time over this lane's measured rounds (zero where not
    /// read), for the share the hypervisor stole.
    machine: rss::MachineTime,
    /// The machine's busy CPU time per request over those rounds (µs).
    machine_cpu_us: Option<f64>,
    /// Each measured round's throughput, in round order (`None` for a round
    /// that completed no request).
    round_throughputs: Vec<Option<f64>>,
}

/// The whole run.
pub async fn run(options: &Options) -> Result<Report> {
    let plan = Plan::of(options);
    let mut notes = Vec::new();
    if cfg!(debug_assertions) {
        notes.push("built without --release: figures are not representative".to_string());
    }
    let tmp = tempfile::tempdir().context("creating a temporary directory")?;
    let dir = tmp.path().to_path_buf();

    eprintln!("starting the dev environment (target devcluster, client devcluster, crproxy)...");
    let env = crproxy::devenv::DevEnv::start(crproxy::devenv::DevOptions {
        dir: dir.join("dev"),
        clients: 1,
        target_replicas: 1,
        target_port: 0,
        client_port: 0,
        proxy_base_port: 0,
        metrics_port: 0,
        host_port: 0,
        sync_metrics_port: 0,
        persistent: false,
        share_ports: false,
    })
    .await
    .context("starting the dev environment")?;
    let result = measure_all(options, &plan, &env, &dir, &mut notes).await;
    env.shutdown().await;
    let Measurements {
        rows,
        aggregated,
        cache_events,
        memory,
        targets,
        goals,
        settings,
    } = result?;
    Ok(Report {
        finished_at_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        commit: git_commit(),
        machine: report::Machine::detect(),
        settings,
        rows,
        aggregated,
        cache_events,
        memory,
        targets,
        goals,
        notes,
    })
}

/// Everything [`measure_all`] produced for the report.
struct Measurements {
    rows: Vec<Row>,
    /// The rows measured through the aggregation layer.
    aggregated: Vec<Row>,
    cache_events: Vec<CacheEventCost>,
    memory: Vec<MemoryFigure>,
    targets: Vec<report::TargetCheck>,
    goals: Vec<report::TargetCheck>,
    settings: Value,
}

async fn measure_all(
    options: &Options,
    plan: &Plan,
    env: &crproxy::devenv::DevEnv,
    dir: &Path,
    notes: &mut Vec<String>,
) -> Result<Measurements> {
    let client = env
        .clients
        .first()
        .ok_or_else(|| anyhow!("the dev environment has no client"))?;
    let owner = Owner {
        name: client.name.clone(),
        project: "default".into(),
    };
    // The direct path uses the client's own identity on the target, the one the
    // proxy forwards with, so authorization costs the same on both paths.
    let identity_kubeconfig = client
        .link
        .config_path
        .parent()
        .map(|d| d.join("target-identity.kubeconfig"))
        .ok_or_else(|| anyhow!("the client's config has no directory"))?;
    let (user, token) = crproxy_kube::Kubeconfig::load(&identity_kubeconfig)
        .ok()
        .and_then(|k| {
            let user = k.context(None).ok()?.context.user.clone();
            let cluster = crproxy_kube::ClusterConfig::from_kubeconfig(&k, None).ok()?;
            let token = match cluster.auth {
                crproxy_kube::Auth::Token(token) => token,
                crproxy_kube::Auth::TokenFile(path) => {
                    std::fs::read_to_string(path).ok()?.trim().to_string()
                }
                _ => return None,
            };
            Some((user, token))
        })
        .ok_or_else(|| {
            anyhow!(
                "no bearer token for the client identity in {}",
                identity_kubeconfig.display()
            )
        })?;
    let target_addr = env.target.addr();
    let target_ca = env.target.ca_pem();
    let endpoint = |token: &str| {
        Endpoint::new(
            "direct",
            target_addr,
            Some(&target_ca),
            &Identity::Bearer(token.to_string()),
            options.protocol,
        )
    };
    let mut direct = Arc::new(endpoint(&token)?);
    let mut bearer = Identity::Bearer(token.clone());
    let mut target_token = token;
    let mut child_replacements = Vec::new();
    if !may_use_widgets(&direct).await? {
        // The target does not authorize the identity (its authorizer does not
        // evaluate RBAC yet): give the same user system:masters, on every path,
        // so authorization costs the same everywhere.
        let token = env
            .target
            .issue_token(&user, &["system:masters"])
            .context("issuing a token on the target")?;
        let kubeconfig = dir.join("bench-identity.kubeconfig");
        std::fs::write(&kubeconfig, env.target.kubeconfig(&user, &token))?;
        child_replacements.push((
            identity_kubeconfig.display().to_string(),
            kubeconfig.display().to_string(),
        ));
        direct = Arc::new(endpoint(&token)?);
        bearer = Identity::Bearer(token.clone());
        target_token = token;
        notes.push(format!(
            "the target refused {user} the widgets resource (its RBAC is not evaluated yet); every path used {user} in group system:masters instead, so only the child crproxy process could be measured"
        ));
    }

    // crproxy: a child process when the binary is there, else the in-process one.
    let front_proxy = Identity::FrontProxy {
        cert: client.cluster.front_proxy_client(),
        user: "bench-user".into(),
        groups: vec!["system:masters".into(), "system:authenticated".into()],
    };
    let binary = options
        .proxy_binary
        .clone()
        .or_else(child::sibling_binary)
        .or_else(|| build_proxy_binary(notes));
    let mut child_proxy = None;
    if !options.in_process {
        match &binary {
            Some(binary) => {
                eprintln!("starting {} run as a child process...", binary.display());
                match ChildProxy::start(
                    binary,
                    &client.link.config_path,
                    &dir.join("crproxy-child"),
                    &child_replacements,
                    options.proxy_worker_threads,
                )
                    .await
                {
                    Ok(c) => {
                        notes.push(format!(
                            "crproxy child's tokio worker threads: {}",
                            c.worker_threads
                        ));
                        notes.push(build_note(&c.build));
                        child_proxy = Some(c);
                    }
                    Err(e) => notes.push(format!(
                        "crproxy child process did not start ({e}); measured the in-process proxy"
                    )),
                }
            }
            None => notes.push(
                "no crproxy binary found next to the benchmark (cargo build --release -p crproxy); measured the in-process proxy".into(),
            ),
        }
    }
    let (proxy_addr, proxy_ca, proxy_pid) = match &child_proxy {
        Some(c) => (c.addr, Some(c.ca_pem.clone()), Some(c.pid)),
        None => {
            let addr = client
                .proxy()
                .ok_or_else(|| anyhow!("the in-process proxy is not running"))?
                .servers
                .first()
                .map(|(_, a)| *a)
                .ok_or_else(|| anyhow!("the in-process proxy serves nothing"))?;
            (addr, None, None)
        }
    };
    let crproxy = Arc::new(Endpoint::new(
        "crproxy",
        proxy_addr,
        proxy_ca.as_deref(),
        &front_proxy,
        options.protocol,
    )?);
    wait_until_serving(&crproxy).await?;
    let idle_kib = proxy_pid.and_then(rss::memory).map(|m| m.rss_kib);
    // One clock for every lane, so the CPU columns are comparable.
    let cpu_clock = rss::CpuClock::detect(proxy_pid.unwrap_or_else(std::process::id));
    if cpu_clock == rss::CpuClock::StatTicks {
        notes.push("the kernel reports no schedstat: CPU per request comes from 10 ms ticks of /proc/<pid>/stat, meaningful only over many requests".into());
    }

    let mut nginx_proc = None;
    if options.skip_nginx {
        notes.push("nginx column skipped (--no-nginx)".into());
    } else if let Some(binary) = nginx::find_binary() {
        let listen = SocketAddr::from(([127, 0, 0, 1], crproxy::devenv::free_port()?));
        let workers = nginx_workers();
        match Nginx::start(
            &binary,
            &dir.join("nginx"),
            listen,
            nginx::Upstream::devcluster(target_addr, target_ca.clone()),
            workers,
            None,
        )
        .await
        {
            Ok(n) => nginx_proc = Some(n),
            Err(e) => notes.push(format!("nginx column skipped: {e}")),
        }
    } else {
        let note = "nginx is not installed (Debian package nginx, which scripts/bench installs): nginx column skipped";
        eprintln!("note: {note}");
        notes.push(note.into());
    }

    let mut lanes = vec![
        Lane {
            name: "direct",
            column: Column::Direct,
            endpoint: Arc::clone(&direct),
            pid: None,
            metrics: None,
        },
        Lane {
            name: "crproxy",
            column: Column::Crproxy,
            endpoint: Arc::clone(&crproxy),
            pid: proxy_pid,
            metrics: child_proxy.as_ref().map(|c| c.metrics_addr),
        },
    ];
    if let Some(n) = &nginx_proc {
        lanes.push(Lane {
            name: "nginx",
            column: Column::Nginx,
            endpoint: Arc::new(Endpoint::new(
                "nginx",
                n.addr,
                Some(&n.ca_pem),
                &bearer,
                options.protocol,
            )?),
            pid: Some(n.pid),
            metrics: None,
        });
    }
    let nginx_sampler = nginx_proc
        .as_ref()
        .map(|n| rss::Sampler::start(n.pid, Duration::from_millis(200), Duration::from_secs(7200)));

    eprintln!("seeding the target...");
    let admin_target = kube_client(&env.target_kubeconfig)?;
    let admin_client = kube_client(&client.kubeconfig)?;
    for ns in [
        NS_GET, NS_RW, NS_WATCH, NS_IDLE, NS_BIG, NS_SEEDED, NS_EVENTS,
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([list_ns(plan.small_list), list_ns(plan.large_list)])
    {
        create_namespace(&admin_client, &ns).await?;
        create_namespace(&admin_target, &ns).await?;
    }
    seed(&direct, NS_GET, &["obj-0".to_string()], &owner).await?;
    for n in [plan.small_list, plan.large_list] {
        let names: Vec<String> = (0..n).map(|i| format!("o-{i}")).collect();
        seed(&direct, &list_ns(n), &names, &owner).await?;
    }
    // One object per worker, path and concurrency for updates and patches.
    let update_rvs = seed_worker_objects(&direct, &lanes, &plan.concurrency, &owner).await?;
    let catch_up = child_proxy.as_ref().map(|child| CacheCatchUp {
        direct: &direct,
        crproxy: &crproxy,
        metrics: child.metrics_addr,
        owner: &owner,
    });
    if let Some(catch_up) = &catch_up {
        // Owned writes are measured in steady state: the proxy's ownership cache
        // starts with the first owned write, so it is started and synced here.
        catch_up
            .await_or_note(
                "start",
                "crproxy ownership cache not synced before the timed part",
                notes,
            )
            .await;
    }
    let wanted = |scenario: &str| options.wants(scenario);
    let timed_part_started = rss::machine_time();
    let mut cache_events = Vec::new();
    let mut runner = Runner {
        plan,
        lanes: &lanes,
        clock: cpu_clock,
        rows: Vec::new(),
        notes,
    };
    for &c in &plan.concurrency {
        if wanted("get") {
            runner.get(c).await?;
        }
        for (n, base) in [
            (plan.small_list, plan.small_list_requests),
            (plan.large_list, plan.large_list_requests),
        ] {
            if wanted(&format!("list {n}")) {
                runner.list(n, base, c).await?;
            }
        }
        // The large list again with the owner selector on every path, so the
        // direct column pays the target's label filtering too and the crproxy
        // ratio is the proxy's own cost (crproxy ANDs the same selector again).
        let selected = format!("list {} +selector", plan.large_list);
        if c <= 16 && wanted(&selected) {
            let selector = format!(
                "{OWNER_VCLUSTER_LABEL}={},{OWNER_PROJECT_LABEL}={}",
                owner.name, owner.project
            );
            let path = format!(
                "{}?labelSelector={}",
                collection_path(&list_ns(plan.large_list)),
                query_escape(&selector)
            );
            let base = plan.large_list_requests;
            let min_bytes = 100 * plan.large_list as u64;
            runner
                .row(&selected, c, plan.list_counts(base, c), |_, _| {
                    Arc::new(ReadPath {
                        path: path.clone(),
                        min_bytes,
                    })
                })
                .await?;
        }
        if wanted("create") || wanted("delete") {
            runner.create_and_delete(c, &owner).await?;
        }
        // Patch, then delete, objects that existed before the rows: each request
        // its own object, so an ownership cache must know them all. They are
        // created here, one concurrency at a time, so that the owned objects of
        // the resource stay well under crproxy's cache limit (50 000; all of a
        // full run's at once came close, and the creates then went over it), and
        // the rows start once the cache has read them.
        let counts = plan.counts(plan.requests, c);
        if wanted("patch (seeded)") || wanted("delete (seeded)") {
            let names: Vec<Vec<String>> = lanes
                .iter()
                .map(|lane| seeded_names(plan, &[lane.name], c))
                .collect();
            eprintln!(
                "seeding {} objects for the seeded patch and delete c={c}...",
                names.iter().map(Vec::len).sum::<usize>()
            );
            for (lane, names) in lanes.iter().zip(&names) {
                seed(&direct, NS_SEEDED, names, &lane.objects_owner(&owner)).await?;
            }
            if let Some(catch_up) = &catch_up {
                let what = format!(
                    "crproxy ownership cache had not read the objects seeded for c={c} before their rows"
                );
                catch_up
                    .await_or_note(&format!("c{c}"), &what, runner.notes)
                    .await;
            }
            let prefix = |lane: &Lane, tag: &str| seeded_prefix(lane.name, c, tag);
            if wanted("patch (seeded)") {
                runner
                    .row("patch (seeded)", c, counts, |lane, tag| {
                        Arc::new(PatchNamed {
                            namespace: NS_SEEDED.into(),
                            prefix: prefix(lane, tag),
                        })
                    })
                    .await?;
            }
            if wanted("delete (seeded)") {
                runner
                    .row("delete (seeded)", c, counts, |lane, tag| {
                        Arc::new(DeleteObjects {
                            namespace: NS_SEEDED.into(),
                            prefix: prefix(lane, tag),
                        })
                    })
                    .await?;
            }
            // Whatever rows ran (the DELETE rows leave nothing, unless some of
            // their requests failed), the next concurrency's objects do not pile
            // up on these towards the cache limit.
            delete_all(&direct, NS_SEEDED).await?;
        }
        if wanted("update (PUT)") {
            runner.update(c, &owner, &update_rvs).await?;
        }
        if wanted("patch (merge)") {
            runner.patch(c).await?;
        }
        if wanted(CACHE_EVENTS) {
            match &child_proxy {
                Some(child) => {
                    let watcher = CacheWatcher {
                        pid: child.pid,
                        clock: cpu_clock,
                        catch_up,
                    };
                    let cost =
                        cache_event_cost(plan, c, &direct, &watcher, &owner, runner.notes).await?;
                    cache_events.push(cost);
                }
                None if c == plan.concurrency[0] => runner.notes.push(
                    "cache events not measured: crproxy ran inside the benchmark process".into(),
                ),
                None => {}
            }
        }
    }
    for &(watches, events) in &plan.watches {
        if wanted(&format!("watch {watches}")) {
            let row =
                watch_row(watches, events, &lanes, plan, &direct, &owner, runner.notes).await?;
            runner.rows.push(row);
        }
    }
    let rows = runner.rows;

    let aggregated = if options.skip_aggregator {
        notes.push(
            "the comparison through the aggregation layer was skipped (--no-aggregator)".into(),
        );
        Vec::new()
    } else {
        let setup = AggregatedSetup {
            options,
            plan,
            dir,
            client,
            crproxy: lanes
                .iter()
                .find(|lane| lane.column == Column::Crproxy)
                .ok_or_else(|| anyhow!("no crproxy lane"))?,
            with_nginx: nginx_proc.is_some(),
            target_addr,
            target_ca: &target_ca,
            target_token: &target_token,
            clock: cpu_clock,
            direct: &direct,
            owner: &owner,
        };
        measure_through_aggregator(&setup, notes).await?
    };
    if let Some(share) = timed_part_started
        .zip(rss::machine_time())
        .and_then(|(before, after)| after.since(before).steal_percent())
    {
        notes.push(format!(
            "steal time over the timed scenarios: the hypervisor took {share:.1} % of this machine's CPU time (/proc/stat); rows where it took {STEAL_NOTE_PERCENT} % or more during crproxy's or nginx's rounds are named"
        ));
    }

    // Memory of crproxy itself.
    let mut memory = Vec::new();
    let mut idle_watch_mib = None;
    let mut list_peaks = None;
    if let Some(kib) = idle_kib {
        memory.push(MemoryFigure {
            name: "crproxy RSS after start, idle".into(),
            mib: rss::mib(kib),
            note: String::new(),
        });
    }
    if let Some(pid) = proxy_pid {
        if let Some(m) = rss::memory(pid) {
            memory.push(MemoryFigure {
                name: "crproxy peak RSS during the latency scenarios".into(),
                mib: rss::mib(m.peak_kib),
                note: "VmHWM of the crproxy process".into(),
            });
        }
        if options.wants_memory_phase() {
            let (figures, idle, lists) =
                memory_phase(plan, pid, &crproxy, &direct, &owner, notes).await?;
            memory.extend(figures);
            idle_watch_mib = idle;
            list_peaks = lists;
        }
    } else {
        notes.push(
            "crproxy ran inside the benchmark process: no separate memory or CPU figures".into(),
        );
    }
    if let Some(sampler) = nginx_sampler {
        memory.push(MemoryFigure {
            name: "nginx peak RSS over the latency scenarios (master + workers, sampled)".into(),
            mib: rss::mib(sampler.stop().await),
            note: String::new(),
        });
    }
    if let (Some(n), Some(lane)) = (
        &nginx_proc,
        lanes.iter().find(|l| l.column == Column::Nginx),
    ) {
        if options.wants_memory_phase() {
            // For scale: what a plain proxy needs for the same idle watches.
            let (figure, _) =
                idle_watches("nginx", &lane.endpoint, n.pid, plan, &direct, &owner, notes).await?;
            memory.push(figure);
        }
    }
    if let Some(m) = rss::memory(std::process::id()) {
        memory.push(MemoryFigure {
            name: "benchmark process peak RSS".into(),
            mib: rss::mib(m.peak_kib),
            note: "load driver + both devclusters + the dev environment's own proxy".into(),
        });
    }

    let mut targets = report::latency_targets(&rows);
    targets.extend(report::memory_targets(idle_watch_mib, list_peaks));
    let goals = report::goal_checks(&rows, idle_watch_mib);
    let settings = json!({
        "mode": if options.quick { "quick" } else { "full" },
        "protocol": options.protocol,
        "crproxy": if proxy_pid.is_some() { "child process (crproxy run)" } else { "in-process" },
        "crproxy_worker_threads": child_proxy.as_ref().map(|c| &c.worker_threads),
        "crproxy_build": child_proxy.as_ref().map(|c| &c.build),
        "access": "owned",
        "nginx": nginx_proc.as_ref().map(|_| nginx_version()),
        "cpu_clock": cpu_clock,
        "plan": plan,
        "aggregated_concurrency": AGGREGATED_CONCURRENCY,
    });
    if let Some(n) = nginx_proc {
        n.stop().await;
    }
    if let Some(c) = child_proxy {
        // How often owned writes skipped the ownership GET in this run.
        match scrape(c.metrics_addr)
            .await
            .as_deref()
            .map(CacheLookups::parse)
        {
            Ok(Some(lookups)) => notes.push(lookups.note()),
            Ok(None) => notes.push("crproxy ownership cache: no owned writes counted".into()),
            Err(e) => notes.push(format!("crproxy ownership cache: metrics not read ({e})")),
        }
        c.stop().await;
    }
    Ok(Measurements {
        rows,
        aggregated,
        cache_events,
        memory,
        targets,
        goals,
        settings,
    })
}

/// What [`measure_through_aggregator`] works with.
struct AggregatedSetup<'a> {
    options: &'a Options,
    plan: &'a Plan,
    dir: &'a Path,
    /// The dev environment's client: its front-proxy certificate is the one
    /// crproxy trusts.
    client: &'a crproxy::devenv::DevClient,
    /// The direct comparison's crproxy lane: the aggregation layer's backend is
    /// the same listener, and the same process is charged and its dials counted.
    crproxy: &'a Lane,
    with_nginx: bool,
    target_addr: SocketAddr,
    /// The CA of the target's serving certificate, for nginx to check it with.
    target_ca: &'a str,
    /// The credentials crproxy uses on the target, for nginx to use too.
    target_token: &'a str,
    clock: rss::CpuClock,
    direct: &'a Arc<Endpoint>,
    owner: &'a Owner,
}

/// Concurrencies measured through the aggregation layer.
const AGGREGATED_CONCURRENCY: &[usize] = &[1, 16];

/// GET, LIST 100, merge PATCH and PUT of pre-existing objects, and create then
/// DELETE, at 1 and 16 workers, with crproxy and nginx each the backend of the
/// APIService of a client devcluster ([`aggregated`]), lanes interleaved round by
/// round as in the direct comparison. CPU per request is the backend's.
async fn measure_through_aggregator(
    setup: &AggregatedSetup<'_>,
    notes: &mut Vec<String>,
) -> Result<Vec<Row>> {
    let plan = setup.plan;
    let wanted = |scenario: &str| setup.options.wants(scenario);
    let list_name = format!("list {}", plan.small_list);
    if ![
        "get",
        list_name.as_str(),
        "patch (merge)",
        "update (PUT)",
        "create",
        "delete",
    ]
    .iter()
    .any(|s| wanted(s))
    {
        return Ok(Vec::new());
    }
    let protocol = setup.options.protocol;
    let front_proxy_client = setup.client.cluster.front_proxy_client();
    let mut layers = Vec::new();
    let mut nginx_proc = None;
    let measured = async {
        eprintln!("through the aggregation layer: a client devcluster in front of crproxy...");
        let layer = AggregationLayer::start(
            &setup.dir.join("front-crproxy"),
            "front-crproxy",
            &front_proxy_client,
            setup.crproxy.endpoint.addr,
            protocol,
        )
        .await?;
        let mut lanes = vec![Lane {
            name: "crproxy-via-aggregator",
            column: Column::Crproxy,
            endpoint: Arc::clone(&layer.endpoint),
            pid: setup.crproxy.pid,
            metrics: setup.crproxy.metrics,
        }];
        layers.push(layer);
        if let Some(binary) = nginx::find_binary().filter(|_| setup.with_nginx) {
            eprintln!("through the aggregation layer: a client devcluster in front of nginx...");
            let listen = SocketAddr::from(([127, 0, 0, 1], crproxy::devenv::free_port()?));
            let backend = nginx::AggregatorBackend {
                front_proxy_ca_pem: setup.client.cluster.front_proxy_ca_pem(),
                target_token: setup.target_token.to_string(),
            };
            let n = nginx_proc.insert(
                Nginx::start(
                    &binary,
                    &setup.dir.join("nginx-aggregated"),
                    listen,
                    nginx::Upstream::devcluster(setup.target_addr, setup.target_ca.to_string()),
                    nginx_workers(),
                    Some(backend),
                )
                .await?,
            );
            let layer = AggregationLayer::start(
                &setup.dir.join("front-nginx"),
                "front-nginx",
                &front_proxy_client,
                n.addr,
                protocol,
            )
            .await?;
            lanes.push(Lane {
                name: "nginx-via-aggregator",
                column: Column::Nginx,
                endpoint: Arc::clone(&layer.endpoint),
                pid: Some(n.pid),
                metrics: None,
            });
            layers.push(layer);
        }
        for layer in &layers {
            let admin = crproxy::devenv::admin_client(&layer.cluster)?;
            for ns in [NS_GET.to_string(), NS_RW.into(), list_ns(plan.small_list)] {
                create_namespace(&admin, &ns).await?;
            }
        }
        let update_rvs =
            seed_worker_objects(setup.direct, &lanes, AGGREGATED_CONCURRENCY, setup.owner).await?;
        // As in the direct comparison, the writes are timed once crproxy's
        // ownership cache has read the objects seeded for them.
        if let Some(metrics) = setup.crproxy.metrics {
            let catch_up = CacheCatchUp {
                direct: setup.direct,
                crproxy: &setup.crproxy.endpoint,
                metrics,
                owner: setup.owner,
            };
            catch_up
                .await_or_note(
                    "aggregated",
                    "crproxy ownership cache had not read the objects seeded for the aggregation layer's rows",
                    notes,
                )
                .await;
        }
        let mut runner = Runner {
            plan,
            lanes: &lanes,
            clock: setup.clock,
            rows: Vec::new(),
            notes,
        };
        for &c in AGGREGATED_CONCURRENCY {
            if wanted("get") {
                runner.get(c).await?;
            }
            if wanted(&list_name) {
                runner
                    .list(plan.small_list, plan.small_list_requests, c)
                    .await?;
            }
            if wanted("patch (merge)") {
                runner.patch(c).await?;
            }
            if wanted("update (PUT)") {
                runner.update(c, setup.owner, &update_rvs).await?;
            }
            if wanted("create") || wanted("delete") {
                runner.create_and_delete(c, setup.owner).await?;
            }
        }
        Ok::<_, anyhow::Error>(runner.rows)
    }
    .await;
    if let Some(n) = nginx_proc {
        n.stop().await;
    }
    for layer in layers {
        layer.shutdown().await;
    }
    measured.context("measuring through the aggregation layer")
}

/// nginx worker processes: one per core crproxy's runtime may use.
fn nginx_workers() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// Measures rows over one set of lanes (the direct comparison, or the one
/// through the aggregation layer) and collects them.
struct Runner<'a> {
    plan: &'a Plan,
    lanes: &'a [Lane],
    clock: rss::CpuClock,
    rows: Vec<Row>,
    notes: &'a mut Vec<String>,
}

impl Runner<'_> {
    /// GET of one object.
    async fn get(&mut self, c: usize) -> Result<()> {
        let path = object_path(NS_GET, "obj-0");
        self.row(
            "get",
            c,
            self.plan.counts(self.plan.get_requests, c),
            |_, _| {
                Arc::new(ReadPath {
                    path: path.clone(),
                    min_bytes: 0,
                })
            },
        )
        .await
    }

    /// LIST of the namespace holding `n` objects, `base` requests per round.
    async fn list(&mut self, n: usize, base: usize, c: usize) -> Result<()> {
        let path = collection_path(&list_ns(n));
        let counts = self.plan.list_counts(base, c);
        self.row(&format!("list {n}"), c, counts, |_, _| {
            Arc::new(ReadPath {
                path: path.clone(),
                min_bytes: 100 * n as u64,
            })
        })
        .await
    }

    /// Merge patch of each worker's own object (seeded as `p-<lane>-<c>-<w>`).
    async fn patch(&mut self, c: usize) -> Result<()> {
        self.row_with_states(
            "patch (merge)",
            c,
            self.plan.counts(self.plan.own_object_write_requests, c),
            |_, _| {
                Arc::new(PatchObjects {
                    namespace: NS_RW.into(),
                })
            },
            |lane| worker_names("p", lane, c),
        )
        .await
    }

    /// PUT of each worker's own object (seeded as `u-<lane>-<c>-<w>`, its
    /// resourceVersion in `seeded_rvs`). crproxy stamps `client`'s labels; the
    /// other lanes' bodies carry another owner's (see [`Lane::body_owner`]).
    async fn update(
        &mut self,
        c: usize,
        client: &Owner,
        seeded_rvs: &HashMap<String, String>,
    ) -> Result<()> {
        self.row_with_states(
            "update (PUT)",
            c,
            self.plan.counts(self.plan.own_object_write_requests, c),
            |lane, _| {
                Arc::new(UpdateObjects {
                    namespace: NS_RW.into(),
                    owner: lane.body_owner(client),
                })
            },
            |lane| {
                worker_names("u", lane, c)
                    .into_iter()
                    .map(|name| Owned {
                        resource_version: seeded_rvs.get(&name).cloned().unwrap_or_default(),
                        name,
                    })
                    .collect()
            },
        )
        .await
    }

    /// A row of creates, then a row of deletes that removes exactly what the
    /// creates made, round by round. Owners as in [`Runner::update`].
    async fn create_and_delete(&mut self, c: usize, client: &Owner) -> Result<()> {
        let counts = self.plan.counts(self.plan.requests, c);
        let prefix = |lane: &Lane, tag: &str| format!("c-{}-{c}-{tag}", lane.name);
        self.row("create", c, counts, |lane, tag| {
            Arc::new(CreateObjects {
                namespace: NS_RW.into(),
                prefix: prefix(lane, tag),
                owner: lane.body_owner(client),
            })
        })
        .await?;
        self.row("delete", c, counts, |lane, tag| {
            Arc::new(DeleteObjects {
                namespace: NS_RW.into(),
                prefix: prefix(lane, tag),
            })
        })
        .await
    }

    /// A row whose workers keep no state.
    async fn row<W, F>(
        &mut self,
        scenario: &str,
        c: usize,
        counts: Counts,
        workload: F,
    ) -> Result<()>
    where
        W: Workload<State = ()>,
        F: Fn(&Lane, &str) -> Arc<W>,
    {
        self.row_with_states(scenario, c, counts, workload, |_| vec![(); c])
            .await
    }

    /// One scenario at one concurrency on every lane: connect, warm up, then the
    /// rounds, interleaving lanes. `workload` gets the lane and the phase (`warm`,
    /// `r<round>`); `states` the lane's per-worker states.
    async fn row_with_states<W, F, S>(
        &mut self,
        scenario: &str,
        concurrency: usize,
        counts: Counts,
        workload: F,
        states: S,
    ) -> Result<()>
    where
        W: Workload,
        F: Fn(&Lane, &str) -> Arc<W>,
        S: Fn(&Lane) -> Vec<W::State>,
    {
        let lanes = self.lanes;
        let limit = self.plan.limit();
        eprintln!("{scenario} c={concurrency}");
        let mut workers = Vec::new();
        for lane in lanes {
            let senders = lane.endpoint.senders(concurrency).await?;
            let lane_workers: Vec<(Sender, W::State)> =
                senders.into_iter().zip(states(lane)).collect();
            let (warm, lane_workers) = closed_loop(
                Arc::clone(&lane.endpoint),
                workload(lane, "warm"),
                lane_workers,
                counts.warmup,
                limit,
            )
            .await;
            if warm.errors > 0 {
                eprintln!(
                    "  warm-up on {}: {} errors, first: {}",
                    lane.name,
                    warm.errors,
                    warm.first_error.as_deref().unwrap_or("")
                );
            }
            workers.push(lane_workers);
        }
        let mut rounds: Vec<Vec<RoundStats>> = vec![Vec::new(); lanes.len()];
        let mut cpu: Vec<(Duration, usize)> = vec![(Duration::ZERO, 0); lanes.len()];
        let mut first_errors: Vec<Option<String>> = vec![None; lanes.len()];
        let mut errors = vec![0u64; lanes.len()];
        let mut dials = vec![0u64; lanes.len()];
        let mut machine = vec![rss::MachineTime::default(); lanes.len()];
        let mut machine_requests = vec![0usize; lanes.len()];
        let mut round_throughputs: Vec<Vec<Option<f64>>> = vec![Vec::new(); lanes.len()];
        for round in 0..self.plan.rounds {
            for (i, lane) in lanes.iter().enumerate() {
                let lane_workers = std::mem::take(&mut workers[i]);
                let cpu_of = |pid| rss::tree_cpu(pid, self.clock);
                // Scraped outside the CPU window: rendering metrics is not a request.
                let dials_before = lane_dials(lane).await;
                let cpu_before = lane.pid.and_then(cpu_of);
                let machine_before = rss::machine_time();
                let (result, back) = closed_loop(
                    Arc::clone(&lane.endpoint),
                    workload(lane, &format!("r{round}")),
                    lane_workers,
                    counts.total,
                    limit,
                )
                .await;
                let cpu_after = lane.pid.and_then(cpu_of);
                if let (Some(before), Some(after)) = (machine_before, rss::machine_time()) {
                    machine[i] += after.since(before);
                    machine_requests[i] += result.latencies.len();
                }
                if let (Some(before), Some(after)) = (dials_before, lane_dials(lane).await) {
                    dials[i] += after.saturating_sub(before);
                }
                workers[i] = back;
                if let (Some(before), Some(after)) = (cpu_before, cpu_after) {
                    cpu[i].0 += after.saturating_sub(before);
                    cpu[i].1 += result.latencies.len();
                }
                if first_errors[i].is_none() {
                    first_errors[i] = result.first_error.clone();
                }
                errors[i] += result.errors;
                let stats =
                    RoundStats::from_samples(result.latencies, result.errors, Some(result.wall));
                round_throughputs[i].push(stats.as_ref().and_then(|s| s.throughput));
                rounds[i].extend(stats);
            }
        }
        let measured: Vec<Measured> = (0..lanes.len())
            .map(|i| Measured {
                summary: Summary::of(&rounds[i]),
                errors: errors[i],
                cpu_us: micros_each(cpu[i].0, cpu[i].1),
                first_error: first_errors[i].take(),
                dials: dials[i],
                machine: machine[i],
                machine_cpu_us: micros_each(machine[i].busy(), machine_requests[i]),
                round_throughputs: std::mem::take(&mut round_throughputs[i]),
            })
            .collect();
        let row = row_from(scenario, concurrency, lanes, measured, self.notes);
        self.rows.push(row);
        Ok(())
    }
}

fn row_from(
    scenario: &str,
    concurrency: usize,
    lanes: &[Lane],
    measured: Vec<Measured>,
    notes: &mut Vec<String>,
) -> Row {
    let (mut direct, mut crproxy, mut nginx) = (None, None, None);
    for (lane, m) in lanes.iter().zip(measured) {
        let errors = m.errors;
        if errors > 0 || m.summary.is_none() {
            notes.push(format!(
                "{scenario} c={concurrency} on {}: {errors} failed requests; first problem: {}",
                lane.name,
                m.first_error.as_deref().unwrap_or("no successful request")
            ));
        }
        if m.dials > 0 {
            notes.push(format!(
                "{scenario} c={concurrency} on {}: {} of crproxy's dials to the target fell inside the measured rounds; their handshakes are in its CPU per request",
                lane.name, m.dials
            ));
        }
        match lane.column {
            Column::Direct => direct = Some(m),
            Column::Crproxy => crproxy = Some(m),
            Column::Nginx => nginx = Some(m),
        }
    }
    let mut row = Row::new(
        scenario,
        concurrency,
        direct.and_then(|m| m.summary),
        crproxy.as_ref().and_then(|m| m.summary.clone()),
        nginx.as_ref().and_then(|m| m.summary.clone()),
    );
    row.crproxy_cpu_us = crproxy.as_ref().and_then(|m| m.cpu_us);
    row.nginx_cpu_us = nginx.as_ref().and_then(|m| m.cpu_us);
    row.crproxy_machine_cpu_us = crproxy.as_ref().and_then(|m| m.machine_cpu_us);
    row.nginx_machine_cpu_us = nginx.as_ref().and_then(|m| m.machine_cpu_us);
    if let (Some(crproxy), Some(nginx)) = (&crproxy, &nginx) {
        row.crproxy_vs_nginx_round_throughput =
            paired_round_ratios(&crproxy.round_throughputs, &nginx.round_throughputs);
    }
    row.crproxy_steal_percent = crproxy.and_then(|m| m.machine.steal_percent());
    row.nginx_steal_percent = nginx.and_then(|m| m.machine.steal_percent());
    if let Some(note) = steal_note(&row) {
        notes.push(note);
    }
    row
}

/// The scenario name `--only` matches to price crproxy's cache events.
pub const CACHE_EVENTS: &str = "cache events";

/// Time for the crproxy child to read the last events of a batch of writes before
/// its CPU is read, and to finish what came before the first batch: its cache
/// reads its watch after a pause of 10 ms. Each batch of either kind waits the
/// same, so with as many writes of each kind the idle time cancels out of the
/// difference (the table shows both counts).
const CACHE_EVENTS_SETTLE: Duration = Duration::from_millis(100);

/// The crproxy child whose cache events [`cache_event_cost`] prices.
struct CacheWatcher<'a> {
    pid: u32,
    clock: rss::CpuClock,
    /// Makes sure its cache is watching before the first batch; `None` where
    /// that cannot be asked (tests).
    catch_up: Option<CacheCatchUp<'a>>,
}

/// The price of one event on the crproxy child's ownership cache watch at `c`
/// concurrent writers ([`CacheEventCost`]): each round, the direct path creates
/// and then deletes a round's worth of objects labelled as the child's client's,
/// and as many labelled as another client's, the kinds taking turns at going
/// first; the child's CPU is read around each batch. crproxy serves no request
/// meanwhile; what it spends over the other client's writes is its idle cost.
async fn cache_event_cost(
    plan: &Plan,
    c: usize,
    direct: &Arc<Endpoint>,
    watcher: &CacheWatcher<'_>,
    owner: &Owner,
    notes: &mut Vec<String>,
) -> Result<CacheEventCost> {
    eprintln!("{CACHE_EVENTS} c={c}");
    // Without a watching cache (dropped after idling, or over its limit) the
    // child's own writes would cost no events and the table would read 0.
    if let Some(catch_up) = &watcher.catch_up {
        let what = format!(
            "{CACHE_EVENTS} c={c}: crproxy's ownership cache was not watching before the writes, so the figures may leave the events out"
        );
        catch_up
            .await_or_note(&format!("events-c{c}"), &what, notes)
            .await;
    }
    let cpu = || {
        rss::tree_cpu(watcher.pid, watcher.clock).ok_or_else(|| {
            anyhow!(
                "crproxy's CPU time (process {}) could not be read",
                watcher.pid
            )
        })
    };
    let count = plan.count(plan.requests, c);
    let kinds = [("own", owner.clone()), ("other", elsewhere(owner))];
    // Per kind: the child's CPU time and the writes it covers, failures.
    let mut spent = [(Duration::ZERO, 0usize); 2];
    let mut errors = [0u64; 2];
    let mut first_errors: [Option<String>; 2] = [None, None];
    let mut workers: Vec<(Sender, ())> = direct
        .senders(c)
        .await?
        .into_iter()
        .map(|sender| (sender, ()))
        .collect();
    tokio::time::sleep(CACHE_EVENTS_SETTLE).await;
    for round in 0..plan.rounds {
        for turn in 0..kinds.len() {
            let i = (turn + round) % kinds.len();
            let (kind, objects_owner) = &kinds[i];
            let prefix = format!("e-{kind}-{c}-r{round}");
            let create = Arc::new(CreateObjects {
                namespace: NS_EVENTS.into(),
                prefix: prefix.clone(),
                owner: Some(objects_owner.clone()),
            });
            let delete = Arc::new(DeleteObjects {
                namespace: NS_EVENTS.into(),
                prefix,
            });
            let before = cpu()?;
            let (created, back) =
                closed_loop(Arc::clone(direct), create, workers, count, plan.limit()).await;
            let (deleted, back) =
                closed_loop(Arc::clone(direct), delete, back, count, plan.limit()).await;
            workers = back;
            tokio::time::sleep(CACHE_EVENTS_SETTLE).await;
            spent[i].0 += cpu()?.saturating_sub(before);
            spent[i].1 += created.latencies.len() + deleted.latencies.len();
            errors[i] += created.errors + deleted.errors;
            first_errors[i] = first_errors[i]
                .take()
                .or(created.first_error)
                .or(deleted.first_error);
        }
    }
    for (((kind, _), errors), first_error) in kinds.iter().zip(errors).zip(first_errors) {
        if errors > 0 {
            notes.push(format!(
                "{CACHE_EVENTS} c={c}: {errors} of the direct path's writes of {kind} objects failed; first problem: {}",
                first_error.as_deref().unwrap_or("unknown")
            ));
        }
    }
    Ok(CacheEventCost::new(c, spent[0], spent[1]))
}

/// Steal time from this share of the machine's CPU time up, in the rounds of
/// crproxy or of nginx, makes a row's comparison worth a note. A line drawn
/// between what docs/performance.md saw: quiet runs at 0 to 1.1 %, runs whose
/// ratios were not repeatable at 14 to 17 %.
const STEAL_NOTE_PERCENT: f64 = 5.0;

/// A note for a row whose crproxy or nginx rounds ran while the hypervisor took
/// [`STEAL_NOTE_PERCENT`] or more of the machine's CPU time: both paths lose CPU
/// alike only if it hit both alike.
fn steal_note(row: &Row) -> Option<String> {
    let shares = [
        ("crproxy", row.crproxy_steal_percent),
        ("nginx", row.nginx_steal_percent),
    ];
    if !shares
        .iter()
        .any(|(_, share)| share.is_some_and(|s| s >= STEAL_NOTE_PERCENT))
    {
        return None;
    }
    let during: Vec<String> = shares
        .iter()
        .filter_map(|(path, share)| share.map(|s| format!("{s:.1} % during {path}'s rounds")))
        .collect();
    Some(format!(
        "{} c={}: the hypervisor took the CPU from this machine (steal time {}); its figures against each other are less certain",
        row.scenario,
        row.concurrency,
        during.join(", ")
    ))
}

/// Watch delivery: `watches` watches through each lane, `events` writes on the
/// target per round, each timed from just before the write until it arrives on
/// each watch.
async fn watch_row(
    watches: usize,
    events: usize,
    lanes: &[Lane],
    plan: &Plan,
    direct: &Arc<Endpoint>,
    owner: &Owner,
    notes: &mut Vec<String>,
) -> Result<Row> {
    let scenario = format!("watch {watches}");
    eprintln!("{scenario}");
    let mut writer = direct.connect().await?;
    let mut measured = Vec::new();
    for lane in lanes {
        let rv = collection_rv(&mut writer, direct, NS_WATCH).await?;
        let marker = format!("ev-{}-{watches}-", lane.name);
        eprintln!("  {}: opening {watches} watches", lane.name);
        let path = format!("{}?watch=1&resourceVersion={rv}", collection_path(NS_WATCH));
        let mut set = WatchSet::open(
            Arc::clone(&lane.endpoint),
            &path,
            watches,
            &marker,
            Duration::from_secs(60),
        )
        .await?;
        if set.established < watches {
            let name = format!("{marker}{PRIME_SEQ}");
            let sent_at = Instant::now();
            write_widget(&mut writer, direct, NS_WATCH, &name, owner).await?;
            set.prime(PRIME_SEQ, watches, sent_at, Duration::from_secs(15))
                .await;
        }
        let mut first_error = set.first_error.clone();
        let mut rounds = Vec::new();
        if set.established > 0 {
            for round in 0..plan.rounds {
                let mut delays = Vec::new();
                let mut missing = 0;
                for k in 0..events {
                    let seq = (round * events + k) as u64;
                    let name = format!("{marker}{seq}");
                    let sent_at = Instant::now();
                    if let Err(e) = write_widget(&mut writer, direct, NS_WATCH, &name, owner).await
                    {
                        first_error.get_or_insert(e.to_string());
                        continue;
                    }
                    let (got, lost) = set
                        .collect(seq, set.established, sent_at, Duration::from_secs(10))
                        .await;
                    if lost > 0 {
                        first_error.get_or_insert(format!(
                            "{lost} of {} watches did not deliver {name} within 10s",
                            set.established
                        ));
                    }
                    delays.extend(got);
                    missing += lost as u64;
                }
                if let Some(stats) = RoundStats::from_samples(delays, missing, None) {
                    rounds.push(stats);
                }
            }
        }
        if set.established < watches {
            notes.push(format!(
                "{scenario} on {}: only {} of {watches} watches opened; its latencies cover those only, so its ratios are not like for like",
                lane.name, set.established
            ));
        }
        set.close();
        let errors = rounds.iter().map(|r| r.errors).sum();
        measured.push(Measured {
            errors,
            summary: Summary::of(&rounds),
            cpu_us: None,
            first_error,
            dials: 0,
            machine: rss::MachineTime::default(),
            machine_cpu_us: None,
            // Watch delivery has no throughput.
            round_throughputs: Vec::new(),
        });
    }
    Ok(row_from(&scenario, watches, lanes, measured, notes))
}

type MemoryOutcome = (
    Vec<MemoryFigure>,
    Option<(usize, f64)>,
    Option<((usize, f64), (usize, f64))>,
);

/// crproxy's peak RSS while listing a large and a larger collection (first, so
/// the idle-watch phase cannot inflate it), then its RSS with many idle watches.
async fn memory_phase(
    plan: &Plan,
    pid: u32,
    crproxy: &Arc<Endpoint>,
    direct: &Arc<Endpoint>,
    owner: &Owner,
    notes: &mut Vec<String>,
) -> Result<MemoryOutcome> {
    let mut figures = Vec::new();
    let (small, large) = plan.memory_lists;
    eprintln!("memory: seeding {large} objects for the large list");
    let names: Vec<String> = (0..large).map(|i| format!("o-{i}")).collect();
    seed(direct, NS_BIG, &names, owner).await?;
    if small != plan.large_list && small != plan.small_list {
        let names: Vec<String> = (0..small).map(|i| format!("o-{i}")).collect();
        seed(direct, &list_ns(small), &names, owner).await?;
    }
    let mut peaks = Vec::new();
    for (n, ns) in [(small, list_ns(small)), (large, NS_BIG.to_string())] {
        eprintln!("memory: listing {n} objects through crproxy");
        // Give memory freed by the previous phase back before the baseline.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let before = rss::memory(pid).map(|m| m.rss_kib).unwrap_or(0);
        if !rss::reset_peak(pid) {
            notes.push(
                "could not reset crproxy's peak RSS; list peaks include earlier phases".into(),
            );
        }
        let mut sender = crproxy.connect().await?;
        let mut bytes = 0;
        for _ in 0..3 {
            let request = crproxy.request(Method::GET, &collection_path(&ns), None)?;
            let answer = driver::exchange(&mut sender, request, false).await?;
            if !answer.status.is_success() {
                bail!(
                    "listing {n} objects through crproxy answered {}",
                    answer.status
                );
            }
            bytes = answer.bytes;
        }
        let peak = rss::memory(pid).map(|m| m.peak_kib).unwrap_or(0);
        figures.push(MemoryFigure {
            name: format!("crproxy peak RSS listing {n} objects"),
            mib: rss::mib(peak),
            note: format!(
                "{:.1} MiB before; 3 sequential lists of {:.1} MiB each",
                rss::mib(before),
                bytes as f64 / 1048576.0
            ),
        });
        peaks.push((n, rss::mib(peak)));
    }
    let lists = match peaks.as_slice() {
        [a, b] => Some((*a, *b)),
        _ => None,
    };

    let (figure, mib) = idle_watches("crproxy", crproxy, pid, plan, direct, owner, notes).await?;
    figures.push(figure);
    Ok((figures, Some((plan.idle_watches, mib)), lists))
}

/// The RSS of `pid` and its children with `plan.idle_watches` watches open
/// through `endpoint`, in MiB, as a figure for the report.
async fn idle_watches(
    label: &str,
    endpoint: &Arc<Endpoint>,
    pid: u32,
    plan: &Plan,
    direct: &Arc<Endpoint>,
    owner: &Owner,
    notes: &mut Vec<String>,
) -> Result<(MemoryFigure, f64)> {
    let count = plan.idle_watches;
    eprintln!("memory: {count} idle watches through {label}");
    let marker = format!("idle-{label}-");
    let mut writer = direct.connect().await?;
    let rv = collection_rv(&mut writer, direct, NS_IDLE).await?;
    let before = rss::tree_memory(pid).map(|m| m.rss_kib).unwrap_or(0);
    let path = format!("{}?watch=1&resourceVersion={rv}", collection_path(NS_IDLE));
    let mut set = WatchSet::open(
        Arc::clone(endpoint),
        &path,
        count,
        &marker,
        Duration::from_secs(120),
    )
    .await?;
    if set.established < count {
        let name = format!("{marker}{PRIME_SEQ}");
        let sent_at = Instant::now();
        write_widget(&mut writer, direct, NS_IDLE, &name, owner).await?;
        set.prime(PRIME_SEQ, count, sent_at, Duration::from_secs(30))
            .await;
    }
    // Let allocations settle (connection buffers, timers) before reading.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let with = rss::tree_memory(pid).map(|m| m.rss_kib).unwrap_or(0);
    let established = set.established;
    if established < count {
        notes.push(format!(
            "idle watches: only {established} of {count} were established through {label} (the rest stayed pending inside it, and count in its RSS); first problem: {}",
            set.first_error.as_deref().unwrap_or("none reported")
        ));
    }
    set.close();
    let figure = MemoryFigure {
        name: format!("{label} RSS with {count} idle watches ({established} established)"),
        mib: rss::mib(with),
        note: format!("{:.1} MiB before opening them", rss::mib(before)),
    };
    Ok((figure, rss::mib(with)))
}

/// What [`CacheCatchUp::run`] needs: the target directly (to write a marker),
/// crproxy's proxy port (to write it through) and its metrics listener (to see
/// whether the cache answered).
#[derive(Clone, Copy)]
struct CacheCatchUp<'a> {
    direct: &'a Arc<Endpoint>,
    crproxy: &'a Endpoint,
    metrics: SocketAddr,
    owner: &'a Owner,
}

impl CacheCatchUp<'_> {
    /// Waits until crproxy's ownership cache is synced and has read everything
    /// written to the target so far (bounded: 30 s), so that timed rows neither
    /// include the cache's start (a resource's first owned write starts it) nor
    /// its reading of objects seeded just before. A watch delivers events in
    /// order, so the cache has caught up once it knows an object created directly
    /// on the target after the rest: a fresh marker each attempt
    /// (`cache-marker-<tag>-<n>`), patched through crproxy once, must be counted
    /// as a hit. (Patching the same marker again proves nothing: the first
    /// patch's answer teaches the cache the object.)
    async fn run(&self, tag: &str) -> Result<()> {
        let mut sender = self.crproxy.connect().await?;
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut last = String::from("no attempt");
        let hits = |exposition: &str| CacheLookups::parse(exposition).map(|l| l.hit);
        let mut attempt = 0;
        while Instant::now() < deadline {
            let marker = format!("cache-marker-{tag}-{attempt}");
            attempt += 1;
            seed(
                self.direct,
                NS_RW,
                std::slice::from_ref(&marker),
                self.owner,
            )
            .await?;
            let before = hits(&scrape(self.metrics).await?).unwrap_or(0);
            let status = patch_through(self.crproxy, &mut sender, &marker).await?;
            if !status.is_success() {
                last = format!("patching {marker} answered {status}");
            } else {
                match hits(&scrape(self.metrics).await?) {
                    Some(after) if after > before => return Ok(()),
                    Some(_) => last = format!("{marker} was not in the cache yet"),
                    None => {
                        last = "the child exports no crproxy_ownership_cache_lookups_total (a crproxy without the ownership cache?)".into()
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        bail!("{last}")
    }

    /// [`Self::run`], a failure becoming the report's note `what: <why>`: rows
    /// measured without the cache caught up are still worth reporting, marked.
    async fn await_or_note(&self, tag: &str, what: &str, notes: &mut Vec<String>) {
        if let Err(e) = self.run(tag).await {
            notes.push(format!("{what}: {e}"));
        }
    }
}

/// Seeds, in the read-write namespace, each lane's objects for its PUT (`u-*`)
/// and merge PATCH (`p-*`) rows: one per worker at each concurrency, labelled
/// as the lane's writes label them. Answers the seeded PUT objects'
/// resourceVersions by name, which the PUT rows start from.
async fn seed_worker_objects(
    direct: &Arc<Endpoint>,
    lanes: &[Lane],
    concurrency: &[usize],
    owner: &Owner,
) -> Result<HashMap<String, String>> {
    let mut update_rvs = HashMap::new();
    for lane in lanes {
        let objects_owner = lane.objects_owner(owner);
        for &c in concurrency {
            update_rvs
                .extend(seed(direct, NS_RW, &worker_names("u", lane, c), &objects_owner).await?);
            seed(direct, NS_RW, &worker_names("p", lane, c), &objects_owner).await?;
        }
    }
    Ok(update_rvs)
}

/// A merge patch of the widget `name` in the read-write namespace, sent through
/// crproxy; its status.
async fn patch_through(
    crproxy: &Endpoint,
    sender: &mut Sender,
    name: &str,
) -> Result<http::StatusCode> {
    let request = crproxy.request(
        Method::PATCH,
        &object_path(NS_RW, name),
        Some((
            "application/merge-patch+json",
            bytes::Bytes::from_static(br#"{"spec":{"n":1}}"#),
        )),
    )?;
    Ok(driver::exchange(sender, request, false).await?.status)
}

/// The dials the lane's crproxy child has attempted so far; `None` for other
/// lanes, or when its metrics cannot be read.
async fn lane_dials(lane: &Lane) -> Option<u64> {
    let exposition = scrape(lane.metrics?).await.ok()?;
    Some(dial_attempts(&exposition))
}

/// `GET /metrics` of a plain-HTTP metrics listener, the body as text.
async fn scrape(addr: SocketAddr) -> Result<String> {
    crproxy::doctor::fetch_metrics(&format!("http://{addr}/metrics")).await
}

/// Dials crproxy has attempted to the target's peers since it started: every
/// attempt is observed once in its dial-latency histogram.
fn dial_attempts(exposition: &str) -> u64 {
    exposition::parse(exposition)
        .iter()
        .filter(|s| s.name == "vcluster_proxy_peer_dial_duration_seconds_count")
        .map(|s| s.value as u64)
        .sum()
}

/// `crproxy_ownership_cache_lookups_total` summed by result over the run.
#[derive(Debug, Default, PartialEq, Eq)]
struct CacheLookups {
    hit: u64,
    stale: u64,
    miss: u64,
    unsynced: u64,
}

impl CacheLookups {
    /// `None` when the exposition has no such series (no owned write happened).
    fn parse(exposition: &str) -> Option<Self> {
        let mut lookups = CacheLookups::default();
        let mut seen = false;
        let samples = exposition::parse(exposition);
        let lookups_total = samples
            .iter()
            .filter(|s| s.name == "crproxy_ownership_cache_lookups_total");
        for sample in lookups_total {
            let slot = match sample.labels.get("result").map(String::as_str) {
                Some("hit") => &mut lookups.hit,
                Some("stale") => &mut lookups.stale,
                Some("miss") => &mut lookups.miss,
                Some("unsynced") => &mut lookups.unsynced,
                _ => continue,
            };
            *slot += sample.value as u64;
            seen = true;
        }
        seen.then_some(lookups)
    }

    fn note(&self) -> String {
        let total = self.hit + self.stale + self.miss + self.unsynced;
        let rate = if total > 0 {
            self.hit as f64 * 100.0 / total as f64
        } else {
            0.0
        };
        format!(
            "crproxy ownership cache over the run: {rate:.1}% of {total} owned writes in one exchange (hit {}, stale {}, miss {}, unsynced {})",
            self.hit, self.stale, self.miss, self.unsynced
        )
    }
}

/// Percent-encodes a query parameter value (RFC 3986 unreserved characters stay).
fn query_escape(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Creates one Widget on the target (the write a watch is timed against).
async fn write_widget(
    writer: &mut Sender,
    direct: &Endpoint,
    namespace: &str,
    name: &str,
    owner: &Owner,
) -> Result<()> {
    let object = widget(namespace, name, 0, Some(owner), None);
    let request = direct.request(
        Method::POST,
        &collection_path(namespace),
        Some(("application/json", bytes::Bytes::from(object.to_string()))),
    )?;
    let answer = driver::exchange(writer, request, false).await?;
    if !answer.status.is_success() {
        bail!(
            "writing {namespace}/{name} on the target answered {}",
            answer.status
        );
    }
    Ok(())
}

/// Whether the endpoint's identity may list widgets across namespaces.
async fn may_use_widgets(direct: &Endpoint) -> Result<bool> {
    let mut sender = direct.connect().await?;
    let request = direct.request(Method::GET, "/apis/example.com/v1/widgets?limit=1", None)?;
    let answer = driver::exchange(&mut sender, request, false).await?;
    Ok(answer.status != http::StatusCode::FORBIDDEN)
}

/// Waits until a discovery request through the endpoint answers 200 (front-proxy
/// trust loaded, peers known).
async fn wait_until_serving(endpoint: &Endpoint) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = String::new();
    while Instant::now() < deadline {
        match endpoint.connect().await {
            Ok(mut sender) => {
                let request = endpoint.request(Method::GET, "/apis/example.com/v1", None)?;
                match driver::exchange(&mut sender, request, true).await {
                    Ok(answer) if answer.status.is_success() => return Ok(()),
                    Ok(answer) => last = format!("answered {}", answer.status),
                    Err(e) => last = e.to_string(),
                }
            }
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    bail!("{} did not serve within 30s: {last}", endpoint.label)
}

/// The collection's current resourceVersion, so a watch starts after everything
/// already there.
async fn collection_rv(writer: &mut Sender, direct: &Endpoint, namespace: &str) -> Result<String> {
    let request = direct.request(
        Method::GET,
        &format!("{}?limit=1", collection_path(namespace)),
        None,
    )?;
    let answer = driver::exchange(writer, request, true).await?;
    answer
        .body
        .as_deref()
        .and_then(resource_version)
        .ok_or_else(|| {
            anyhow!(
                "listing {namespace} gave no resourceVersion ({})",
                answer.status
            )
        })
}

/// Creates named objects (with the ownership labels) directly on the target, 32
/// at a time; returns each name's resourceVersion. Existing objects are kept.
async fn seed(
    direct: &Arc<Endpoint>,
    namespace: &str,
    names: &[String],
    owner: &Owner,
) -> Result<Vec<(String, String)>> {
    const PARALLEL: usize = 32;
    let senders = direct.senders(PARALLEL.min(names.len().max(1))).await?;
    let chunk = names.len().div_ceil(senders.len()).max(1);
    let mut tasks = Vec::new();
    for (mut sender, names) in senders.into_iter().zip(names.chunks(chunk)) {
        let direct = Arc::clone(direct);
        let names = names.to_vec();
        let namespace = namespace.to_string();
        let owner = owner.clone();
        tasks.push(tokio::spawn(async move {
            let mut out = Vec::with_capacity(names.len());
            for name in names {
                let object = widget(&namespace, &name, 0, Some(&owner), None);
                let request = direct.request(
                    Method::POST,
                    &collection_path(&namespace),
                    Some(("application/json", bytes::Bytes::from(object.to_string()))),
                )?;
                let mut answer = driver::exchange(&mut sender, request, true).await?;
                if answer.status == http::StatusCode::CONFLICT {
                    let request =
                        direct.request(Method::GET, &object_path(&namespace, &name), None)?;
                    answer = driver::exchange(&mut sender, request, true).await?;
                }
                if !answer.status.is_success() {
                    bail!(
                        "seeding {namespace}/{name} answered {}: {}",
                        answer.status,
                        answer
                            .body
                            .as_deref()
                            .map(String::from_utf8_lossy)
                            .unwrap_or_default()
                    );
                }
                let rv = answer
                    .body
                    .as_deref()
                    .and_then(resource_version)
                    .unwrap_or_default();
                out.push((name, rv));
            }
            Ok::<_, anyhow::Error>(out)
        }));
    }
    let mut all = Vec::with_capacity(names.len());
    for task in tasks {
        all.extend(task.await.context("a seeding task panicked")??);
    }
    Ok(all)
}

/// Deletes every widget of `namespace` on the target, in one request.
async fn delete_all(direct: &Arc<Endpoint>, namespace: &str) -> Result<()> {
    let mut sender = direct.connect().await?;
    let request = direct.request(Method::DELETE, &collection_path(namespace), None)?;
    let answer = driver::exchange(&mut sender, request, false).await?;
    if !answer.status.is_success() {
        bail!(
            "deleting the widgets of {namespace} answered {}",
            answer.status
        );
    }
    Ok(())
}

/// A kube-rs client for the identity a kubeconfig names (the set-up's admin
/// writes: namespaces on the client and the target).
fn kube_client(kubeconfig: &Path) -> Result<kube::Client> {
    // The loader's error names the file already.
    let loaded = crproxy_kube::Kubeconfig::load(kubeconfig)?;
    let cluster = crproxy_kube::ClusterConfig::from_kubeconfig(&loaded, None)?;
    let credentials = cluster.credentials()?;
    Ok(crproxy_kube::kube_client(&cluster, credentials, "default")?)
}

pub(crate) async fn create_namespace(client: &kube::Client, name: &str) -> Result<()> {
    let resource = kube::api::ApiResource {
        group: String::new(),
        version: "v1".into(),
        api_version: "v1".into(),
        kind: "Namespace".into(),
        plural: "namespaces".into(),
    };
    let namespace = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}});
    aggregated::create_object(client, &resource, &namespace).await
}

/// The report's note on how the child was optimised: the image ships a
/// profile-guided build, so a run of any other says the rows are not for it.
fn build_note(build: &str) -> String {
    if build == crproxy::build_kind::PROFILE_GUIDED {
        format!("crproxy child: {build} build, as the image ships it (scripts/pgo-build)")
    } else {
        format!(
            "crproxy child: {build} build, not the profile-guided one the image ships \
             (scripts/pgo-build; scripts/bench measures that unless told --plain-build): \
             its rows, the goal rows too, say what this build does"
        )
    }
}

/// `cargo build --release -p crproxy` when the benchmark runs under cargo and the
/// binary is missing, so `cargo run -p crproxy-bench` is enough.
fn build_proxy_binary(notes: &mut Vec<String>) -> Option<PathBuf> {
    let cargo = std::env::var_os("CARGO")?;
    let mut command = std::process::Command::new(cargo);
    command.args(["build", "-p", "crproxy"]);
    if !cfg!(debug_assertions) {
        command.arg("--release");
    }
    eprintln!("building the crproxy binary ({command:?})...");
    match command.status() {
        Ok(status) if status.success() => child::sibling_binary(),
        Ok(status) => {
            notes.push(format!("building crproxy failed ({status})"));
            None
        }
        Err(e) => {
            notes.push(format!("could not run cargo to build crproxy: {e}"));
            None
        }
    }
}

fn nginx_version() -> Option<String> {
    let binary = nginx::find_binary()?;
    let output = std::process::Command::new(binary).arg("-v").output().ok()?;
    let text = String::from_utf8_lossy(&output.stderr).trim().to_string();
    Some(text.trim_start_matches("nginx version: ").to_string())
}

fn git_commit() -> Option<String> {
    let output = std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run of anything but the shipped, profile-guided build says so beside
    /// its rows.
    #[test]
    fn the_notes_say_whether_the_child_is_the_shipped_build() {
        let shipped = build_note("profile-guided");
        assert!(
            shipped.contains("profile-guided build, as the image ships it"),
            "{shipped}"
        );
        let plain = build_note("plain");
        assert!(
            plain.starts_with("crproxy child: plain build, not the profile-guided one"),
            "{plain}"
        );
        assert!(plain.contains("--plain-build"), "{plain}");
    }

    /// A lane of `column` whose endpoint is never connected to.
    fn test_lane(column: Column) -> Lane {
        Lane {
            name: "lane",
            column,
            endpoint: Arc::new(
                Endpoint::new(
                    "lane",
                    SocketAddr::from(([127, 0, 0, 1], 1)),
                    None,
                    &Identity::Bearer("t".into()),
                    Protocol::Http2,
                )
                .expect("an endpoint needs no connection"),
            ),
            pid: None,
            metrics: None,
        }
    }

    #[test]
    fn only_crproxy_writes_its_client_s_objects() {
        use crproxy_core::ownership::{response_visibility, Visibility};
        let client = Owner {
            name: "client-1".into(),
            project: "default".into(),
        };
        let judge = crproxy_core::ownership::Owner::new(&client.name, &client.project);
        for (column, visibility) in [
            (Column::Direct, Visibility::NotOwned),
            (Column::Nginx, Visibility::NotOwned),
            (Column::Crproxy, Visibility::Owned),
        ] {
            let lane = test_lane(column);
            let stored = lane.objects_owner(&client);
            let object = widget(NS_RW, "w", 0, Some(&stored), None).to_string();
            assert_eq!(
                response_visibility(&judge, object.as_bytes()),
                visibility,
                "{column:?}: {object}"
            );
            // Still a valid label value (at most 63 characters).
            assert!(stored.name.len() <= 63, "{}", stored.name);
        }
        assert_eq!(test_lane(Column::Crproxy).body_owner(&client), None);
    }

    #[test]
    fn dials_are_read_from_crproxy_s_own_exposition() {
        let metrics = crproxy_proxy::metrics::Metrics::new();
        assert_eq!(dial_attempts(&metrics.encode()), 0);
        let one = metrics.target("default/one");
        for seconds in [0.001, 0.002, 6.0] {
            one.dial_duration(seconds);
        }
        metrics.target("default/two").dial_duration(0.5);
        assert_eq!(dial_attempts(&metrics.encode()), 4);
        assert_eq!(dial_attempts(&metrics.encode_prometheus_text()), 4);
    }

    #[test]
    fn dials_are_those_of_the_named_metric_only() {
        let text = "# TYPE vcluster_proxy_peer_dial_duration_seconds histogram\n\
            vcluster_proxy_peer_dial_duration_seconds_count{target=\"a\",note=\"x} 9\"} 2\n\
            vcluster_proxy_peer_dial_duration_seconds_count 3\n\
            vcluster_proxy_peer_dial_duration_seconds_count_extra 100\n\
            vcluster_proxy_peer_dial_duration_seconds_count{target=\"b\"} not-a-number\n\
            other_vcluster_proxy_peer_dial_duration_seconds_count 7\n";
        assert_eq!(dial_attempts(text), 5);
    }

    #[test]
    fn the_cache_hit_rate_is_read_from_the_exposition() {
        let text = "# TYPE crproxy_ownership_cache_lookups counter\n\
            crproxy_ownership_cache_lookups_total{target=\"default/t\",group_version=\"example.com/v1\",result=\"hit\"} 90\n\
            crproxy_ownership_cache_lookups_total{target=\"default/t\",group_version=\"example.com/v1\",result=\"stale\"} 4\n\
            crproxy_ownership_cache_lookups_total{target=\"default/t\",group_version=\"example.com/v1\",result=\"unsynced\"} 6\n\
            vcluster_proxy_watch_events_total{target=\"default/t\"} 3\n";
        let lookups = CacheLookups::parse(text).expect("lookups");
        assert_eq!(
            lookups,
            CacheLookups {
                hit: 90,
                stale: 4,
                miss: 0,
                unsynced: 6
            }
        );
        assert!(
            lookups.note().contains("90.0% of 100 owned writes"),
            "{}",
            lookups.note()
        );
        assert_eq!(
            CacheLookups::parse("vcluster_proxy_watch_events_total 3\n"),
            None
        );
    }

    #[test]
    fn query_values_are_escaped() {
        assert_eq!(
            query_escape("vcluster.com/owner-vcluster=client,x=y z"),
            "vcluster.com%2Fowner-vcluster%3Dclient%2Cx%3Dy%20z"
        );
    }

    #[test]
    fn only_memory_runs_the_memory_phase_alone() {
        let only = |text: &str| Options {
            only: Some(text.into()),
            ..Options::default()
        };
        assert!(Options::default().wants_memory_phase());
        assert!(only("memory").wants_memory_phase());
        assert!(!only("memory").wants("get") && !only("memory").wants("watch delivery"));
        assert!(!only("get").wants_memory_phase());
        let skipped = Options {
            skip_memory: true,
            ..only("memory")
        };
        assert!(!skipped.wants_memory_phase());
    }

    #[test]
    fn the_quick_plan_is_smaller_than_the_full_one() {
        let quick = Plan::new(true);
        let full = Plan::new(false);
        assert!(quick.rounds < full.rounds && quick.requests < full.requests);
        assert!(quick.get_requests < full.get_requests);
        assert!(quick.own_object_write_requests < full.own_object_write_requests);
        assert_eq!(full.concurrency, [1, 16, 64]);
        assert_eq!(full.memory_lists, (10_000, 100_000));
        assert_eq!(full.count(16, 64), 128, "two requests per worker at least");
    }

    #[test]
    fn a_round_count_replaces_the_plans_own() {
        let rounds = |quick, rounds: Option<usize>| {
            let options = Options {
                quick,
                rounds: rounds.and_then(NonZeroUsize::new),
                ..Options::default()
            };
            Plan::of(&options).rounds
        };
        assert_eq!(rounds(false, None), Plan::new(false).rounds);
        assert_eq!(rounds(true, None), Plan::new(true).rounds);
        assert_eq!(rounds(true, Some(7)), 7);
        assert_eq!(rounds(false, Some(40)), 40);
    }

    #[test]
    fn a_full_run_keeps_the_owned_widgets_under_the_ownership_cache_limit() {
        let plan = Plan::new(false);
        let lanes = ["direct", "crproxy", "nginx"];
        let c = *plan.concurrency.iter().max().expect("concurrencies");
        let seeded = seeded_names(&plan, &lanes, c);
        let distinct: std::collections::HashSet<&String> = seeded.iter().collect();
        assert_eq!(distinct.len(), seeded.len(), "one object per request");
        let counts = plan.counts(plan.requests, c);
        assert_eq!(
            seeded.len(),
            lanes.len() * (counts.warmup + plan.rounds * counts.total)
        );
        // At most at once: the lists' objects, every worker's object for PUT and
        // PATCH, and either the create row's objects (the delete row removes
        // them) or, seeded after that, one concurrency's seeded objects. Counted
        // for every lane, a bound: only the crproxy lane's carry its client's
        // labels (the others write `elsewhere`'s).
        let created = lanes.len() * (counts.warmup + plan.rounds * counts.total);
        let workers: usize = plan.concurrency.iter().sum::<usize>() * lanes.len() * 2;
        let peak = plan.small_list + plan.large_list + workers + seeded.len().max(created);
        let limit = crproxy_proxy::ownership_cache::MAX_OBJECTS;
        assert!(peak < limit, "{peak} owned widgets at once, limit {limit}");
    }

    #[test]
    fn every_worker_warms_up_with_several_requests() {
        let quick = Plan::new(true);
        assert_eq!(quick.warmup(300, 1), 60, "a fifth of a round");
        assert_eq!(quick.warmup(300, 64), 64 * WARMUP_PER_WORKER);
        let lists = quick.list_counts(100, 64);
        assert_eq!(lists.warmup, 128, "lists stay at two a worker");
        assert_eq!(lists.total, 128);
    }

    /// The direct path to the test environment's target, as an administrator,
    /// with `namespace` created there.
    async fn direct_with_namespace(
        env: &crproxy::devenv::DevEnv,
        namespace: &str,
    ) -> Arc<Endpoint> {
        let token = env
            .target
            .issue_token("bench-test", &["system:masters"])
            .expect("token");
        let direct = Arc::new(
            Endpoint::new(
                "direct",
                env.target.addr(),
                Some(&env.target.ca_pem()),
                &Identity::Bearer(token),
                Protocol::Http2,
            )
            .expect("endpoint"),
        );
        let admin = crproxy::devenv::admin_client(&env.target).expect("admin");
        create_namespace(&admin, namespace)
            .await
            .expect("namespace");
        direct
    }

    /// The widgets of `namespace`, listed through `direct`.
    async fn widgets_in(direct: &Endpoint, namespace: &str) -> Value {
        let mut sender = direct.connect().await.expect("connect");
        let list = direct
            .request(Method::GET, &collection_path(namespace), None)
            .expect("request");
        let answer = driver::exchange(&mut sender, list, true)
            .await
            .expect("list");
        let list: Value =
            serde_json::from_slice(answer.body.as_deref().unwrap_or_default()).expect("a list");
        list["items"].clone()
    }

    fn test_owner() -> Owner {
        Owner {
            name: "c".into(),
            project: "default".into(),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn delete_all_leaves_the_namespace_without_widgets() {
        let dir = tempfile::tempdir().expect("tempdir");
        let env = crate::test_env(dir.path()).await;
        let direct = direct_with_namespace(&env, NS_SEEDED).await;
        let names: Vec<String> = (0..5).map(|i| format!("s-{i}")).collect();
        seed(&direct, NS_SEEDED, &names, &test_owner())
            .await
            .expect("seed");

        delete_all(&direct, NS_SEEDED).await.expect("delete");

        assert_eq!(widgets_in(&direct, NS_SEEDED).await, json!([]));
        env.shutdown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cache_events_count_every_write_of_each_kind_and_leave_nothing_behind() {
        let dir = tempfile::tempdir().expect("tempdir");
        let env = crate::test_env(dir.path()).await;
        let direct = direct_with_namespace(&env, NS_EVENTS).await;
        let mut plan = Plan::new(true);
        plan.rounds = 2;
        plan.requests = 5;
        let c = 2;
        // This process stands in for crproxy's: only the counting is checked here.
        let watcher = CacheWatcher {
            pid: std::process::id(),
            clock: rss::CpuClock::detect(std::process::id()),
            catch_up: None,
        };
        let mut notes = Vec::new();

        let cost = cache_event_cost(&plan, c, &direct, &watcher, &test_owner(), &mut notes)
            .await
            .expect("cache events");

        assert!(notes.is_empty(), "{notes:?}");
        // Each kind: a create and a delete per object, every round.
        let writes = plan.rounds * 2 * plan.count(plan.requests, c);
        assert_eq!((cost.own_writes, cost.other_writes), (writes, writes));
        assert_eq!(cost.concurrency, c);
        assert!(cost.own_cpu_us.is_some() && cost.other_cpu_us.is_some());
        assert_eq!(widgets_in(&direct, NS_EVENTS).await, json!([]));
        env.shutdown().await;
    }

    #[test]
    fn rows_measured_under_steal_time_are_named() {
        let check = |crproxy: Option<f64>, nginx: Option<f64>, expected: Option<&str>| {
            let mut row = Row::new("get", 16, None, None, None);
            row.crproxy_steal_percent = crproxy;
            row.nginx_steal_percent = nginx;
            assert_eq!(
                steal_note(&row).as_deref(),
                expected,
                "{crproxy:?} {nginx:?}"
            );
        };
        check(Some(0.4), Some(4.9), None);
        check(None, None, None);
        check(
            Some(5.0),
            Some(0.2),
            Some("get c=16: the hypervisor took the CPU from this machine (steal time 5.0 % during crproxy's rounds, 0.2 % during nginx's rounds); its figures against each other are less certain"),
        );
        check(
            None,
            Some(13.64),
            Some("get c=16: the hypervisor took the CPU from this machine (steal time 13.6 % during nginx's rounds); its figures against each other are less certain"),
        );
    }

    #[test]
    fn a_row_carries_the_steal_time_of_its_lanes_rounds() {
        let measured = |steal, total, machine_cpu_us| Measured {
            summary: None,
            errors: 0,
            cpu_us: None,
            first_error: None,
            dials: 0,
            machine: rss::MachineTime {
                steal,
                idle: 0,
                total,
            },
            machine_cpu_us: Some(machine_cpu_us),
            round_throughputs: Vec::new(),
        };
        let lanes = [Column::Direct, Column::Crproxy, Column::Nginx].map(test_lane);
        let mut notes = Vec::new();
        let row = row_from(
            "get",
            1,
            &lanes,
            vec![
                measured(0, 100, 100.0),
                measured(20, 200, 200.0),
                measured(1, 10, 10.0),
            ],
            &mut notes,
        );
        assert_eq!(row.crproxy_steal_percent, Some(10.0));
        assert_eq!(row.nginx_steal_percent, None, "too short a span to tell");
        assert_eq!(row.crproxy_machine_cpu_us, Some(200.0));
        assert_eq!(row.nginx_machine_cpu_us, Some(10.0));
        assert!(
            notes
                .iter()
                .any(|n| n.contains("10.0 % during crproxy's rounds")),
            "{notes:?}"
        );
    }

    #[test]
    fn a_row_pairs_crproxy_s_rounds_with_nginx_s() {
        let measured = |round_throughputs: Vec<Option<f64>>| Measured {
            summary: None,
            errors: 0,
            cpu_us: None,
            first_error: None,
            dials: 0,
            machine: rss::MachineTime::default(),
            machine_cpu_us: None,
            round_throughputs,
        };
        let lanes = [Column::Direct, Column::Nginx, Column::Crproxy].map(test_lane);
        let row = row_from(
            "get",
            1,
            &lanes,
            vec![
                measured(vec![Some(1.0), Some(1.0)]),
                measured(vec![Some(1000.0), Some(500.0)]),
                measured(vec![Some(900.0), Some(600.0)]),
            ],
            &mut Vec::new(),
        );
        assert_eq!(row.crproxy_vs_nginx_round_throughput, [0.9, 1.2]);
    }
}
