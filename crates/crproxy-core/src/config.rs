//! The crproxy configuration file and its validation.
//!
//! The keys under `experimental.proxy.customResources` are vcluster.yaml's; `client`,
//! `proxy` and `targets` are crproxy's own answers to what a platform would otherwise
//! provide (who the client is, where its targets live and how to find their API
//! server replicas).
//!
//! Loading happens in two steps, and each collects every problem it finds rather than
//! stopping at the first, so one `check-config` run shows an operator everything:
//! 1. [`parse`]: YAML syntax, unknown keys and wrong value types.
//! 2. [`Config::validate`]: required values and the cross-entry rules, producing the
//!    [`ProxyPlan`] (which group/versions to serve, on which port, for which target).
//!
//! Every [`ConfigError`] names the key it is about with a path such as
//! `experimental.proxy.customResources["widgets.example.com/v1"].targetVirtualCluster.name`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::ops::RangeInclusive;

use serde_json::{Map, Value};

pub mod peer;
mod source;
pub mod sync;
#[cfg(test)]
mod tests;

pub use source::{Position, SourceMap, YamlSyntaxError};

/// One problem in the configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    /// Dotted path of the offending key (empty for the document itself).
    pub key: String,
    /// What is wrong and, where useful, what to write instead.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.key.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "{}: {}", self.key, self.message)
        }
    }
}

impl ConfigError {
    fn new(key: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError {
            key: key.into(),
            message: message.into(),
        }
    }
}

/// Default listen address of the per-group/version servers.
pub const DEFAULT_BIND_ADDRESS: &str = "127.0.0.1";
/// First proxy port; group/versions get consecutive ports in alphabetical order.
pub const DEFAULT_BASE_PORT: u16 = 9100;
/// Default metrics listener.
pub const DEFAULT_METRICS_ADDRESS: &str = "127.0.0.1:9090";
/// What a port key accepts: 0 would mean "any free port", which no one can reach.
const PORT_RANGE: RangeInclusive<u64> = 1..=65_535;

/// The whole file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub client: ClientConfig,
    pub proxy: ProxySettings,
    pub targets: Vec<TargetConfig>,
    /// `experimental.proxy.customResources`, keyed by `<resource>.<group>/<version>`.
    pub custom_resources: BTreeMap<String, CustomResourceEntry>,
    /// The `sync` section (see [`sync`]).
    pub sync: sync::SyncConfig,
}

/// Who the client is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientConfig {
    /// Client virtual cluster name (empty when missing; validation reports it).
    pub name: String,
    /// Platform project *name*.
    pub project: String,
    /// `client.projectNamespace` as written; unset, the Platform project's
    /// namespace is `p-<project>` ([`ClientConfig::project_namespace`]).
    pub configured_project_namespace: Option<String>,
    /// Kubeconfig for the client cluster; `None` means in-cluster credentials.
    pub kubeconfig: Option<String>,
}

impl ClientConfig {
    /// The Kubernetes namespace of the client's Platform project.
    pub fn project_namespace(&self) -> String {
        self.configured_project_namespace
            .clone()
            .unwrap_or_else(|| format!("p-{}", self.project))
    }
}

/// Listener and registration settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxySettings {
    pub bind_address: String,
    pub base_port: u16,
    pub metrics_address: String,
    pub registration: Registration,
}

/// How the leader registers the per-group/version Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    pub service_type: ServiceType,
    pub external_name: String,
    pub insecure_skip_tls_verify: bool,
}

/// Kind of Service registered for the APIService.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServiceType {
    ExternalName,
    ClusterIP,
}

/// A target cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetConfig {
    pub name: String,
    /// Platform project of the target (defaults to the client's project).
    pub project: String,
    /// Credentials and CA for the target (empty when missing; validation reports it).
    pub kubeconfig: String,
    /// The configured peer sources; validation requires exactly one.
    pub peers: PeerSources,
}

impl TargetConfig {
    /// The reference entries use to point at this target.
    pub fn target_ref(&self) -> TargetRef {
        TargetRef {
            name: self.name.clone(),
            project: self.project.clone(),
        }
    }
}

/// The peer-source keys as written; [`PeerSources::source`] gives the single one.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PeerSources {
    pub static_peers: Option<Vec<String>>,
    pub dns: Option<DnsPeers>,
    pub endpoint_slices: Option<EndpointSlicePeers>,
    pub file: Option<String>,
}

impl PeerSources {
    /// The configured source when exactly one is set.
    pub fn source(&self) -> Option<PeerSource> {
        match self.configured().as_slice() {
            [only] => Some(only.clone()),
            _ => None,
        }
    }

    fn configured(&self) -> Vec<PeerSource> {
        let mut out = Vec::new();
        if let Some(s) = &self.static_peers {
            out.push(PeerSource::Static(s.clone()));
        }
        if let Some(d) = &self.dns {
            out.push(PeerSource::Dns(d.clone()));
        }
        if let Some(e) = &self.endpoint_slices {
            out.push(PeerSource::EndpointSlices(e.clone()));
        }
        if let Some(f) = &self.file {
            out.push(PeerSource::File(f.clone()));
        }
        out
    }
}

/// Where a target's API server replicas come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerSource {
    /// Fixed `host:port` list.
    Static(Vec<String>),
    /// A DNS name resolved periodically.
    Dns(DnsPeers),
    /// An EndpointSlice watch.
    EndpointSlices(EndpointSlicePeers),
    /// A watched YAML file listing peers.
    File(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsPeers {
    pub name: String,
    pub port: u16,
    pub interval_seconds: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointSlicePeers {
    /// Kubeconfig of the cluster holding the slices; `None` = the target's.
    pub kubeconfig: Option<String>,
    pub namespace: String,
    pub service: String,
    pub port_name: Option<String>,
}

/// One `experimental.proxy.customResources` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CustomResourceEntry {
    pub enabled: bool,
    /// `targetVirtualCluster.name` (empty when missing).
    pub target_name: String,
    /// `targetVirtualCluster.project` (`None` = the client's project).
    pub target_project: Option<String>,
    pub access: AccessMode,
}

/// `accessResources`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AccessMode {
    /// Only objects carrying the client's ownership labels (the default).
    Owned,
    /// Everything the target's RBAC allows.
    All,
}

impl AccessMode {
    pub fn as_str(self) -> &'static str {
        match self {
            AccessMode::Owned => "owned",
            AccessMode::All => "all",
        }
    }
}

/// A target as entries name it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TargetRef {
    pub name: String,
    pub project: String,
}

impl fmt::Display for TargetRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.project, self.name)
    }
}

/// Which resources of a group/version are configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResourceSet {
    /// Named resources (plural names), sorted.
    Explicit(Vec<String>),
    /// `*.<group>/<version>`: every resource of the group/version.
    Wildcard,
}

impl ResourceSet {
    /// Whether the set names its resources (no wildcard), so that the target's
    /// documents of the group/version are cut down to them.
    pub fn is_explicit(&self) -> bool {
        matches!(self, ResourceSet::Explicit(_))
    }

    /// Whether `resource` (a plural name, without a subresource) is one the proxy
    /// serves: every resource under a wildcard, only the enabled keys otherwise.
    pub fn serves(&self, resource: &str) -> bool {
        match self {
            ResourceSet::Wildcard => true,
            ResourceSet::Explicit(names) => names
                .binary_search_by(|name| name.as_str().cmp(resource))
                .is_ok(),
        }
    }
}

/// What the proxy serves, computed by [`Config::validate`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyPlan {
    /// Sorted by `group/version`; identical on every replica.
    pub group_versions: Vec<GroupVersionPlan>,
}

/// One per-group/version server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupVersionPlan {
    pub group: String,
    pub version: String,
    pub resources: ResourceSet,
    pub target: TargetRef,
    pub access: AccessMode,
    pub port: u16,
}

// ---------------------------------------------------------------------------------
// Parsing.

/// Parses the YAML text; on failure returns the first problem (see [`parse_all`]).
pub fn parse(yaml: &str) -> Result<Config, ConfigError> {
    parse_all(yaml).map_err(|mut errs| errs.swap_remove(0))
}

/// Parses the YAML text, reporting every syntax, duplicate-key, unknown-key and
/// type problem.
pub fn parse_all(yaml: &str) -> Result<Config, Vec<ConfigError>> {
    let source = SourceMap::build(yaml).map_err(|e| vec![ConfigError::new("", e.to_string())])?;
    let (config, errors) = read(yaml, &source)?;
    if errors.is_empty() {
        Ok(config)
    } else {
        Err(errors)
    }
}

/// Reads the document into a [`Config`] (with defaults where values are missing or
/// wrong) and the problems found on the way, duplicates first.
fn read(yaml: &str, source: &SourceMap) -> Result<(Config, Vec<ConfigError>), Vec<ConfigError>> {
    let doc: Value = if yaml.trim().is_empty() {
        Value::Null
    } else {
        // Duplicates are reported from the source map; the later value is used,
        // so the rest of the file is still checked.
        let options = serde_saphyr::options! {
            duplicate_keys: serde_saphyr::DuplicateKeyPolicy::LastWins,
        };
        serde_saphyr::from_str_with_options(yaml, options).map_err(|e| {
            // Only what the source map's walk lets through gets here (a value its
            // tag refuses): named by the key it is written under.
            let key = e.location().map_or_else(String::new, |at| {
                source.key_before(Position {
                    line: usize::try_from(at.line()).unwrap_or(usize::MAX),
                    column: usize::try_from(at.column()).unwrap_or(usize::MAX),
                })
            });
            let problem = crate::yaml_error::one_line(&e);
            vec![ConfigError::new(key, format!("invalid YAML: {problem}"))]
        })?
    };
    let mut r = Reader::default();
    r.errors.extend(source.duplicates().iter().cloned());
    let config = r.config(&doc);
    Ok((config, r.errors))
}

/// Parses and validates in one go: what `crproxy check-config` and start-up use.
/// Every problem is reported: those found while reading the file and those of the
/// rules, except rule errors that only follow from a reading error (a value of the
/// wrong type is not also reported as missing); see [`check`].
pub fn load(yaml: &str) -> Result<(Config, ProxyPlan), Vec<ConfigError>> {
    let source = SourceMap::build(yaml).map_err(|e| vec![ConfigError::new("", e.to_string())])?;
    load_with(yaml, &source)
}

/// [`load`] with the [`SourceMap`] the caller built for printing positions.
pub fn load_with(yaml: &str, source: &SourceMap) -> Result<(Config, ProxyPlan), Vec<ConfigError>> {
    match check(yaml, source) {
        Checked {
            config: Some(config),
            plan: Some(plan),
            errors,
        } if errors.is_empty() => Ok((config, plan)),
        Checked { errors, .. } => Err(errors),
    }
}

/// What reading and validating a file found.
#[derive(Debug, Clone)]
pub struct Checked {
    /// The configuration as read (defaults where values were missing or wrong);
    /// `None` only when the YAML could not be read at all.
    pub config: Option<Config>,
    /// The plan, when the rules passed.
    pub plan: Option<ProxyPlan>,
    /// Every problem; empty means the file is valid.
    pub errors: Vec<ConfigError>,
}

/// Reads and validates, keeping whatever could be read (for checks beyond the
/// file itself, such as the files it names).
pub fn check(yaml: &str, source: &SourceMap) -> Checked {
    let (config, mut errors) = match read(yaml, source) {
        Ok(read) => read,
        Err(errors) => {
            return Checked {
                config: None,
                plan: None,
                errors,
            }
        }
    };
    let plan = match config.validate() {
        Ok(plan) => Some(plan),
        Err(rule_errors) => {
            let reported: Vec<String> = errors.iter().map(|e| e.key.clone()).collect();
            // Errors reported at an entry's own key (`customResources["<key>"]`) judge
            // the name the user gave the entry — its format, or its clash with other
            // entries' names — never the values under it, which the rules report at
            // their own keys; so they stand even when a value under the entry could
            // not be read.
            let entry_keys: BTreeSet<String> = config
                .custom_resources
                .keys()
                .map(|k| entry_path(k))
                .chain(
                    config
                        .sync
                        .to_host
                        .keys()
                        .map(|k| sync::sync_entry_path(sync::Direction::ToHost, k)),
                )
                .chain(
                    config
                        .sync
                        .from_host
                        .keys()
                        .map(|k| sync::sync_entry_path(sync::Direction::FromHost, k)),
                )
                .collect();
            errors.extend(rule_errors.into_iter().filter(|e| {
                !reported.iter().any(|r| {
                    // A rule's complaint about a key that could not be read only
                    // repeats the reading problem. One about what encloses it judges
                    // the default the reader put in its place (an unreadable `enabled`
                    // makes "no custom resource is enabled"), so it is a consequence
                    // too, unless it is about an entry's name (above).
                    is_within(&e.key, r) || (is_within(r, &e.key) && !entry_keys.contains(&e.key))
                })
            }));
            None
        }
    };
    Checked {
        config: Some(config),
        plan,
        errors,
    }
}

/// Whether `key` is `ancestor` or lies under it (`a.b[0]` is within `a.b`; every
/// key is within the document, ``).
fn is_within(key: &str, ancestor: &str) -> bool {
    ancestor.is_empty()
        || key == ancestor
        || key
            .strip_prefix(ancestor)
            .is_some_and(|rest| rest.starts_with('.') || rest.starts_with('['))
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

/// Path of a `customResources` entry.
pub fn entry_path(key: &str) -> String {
    format!("experimental.proxy.customResources[{key:?}]")
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

#[derive(Default)]
struct Reader {
    errors: Vec<ConfigError>,
}

impl Reader {
    fn err(&mut self, key: impl Into<String>, message: impl Into<String>) {
        self.errors.push(ConfigError::new(key, message));
    }

    /// A mapping with only `allowed` keys. `null` or absent reads as empty.
    fn mapping<'a>(
        &mut self,
        v: Option<&'a Value>,
        path: &str,
        allowed: &[&str],
    ) -> Option<&'a Map<String, Value>> {
        let m = match v {
            None | Some(Value::Null) => return None,
            Some(Value::Object(m)) => m,
            Some(other) => {
                self.err(
                    path,
                    format!("expected a mapping, found {}", type_name(other)),
                );
                return None;
            }
        };
        for k in m.keys() {
            if !allowed.contains(&k.as_str()) {
                let expected = allowed.join(", ");
                self.err(
                    join(path, k),
                    format!("unknown key; expected one of: {expected}"),
                );
            }
        }
        Some(m)
    }

    fn string(&mut self, m: Option<&Map<String, Value>>, path: &str, key: &str) -> Option<String> {
        match m.and_then(|m| m.get(key)) {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(other) => {
                self.err(
                    join(path, key),
                    format!("expected a string, found {}", type_name(other)),
                );
                None
            }
        }
    }

    fn boolean(&mut self, m: Option<&Map<String, Value>>, path: &str, key: &str) -> Option<bool> {
        match m.and_then(|m| m.get(key)) {
            None | Some(Value::Null) => None,
            Some(Value::Bool(b)) => Some(*b),
            Some(other) => {
                self.err(
                    join(path, key),
                    format!("expected true or false, found {}", type_name(other)),
                );
                None
            }
        }
    }

    /// A whole number in `range`; the range is the whole rule for the key, so the
    /// message states exactly what is accepted.
    fn unsigned(
        &mut self,
        m: Option<&Map<String, Value>>,
        path: &str,
        key: &str,
        range: RangeInclusive<u64>,
    ) -> Option<u64> {
        match m.and_then(|m| m.get(key)) {
            None | Some(Value::Null) => None,
            Some(Value::Number(n)) => match n.as_u64() {
                Some(v) if range.contains(&v) => Some(v),
                _ => {
                    self.err(
                        join(path, key),
                        format!(
                            "must be a whole number between {} and {}, found {n}",
                            range.start(),
                            range.end()
                        ),
                    );
                    None
                }
            },
            Some(other) => {
                self.err(
                    join(path, key),
                    format!("expected a number, found {}", type_name(other)),
                );
                None
            }
        }
    }

    fn config(&mut self, doc: &Value) -> Config {
        const TOP_LEVEL: [&str; 5] = ["client", "proxy", "targets", "experimental", "sync"];
        let root = match doc {
            // The document is no key of its own, so say what it must hold.
            Value::Null | Value::Object(_) => self.mapping(Some(doc), "", &TOP_LEVEL),
            other => {
                self.err(
                    "",
                    format!(
                        "the file must be a mapping of the configuration's top-level keys ({}), found {}",
                        TOP_LEVEL.join(", "),
                        type_name(other)
                    ),
                );
                None
            }
        };
        let client = self.client(root.and_then(|r| r.get("client")));
        let proxy = self.proxy(root.and_then(|r| r.get("proxy")));
        let targets = self.targets(root.and_then(|r| r.get("targets")), &client.project);
        let experimental = self.mapping(
            root.and_then(|r| r.get("experimental")),
            "experimental",
            &["proxy"],
        );
        let exp_proxy = self.mapping(
            experimental.and_then(|e| e.get("proxy")),
            "experimental.proxy",
            &["customResources"],
        );
        let custom_resources =
            self.custom_resources(exp_proxy.and_then(|p| p.get("customResources")));
        let sync = self.sync(root.and_then(|r| r.get("sync")));
        Config {
            client,
            proxy,
            targets,
            custom_resources,
            sync,
        }
    }

    fn client(&mut self, v: Option<&Value>) -> ClientConfig {
        let p = "client";
        let m = self.mapping(v, p, &["name", "project", "projectNamespace", "kubeconfig"]);
        let name = self.string(m, p, "name").unwrap_or_default();
        let project = self.string(m, p, "project").unwrap_or_default();
        let configured_project_namespace = self.string(m, p, "projectNamespace");
        let kubeconfig = self.string(m, p, "kubeconfig");
        ClientConfig {
            name,
            project,
            configured_project_namespace,
            kubeconfig,
        }
    }

    fn proxy(&mut self, v: Option<&Value>) -> ProxySettings {
        let p = "proxy";
        let m = self.mapping(
            v,
            p,
            &["bindAddress", "basePort", "metricsAddress", "registration"],
        );
        let bind_address = self
            .string(m, p, "bindAddress")
            .unwrap_or_else(|| DEFAULT_BIND_ADDRESS.to_owned());
        let base_port = self
            .unsigned(m, p, "basePort", PORT_RANGE)
            .and_then(|n| u16::try_from(n).ok())
            .unwrap_or(DEFAULT_BASE_PORT);
        let metrics_address = self
            .string(m, p, "metricsAddress")
            .unwrap_or_else(|| DEFAULT_METRICS_ADDRESS.to_owned());
        let rp = "proxy.registration";
        let r = self.mapping(
            m.and_then(|m| m.get("registration")),
            rp,
            &["serviceType", "externalName", "insecureSkipTLSVerify"],
        );
        let service_type = match self.string(r, rp, "serviceType").as_deref() {
            None | Some("ExternalName") => ServiceType::ExternalName,
            Some("ClusterIP") => ServiceType::ClusterIP,
            Some(other) => {
                self.err(
                    join(rp, "serviceType"),
                    format!("unknown value {other:?}; expected ExternalName or ClusterIP"),
                );
                ServiceType::ExternalName
            }
        };
        let external_name = self
            .string(r, rp, "externalName")
            .unwrap_or_else(|| "localhost".to_owned());
        let insecure_skip_tls_verify = self
            .boolean(r, rp, "insecureSkipTLSVerify")
            .unwrap_or(false);
        ProxySettings {
            bind_address,
            base_port,
            metrics_address,
            registration: Registration {
                service_type,
                external_name,
                insecure_skip_tls_verify,
            },
        }
    }

    fn targets(&mut self, v: Option<&Value>, client_project: &str) -> Vec<TargetConfig> {
        let items = match v {
            None | Some(Value::Null) => return Vec::new(),
            Some(Value::Array(a)) => a,
            Some(other) => {
                self.err(
                    "targets",
                    format!("expected a list, found {}", type_name(other)),
                );
                return Vec::new();
            }
        };
        let mut out = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let p = format!("targets[{i}]");
            let m = self.mapping(Some(item), &p, &["name", "project", "kubeconfig", "peers"]);
            if item.is_null() {
                self.err(&p, "expected a mapping, found null");
            }
            let name = self.string(m, &p, "name").unwrap_or_default();
            let project = self
                .string(m, &p, "project")
                .unwrap_or_else(|| client_project.to_owned());
            let kubeconfig = self.string(m, &p, "kubeconfig").unwrap_or_default();
            let peers = self.peers(m.and_then(|m| m.get("peers")), &join(&p, "peers"));
            out.push(TargetConfig {
                name,
                project,
                kubeconfig,
                peers,
            });
        }
        out
    }

    fn peers(&mut self, v: Option<&Value>, p: &str) -> PeerSources {
        let m = self.mapping(v, p, &["static", "dns", "endpointSlices", "file"]);
        let static_peers = match m.and_then(|m| m.get("static")) {
            None | Some(Value::Null) => None,
            Some(Value::Array(a)) => {
                let mut list = Vec::new();
                for (i, e) in a.iter().enumerate() {
                    match e {
                        Value::String(s) => list.push(s.clone()),
                        other => self.err(
                            format!("{p}.static[{i}]"),
                            format!(
                                "expected a \"host:port\" string, found {}",
                                type_name(other)
                            ),
                        ),
                    }
                }
                Some(list)
            }
            Some(other) => {
                self.err(
                    join(p, "static"),
                    format!("expected a list, found {}", type_name(other)),
                );
                None
            }
        };
        let dns = match m.and_then(|m| m.get("dns")) {
            None | Some(Value::Null) => None,
            Some(v) => {
                let dp = join(p, "dns");
                let d = self.mapping(Some(v), &dp, &["name", "port", "intervalSeconds"]);
                Some(DnsPeers {
                    name: self.string(d, &dp, "name").unwrap_or_default(),
                    port: self
                        .unsigned(d, &dp, "port", PORT_RANGE)
                        .and_then(|n| u16::try_from(n).ok())
                        .unwrap_or(443),
                    interval_seconds: self
                        .unsigned(d, &dp, "intervalSeconds", 1..=86_400)
                        .unwrap_or(10),
                })
            }
        };
        let endpoint_slices = match m.and_then(|m| m.get("endpointSlices")) {
            None | Some(Value::Null) => None,
            Some(v) => {
                let ep = join(p, "endpointSlices");
                let e = self.mapping(
                    Some(v),
                    &ep,
                    &["kubeconfig", "namespace", "service", "portName"],
                );
                Some(EndpointSlicePeers {
                    kubeconfig: self.string(e, &ep, "kubeconfig"),
                    namespace: self
                        .string(e, &ep, "namespace")
                        .unwrap_or_else(|| "default".to_owned()),
                    service: self
                        .string(e, &ep, "service")
                        .unwrap_or_else(|| "kubernetes".to_owned()),
                    port_name: self.string(e, &ep, "portName"),
                })
            }
        };
        let file = self.string(m, p, "file");
        PeerSources {
            static_peers,
            dns,
            endpoint_slices,
            file,
        }
    }

    fn custom_resources(&mut self, v: Option<&Value>) -> BTreeMap<String, CustomResourceEntry> {
        let p = "experimental.proxy.customResources";
        let m = match v {
            None | Some(Value::Null) => return BTreeMap::new(),
            Some(Value::Object(m)) => m,
            Some(other) => {
                self.err(p, format!("expected a mapping, found {}", type_name(other)));
                return BTreeMap::new();
            }
        };
        let mut out = BTreeMap::new();
        for (key, entry) in m {
            let ep = entry_path(key);
            let e = self.mapping(
                Some(entry),
                &ep,
                &["enabled", "targetVirtualCluster", "accessResources"],
            );
            let enabled = self.boolean(e, &ep, "enabled").unwrap_or(false);
            let tp = join(&ep, "targetVirtualCluster");
            let t = self.mapping(
                e.and_then(|e| e.get("targetVirtualCluster")),
                &tp,
                &["name", "project"],
            );
            let target_name = self.string(t, &tp, "name").unwrap_or_default();
            let target_project = self.string(t, &tp, "project").filter(|s| !s.is_empty());
            let access = match self.string(e, &ep, "accessResources").as_deref() {
                None | Some("owned") => AccessMode::Owned,
                Some("all") => AccessMode::All,
                Some(other) => {
                    self.err(
                        join(&ep, "accessResources"),
                        format!("unknown value {other:?}; expected owned or all"),
                    );
                    AccessMode::Owned
                }
            };
            out.insert(
                key.clone(),
                CustomResourceEntry {
                    enabled,
                    target_name,
                    target_project,
                    access,
                },
            );
        }
        out
    }
}

// ---------------------------------------------------------------------------------
// Validation.

/// A parsed `customResources` key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryKey {
    /// `None` for `*`.
    pub resource: Option<String>,
    pub group: String,
    pub version: String,
}

/// What a DNS-1123 label is, as every message about one says it.
pub const DNS_LABEL_SHAPE: &str =
    "use at most 63 lower-case letters, digits and '-', starting and ending with a letter or digit";

/// `<value> is not a valid name: <the DNS label shape>`, the start of every
/// message about a name that must be a DNS label.
fn not_a_dns_label(value: &str) -> String {
    format!("{value:?} is not a valid name: {DNS_LABEL_SHAPE}")
}

const KEY_FORMAT: &str = "the key must look like <resource>.<group>/<version> or *.<group>/<version>, for example widgets.example.com/v1";

/// A DNS-1123 label (kube's `IsDNS1123Label`): at most 63 lower-case letters,
/// digits and `-`, a letter or digit at either end. Namespace names are these.
pub fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b.first().is_some_and(u8::is_ascii_alphanumeric)
        && b.last().is_some_and(u8::is_ascii_alphanumeric)
}

fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// The API groups kube-apiserver 1.32 serves itself (the core group has no
/// name and cannot be written in a key). Registering one would take the
/// client's own API away; groups under `k8s.io` that CRDs serve (the Gateway
/// API's `gateway.networking.k8s.io`, say) stay allowed.
const BUILT_IN_GROUPS: &[&str] = &[
    "admissionregistration.k8s.io",
    "apiextensions.k8s.io",
    "apiregistration.k8s.io",
    "apps",
    "authentication.k8s.io",
    "authorization.k8s.io",
    "autoscaling",
    "batch",
    "certificates.k8s.io",
    "coordination.k8s.io",
    "discovery.k8s.io",
    "events.k8s.io",
    "extensions",
    "flowcontrol.apiserver.k8s.io",
    "internal.apiserver.k8s.io",
    "networking.k8s.io",
    "node.k8s.io",
    "policy",
    "rbac.authorization.k8s.io",
    "resource.k8s.io",
    "scheduling.k8s.io",
    "storage.k8s.io",
    "storagemigration.k8s.io",
];

/// Splits and checks a `customResources` key.
pub fn parse_entry_key(key: &str) -> Result<EntryKey, String> {
    let Some((left, version)) = key.split_once('/') else {
        return Err(format!("a version is required; {KEY_FORMAT}"));
    };
    if version.is_empty() {
        return Err(format!("a version is required; {KEY_FORMAT}"));
    }
    if version.contains('/') {
        return Err(format!("too many '/'; {KEY_FORMAT}"));
    }
    let Some((resource, group)) = left.split_once('.') else {
        return Err(format!("a group is required; {KEY_FORMAT}"));
    };
    if group.is_empty() {
        return Err(format!("a group is required; {KEY_FORMAT}"));
    }
    if resource.is_empty() {
        return Err(format!("a resource or * is required; {KEY_FORMAT}"));
    }
    if !is_dns_subdomain(group) {
        return Err(format!(
            "group {group:?} is not a valid API group (lower-case DNS subdomain)"
        ));
    }
    if BUILT_IN_GROUPS.contains(&group) {
        return Err(format!(
            "group {group:?} is served by the Kubernetes API server itself; crproxy proxies custom resource groups only"
        ));
    }
    if !is_dns_label(version) {
        return Err(format!(
            "version {version:?} is not a valid API version (lower-case DNS label such as v1 or v1beta1)"
        ));
    }
    let resource = if resource == "*" {
        None
    } else if is_dns_label(resource) {
        Some(resource.to_owned())
    } else {
        return Err(format!(
            "resource {resource:?} is not a valid plural resource name (lower-case DNS label) or *"
        ));
    };
    Ok(EntryKey {
        resource,
        group: group.to_owned(),
        version: version.to_owned(),
    })
}

impl Config {
    /// Checks every rule and computes the proxy plan. All problems are reported.
    pub fn validate(&self) -> Result<ProxyPlan, Vec<ConfigError>> {
        let mut errs: Vec<ConfigError> = Vec::new();
        let mut err = |k: String, m: String| errs.push(ConfigError::new(k, m));

        // Client.
        for (key, value, what) in [
            (
                "client.name",
                &self.client.name,
                "the client virtual cluster's name",
            ),
            (
                "client.project",
                &self.client.project,
                "the client's Platform project name",
            ),
        ] {
            if value.is_empty() {
                err(key.into(), format!("is required: set it to {what}"));
            } else if !is_dns_label(value) {
                // Both end up in ownership label values and in the target identity,
                // and virtual cluster and project names are DNS labels anyway (a
                // DNS label is always a valid label value, so this one rule says it
                // all).
                err(key.into(), not_a_dns_label(value));
            }
        }
        // It names the Kubernetes namespace of the Platform project, in the
        // identity the target credentials carry.
        let problem = match &self.client.configured_project_namespace {
            Some(written) if written.is_empty() => Some("must not be empty".to_string()),
            Some(written) if !is_dns_label(written) => Some(format!(
                "{} (it is the Kubernetes namespace of the client's Platform project)",
                not_a_dns_label(written)
            )),
            Some(_) => None,
            // The default from an invalid client.project is reported there.
            None if !is_dns_label(&self.client.project) => None,
            None => {
                let defaulted = self.client.project_namespace();
                (!is_dns_label(&defaulted)).then(|| {
                    format!(
                        "{}; it defaults to p-<client.project>, which is too long here: set \
                         client.projectNamespace to the project's namespace",
                        not_a_dns_label(&defaulted)
                    )
                })
            }
        };
        if let Some(message) = problem {
            err("client.projectNamespace".into(), message);
        }

        // Proxy listeners.
        if self.proxy.bind_address.parse::<IpAddr>().is_err() {
            err(
                "proxy.bindAddress".into(),
                format!("{:?} is not an IP address", self.proxy.bind_address),
            );
        }
        if self.proxy.metrics_address.parse::<SocketAddr>().is_err() {
            err(
                "proxy.metricsAddress".into(),
                format!(
                    "{:?} is not an address of the form ip:port",
                    self.proxy.metrics_address
                ),
            );
        }
        if self.proxy.registration.service_type == ServiceType::ExternalName
            && self.proxy.registration.external_name.is_empty()
        {
            err(
                "proxy.registration.externalName".into(),
                "must not be empty when serviceType is ExternalName".into(),
            );
        }

        // Targets.
        let mut seen_targets: BTreeMap<TargetRef, usize> = BTreeMap::new();
        for (i, t) in self.targets.iter().enumerate() {
            let p = format!("targets[{i}]");
            if t.name.is_empty() {
                err(format!("{p}.name"), "is required".into());
            } else if !is_dns_label(&t.name) {
                // The name is part of the placeholder upstream host name.
                err(format!("{p}.name"), not_a_dns_label(&t.name));
            }
            if t.project.is_empty() {
                err(
                    format!("{p}.project"),
                    "is required (it defaults to client.project, which is empty)".into(),
                );
            } else if !is_dns_label(&t.project) {
                err(format!("{p}.project"), not_a_dns_label(&t.project));
            }
            if t.kubeconfig.is_empty() {
                err(
                    format!("{p}.kubeconfig"),
                    "is required: the path of a kubeconfig with the credentials and CA for this target".into(),
                );
            }
            if !t.name.is_empty() {
                if let Some(first) = seen_targets.insert(t.target_ref(), i) {
                    err(
                        format!("{p}.name"),
                        format!(
                            "duplicate target {}: targets[{first}] already uses this name and project",
                            t.target_ref()
                        ),
                    );
                }
            }
            let pp = format!("{p}.peers");
            let configured = t.peers.configured();
            if configured.len() != 1 {
                err(
                    pp.clone(),
                    format!(
                        "exactly one peer source is required (static, dns, endpointSlices or file); found {}",
                        configured.len()
                    ),
                );
            }
            if let Some(list) = &t.peers.static_peers {
                if list.is_empty() {
                    err(
                        format!("{pp}.static"),
                        "must list at least one host:port".into(),
                    );
                }
                for (j, hp) in list.iter().enumerate() {
                    if !peer::is_host_port(hp) {
                        err(
                            format!("{pp}.static[{j}]"),
                            format!("{hp:?} is not a host:port address"),
                        );
                    }
                }
            }
            if let Some(d) = &t.peers.dns {
                if d.name.is_empty() {
                    err(format!("{pp}.dns.name"), "is required".into());
                } else if !peer::is_host(&d.name) {
                    err(
                        format!("{pp}.dns.name"),
                        format!("{:?} is not a host name", d.name),
                    );
                }
            }
            if let Some(e) = &t.peers.endpoint_slices {
                if e.namespace.is_empty() {
                    err(
                        format!("{pp}.endpointSlices.namespace"),
                        "must not be empty".into(),
                    );
                }
                if e.service.is_empty() {
                    err(
                        format!("{pp}.endpointSlices.service"),
                        "must not be empty".into(),
                    );
                }
            }
            if t.peers.file.as_deref() == Some("") {
                err(format!("{pp}.file"), "must not be empty".into());
            }
        }

        // Custom resource entries.
        struct Routed<'a> {
            key: &'a str,
            parsed: EntryKey,
            target: TargetRef,
            access: AccessMode,
        }
        let mut routed: Vec<Routed> = Vec::new();
        for (key, entry) in &self.custom_resources {
            let ep = entry_path(key);
            let parsed = match parse_entry_key(key) {
                Ok(k) => Some(k),
                Err(m) => {
                    err(ep.clone(), m);
                    None
                }
            };
            if entry.target_name.is_empty() {
                err(
                    format!("{ep}.targetVirtualCluster.name"),
                    "is required, also for entries with enabled: false".into(),
                );
            }
            let target = TargetRef {
                name: entry.target_name.clone(),
                project: entry
                    .target_project
                    .clone()
                    .unwrap_or_else(|| self.client.project.clone()),
            };
            if !entry.enabled {
                continue;
            }
            if !entry.target_name.is_empty() && !seen_targets.contains_key(&target) {
                err(
                    format!("{ep}.targetVirtualCluster"),
                    format!(
                        "no entry in targets has name {:?} and project {:?}; add one with its kubeconfig and peers",
                        target.name, target.project
                    ),
                );
            }
            if let Some(parsed) = parsed {
                routed.push(Routed {
                    key,
                    parsed,
                    target,
                    access: entry.access,
                });
            }
        }

        if !self.custom_resources.values().any(|e| e.enabled) && !self.sync.any_enabled() {
            err(
                "experimental.proxy.customResources".into(),
                "no custom resource is enabled, so neither the proxy nor the sync starts: set enabled: true on at least one entry".into(),
            );
        }

        // Group/version agreement among enabled entries.
        let mut by_gv: BTreeMap<(String, String), Vec<&Routed>> = BTreeMap::new();
        for r in &routed {
            by_gv
                .entry((r.parsed.group.clone(), r.parsed.version.clone()))
                .or_default()
                .push(r);
        }
        let mut plans = Vec::new();
        // Every group/version gets a Service of its own in the client, named from
        // the group with its dots as dashes: `a-b.io` and `a.b.io` would share one.
        let mut services: BTreeMap<String, String> = BTreeMap::new();
        for ((group, version), entries) in &by_gv {
            let Some(first) = entries.first() else {
                continue;
            };
            let service = crate::names::service_name(group, version);
            if let Some(taken) = services.insert(service.clone(), format!("{group}/{version}")) {
                err(
                    entry_path(first.key),
                    format!(
                        "group/version {group}/{version} would be served through the Service {service}, which {taken} already uses; rename one of the groups"
                    ),
                );
                continue;
            }
            let mut consistent = true;
            for other in entries.iter().skip(1) {
                let ep = entry_path(other.key);
                if other.target != first.target {
                    consistent = false;
                    err(
                        format!("{ep}.targetVirtualCluster"),
                        format!(
                            "targets {} but {:?} targets {} for the same group/version {group}/{version}; all entries of one group/version must use the same target",
                            other.target, first.key, first.target
                        ),
                    );
                }
                if other.access != first.access {
                    consistent = false;
                    err(
                        format!("{ep}.accessResources"),
                        format!(
                            "is {} but {:?} uses {} for the same group/version {group}/{version}; all entries of one group/version must use the same access mode",
                            other.access.as_str(),
                            first.key,
                            first.access.as_str()
                        ),
                    );
                }
            }
            if !consistent {
                continue;
            }
            // A wildcard next to explicit keys of the same target and mode is what
            // the spec allows: it already covers them, so they add nothing.
            let wildcard = entries.iter().find(|e| e.parsed.resource.is_none());
            let resources = if wildcard.is_some() {
                ResourceSet::Wildcard
            } else {
                let set: BTreeSet<String> = entries
                    .iter()
                    .filter_map(|e| e.parsed.resource.clone())
                    .collect();
                ResourceSet::Explicit(set.into_iter().collect())
            };
            plans.push(GroupVersionPlan {
                group: group.clone(),
                version: version.clone(),
                resources,
                target: first.target.clone(),
                access: first.access,
                port: 0,
            });
        }

        // Ports: alphabetical by "group/version", consecutive from basePort.
        plans.sort_by(|a, b| {
            format!("{}/{}", a.group, a.version).cmp(&format!("{}/{}", b.group, b.version))
        });
        let count = by_gv.len();
        let base = u32::from(self.proxy.base_port);
        let last = base + u32::try_from(count).unwrap_or(u32::MAX).saturating_sub(1);
        if count > 0 && last > u32::from(u16::MAX) {
            err(
                "proxy.basePort".into(),
                format!(
                    "{base} leaves no room for {count} group/versions: the last port would be {last}, above 65535"
                ),
            );
        }

        errs.extend(sync::validate(self).err().unwrap_or_default());
        if !errs.is_empty() {
            return Err(errs);
        }
        for (i, plan) in plans.iter_mut().enumerate() {
            let port = base + u32::try_from(i).unwrap_or(u32::MAX);
            plan.port = u16::try_from(port).unwrap_or(u16::MAX);
        }
        Ok(ProxyPlan {
            group_versions: plans,
        })
    }
}
