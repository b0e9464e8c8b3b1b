//! `crproxy run` and `crproxy check-config`: from a configuration file to a running
//! proxy with its control-plane wiring.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};

use crate::report::one_line;
use crproxy_core::config::{self, Config, ProxyPlan};
use crproxy_core::ownership::Owner;
use crproxy_core::pki::{CertPem, CertificateAuthority};
use crproxy_proxy::app::{ProxySetup, RunningProxy, TargetSetup};
use crproxy_proxy::metrics::Metrics;
use crproxy_proxy::server::ServingIdentity;
use crproxy_proxy::sources::PeerSourceConfig;
use tokio::signal::unix::{signal, Signal, SignalKind};

/// A configuration file, parsed and validated, with the directory relative paths
/// in it are resolved against.
pub struct Loaded {
    pub config: Config,
    pub plan: ProxyPlan,
    pub base_dir: PathBuf,
}

/// The one-line error of a configuration with `errors`, each after the last.
pub fn invalid(path: &Path, errors: &[config::ConfigError]) -> anyhow::Error {
    let lines: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
    anyhow!(
        "{}: invalid configuration: {}",
        path.display(),
        lines.join("; ")
    )
}

/// Reads and validates a configuration file; every problem is reported.
pub fn load(path: &Path) -> Result<Loaded> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let (config, plan) = config::load(&text).map_err(|errors| invalid(path, &errors))?;
    let base_dir = base_dir_of(path);
    Ok(Loaded {
        config,
        plan,
        base_dir,
    })
}

/// The directory relative paths in a configuration file are resolved against.
fn base_dir_of(path: &Path) -> PathBuf {
    path.parent()
        .filter(|p| !p.as_os_str().is_empty())
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// `crproxy check-config FILE`: prints every problem on its own line as
/// `FILE:LINE:COLUMN: key: message` (compiler style, so editors jump to it), then
/// fails; or prints the plan.
pub fn check_config(path: &Path) -> Result<()> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let file = path.display();
    let source = match config::SourceMap::build(&text) {
        Ok(source) => source,
        Err(syntax) => {
            println!(
                "{file}:{}: invalid YAML: {}",
                syntax.position, syntax.message
            );
            bail!("{file}: not a YAML document");
        }
    };
    let checked = config::check(&text, &source);
    let mut errors = checked.errors;
    // The files the configuration names are checked whenever it could be read.
    if let Some(config) = &checked.config {
        errors.extend(check_files(config, &base_dir_of(path)));
    }
    if errors.is_empty() {
        for gv in checked.plan.iter().flat_map(|p| &p.group_versions) {
            println!(
                "ok: {}/{} -> target {}/{} ({:?}), port {}",
                gv.group, gv.version, gv.target.project, gv.target.name, gv.access, gv.port
            );
        }
        print_sync_plan(&text);
        if let Some(config) = &checked.config {
            print_rbac_names(&config.client.name);
        }
        return Ok(());
    }
    let mut located: Vec<(config::Position, &config::ConfigError)> =
        errors.iter().map(|e| (source.locate(&e.key), e)).collect();
    // File order reads best; problems at one place keep their order.
    located.sort_by_key(|(position, _)| *position);
    for (position, error) in located {
        println!("{file}:{position}: {error}");
    }
    bail!("{file}: {} configuration error(s)", errors.len())
}

/// Every file the configuration names exists and parses: kubeconfigs give a
/// cluster to talk to (and their exec plugins can be found), a peer file lists
/// peers. Relative paths are read from the configuration file's directory, as
/// `crproxy run` reads them.
pub fn check_files(config: &Config, base: &Path) -> Vec<config::ConfigError> {
    let mut errors = check_kubeconfigs(config, base, ExecPlugins::Located)
        .err()
        .unwrap_or_default();
    for (i, target) in config.targets.iter().enumerate() {
        let Some(path) = target.peers.file.as_deref().filter(|p| !p.is_empty()) else {
            continue;
        };
        let resolved = resolve(base, path);
        let shown = resolved.display().to_string();
        let problem = match std::fs::read(&resolved) {
            Err(e) => Some(format!("cannot read peer file {shown}: {e}")),
            Ok(content) => crproxy_proxy::sources::parse_peer_file(&resolved, &content)
                .err()
                .map(|e| match e {
                    // Names the file itself.
                    crproxy_proxy::sources::SourceError::Format { .. } => e.to_string(),
                    _ => format!("peer file {shown}: {e}"),
                }),
        };
        if let Some(message) = problem {
            errors.push(config::ConfigError {
                key: format!("targets[{i}].peers.file"),
                message,
            });
        }
    }
    errors
}

/// Whether a kubeconfig's exec plugin must be found when its kubeconfig is checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExecPlugins {
    /// It must be on PATH (or at its path) now: `check-config` reports it missing.
    Located,
    /// It may appear later: `run` starts without it, logs each failed attempt to
    /// run it, and tries again on the next request, as client-go does.
    Later,
}

/// The clusters the proxy talks to, each built once from its kubeconfig when
/// [`check_kubeconfigs`] checked it, so that what runs is what was checked.
pub struct Clusters {
    /// `client.kubeconfig`'s; `None` when it is unset (in-cluster credentials,
    /// which only a pod has: see [`client_access`]).
    pub client: Option<crproxy_kube::ClusterConfig>,
    /// `sync.host.kubeconfig`'s, when it is set.
    pub sync_host: Option<crproxy_kube::ClusterConfig>,
    /// One per entry of `targets`, in its order.
    pub targets: Vec<TargetClusters>,
}

/// A target's cluster, and the one its EndpointSlices are read from when
/// `peers.endpointSlices.kubeconfig` names another.
pub struct TargetClusters {
    pub cluster: crproxy_kube::ClusterConfig,
    pub endpoint_slices: Option<crproxy_kube::ClusterConfig>,
}

/// Every kubeconfig the configuration names loads into a cluster to talk to, with
/// the same code `crproxy run` connects with (so its CA, client certificate and key
/// are parsed as they will be used). `Err` lists the problems, each at the
/// configuration key that names the kubeconfig, naming the kubeconfig file and the
/// field in it; a kubeconfig left empty is the configuration rules' to report.
pub fn check_kubeconfigs(
    config: &Config,
    base: &Path,
    exec: ExecPlugins,
) -> Result<Clusters, Vec<config::ConfigError>> {
    let mut errors = Vec::new();
    let mut kubeconfig = |key: String, path: &str| -> Option<crproxy_kube::ClusterConfig> {
        if path.is_empty() {
            return None; // Reported as missing by the rules.
        }
        let resolved = resolve(base, path);
        match load_cluster(&resolved, exec) {
            Ok(cluster) => Some(cluster),
            Err(message) => {
                errors.push(config::ConfigError { key, message });
                None
            }
        }
    };
    let client = config
        .client
        .kubeconfig
        .as_deref()
        .and_then(|path| kubeconfig("client.kubeconfig".into(), path));
    let sync_host = config
        .sync
        .host_kubeconfig
        .as_deref()
        .and_then(|path| kubeconfig("sync.host.kubeconfig".into(), path));
    let mut targets = Vec::new();
    for (i, target) in config.targets.iter().enumerate() {
        let cluster = kubeconfig(format!("targets[{i}].kubeconfig"), &target.kubeconfig);
        let slices_path = target
            .peers
            .endpoint_slices
            .as_ref()
            .and_then(|e| e.kubeconfig.as_deref());
        let endpoint_slices = slices_path.and_then(|path| {
            kubeconfig(
                format!("targets[{i}].peers.endpointSlices.kubeconfig"),
                path,
            )
        });
        if let Some(cluster) = cluster {
            targets.push(TargetClusters {
                cluster,
                endpoint_slices,
            });
        }
    }
    if !errors.is_empty() || targets.len() != config.targets.len() {
        return Err(errors);
    }
    Ok(Clusters {
        client,
        sync_host,
        targets,
    })
}

/// The cluster of the kubeconfig at `resolved`, or why it cannot be used, naming
/// the file and the field in it.
fn load_cluster(resolved: &Path, exec: ExecPlugins) -> Result<crproxy_kube::ClusterConfig, String> {
    let shown = resolved.display();
    if !resolved.is_file() {
        return Err(format!("{shown} does not exist (relative paths are read from the configuration file's directory)"));
    }
    let loaded = crproxy_kube::Kubeconfig::load(resolved)
        .map_err(|e| kubeconfig_not_loaded(resolved, &e))?;
    let unusable_because = |problem: String| format!("kubeconfig {shown} is unusable: {problem}");
    let cluster = crproxy_kube::ClusterConfig::from_kubeconfig(&loaded, None)
        .map_err(|e| unusable_because(unusable(&e)))?;
    if let (crproxy_kube::Auth::Exec(plugin), ExecPlugins::Located) = (&cluster.auth, exec) {
        if let Err(problem) = plugin.locate() {
            let user = loaded
                .context(None)
                .map(|c| c.context.user.clone())
                .unwrap_or_default();
            return Err(unusable_because(format!(
                "users[{user}].user.exec.command: {problem}"
            )));
        }
    }
    Ok(cluster)
}

/// `check-config` lines for the sync: one per synced type, and the warnings.
fn print_sync_plan(text: &str) {
    let Ok(config) = config::parse(text) else {
        return;
    };
    if let Ok(Some(plan)) = config::sync::validate(&config) {
        for r in &plan.resources {
            let (key, direction, scope) = (&r.key, r.direction.as_str(), r.scope.as_str());
            match r.direction {
                config::sync::Direction::ToHost => println!(
                    "ok: sync {direction} {key} ({scope}) -> host namespace {}",
                    plan.host_namespace
                ),
                config::sync::Direction::FromHost => {
                    println!("ok: sync {direction} {key} ({scope}) <- host")
                }
            }
        }
    }
    for warning in config::sync::warnings(&config.sync) {
        println!("warning: {warning}");
    }
}

/// The names of the client-cluster objects that deploy/base/rbac.yaml and
/// deploy/components/sync/rbac.yaml allow by name, for this `client.name`: they
/// follow it, and the sync's Lease is shortened with a hash when long, so the
/// operator copies them rather than working them out.
fn print_rbac_names(client_name: &str) {
    println!(
        "ok: names the RBAC allows by name: Lease kube-system/{}, Lease kube-system/{}, \
         ValidatingWebhookConfiguration {}",
        crproxy_core::names::registration_lease_name(client_name),
        crproxy_core::names::sync_lease_name(client_name),
        crproxy_sync::writethrough::configuration_name(client_name),
    );
}

/// The proxy's serving certificate and the CA the APIService `caBundle` carries.
pub struct Serving {
    pub identity: ServingIdentity,
    pub ca_pem: String,
}

/// Loads the serving CA from `dir` (or creates it there when neither of its files
/// is), then issues a serving certificate for every name the aggregator may use to
/// reach the proxy. Replicas that share the directory share the CA, so one
/// `caBundle` trusts them all. One file without the other is refused rather than
/// replaced: a new CA would break every replica and client still trusting the old.
pub fn serving_identity(dir: &Path) -> Result<Serving> {
    if std::fs::metadata(dir).is_ok_and(|m| !m.is_dir()) {
        bail!(
            "serving CA: {} is not a directory: it must hold ca.crt and ca.key, or not exist",
            dir.display()
        );
    }
    let ca = match stored_ca(dir)? {
        StoredCa::Complete(ca) => *ca,
        // Another start that shares the directory may be writing it right now.
        StoredCa::Missing => ca_under_lock(dir)?,
        // Half a CA may be another start's, half written: under the lock it is
        // whole. A directory that cannot be locked (a mounted Secret, say) is
        // being written by no one.
        StoredCa::Unfinished(error) => {
            let Ok(_lock) = lock_serving_dir(dir) else {
                return Err(error);
            };
            locked_ca(dir)?
        }
    };
    // The aggregator verifies `<service>.<namespace>.svc`; service names depend on
    // the group/version, so the certificate carries a wildcard for kube-system
    // services as well as the loopback names.
    let names = [
        "localhost",
        "*.kube-system.svc",
        "*.kube-system.svc.cluster.local",
    ];
    let ips = ["127.0.0.1".parse()?, "::1".parse()?];
    let leaf = ca.issue_server(&names, &ips)?;
    Ok(Serving {
        identity: ServingIdentity {
            cert_chain_pem: format!("{}{}", leaf.cert, ca.pem().cert),
            key_pem: leaf.key,
        },
        ca_pem: ca.pem().cert.clone(),
    })
}

/// The `check-config` message for a kubeconfig file that did not load (it could
/// not be read, or it is not a kubeconfig): the file, then why, on one line.
fn kubeconfig_not_loaded(file: &Path, error: &crproxy_kube::KubeconfigFileError) -> String {
    use crproxy_kube::KubeconfigFileProblem;
    let file = file.display();
    match &error.problem {
        KubeconfigFileProblem::Unreadable(e) => {
            format!("{file} cannot be read: {}", one_line(e))
        }
        KubeconfigFileProblem::Invalid(problem) => {
            format!("{file} is not a kubeconfig: {}", one_line(problem))
        }
    }
}

/// Why a kubeconfig that loaded gives no cluster to talk to, for a line that already
/// says "kubeconfig FILE is unusable": without the error's own "invalid kubeconfig".
fn unusable(error: &crproxy_kube::Error) -> String {
    match error {
        crproxy_kube::Error::Kubeconfig(problem) => one_line(problem),
        other => one_line(&other.to_string()),
    }
}

/// A PEM file of the serving CA, as text.
fn read_pem(path: &Path) -> Result<String> {
    let bytes =
        std::fs::read(path).with_context(|| format!("serving CA: reading {}", path.display()))?;
    String::from_utf8(bytes).map_err(|_| {
        anyhow!(
            "serving CA: reading {}: not UTF-8 (a PEM file is text)",
            path.display()
        )
    })
}

const SERVING_CA_NAME: &str = "crproxy-serving-ca";

/// What a serving-CA directory holds.
enum StoredCa {
    Complete(Box<CertificateAuthority>),
    Missing,
    /// One file without the other, or a pair that does not load: why it is
    /// refused, unless it was another start's CA still being written (its
    /// certificate is created before its text is in it).
    Unfinished(anyhow::Error),
}

fn stored_ca(dir: &Path) -> Result<StoredCa> {
    let cert_path = dir.join("ca.crt");
    let key_path = dir.join("ca.key");
    let exists = |path: &Path| {
        path.try_exists()
            .with_context(|| format!("serving CA: looking for {}", path.display()))
    };
    Ok(match (exists(&cert_path)?, exists(&key_path)?) {
        (true, true) => {
            let loaded = read_pem(&cert_path).and_then(|cert| {
                let pem = CertPem {
                    cert,
                    key: read_pem(&key_path)?,
                };
                CertificateAuthority::from_pem(&pem).with_context(|| {
                    format!(
                        "serving CA: loading {} and {}",
                        cert_path.display(),
                        key_path.display()
                    )
                })
            });
            match loaded {
                Ok(ca) => StoredCa::Complete(Box::new(ca)),
                Err(error) => StoredCa::Unfinished(error),
            }
        }
        (false, false) => StoredCa::Missing,
        (true, false) => StoredCa::Unfinished(anyhow!(
            "serving CA: {} exists but {} does not: restore the key or remove both to \
             generate a new CA",
            cert_path.display(),
            key_path.display()
        )),
        (false, true) => StoredCa::Unfinished(anyhow!(
            "serving CA: {} exists but {} does not: restore the certificate or remove both \
             to generate a new CA",
            key_path.display(),
            cert_path.display()
        )),
    })
}

/// The serving CA in `dir`, generated and written there unless another start got
/// there first: under the directory's lock, which a start that shares the
/// directory holds while it writes, so none sees half of another's CA or fails
/// on its files.
fn ca_under_lock(dir: &Path) -> Result<CertificateAuthority> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("serving CA: creating directory {}", dir.display()))?;
    let _lock = lock_serving_dir(dir)?;
    locked_ca(dir)
}

/// The serving CA in `dir`, read or (when neither file is there) generated and
/// written, by a caller that holds the directory's lock.
fn locked_ca(dir: &Path) -> Result<CertificateAuthority> {
    match stored_ca(dir)? {
        StoredCa::Complete(ca) => Ok(*ca),
        StoredCa::Unfinished(error) => Err(error),
        StoredCa::Missing => {
            let ca = CertificateAuthority::generate(SERVING_CA_NAME)?;
            write_new_ca(dir, &ca)?;
            Ok(ca)
        }
    }
}

/// An exclusive lock on `dir`'s `.lock` file, held until the file is dropped. It
/// waits for another holder: one writing two small files.
fn lock_serving_dir(dir: &Path) -> Result<std::fs::File> {
    let path = dir.join(".lock");
    let context = || format!("serving CA: locking {}", path.display());
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(context)?;
    file.lock().with_context(context)?;
    Ok(file)
}

/// Writes a newly generated serving CA into `dir`: the key first and readable by the
/// owner only, then the certificate. Neither file may exist (another process that
/// shares the directory may have just written its own CA); if the certificate
/// cannot be written, the key is removed again, so the next start does not find
/// half a CA.
fn write_new_ca(dir: &Path, ca: &CertificateAuthority) -> Result<()> {
    let (cert_path, key_path) = (dir.join("ca.crt"), dir.join("ca.key"));
    write_new(&key_path, &ca.pem().key, 0o600)?;
    if let Err(e) = write_new(&cert_path, &ca.pem().cert, 0o644) {
        let _ = std::fs::remove_file(&key_path);
        return Err(e);
    }
    Ok(())
}

/// Creates `path` with `contents` and `mode`; fails if it exists.
fn write_new(path: &Path, contents: &str, mode: u32) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let context = || format!("serving CA: writing {}", path.display());
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .with_context(context)?;
    file.write_all(contents.as_bytes()).with_context(context)?;
    Ok(())
}

fn resolve(base: &Path, path: &str) -> PathBuf {
    let p = PathBuf::from(path);
    if p.is_absolute() {
        p
    } else {
        base.join(p)
    }
}

/// The client cluster, `client.kubeconfig`'s as checked or in-cluster credentials
/// when it is unset, with the credential provider that the proxy, its registration
/// and the sync (whose tenant it is) share.
pub fn client_access(
    client: Option<crproxy_kube::ClusterConfig>,
) -> Result<crproxy_kube::ClusterAccess> {
    let cluster = match client {
        Some(cluster) => cluster,
        None => crproxy_kube::ClusterConfig::in_cluster().context(
            "client.kubeconfig is not set and crproxy is not running in a cluster: set \
             client.kubeconfig to a kubeconfig for the client cluster, or run crproxy in it",
        )?,
    };
    Ok(crproxy_kube::ClusterAccess::new(cluster)?)
}

/// The clusters of a configuration's sync, checked and loaded as [`run`] does, for
/// a start that runs no proxy beside it. `path` names the configuration in errors.
pub fn load_sync_clusters(
    path: &Path,
    config: &Config,
    base: &Path,
) -> Result<crproxy_sync::SyncClusters> {
    let clusters = check_kubeconfigs(config, base, ExecPlugins::Later)
        .map_err(|problems| invalid(path, &problems))?;
    sync_clusters(client_access(clusters.client), clusters.sync_host)
}

/// The sync's clusters: its tenant is the client cluster (`client`, or why it
/// cannot be reached), its host `sync.host.kubeconfig`'s.
pub fn sync_clusters(
    client: Result<crproxy_kube::ClusterAccess>,
    host: Option<crproxy_kube::ClusterConfig>,
) -> Result<crproxy_sync::SyncClusters> {
    let host = host
        .map(crproxy_kube::ClusterAccess::new)
        .transpose()
        .context("sync.host.kubeconfig")?;
    Ok(crproxy_sync::SyncClusters {
        tenant: client.map_err(|e| format!("{e:#}")),
        host,
    })
}

/// Turns a loaded configuration, and the clusters [`check_kubeconfigs`] built from
/// it, into what the proxy library starts from.
pub fn setup(
    loaded: &Loaded,
    client: &crproxy_kube::ClusterAccess,
    target_clusters: Vec<TargetClusters>,
    serving: ServingIdentity,
    metrics: Arc<Metrics>,
) -> Result<ProxySetup> {
    let config = &loaded.config;
    let client_watches = crproxy_proxy::watches::WatchClient::new(client)?;
    let client = client.kube_client_without_retries()?;
    let mut targets = Vec::new();
    for (target, clusters) in config.targets.iter().zip(target_clusters) {
        let project = target.project.clone();
        let source = target.peers.source().ok_or_else(|| {
            anyhow!(
                "target {project}/{}: exactly one peer source is required",
                target.name
            )
        })?;
        let access = crproxy_kube::ClusterAccess::new(clusters.cluster)
            .with_context(|| format!("target {project}/{}", target.name))?;
        let peers = peer_source(&loaded.base_dir, &source, &access, clusters.endpoint_slices)?;
        targets.push(TargetSetup {
            name: target.name.clone(),
            project,
            access,
            peers,
        });
    }
    let bind: IpAddr = config.proxy.bind_address.parse().with_context(|| {
        format!(
            "proxy.bindAddress: {:?} is not an IP address",
            config.proxy.bind_address
        )
    })?;
    let metrics_addr: SocketAddr = config.proxy.metrics_address.parse().with_context(|| {
        format!(
            "proxy.metricsAddress: {:?} is not host:port",
            config.proxy.metrics_address
        )
    })?;
    Ok(ProxySetup {
        owner: Owner {
            name: config.client.name.clone(),
            project: config.client.project.clone(),
        },
        plan: loaded.plan.group_versions.clone(),
        bind,
        metrics_addr,
        client,
        client_watches,
        targets,
        serving,
        metrics,
        share_ports: false,
        startup_sync_timeout: crproxy_proxy::app::STARTUP_SYNC_TIMEOUT,
    })
}

/// `target` is the client's identity on the target: EndpointSlices are read as it
/// unless `endpoint_slices` (`peers.endpointSlices.kubeconfig`'s cluster) is given.
fn peer_source(
    base: &Path,
    peers: &config::PeerSource,
    target: &crproxy_kube::ClusterAccess,
    endpoint_slices: Option<crproxy_kube::ClusterConfig>,
) -> Result<PeerSourceConfig> {
    Ok(match peers {
        config::PeerSource::Static(list) => PeerSourceConfig::Static(list.clone()),
        config::PeerSource::Dns(dns) => PeerSourceConfig::Dns {
            name: dns.name.clone(),
            port: dns.port,
            interval: Duration::from_secs(dns.interval_seconds),
        },
        config::PeerSource::EndpointSlices(slices) => {
            let access = match endpoint_slices {
                Some(cluster) => crproxy_kube::ClusterAccess::new(cluster)?,
                None => target.clone(),
            };
            PeerSourceConfig::EndpointSlices {
                client: crproxy_proxy::watches::WatchClient::new(&access)?,
                namespace: slices.namespace.clone(),
                service: slices.service.clone(),
                port_name: slices.port_name.clone(),
            }
        }
        config::PeerSource::File(path) => PeerSourceConfig::File(resolve(base, path)),
    })
}

/// Starts leader election in the client cluster and, while leader, keeps the
/// Service, APIService and protection policy of every group/version in place.
pub async fn start_wiring(
    loaded: &Loaded,
    client: &crproxy_kube::ClusterAccess,
    proxy: &RunningProxy,
    serving_ca_pem: &str,
    identity: &str,
) -> Result<crproxy_wiring::WiringHandle> {
    let config = &loaded.config;
    // No per-request retries: the elector and the registrar retry on their own
    // intervals, which keeps a renewal from outliving the lease.
    let client = client.kube_client_without_retries()?;
    let holder = format!("{identity}-{}", crproxy_wiring::default_identity());
    let leader = crproxy_wiring::LeaderElector::spawn(
        client.clone(),
        crproxy_wiring::LeaseConfig {
            namespace: crproxy_core::names::LEASE_NAMESPACE.into(),
            name: crproxy_core::names::registration_lease_name(&config.client.name),
            identity: holder,
            lease_duration: Duration::from_secs(15),
            renew_interval: Duration::from_secs(2),
            retry_interval: Duration::from_secs(2),
        },
    );
    let registrations: Vec<crproxy_wiring::Registration> = loaded
        .plan
        .group_versions
        .iter()
        .zip(proxy.servers.iter())
        .map(|(gv, (_, addr))| crproxy_wiring::Registration {
            group: gv.group.clone(),
            version: gv.version.clone(),
            port: addr.port(),
        })
        .collect();
    let registration = &config.proxy.registration;
    let service_mode = match registration.service_type {
        config::ServiceType::ExternalName => crproxy_wiring::ServiceMode::ExternalName {
            external_name: registration.external_name.clone(),
        },
        config::ServiceType::ClusterIP => crproxy_wiring::ServiceMode::ClusterIP {
            selector: BTreeMap::from([(
                "app.kubernetes.io/name".to_string(),
                "crproxy".to_string(),
            )]),
        },
    };
    let registrar = crproxy_wiring::spawn_registrar(
        client,
        crproxy_wiring::RegistrarConfig {
            service_mode,
            service_namespace: "kube-system".into(),
            ca_bundle_pem: serving_ca_pem.as_bytes().to_vec(),
            insecure_skip_tls_verify: registration.insecure_skip_tls_verify,
        },
        registrations,
        leader.clone(),
        Duration::from_secs(10),
    );
    Ok(crproxy_wiring::WiringHandle::new(leader, registrar))
}

/// `crproxy run --config FILE`: runs the proxy when `experimental.proxy` enables a
/// resource, the custom resource sync when `sync` enables one, or both; serves until
/// SIGTERM or Ctrl-C, then shuts down gracefully.
pub async fn run(path: &Path) -> Result<()> {
    let signals = StopSignals::catch();
    let loaded = load(path)?;
    // Everything the configuration names is checked before anything is written
    // (the serving CA) or started.
    let clusters = check_kubeconfigs(&loaded.config, &loaded.base_dir, ExecPlugins::Later)
        .map_err(|problems| invalid(path, &problems))?;
    let sync_metrics = crproxy_sync::SyncMetrics::new();
    let metrics = Metrics::with_extra(|registry| sync_metrics.register(registry));
    // The client cluster is the sync's tenant too: one credential provider serves
    // the proxy, its registration and the sync.
    let client = client_access(clusters.client);
    let mut proxy = None;
    let mut metrics_only = None;
    if loaded.plan.group_versions.is_empty() {
        metrics_only = Some(serve_metrics_only(&loaded, Arc::clone(&metrics)).await?);
    } else {
        // In-cluster credentials too are found before the serving CA may be written.
        let client = client
            .as_ref()
            .map_err(|e| anyhow!("client cluster: {e:#}"))?;
        let serving_dir = loaded.base_dir.join("serving-ca");
        let serving = serving_identity(&serving_dir)?;
        let setup = setup(
            &loaded,
            client,
            clusters.targets,
            serving.identity.clone(),
            metrics,
        )?;
        let running = crproxy_proxy::app::start(setup, true).await?;
        let wiring = start_wiring(
            &loaded,
            client,
            &running,
            &serving.ca_pem,
            &loaded.config.client.name,
        )
        .await?;
        proxy = Some((running, wiring));
    }
    let sync = crproxy_sync::start_from_config(
        &loaded.config,
        sync_clusters(client, clusters.sync_host)?,
        sync_metrics,
        &loaded.config.client.name,
        crproxy_sync::LEASE_DURATION,
    )
    .await
    .context("custom resource sync")?;
    signals.wait().await;
    tracing::info!("shutting down: no new connections, in-flight requests may finish");
    if let Some(sync) = sync {
        sync.stop().await;
    }
    if let Some((running, wiring)) = proxy {
        wiring.stop().await;
        running.shutdown().await;
    }
    if let Some((stop, task)) = metrics_only {
        let _ = stop.send(true);
        let _ = task.await;
    }
    Ok(())
}

/// Without the proxy, the metrics listener (`/metrics/syncer`) is served on its own.
async fn serve_metrics_only(
    loaded: &Loaded,
    metrics: Arc<Metrics>,
) -> Result<(
    tokio::sync::watch::Sender<bool>,
    tokio::task::JoinHandle<()>,
)> {
    let addr: SocketAddr = loaded
        .config
        .proxy
        .metrics_address
        .parse()
        .with_context(|| {
            format!(
                "proxy.metricsAddress: {:?} is not host:port",
                loaded.config.proxy.metrics_address
            )
        })?;
    let listener = crproxy_proxy::server::bind(addr, false).await?;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let task = crproxy_proxy::server::serve_metrics(
        listener,
        metrics,
        crproxy_proxy::health::Readiness::without_proxy(),
        stopped,
    );
    Ok((stop, task))
}

/// SIGTERM and SIGINT, caught from the moment this is made. Made before start-up,
/// so that a signal arriving while the process starts (just after it announced
/// where it serves, say) stops it cleanly instead of killing it with the default
/// action.
pub struct StopSignals {
    terminate: Option<Signal>,
    interrupt: Option<Signal>,
}

impl StopSignals {
    pub fn catch() -> StopSignals {
        StopSignals {
            terminate: signal(SignalKind::terminate()).ok(),
            interrupt: signal(SignalKind::interrupt()).ok(),
        }
    }

    /// Resolves on the first SIGTERM or SIGINT since [`StopSignals::catch`].
    pub async fn wait(self) {
        let StopSignals {
            terminate,
            interrupt,
        } = self;
        let (Some(mut terminate), Some(mut interrupt)) = (terminate, interrupt) else {
            // The handlers could not be installed: Ctrl-C as the runtime offers it.
            let _ = tokio::signal::ctrl_c().await;
            return;
        };
        tokio::select! {
            _ = terminate.recv() => {}
            _ = interrupt.recv() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crproxy_kube::{Error, KubeconfigFileError, KubeconfigFileProblem};

    fn file_error(problem: KubeconfigFileProblem) -> KubeconfigFileError {
        KubeconfigFileError {
            path: "/etc/k.yaml".into(),
            problem,
        }
    }

    /// `check-config`'s kubeconfig messages name the file once where they can, and
    /// are always one line.
    #[test]
    fn kubeconfig_problems_are_one_line() {
        let file = Path::new("/etc/k.yaml");
        for (message, expected) in [
            (
                kubeconfig_not_loaded(
                    file,
                    &file_error(KubeconfigFileProblem::Invalid(
                        "bad YAML: unclosed bracket '[' at line 1, column 11".into(),
                    )),
                ),
                "/etc/k.yaml is not a kubeconfig: bad YAML: unclosed bracket '[' at line 1, column 11",
            ),
            (
                kubeconfig_not_loaded(
                    file,
                    &file_error(KubeconfigFileProblem::Unreadable(
                        "Permission denied (os error 13)".into(),
                    )),
                ),
                "/etc/k.yaml cannot be read: Permission denied (os error 13)",
            ),
            (
                unusable(&Error::Kubeconfig("context \"x\" not found".into())),
                "context \"x\" not found",
            ),
            (
                unusable(&Error::Tls("the CA PEM\nholds no certificate".into())),
                "invalid TLS configuration: the CA PEM holds no certificate",
            ),
        ] {
            assert_eq!(message, expected);
        }
    }

    /// `serving_identity` of a `serving-ca` directory prepared by `prepare`: the
    /// error line, with `{dir}` standing for the directory.
    fn serving_error(prepare: impl FnOnce(&Path)) -> (String, PathBuf, tempfile::TempDir) {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("serving-ca");
        prepare(&dir);
        let error = match serving_identity(&dir) {
            Ok(_) => panic!("serving_identity accepted it"),
            Err(e) => crate::report::error_line(&e),
        };
        (error.replace(&dir.display().to_string(), "{dir}"), dir, tmp)
    }

    fn write(path: &Path, contents: &[u8]) {
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, contents).expect("write");
    }

    /// Half a serving CA is refused, and nothing is written over the half there is.
    #[test]
    fn half_a_serving_ca_is_refused_not_replaced() {
        let ca = CertificateAuthority::generate("kept").expect("ca");
        let (error, dir, _tmp) =
            serving_error(|dir| write(&dir.join("ca.crt"), ca.pem().cert.as_bytes()));
        assert_eq!(
            error,
            "serving CA: {dir}/ca.crt exists but {dir}/ca.key does not: restore the key or \
             remove both to generate a new CA"
        );
        assert_eq!(
            std::fs::read_to_string(dir.join("ca.crt")).expect("read"),
            ca.pem().cert
        );
        assert!(!dir.join("ca.key").exists());
        let (error, dir, _tmp) =
            serving_error(|dir| write(&dir.join("ca.key"), ca.pem().key.as_bytes()));
        assert_eq!(
            error,
            "serving CA: {dir}/ca.key exists but {dir}/ca.crt does not: restore the \
             certificate or remove both to generate a new CA"
        );
        assert!(!dir.join("ca.crt").exists());
    }

    /// With neither file the CA is generated and kept; the next start loads it.
    #[test]
    fn a_missing_serving_ca_is_generated_and_then_reused() {
        use std::os::unix::fs::PermissionsExt as _;
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("serving-ca");
        let first = serving_identity(&dir).expect("generated");
        let mode = std::fs::metadata(dir.join("ca.key"))
            .expect("key")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(
            std::fs::read_to_string(dir.join("ca.crt")).expect("crt"),
            first.ca_pem
        );
        let second = serving_identity(&dir).expect("loaded");
        assert_eq!(second.ca_pem, first.ca_pem);
    }

    /// Starts that share a serving-CA directory and find it empty at the same
    /// moment all end up with one CA: none fails on the other's files, and none
    /// reads half of them.
    #[test]
    fn concurrent_first_starts_share_one_serving_ca() {
        const STARTS: usize = 6;
        for round in 0..5 {
            let tmp = tempfile::tempdir().expect("tempdir");
            let dir = tmp.path().join("serving-ca");
            let barrier = std::sync::Barrier::new(STARTS);
            let cas: Vec<String> = std::thread::scope(|scope| {
                let starts: Vec<_> = (0..STARTS)
                    .map(|_| {
                        scope.spawn(|| {
                            barrier.wait();
                            serving_identity(&dir).map(|serving| serving.ca_pem)
                        })
                    })
                    .collect();
                starts
                    .into_iter()
                    .map(|start| match start.join().expect("no panic") {
                        Ok(ca) => ca,
                        Err(e) => panic!("round {round}: {}", crate::report::error_line(&e)),
                    })
                    .collect()
            });
            let kept = std::fs::read_to_string(dir.join("ca.crt")).expect("ca.crt");
            assert!(cas.iter().all(|ca| *ca == kept), "round {round}");
        }
    }

    /// A start that finds half a CA while another start holds the directory's lock
    /// waits for the rest rather than refusing it: the key alone, or both files
    /// with the certificate created but not yet written (what a start that reads
    /// without the lock may meet).
    #[test]
    fn half_a_serving_ca_being_written_is_waited_for() {
        for certificate_created_empty in [false, true] {
            let tmp = tempfile::tempdir().expect("tempdir");
            let dir = tmp.path().join("serving-ca");
            let ca = CertificateAuthority::generate("other start").expect("ca");
            std::fs::create_dir_all(&dir).expect("mkdir");
            let lock = lock_serving_dir(&dir).expect("lock");
            write(&dir.join("ca.key"), ca.pem().key.as_bytes());
            if certificate_created_empty {
                write(&dir.join("ca.crt"), b"");
            }
            let waiting = std::thread::spawn({
                let dir = dir.clone();
                move || serving_identity(&dir).map(|serving| serving.ca_pem)
            });
            // Long enough for the start to find the CA unfinished.
            std::thread::sleep(Duration::from_millis(200));
            write(&dir.join("ca.crt"), ca.pem().cert.as_bytes());
            drop(lock);
            match waiting.join().expect("no panic") {
                Ok(loaded) => assert_eq!(loaded, ca.pem().cert, "{certificate_created_empty}"),
                Err(e) => panic!(
                    "{certificate_created_empty}: {}",
                    crate::report::error_line(&e)
                ),
            }
        }
    }

    /// Every I/O problem with the serving CA says what was being done, and where.
    #[test]
    fn serving_ca_io_errors_name_the_path() {
        for (prepare, expected) in [
            (
                Box::new(|dir: &Path| write(dir, b"")) as Box<dyn FnOnce(&Path)>,
                "serving CA: {dir} is not a directory: it must hold ca.crt and ca.key, or not exist",
            ),
            (
                // A dangling link: nothing to read, and no directory can be made.
                Box::new(|dir: &Path| {
                    std::os::unix::fs::symlink("/nonexistent/serving-ca", dir).expect("symlink")
                }),
                "serving CA: creating directory {dir}: File exists (os error 17)",
            ),
            (
                Box::new(|dir: &Path| {
                    std::fs::create_dir_all(dir.join("ca.crt")).expect("mkdir");
                    write(&dir.join("ca.key"), b"key");
                }),
                "serving CA: reading {dir}/ca.crt: Is a directory (os error 21)",
            ),
            (
                Box::new(|dir: &Path| {
                    write(&dir.join("ca.crt"), b"\xff\xfe");
                    write(&dir.join("ca.key"), b"key");
                }),
                "serving CA: reading {dir}/ca.crt: not UTF-8 (a PEM file is text)",
            ),
        ] {
            assert_eq!(serving_error(prepare).0, expected);
        }
    }

    /// A configuration naming `kubeconfig` (written into a fresh directory), as
    /// `check-config` (exec plugins located) and `run` (not) check it: the message
    /// of each, with `{dir}` standing for the directory.
    fn kubeconfig_problems(kubeconfig: &str) -> [Vec<String>; 2] {
        let tmp = tempfile::tempdir().expect("tempdir");
        write(&tmp.path().join("client.kubeconfig"), kubeconfig.as_bytes());
        let mut config = config::parse("client: {name: c, project: p}\n").expect("config");
        config.client.kubeconfig = Some("client.kubeconfig".into());
        [ExecPlugins::Located, ExecPlugins::Later].map(|exec| {
            check_kubeconfigs(&config, tmp.path(), exec)
                .err()
                .unwrap_or_default()
                .iter()
                .map(|e| {
                    e.to_string()
                        .replace(&tmp.path().display().to_string(), "{dir}")
                })
                .collect()
        })
    }

    fn kubeconfig_with(cluster: &str, user: &str) -> String {
        format!(
            "clusters: [{{name: c, cluster: {cluster}}}]\n\
             users: [{{name: admin, user: {user}}}]\n\
             contexts: [{{name: x, context: {{cluster: c, user: admin}}}}]\n\
             current-context: x\n"
        )
    }

    /// The clusters `run` starts from are the ones each key names, built when they
    /// were checked: the client's (none when unset), and per target its own and
    /// the one its EndpointSlices are read from.
    #[test]
    fn checked_kubeconfigs_are_the_clusters_run_uses() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let ca = CertificateAuthority::generate("ca").expect("ca");
        let ca_file = tmp.path().join("ca.crt");
        write(&ca_file, ca.pem().cert.as_bytes());
        let at = |port: u16| {
            let cluster = format!(
                "{{server: 'https://127.0.0.1:{port}', certificate-authority: {}}}",
                ca_file.display()
            );
            kubeconfig_with(&cluster, "{token: t}")
        };
        for (file, port) in [
            ("client", 6443),
            ("t0", 7443),
            ("slices", 8443),
            ("t1", 9443),
        ] {
            write(&tmp.path().join(file), at(port).as_bytes());
        }
        let targets = "targets:\n\
             - {name: a, project: p, kubeconfig: t0,\n\
                peers: {endpointSlices: {kubeconfig: slices, namespace: ns, service: svc}}}\n\
             - {name: b, project: p, kubeconfig: t1, peers: {static: ['127.0.0.1:1']}}\n";
        let mut config =
            config::parse(&format!("client: {{name: c, project: p}}\n{targets}")).expect("config");
        let port = |cluster: &crproxy_kube::ClusterConfig| cluster.server.port();
        let Ok(clusters) = check_kubeconfigs(&config, tmp.path(), ExecPlugins::Later) else {
            panic!("the kubeconfigs load");
        };
        assert!(clusters.client.is_none());
        let ports: Vec<_> = clusters
            .targets
            .iter()
            .map(|t| (port(&t.cluster), t.endpoint_slices.as_ref().map(port)))
            .collect();
        assert_eq!(ports, [(Some(7443), Some(Some(8443))), (Some(9443), None)]);
        config.client.kubeconfig = Some("client".into());
        let Ok(clusters) = check_kubeconfigs(&config, tmp.path(), ExecPlugins::Later) else {
            panic!("the kubeconfigs load");
        };
        assert_eq!(clusters.client.as_ref().and_then(port), Some(6443));
    }

    /// TLS material that is not PEM fails `check-config` as it fails `run`: at the
    /// key, naming the kubeconfig file and the field in it.
    #[test]
    fn kubeconfig_tls_material_is_checked_as_run_loads_it() {
        use base64::Engine as _;
        let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        let ca = CertificateAuthority::generate("ca").expect("ca");
        let client = ca.issue_client("admin", &[]).expect("client");
        let good_ca = b64(ca.pem().cert.as_bytes());
        let cluster =
            format!("{{server: 'https://127.0.0.1:6443', certificate-authority-data: {good_ca}}}");
        let user = |cert: &str| {
            format!(
                "{{client-certificate-data: {cert}, client-key-data: {}}}",
                b64(client.key.as_bytes())
            )
        };
        let good = kubeconfig_with(&cluster, &user(&b64(client.cert.as_bytes())));
        assert_eq!(
            kubeconfig_problems(&good),
            [Vec::<String>::new(), Vec::new()]
        );
        let twice = kubeconfig_with(
            &cluster,
            &user(&b64(b64(client.cert.as_bytes()).as_bytes())),
        );
        let expected = "client.kubeconfig: kubeconfig {dir}/client.kubeconfig is unusable: \
             users[admin].user.client-certificate-data: holds no PEM certificate \
             (base64-encoded twice?)";
        assert_eq!(
            kubeconfig_problems(&twice),
            [vec![expected.to_string()], vec![expected.to_string()]]
        );
        let ca_twice = kubeconfig_with(
            &cluster.replace(&good_ca, &b64(good_ca.as_bytes())),
            "{token: t}",
        );
        let expected = "client.kubeconfig: kubeconfig {dir}/client.kubeconfig is unusable: \
             clusters[c].cluster.certificate-authority-data: holds no PEM certificate \
             (base64-encoded twice?)";
        assert_eq!(kubeconfig_problems(&ca_twice)[0], [expected]);
    }

    /// An exec plugin that cannot be found fails `check-config`; `run` starts
    /// anyway and keeps trying to run it.
    #[test]
    fn a_missing_exec_plugin_fails_check_config_only() {
        let kubeconfig = kubeconfig_with(
            "{server: 'https://127.0.0.1:6443', insecure-skip-tls-verify: true}",
            "{exec: {apiVersion: client.authentication.k8s.io/v1, command: ./no-such-plugin}}",
        );
        let [check, run] = kubeconfig_problems(&kubeconfig);
        assert_eq!(
            check,
            [
                "client.kubeconfig: kubeconfig {dir}/client.kubeconfig is unusable: \
              users[admin].user.exec.command: \"{dir}/./no-such-plugin\" does not exist"
            ]
        );
        assert_eq!(run, Vec::<String>::new());
    }
}
