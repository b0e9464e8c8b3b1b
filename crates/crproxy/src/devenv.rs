//! The `crproxy dev` environment: a target devcluster (with N replica listeners on
//! one store), one or more client devclusters, and one proxy per client wired
//! between them exactly as in production — configuration file, registration by an
//! elected leader, front-proxy trust — so that what the tour shows is what
//! operators get.
//!
//! The end-to-end tests start the same environment through [`DevEnv::start`].

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
use kube::api::{Api, PostParams};
use serde_json::{json, Value};

use crproxy_core::names;
use crproxy_proxy::app::{AppError, RunningProxy};
use crproxy_proxy::metrics::Metrics;
use crproxy_proxy::server::ServerError;

/// The example resource the environment proxies.
pub const EXAMPLE_GROUP: &str = "example.com";
pub const EXAMPLE_VERSION: &str = "v1";
pub const EXAMPLE_PLURAL: &str = "widgets";

/// Options of `crproxy dev` (and of the tests).
#[derive(Clone, Debug)]
pub struct DevOptions {
    pub dir: PathBuf,
    pub clients: usize,
    pub target_replicas: usize,
    /// 0 picks free ports.
    pub target_port: u16,
    pub client_port: u16,
    pub proxy_base_port: u16,
    pub metrics_port: u16,
    /// The `host` cluster of the custom resource sync, and the sync's metrics
    /// listener (started by `devsync`, checked here with the other ports).
    pub host_port: u16,
    pub sync_metrics_port: u16,
    /// Keep state in `dir` across restarts (the CLI); tests use in-memory stores.
    pub persistent: bool,
    /// Open proxy ports so further replicas on this host can share them (HA tests).
    pub share_ports: bool,
}

impl DevOptions {
    /// In-memory clusters on free ports under `dir`: what tests start.
    pub fn ephemeral(dir: &Path, clients: usize, target_replicas: usize) -> Self {
        Self {
            dir: dir.to_path_buf(),
            clients,
            target_replicas,
            target_port: 0,
            client_port: 0,
            proxy_base_port: 0,
            metrics_port: 0,
            host_port: 0,
            sync_metrics_port: 0,
            persistent: false,
            share_ports: false,
        }
    }
}

/// What a fixed port of the environment is for; each has its own flag of
/// `crproxy dev`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PortRole {
    Target,
    Client,
    Proxy,
    Metrics,
    Host,
    SyncMetrics,
}

/// Each further client's proxy port is this much higher than the previous
/// client's (`--proxy-port`).
pub const PROXY_PORT_STEP: u16 = 10;

impl PortRole {
    const ALL: [PortRole; 6] = [
        PortRole::Target,
        PortRole::Client,
        PortRole::Proxy,
        PortRole::Metrics,
        PortRole::Host,
        PortRole::SyncMetrics,
    ];

    /// The `crproxy dev` flag that moves this port.
    pub fn flag(self) -> &'static str {
        match self {
            PortRole::Target => "--target-port",
            PortRole::Client => "--client-port",
            PortRole::Proxy => "--proxy-port",
            PortRole::Metrics => "--metrics-port",
            PortRole::Host => "--host-port",
            PortRole::SyncMetrics => "--sync-metrics-port",
        }
    }

    /// How far apart the ports of consecutive clients (or target replicas) are.
    fn step(self) -> u16 {
        match self {
            PortRole::Proxy => PROXY_PORT_STEP,
            _ => 1,
        }
    }

    /// What the number of ports this one's flag stands for follows.
    fn spread(self) -> PortSpread {
        match self {
            PortRole::Target => PortSpread::PerTargetReplica,
            PortRole::Client | PortRole::Proxy | PortRole::Metrics => PortSpread::PerClient,
            PortRole::Host | PortRole::SyncMetrics => PortSpread::One,
        }
    }

    /// The flag that says how many ports this one's flag stands for, when it
    /// can be more than one.
    fn count_flag(self) -> Option<&'static str> {
        match self.spread() {
            PortSpread::PerTargetReplica => Some("--target-replicas"),
            PortSpread::PerClient => Some("--clients"),
            PortSpread::One => None,
        }
    }
}

/// How many ports a [`PortRole`]'s flag stands for: one per target replica, one
/// per client, or one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PortSpread {
    PerTargetReplica,
    PerClient,
    One,
}

/// Ports of the environment that were already in use, found before anything was
/// started or written.
#[derive(Debug)]
pub struct PortsInUse(pub Vec<(PortRole, u16)>);

impl std::fmt::Display for PortsInUse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ports: Vec<String> = self
            .0
            .iter()
            .map(|(role, port)| format!("{port} (move it with {})", role.flag()))
            .collect();
        write!(
            f,
            "port{} already in use on 127.0.0.1: {}; nothing was started or written",
            if ports.len() == 1 { "" } else { "s" },
            ports.join(", ")
        )
    }
}

impl std::error::Error for PortsInUse {}

/// Options `crproxy dev` cannot run with, found before anything was started or
/// written.
#[derive(Debug, thiserror::Error)]
pub enum DevPlanError {
    /// `--clients 0` or `--target-replicas 0`.
    #[error("{flag} must be 1 or more; nothing was started or written")]
    NoneOf { flag: &'static str },
    /// A port flag whose derived ports (one per client or replica) go past 65535.
    #[error("{}", beyond_range(*role, *base, *count))]
    BeyondRange {
        role: PortRole,
        base: u16,
        count: usize,
    },
    /// Two port flags whose derived ports overlap.
    #[error(
        "{} and {} both take port {port} ({ranges}): move one of them; nothing was started \
         or written",
        first.flag(),
        second.flag()
    )]
    SharedPort {
        first: PortRole,
        second: PortRole,
        port: u16,
        /// The ports each of the two flags takes.
        ranges: String,
    },
    /// Ports something else listens on already.
    #[error(transparent)]
    InUse(#[from] PortsInUse),
}

/// What [`DevPlanError::BeyondRange`] says: the flag, the ports it needs and the
/// highest value that fits.
fn beyond_range(role: PortRole, base: u16, count: usize) -> String {
    let flag = role.flag();
    let step = u64::from(role.step());
    let span = (count as u64).saturating_sub(1).saturating_mul(step);
    let last = u64::from(base).saturating_add(span);
    let apart = if step == 1 {
        String::new()
    } else {
        format!(", {step} apart")
    };
    let counted = role
        .count_flag()
        .map(|count_flag| format!(" with {count_flag} {count}"))
        .unwrap_or_default();
    let fix = match u64::from(u16::MAX).checked_sub(span) {
        Some(highest) if highest >= 1 => format!("give {flag} {highest} or lower"),
        _ => format!(
            "lower {}",
            role.count_flag().unwrap_or("the number of clients")
        ),
    };
    format!(
        "{flag} {base}{counted} needs ports {base} to {last}{apart}, past the last port \
         65535: {fix}; nothing was started or written"
    )
}

impl DevOptions {
    /// The ports `role`'s flag takes, for [`DevPlanError::SharedPort`].
    fn takes(&self, role: PortRole) -> String {
        let base = self.base(role);
        let count = self.count(role);
        if count <= 1 {
            return format!("{} {base} takes {base}", role.flag());
        }
        let last = self.port(role, count - 1).unwrap_or(u16::MAX);
        let every = match role.step() {
            1 => String::new(),
            step => format!(", every {step}th"),
        };
        format!("{} {base} takes {base} to {last}{every}", role.flag())
    }

    /// The value of `role`'s flag.
    fn base(&self, role: PortRole) -> u16 {
        match role {
            PortRole::Target => self.target_port,
            PortRole::Client => self.client_port,
            PortRole::Proxy => self.proxy_base_port,
            PortRole::Metrics => self.metrics_port,
            PortRole::Host => self.host_port,
            PortRole::SyncMetrics => self.sync_metrics_port,
        }
    }

    /// How many ports `role`'s flag stands for.
    fn count(&self, role: PortRole) -> usize {
        match role.spread() {
            PortSpread::PerTargetReplica => self.target_replicas,
            PortSpread::PerClient => self.clients,
            PortSpread::One => 1,
        }
    }

    /// The port `role` takes for client (or target replica) `index`: 0, picked
    /// when the listener opens, when its flag is 0.
    pub fn port(&self, role: PortRole, index: usize) -> Result<u16, DevPlanError> {
        let base = self.base(role);
        if base == 0 {
            return Ok(0);
        }
        u16::try_from(index)
            .ok()
            .and_then(|index| index.checked_mul(role.step()))
            .and_then(|offset| base.checked_add(offset))
            .ok_or(DevPlanError::BeyondRange {
                role,
                base,
                count: self.count(role),
            })
    }

    /// Refuses options the environment cannot run with — no client or target
    /// listener, ports past 65535, two flags that take the same port — without
    /// touching anything, so a mistake costs nothing.
    pub fn check_plan(&self) -> Result<(), DevPlanError> {
        for (flag, count) in [
            ("--clients", self.clients),
            ("--target-replicas", self.target_replicas),
        ] {
            if count == 0 {
                return Err(DevPlanError::NoneOf { flag });
            }
        }
        for role in PortRole::ALL {
            // The last port of a flag is its highest.
            self.port(role, self.count(role) - 1)?;
        }
        let mut taken = std::collections::HashMap::new();
        for (role, port) in self.fixed_ports()? {
            if let Some(first) = taken.insert(port, role) {
                return Err(DevPlanError::SharedPort {
                    first,
                    second: role,
                    port,
                    ranges: format!("{}; {}", self.takes(first), self.takes(role)),
                });
            }
        }
        Ok(())
    }

    /// Every port the environment will listen on that is not picked freely, in
    /// the order they are opened.
    pub fn fixed_ports(&self) -> Result<Vec<(PortRole, u16)>, DevPlanError> {
        let mut ports = Vec::new();
        // Only the flags that were given: 0 stands for any number of free picks,
        // and a flag that was given has at most 65535 ports before `port` refuses.
        // A client's ports are opened together, client by client.
        for spread in [
            PortSpread::PerTargetReplica,
            PortSpread::PerClient,
            PortSpread::One,
        ] {
            let roles: Vec<PortRole> = PortRole::ALL
                .into_iter()
                .filter(|role| role.spread() == spread && self.base(*role) != 0)
                .collect();
            let Some(first) = roles.first() else {
                continue;
            };
            for index in 0..self.count(*first) {
                for role in &roles {
                    ports.push((*role, self.port(*role, index)?));
                }
            }
        }
        Ok(ports)
    }

    /// Checks the plan, then tries every fixed port at once, so a conflict names
    /// all busy ports before any cluster starts or any file is written.
    pub fn check_ports(&self) -> Result<(), DevPlanError> {
        self.check_plan()?;
        let mut held = Vec::new();
        let mut busy = Vec::new();
        for (role, port) in self.fixed_ports()? {
            match std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, port)) {
                Ok(listener) => held.push(listener),
                Err(_) => busy.push((role, port)),
            }
        }
        if busy.is_empty() {
            Ok(())
        } else {
            Err(PortsInUse(busy).into())
        }
    }
}

/// Fails when `dir` (`--dir`), or a directory it would be created in, is a
/// file: creating it would fail with a bare "File exists".
fn check_dir(dir: &Path) -> Result<()> {
    for ancestor in dir.ancestors().filter(|a| !a.as_os_str().is_empty()) {
        match std::fs::metadata(ancestor) {
            Ok(metadata) if metadata.is_dir() => return Ok(()),
            Ok(_) if ancestor == dir => {
                return Err(anyhow!(
                    "--dir {} is a file, not a directory: pass a directory (it is created \
                     when missing)",
                    dir.display()
                ))
            }
            Ok(_) => {
                return Err(anyhow!(
                    "--dir {}: {} is a file, not a directory: pass a directory (it is \
                     created when missing)",
                    dir.display(),
                    ancestor.display()
                ))
            }
            // Missing (created later), or unreadable (creating it says why).
            Err(_) => {}
        }
    }
    Ok(())
}

/// The name of the lock file a running environment holds in its directory.
pub const LOCK_FILE: &str = ".lock";

/// Fails when another running environment holds `dir`'s lock (its clusters keep
/// their databases open there). Creates nothing when `dir` does not exist yet.
fn check_not_in_use(dir: &Path) -> Result<()> {
    let path = dir.join(LOCK_FILE);
    if !path.exists() {
        return Ok(());
    }
    let file = std::fs::File::open(&path).with_context(|| format!("opening {}", path.display()))?;
    match file.try_lock() {
        Ok(()) => Ok(()),
        Err(std::fs::TryLockError::WouldBlock) => {
            let holder = std::fs::read_to_string(&path).unwrap_or_default();
            let holder = holder.trim();
            let by = if holder.is_empty() {
                String::new()
            } else {
                format!(" (pid {holder})")
            };
            Err(anyhow!(
                "{} is in use by another running crproxy dev{by}; stop it, or pass --dir to start a separate environment",
                dir.display()
            ))
        }
        Err(std::fs::TryLockError::Error(e)) => {
            Err(e).with_context(|| format!("locking {}", path.display()))
        }
    }
}

/// Takes `dir`'s lock for as long as the returned file is open, and notes the pid.
fn lock_dir(dir: &Path) -> Result<std::fs::File> {
    use std::io::Write;
    let path = dir.join(LOCK_FILE);
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("creating {}", path.display()))?;
    file.try_lock().map_err(|_| {
        anyhow!(
            "{} is in use by another running crproxy dev; stop it, or pass --dir to start a separate environment",
            dir.display()
        )
    })?;
    file.set_len(0)?;
    write!(file, "{}", std::process::id())?;
    Ok(file)
}

/// Polls the APIService `name` until its `Available` condition is True.
pub async fn wait_for_available(api: &kube::Client, name: &str, limit: Duration) -> Result<()> {
    let apiservices = Api::<APIService>::all(api.clone());
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let apiservice = apiservices.get(name).await.ok();
        let available_condition = apiservice
            .as_ref()
            .and_then(|s| s.status.as_ref())
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "Available"));
        if available_condition.is_some_and(|c| c.status == "True") {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            // The aggregator's last word says what is wrong (no Service, refused
            // connection, bad certificate...).
            let why = available_condition
                .map(|c| {
                    format!(
                        " ({}: {})",
                        c.reason.as_deref().unwrap_or_default(),
                        c.message.as_deref().unwrap_or_default()
                    )
                })
                .unwrap_or_default();
            return Err(anyhow!(
                "{}/{name} did not become Available within {}s{why}",
                apiservices.resource_url(),
                limit.as_secs()
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One client cluster and its proxy.
pub struct DevClient {
    pub name: String,
    pub cluster: devcluster::DevCluster,
    pub kubeconfig: PathBuf,
    pub link: Link,
    /// The proxy replica this environment started (None once stopped).
    pub replica: Option<ProxyReplica>,
}

impl DevClient {
    /// The running replica's proxy.
    pub fn proxy(&self) -> Option<&RunningProxy> {
        self.replica.as_ref().map(|r| &r.proxy)
    }

    /// The running replica's metrics URL.
    pub fn metrics_url(&self) -> String {
        self.replica
            .as_ref()
            .map(|r| r.metrics_url.clone())
            .unwrap_or_default()
    }

    /// Stops this client's proxy replica (releasing leadership).
    pub async fn stop_proxy(&mut self) {
        if let Some(replica) = self.replica.take() {
            replica.stop().await;
        }
    }
}

/// A proxied resource: what the target stores and the client uses.
#[derive(Clone, Debug)]
pub struct ProxiedResource {
    pub group: String,
    pub version: String,
    pub plural: String,
    pub kind: String,
}

impl ProxiedResource {
    /// `widgets.example.com/v1`, the resource `crproxy dev` proxies.
    pub fn example() -> Self {
        Self {
            group: EXAMPLE_GROUP.into(),
            version: EXAMPLE_VERSION.into(),
            plural: EXAMPLE_PLURAL.into(),
            kind: "Widget".into(),
        }
    }
}

/// One direction of proxying: a client cluster using a resource stored on a
/// target cluster. Preparing it writes the configuration a proxy replica runs from.
pub struct Link {
    pub client_name: String,
    pub config_path: PathBuf,
    serving_dir: PathBuf,
    /// Whether the proxy port was picked here (the spec named none) and no
    /// replica has listened on it yet: then a pick another listener took first
    /// may be replaced (see [`Link::start_replica_with`]).
    repickable_port: std::sync::atomic::AtomicBool,
}

/// Everything a link needs to be prepared.
pub struct LinkSpec<'a> {
    /// Where the link's configuration, kubeconfigs and serving CA are written.
    pub dir: PathBuf,
    pub client_name: String,
    pub client_kubeconfig: PathBuf,
    pub target_name: String,
    pub target: &'a devcluster::DevCluster,
    pub target_peers: Vec<SocketAddr>,
    /// At least one; each is its own entry of the configuration, so resources of
    /// different group/versions make a proxy that serves several.
    pub resources: Vec<ProxiedResource>,
    /// 0 picks a free port.
    pub proxy_port: u16,
    /// 0 picks a free port.
    pub metrics_port: u16,
}

impl Link {
    /// Grants the client's identity its rights on the target, installs the
    /// resources' CRDs there, and writes the proxy configuration.
    pub async fn prepare(spec: LinkSpec<'_>) -> Result<Link> {
        if spec.resources.is_empty() {
            bail!("the link has no resource to proxy: give LinkSpec.resources at least one");
        }
        std::fs::create_dir_all(&spec.dir)
            .with_context(|| format!("creating {}", spec.dir.display()))?;
        let project = "default";
        let project_namespace = "p-default";
        let target_admin = admin_client(spec.target)?;
        for resource in &spec.resources {
            install_crd(&target_admin, resource).await?;
        }
        let identity = names::target_identity(project_namespace, &spec.client_name);
        let token = spec
            .target
            .issue_token(&identity, &[])
            .context("issuing the client identity's token on the target")?;
        for resource in &spec.resources {
            grant_target_access(&target_admin, &identity, &resource.group).await?;
        }
        // The token lives in its own file, as a projected service-account token
        // does, so the proxy reads it again when it is rotated.
        let identity_token = spec.dir.join(IDENTITY_TOKEN_FILE);
        std::fs::write(&identity_token, format!("{token}\n"))
            .with_context(|| format!("writing {}", identity_token.display()))?;
        let identity_kubeconfig = spec.dir.join("target-identity.kubeconfig");
        std::fs::write(
            &identity_kubeconfig,
            token_file_kubeconfig(
                &spec.target_name,
                &spec.target.url(),
                &spec.target.ca_pem(),
                &identity,
                &identity_token,
            ),
        )?;
        let proxy_port = match spec.proxy_port {
            // The configuration needs a real port (replicas must agree on it).
            0 => free_port()?,
            port => port,
        };
        let peers: Vec<String> = spec.target_peers.iter().map(|a| a.to_string()).collect();
        let config_path = spec.dir.join("crproxy.yaml");
        std::fs::write(
            &config_path,
            config_yaml(&ConfigValues {
                name: &spec.client_name,
                project,
                project_namespace,
                client_kubeconfig: &spec.client_kubeconfig,
                target_name: &spec.target_name,
                target_kubeconfig: &identity_kubeconfig,
                peers: &peers,
                base_port: proxy_port,
                metrics_port: spec.metrics_port,
                resources: &spec.resources,
            }),
        )?;
        Ok(Link {
            client_name: spec.client_name,
            config_path,
            serving_dir: spec.dir.join("serving-ca"),
            repickable_port: std::sync::atomic::AtomicBool::new(spec.proxy_port == 0),
        })
    }

    /// Starts one proxy replica from the link's configuration, with leader
    /// election and registration. Several replicas of one link share the serving
    /// CA and the listening port (the port is opened with SO_REUSEPORT).
    pub async fn start_replica(&self) -> Result<ProxyReplica> {
        self.start_replica_with(ReplicaOptions::default()).await
    }

    /// [`Link::start_replica`] with options for tests of several replicas.
    ///
    /// A proxy port picked by [`Link::prepare`] was free when it was picked, but
    /// nothing holds it until the proxy listens: another listener (another
    /// test's pick, in this process or the next) may take it first. The first
    /// replica then picks again, up to [`PORT_PICKS`] times, and writes the new
    /// port to the configuration, which later replicas read. It loads that file
    /// again rather than change the port in the loaded configuration: every
    /// group/version's port follows from `basePort` in the validated plan, and
    /// what runs stays what the file says.
    pub async fn start_replica_with(&self, options: ReplicaOptions) -> Result<ProxyReplica> {
        let serving = crate::run::serving_identity(&self.serving_dir)?;
        let mut picks = 1;
        let (loaded, client, proxy) = loop {
            let mut loaded = crate::run::load(&self.config_path)?;
            if let Some(metrics_address) = &options.metrics_address {
                loaded.config.proxy.metrics_address = metrics_address.clone();
            }
            let clusters = crate::run::check_kubeconfigs(
                &loaded.config,
                &loaded.base_dir,
                crate::run::ExecPlugins::Later,
            )
            .map_err(|problems| crate::run::invalid(&self.config_path, &problems))?;
            let client = crate::run::client_access(clusters.client)?;
            let mut setup = crate::run::setup(
                &loaded,
                &client,
                clusters.targets,
                serving.identity.clone(),
                Metrics::new(),
            )?;
            setup.share_ports = options.share_ports;
            match crproxy_proxy::app::start(setup, true).await {
                Ok(proxy) => break (loaded, client, proxy),
                Err(AppError::Server(ServerError::Bind { addr, source }))
                    if source.kind() == std::io::ErrorKind::AddrInUse
                        && picks < PORT_PICKS
                        && addr.port() == loaded.config.proxy.base_port
                        && self
                            .repickable_port
                            .load(std::sync::atomic::Ordering::Acquire) =>
                {
                    self.repick_port(addr.port())?;
                    picks += 1;
                }
                Err(e) => {
                    return Err(anyhow::Error::new(e)
                        .context(format!("starting the proxy for {}", self.client_name)))
                }
            }
        };
        self.repickable_port
            .store(false, std::sync::atomic::Ordering::Release);
        let metrics_url = proxy
            .metrics_addr
            .map(|a| format!("http://{a}/metrics"))
            .unwrap_or_default();
        let wiring =
            crate::run::start_wiring(&loaded, &client, &proxy, &serving.ca_pem, &self.client_name)
                .await?;
        Ok(ProxyReplica {
            proxy,
            wiring,
            metrics_url,
        })
    }
}

/// How many ports a link's first replica tries when the ones picked for it are
/// taken before it listens.
const PORT_PICKS: usize = 4;

impl Link {
    /// Writes a freshly picked proxy port in place of `taken` in the link's
    /// configuration (which [`Link::prepare`] wrote, one `basePort` line).
    fn repick_port(&self, taken: u16) -> Result<()> {
        let text = std::fs::read_to_string(&self.config_path)
            .with_context(|| format!("reading {}", self.config_path.display()))?;
        let port = free_port()?;
        tracing::info!(taken, port, client = %self.client_name, "the proxy port picked for the dev environment was taken before the proxy listened; picked another");
        let text = with_config_line(&text, "basePort", &port.to_string())
            .ok_or_else(|| anyhow!("{} has no basePort line", self.config_path.display()))?;
        std::fs::write(&self.config_path, text)
            .with_context(|| format!("writing {}", self.config_path.display()))
    }
}

/// A configuration written by [`Link::prepare`] with its `key:` line (the first,
/// at any indent) set to `value`, everything else as it was; `None` without
/// such a line.
pub fn with_config_line(config: &str, key: &str, value: &str) -> Option<String> {
    let mut found = false;
    let lines: Vec<String> = config
        .lines()
        .map(|line| {
            let trimmed = line.trim_start();
            let indent = &line[..line.len() - trimmed.len()];
            match trimmed.strip_prefix(key) {
                Some(rest) if !found && rest.starts_with(':') => {
                    found = true;
                    format!("{indent}{key}: {value}")
                }
                _ => line.to_string(),
            }
        })
        .collect();
    found.then(|| lines.join("\n") + "\n")
}

/// How a replica differs from the link's configuration.
#[derive(Clone, Debug, Default)]
pub struct ReplicaOptions {
    /// Listen on the proxy ports alongside other replicas on this host.
    pub share_ports: bool,
    /// Another metrics address (two replicas cannot share one).
    pub metrics_address: Option<String>,
}

/// One running proxy process-equivalent: servers, metrics, leader election and
/// registration.
pub struct ProxyReplica {
    pub proxy: RunningProxy,
    pub wiring: crproxy_wiring::WiringHandle,
    pub metrics_url: String,
}

impl ProxyReplica {
    /// Whether this replica currently holds the registration lease.
    pub fn is_leader(&self) -> bool {
        self.wiring.leader().is_leader()
    }

    /// A clean stop: hand leadership back, then drain the servers.
    pub async fn stop(self) {
        self.wiring.stop().await;
        self.proxy.shutdown().await;
    }

    /// A crash: stop everything without handing the lease back.
    pub async fn crash(self) {
        self.wiring.abort();
        self.proxy.shutdown().await;
    }
}

/// A running environment.
pub struct DevEnv {
    pub options: DevOptions,
    pub target: devcluster::DevCluster,
    /// Every listener of the target: the first is `target.addr()`.
    pub target_replicas: Vec<SocketAddr>,
    pub target_kubeconfig: PathBuf,
    pub clients: Vec<DevClient>,
    /// Held while the environment runs: see [`LOCK_FILE`].
    _lock: std::fs::File,
}

impl DevEnv {
    /// Starts everything and waits until each client's APIService is Available.
    pub async fn start(mut options: DevOptions) -> Result<Self> {
        // Nothing is written before these checks pass, so a failed start leaves
        // the directory as it was.
        check_dir(&options.dir)?;
        check_not_in_use(&options.dir)?;
        // Checks the plan first.
        options.check_ports()?;
        std::fs::create_dir_all(&options.dir)
            .with_context(|| format!("creating {}", options.dir.display()))?;
        let lock = lock_dir(&options.dir)?;
        // dev.json describes a running environment: a previous run's copy must not
        // be mistaken for this one before it is up.
        let stale = options.dir.join("dev.json");
        if stale.exists() {
            std::fs::remove_file(&stale)
                .with_context(|| format!("removing {}", stale.display()))?;
        }
        // The configuration files written below name other files by path and are
        // read relative to their own directory: only absolute paths survive that.
        options.dir = std::fs::canonicalize(&options.dir)
            .with_context(|| format!("resolving {}", options.dir.display()))?;
        let dir = options.dir.clone();

        let target = devcluster::start(devcluster::DevClusterConfig {
            name: "target".into(),
            data_dir: options.persistent.then(|| dir.join("target")),
            bind: IpAddr::V4(Ipv4Addr::LOCALHOST),
            port: options.target_port,
        })
        .await
        .context("starting the target devcluster")?;
        let mut target_replicas = vec![target.addr()];
        for i in 1..options.target_replicas {
            let port = options.port(PortRole::Target, i)?;
            let addr = target
                .add_listener(port)
                .await
                .with_context(|| format!("starting target replica listener {i}"))?;
            target_replicas.push(addr);
        }
        let target_kubeconfig = dir.join("target.kubeconfig");
        std::fs::write(&target_kubeconfig, target.admin_kubeconfig())
            .with_context(|| format!("writing {}", target_kubeconfig.display()))?;

        let mut clients = Vec::new();
        for index in 0..options.clients {
            let client = start_client(&options, index, &target, &target_replicas).await?;
            clients.push(client);
        }
        let env = Self {
            options,
            target,
            target_replicas,
            target_kubeconfig,
            clients,
            _lock: lock,
        };
        env.wait_until_available(Duration::from_secs(30)).await?;
        env.write_dev_json()?;
        Ok(env)
    }

    /// Polls each client's APIService until it reports Available=True.
    pub async fn wait_until_available(&self, limit: Duration) -> Result<()> {
        let name = names::apiservice_name(EXAMPLE_GROUP, EXAMPLE_VERSION);
        for client in &self.clients {
            let api = admin_client(&client.cluster)?;
            let deadline = tokio::time::Instant::now() + limit;
            wait_for_available(&api, &name, limit)
                .await
                .with_context(|| format!("client {}", client.name))?;
            // The aggregator fetches the backend's discovery a moment later.
            while !lists_resource_in_discovery(&api, EXAMPLE_PLURAL).await {
                if tokio::time::Instant::now() >= deadline {
                    return Err(anyhow!(
                        "client {}: discovery did not list {EXAMPLE_PLURAL} within {}s",
                        client.name,
                        limit.as_secs()
                    ));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(())
    }

    /// Every URL and port, for people and scripts.
    pub fn describe(&self) -> Value {
        let clients: Vec<Value> = self
            .clients
            .iter()
            .map(|c| {
                json!({
                    "name": c.name,
                    "api_url": c.cluster.url(),
                    "kubeconfig": c.kubeconfig,
                    "config": c.link.config_path,
                    "proxy_ports": c.proxy().map(|p| p.servers.iter()
                        .map(|(gv, addr)| json!({"group_version": gv, "address": addr.to_string()}))
                        .collect::<Vec<_>>()).unwrap_or_default(),
                    "metrics_url": c.metrics_url(),
                })
            })
            .collect();
        json!({
            "dir": self.options.dir,
            "target": {
                "api_url": self.target.url(),
                "kubeconfig": self.target_kubeconfig,
                "replicas": self.target_replicas.iter().map(|a| format!("https://{a}")).collect::<Vec<_>>(),
            },
            "clients": clients,
            "client_kubeconfig": self.clients.first().map(|c| c.kubeconfig.clone()),
            "metrics_url": self.clients.first().map(DevClient::metrics_url),
        })
    }

    fn write_dev_json(&self) -> Result<()> {
        let path = self.options.dir.join("dev.json");
        let text = serde_json::to_string_pretty(&self.describe())?;
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))
    }

    /// Stops the proxies first (so their watches end cleanly), then the clusters.
    pub async fn shutdown(self) {
        for mut client in self.clients {
            client.stop_proxy().await;
            client.cluster.shutdown().await;
        }
        self.target.shutdown().await;
    }
}

async fn start_client(
    options: &DevOptions,
    index: usize,
    target: &devcluster::DevCluster,
    target_replicas: &[SocketAddr],
) -> Result<DevClient> {
    let name = if index == 0 {
        "client".to_string()
    } else {
        format!("client-{}", index + 1)
    };
    let dir = options.dir.join(&name);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let port = options.port(PortRole::Client, index)?;
    let cluster = devcluster::start(devcluster::DevClusterConfig {
        name: name.clone(),
        data_dir: options.persistent.then(|| dir.join("cluster")),
        bind: IpAddr::V4(Ipv4Addr::LOCALHOST),
        port,
    })
    .await
    .with_context(|| format!("starting the {name} devcluster"))?;
    let kubeconfig = if index == 0 {
        options.dir.join("client.kubeconfig")
    } else {
        options.dir.join(format!("{name}.kubeconfig"))
    };
    std::fs::write(&kubeconfig, cluster.admin_kubeconfig())
        .with_context(|| format!("writing {}", kubeconfig.display()))?;

    // 0: the kernel picks it as the proxy listens (no window for another
    // listener to take it first); the replica's metrics_url says where.
    let metrics_port = options.port(PortRole::Metrics, index)?;
    let proxy_port = options.port(PortRole::Proxy, index)?;
    let link = Link::prepare(LinkSpec {
        dir: dir.clone(),
        client_name: name.clone(),
        client_kubeconfig: kubeconfig.clone(),
        target_name: "target".into(),
        target,
        target_peers: target_replicas.to_vec(),
        resources: vec![ProxiedResource::example()],
        proxy_port,
        metrics_port,
    })
    .await?;
    let replica = link
        .start_replica_with(ReplicaOptions {
            share_ports: options.share_ports,
            metrics_address: None,
        })
        .await?;
    Ok(DevClient {
        name,
        cluster,
        kubeconfig,
        link,
        replica: Some(replica),
    })
}

/// Whether the cluster's aggregated discovery (what kubectl reads) lists
/// `plural` in the example group: the aggregator fetches a backend's discovery
/// asynchronously, a moment after the APIService turns Available.
async fn lists_resource_in_discovery(api: &kube::Client, plural: &str) -> bool {
    let request = http::Request::get("/apis")
        .header(
            http::header::ACCEPT,
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
        )
        .body(Vec::new());
    let Ok(request) = request else { return false };
    let Ok(document) = api.request::<Value>(request).await else {
        return false;
    };
    document["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|g| g.pointer("/metadata/name").and_then(Value::as_str) == Some(EXAMPLE_GROUP))
        .flat_map(|g| g["versions"].as_array().cloned().unwrap_or_default())
        .flat_map(|v| v["resources"].as_array().cloned().unwrap_or_default())
        .any(|r| r["resource"] == plural)
}

/// A port that was free a moment ago on 127.0.0.1, for a listener that is
/// opened later (a configuration file must name the port first).
pub fn free_port() -> std::io::Result<u16> {
    Ok(free_listener()?.local_addr()?.port())
}

/// A listener on 127.0.0.1 that holds a port until the caller has written it
/// down, for ports that must stay distinct from each other.
///
/// The port comes from below the kernel's ephemeral range: a port the kernel
/// hands out for `bind(0)` lies inside that range, and any outgoing connection
/// made before the real listener opens may take it as its source port — a
/// busy test process lost its proxy port that way ("Address already in use").
pub fn free_listener() -> std::io::Result<std::net::TcpListener> {
    let ephemeral_start = std::fs::read_to_string(EPHEMERAL_RANGE_FILE)
        .ok()
        .and_then(|text| ephemeral_range_start(&text))
        .unwrap_or(LINUX_DEFAULT_EPHEMERAL_START);
    let candidates = FIXED_PORTS_START..ephemeral_start;
    if candidates.len() >= MIN_FIXED_PORTS {
        for _ in 0..FIXED_PORT_ATTEMPTS {
            let port = candidates.start + (random_u64() % candidates.len() as u64) as u16;
            if let Ok(listener) = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, port)) {
                return Ok(listener);
            }
        }
    }
    // No room below the ephemeral range (or every try taken): the kernel's pick,
    // exposed to the race above again.
    std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
}

const EPHEMERAL_RANGE_FILE: &str = "/proc/sys/net/ipv4/ip_local_port_range";
const LINUX_DEFAULT_EPHEMERAL_START: u16 = 32768;
/// Above the ports that well-known and registered services usually take.
const FIXED_PORTS_START: u16 = 10000;
const MIN_FIXED_PORTS: usize = 1000;
const FIXED_PORT_ATTEMPTS: usize = 64;

/// The first port of the ephemeral range, from the text of
/// `ip_local_port_range` ("32768\t60999\n").
fn ephemeral_range_start(text: &str) -> Option<u16> {
    text.split_whitespace().next()?.parse().ok()
}

/// A random number from the standard library's per-instance hash keys (no
/// dependency needed for picking a port).
fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish()
}

/// A kube-rs client for a devcluster with its admin credentials. Like kube-rs's own
/// clients it retries 429, 503 and 504 answers.
pub fn admin_client(cluster: &devcluster::DevCluster) -> Result<kube::Client> {
    Ok(admin_access(cluster)?.kube_client()?)
}

/// [`admin_client`] without the retries: for checks that every request succeeds,
/// which a retry would hide.
pub fn admin_client_without_retries(cluster: &devcluster::DevCluster) -> Result<kube::Client> {
    Ok(admin_access(cluster)?.kube_client_without_retries()?)
}

fn admin_access(cluster: &devcluster::DevCluster) -> Result<crproxy_kube::ClusterAccess> {
    let config = crproxy_kube::Kubeconfig::from_yaml(&cluster.admin_kubeconfig())?;
    let cluster = crproxy_kube::ClusterConfig::from_kubeconfig(&config, None)?;
    Ok(crproxy_kube::ClusterAccess::new(cluster)?)
}

/// Installs the resource's CRD on a cluster (namespaced, any `spec`, a status
/// subresource) and waits until it is Established.
pub async fn install_crd(cluster: &kube::Client, resource: &ProxiedResource) -> Result<()> {
    let ProxiedResource {
        group,
        version,
        plural,
        kind,
    } = resource;
    let singular = kind.to_lowercase();
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.{group}")},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": plural, "singular": singular, "kind": kind, "listKind": format!("{kind}List")},
            "versions": [{
                "name": version,
                "served": true,
                "storage": true,
                "subresources": {
                    "status": {},
                    "scale": {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas"}
                },
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "properties": {
                        "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                        "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
                    }
                }}
            }]
        }
    });
    let crd: CustomResourceDefinition = serde_json::from_value(crd)?;
    let crds = Api::<CustomResourceDefinition>::all(cluster.clone());
    create_or_keep(&crds, &crd)
        .await
        .with_context(|| format!("installing the {kind} CRD"))?;
    if wait_until_established(&crds, &format!("{plural}.{group}")).await {
        Ok(())
    } else {
        Err(anyhow!("the {kind} CRD did not become Established"))
    }
}

/// Polls the CRD `name` for 5 s at most; whether it became Established.
pub(crate) async fn wait_until_established(
    crds: &Api<CustomResourceDefinition>,
    name: &str,
) -> bool {
    for _ in 0..100 {
        if let Ok(crd) = crds.get(name).await {
            let established = crd.status.and_then(|s| s.conditions).is_some_and(|cs| {
                cs.iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
            });
            if established {
                return true;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// What the client identity may do on the target: the proxied resource, and
/// namespaces so the proxy can mirror them.
async fn grant_target_access(target: &kube::Client, identity: &str, group: &str) -> Result<()> {
    let role_name = format!("crproxy-client-{}", sanitize(group));
    let role = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": role_name},
        "rules": [
            {"apiGroups": [group], "resources": ["*"], "verbs": ["*"]},
            {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch", "create"]}
        ]
    });
    let roles = Api::<ClusterRole>::all(target.clone());
    create_or_keep(&roles, &serde_json::from_value(role)?)
        .await
        .with_context(|| format!("creating {}", roles.resource_url()))?;
    let binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": format!("{role_name}-{}", sanitize(identity))},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role_name},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": identity}]
    });
    let bindings = Api::<ClusterRoleBinding>::all(target.clone());
    create_or_keep(&bindings, &serde_json::from_value(binding)?)
        .await
        .with_context(|| format!("creating {}", bindings.resource_url()))
}

/// Creates `object`, or keeps the one of the same name that exists. The error is
/// crproxy-kube's, whose text says what the API server answered.
pub(crate) async fn create_or_keep<K>(api: &Api<K>, object: &K) -> Result<(), crproxy_kube::Error>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::Serialize + serde::de::DeserializeOwned,
{
    match api.create(&PostParams::default(), object).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.reason == "AlreadyExists" => Ok(()),
        Err(e) => Err(e.into()),
    }
}

fn sanitize(identity: &str) -> String {
    identity
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect::<String>()
        .to_lowercase()
}

/// The status of a condition of an object, e.g. `Available` of an APIService.
pub fn condition_status(object: &Value, condition: &str) -> Option<String> {
    object
        .pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(condition))?
        .get("status")?
        .as_str()
        .map(str::to_string)
}

/// The file, beside a link's configuration, that holds the client identity's token on
/// the target.
pub const IDENTITY_TOKEN_FILE: &str = "target-identity.token";

fn token_file_kubeconfig(
    name: &str,
    server: &str,
    ca_pem: &str,
    user: &str,
    token_file: &Path,
) -> String {
    use base64::Engine;
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let doc = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": server, "certificate-authority-data": ca}}],
        "users": [{"name": user, "user": {"tokenFile": token_file}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": user}}],
        "current-context": name,
    });
    // JSON is valid YAML, and kubectl reads it.
    serde_json::to_string_pretty(&doc).unwrap_or_default()
}

/// The values a link's configuration file is written from.
struct ConfigValues<'a> {
    name: &'a str,
    project: &'a str,
    project_namespace: &'a str,
    client_kubeconfig: &'a Path,
    target_name: &'a str,
    target_kubeconfig: &'a Path,
    peers: &'a [String],
    base_port: u16,
    metrics_port: u16,
    resources: &'a [ProxiedResource],
}

fn config_yaml(v: &ConfigValues<'_>) -> String {
    let peers = v
        .peers
        .iter()
        .map(|p| format!("\"{p}\""))
        .collect::<Vec<_>>()
        .join(", ");
    let entries: String = v
        .resources
        .iter()
        .map(|r| {
            format!(
                "      \"{plural}.{group}/{version}\":\n        enabled: true\n        targetVirtualCluster:\n          name: \"{target_name}\"\n          project: \"{project}\"\n        accessResources: owned\n",
                plural = r.plural,
                group = r.group,
                version = r.version,
                target_name = v.target_name,
                project = v.project,
            )
        })
        .collect();
    format!(
        "# Written by `crproxy dev`. The same file works with `crproxy run --config`.\n\
client:\n  name: \"{name}\"\n  project: \"{project}\"\n  projectNamespace: \"{project_namespace}\"\n  kubeconfig: \"{client}\"\n\
proxy:\n  bindAddress: 127.0.0.1\n  basePort: {base_port}\n  metricsAddress: \"127.0.0.1:{metrics_port}\"\n  registration:\n    serviceType: ExternalName\n    externalName: localhost\n\
targets:\n  - name: \"{target_name}\"\n    project: \"{project}\"\n    kubeconfig: \"{target}\"\n    peers:\n      static: [{peers}]\n\
experimental:\n  proxy:\n    customResources:\n{entries}",
        name = v.name,
        project = v.project,
        project_namespace = v.project_namespace,
        client = v.client_kubeconfig.display(),
        base_port = v.base_port,
        metrics_port = v.metrics_port,
        target_name = v.target_name,
        target = v.target_kubeconfig.display(),
    )
}

#[cfg(test)]
mod tests;
