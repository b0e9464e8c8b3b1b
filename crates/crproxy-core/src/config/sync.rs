//! The `sync` section: custom resource sync between a host cluster and the tenant
//! (the file's `client` cluster).
//!
//! `sync.toHost.customResources` and `sync.fromHost.customResources` are vcluster.yaml's
//! keys; `sync.host` (how to reach the host, and the tenant's namespace there) and
//! `sync.writeThrough` (where the write-through webhook of aggregated types listens
//! and how the tenant's API server reaches it) are crproxy's own. Reading collects type and unknown-key problems like the rest of the file;
//! [`validate`] checks the cross-entry rules and produces the [`SyncPlan`] the sync
//! crate starts from. Pure: no I/O.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};

use serde_json::Value;

use super::{
    is_dns_label, is_dns_subdomain, join, type_name, Config, ConfigError, Reader, PORT_RANGE,
};

#[cfg(test)]
mod tests;

/// The `sync` section as written.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SyncConfig {
    /// `sync.host.kubeconfig`: credentials and CA for the host cluster.
    pub host_kubeconfig: Option<String>,
    /// `sync.host.namespace`: where to-host mirrors live on the host.
    pub host_namespace: Option<String>,
    /// `sync.toHost.customResources`, keyed `<plural>.<group>[/<version>]`.
    pub to_host: BTreeMap<String, SyncEntry>,
    /// `sync.fromHost.customResources`, keyed `<plural>.<group>[/<version>]`.
    pub from_host: BTreeMap<String, SyncEntry>,
    /// `sync.writeThrough`.
    pub write_through: WriteThroughConfig,
}

/// `sync.writeThrough` as written.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct WriteThroughConfig {
    /// `listenAddress`: `<ip>:<port>` the webhook listens on.
    pub listen_address: Option<String>,
    /// `service`: the tenant reaches the webhook through this Service.
    pub service: Option<ServiceRefConfig>,
    /// `url`: the tenant reaches the webhook at this `https://` URL.
    pub url: Option<String>,
}

/// `sync.writeThrough.service` as written.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ServiceRefConfig {
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub port: Option<u64>,
}

/// Where the write-through webhook listens when `listenAddress` is not set: loopback,
/// a free port (a tenant API server on the same machine, as in `crproxy dev`).
pub const DEFAULT_WEBHOOK_LISTEN: &str = "127.0.0.1:0";

/// The write-through webhook's network settings, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteThroughPlan {
    pub listen: SocketAddr,
    pub endpoint: WebhookEndpoint,
}

/// How the tenant's API server reaches the write-through webhook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WebhookEndpoint {
    /// At the listener's own address (`https://<listen address>`): only for a
    /// tenant API server that can reach it, e.g. on the same machine.
    Listener,
    /// Through a Service in the tenant (`clientConfig.service`); the serving
    /// certificate is for `<name>.<namespace>.svc`.
    Service {
        namespace: String,
        name: String,
        port: u16,
    },
    /// At `url` (`https://host[:port][/path]`, no trailing `/`); the serving
    /// certificate is for its host.
    Url { url: String, host: String },
}

impl WebhookEndpoint {
    /// The host name or IP address the tenant's API server verifies the serving
    /// certificate against, beside the loopback names every certificate carries.
    pub fn server_name(&self) -> Option<String> {
        match self {
            WebhookEndpoint::Listener => None,
            WebhookEndpoint::Service {
                namespace, name, ..
            } => Some(format!("{name}.{namespace}.svc")),
            WebhookEndpoint::Url { host, .. } => Some(host.clone()),
        }
    }
}

impl SyncConfig {
    /// Whether any entry is enabled, i.e. whether `crproxy run` starts the sync.
    pub fn any_enabled(&self) -> bool {
        self.to_host
            .values()
            .chain(self.from_host.values())
            .any(|e| e.enabled)
    }
}

/// One `customResources` entry of either direction.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SyncEntry {
    pub enabled: bool,
    /// `scope` as written; `None` takes the direction's default.
    pub scope: Option<Scope>,
    pub patches: Vec<PatchEntry>,
    /// `mappings.byName`, `None` when `mappings` is absent.
    pub by_name: Option<BTreeMap<String, String>>,
}

/// `scope` of a synced type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    Namespaced,
    Cluster,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Namespaced => "Namespaced",
            Scope::Cluster => "Cluster",
        }
    }
}

/// One `patches` item: a field holding the name of another object in the same
/// namespace, rewritten to that object's host name on the way to the host.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PatchEntry {
    /// `path`, e.g. `spec.secretRef.name` or `spec.volumes[*].secretName`.
    pub path: String,
    /// `reference.apiVersion` / `reference.kind`: what the name refers to (for logs
    /// and readers of the file; the rewrite is the same for every kind).
    pub reference: Option<(String, String)>,
}

/// Sync direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Direction {
    ToHost,
    FromHost,
}

impl Direction {
    /// The config key of the direction, also used as a metric and log label.
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::ToHost => "toHost",
            Direction::FromHost => "fromHost",
        }
    }
}

/// Path of a sync entry, e.g. `sync.toHost.customResources["backups.example.org/v1"]`.
pub fn sync_entry_path(direction: Direction, key: &str) -> String {
    format!("sync.{}.customResources[{key:?}]", direction.as_str())
}

// ---------------------------------------------------------------------------------
// The plan.

/// What the sync runs, computed by [`validate`] from the enabled entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncPlan {
    /// The tenant's name (`client.name`), part of every mirror's name and label.
    pub tenant: String,
    /// The tenant's Platform project (`client.project`), recorded on every mirror:
    /// tenants of one name in two projects may share a host namespace.
    pub tenant_project: String,
    /// Empty when only fromHost types are synced.
    pub host_namespace: String,
    /// Sorted by direction, then key.
    pub resources: Vec<SyncResource>,
    pub write_through: WriteThroughPlan,
}

/// One synced type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncResource {
    pub direction: Direction,
    /// The key as written, for logs and metric labels.
    pub key: String,
    pub plural: String,
    pub group: String,
    /// `None`: the version the host stores.
    pub version: Option<String>,
    pub scope: Scope,
    pub patches: Vec<FieldPath>,
    pub mappings: Vec<Mapping>,
}

/// A namespaced from-host mapping (`mappings.byName`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Mapping {
    /// `"host-ns/*": "tenant-ns"`: every object of the host namespace, same names.
    Namespace {
        host_namespace: String,
        tenant_namespace: String,
    },
    /// `"host-ns/name": "tenant-ns/name"`: one object.
    Object {
        host_namespace: String,
        host_name: String,
        tenant_namespace: String,
        tenant_name: String,
    },
}

/// A parsed sync key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncKey {
    pub plural: String,
    pub group: String,
    pub version: Option<String>,
}

const SYNC_KEY_FORMAT: &str =
    "the key must look like <plural>.<group> or <plural>.<group>/<version>, for example backups.example.org/v1";

/// Splits and checks a sync `customResources` key.
pub fn parse_sync_key(key: &str) -> Result<SyncKey, String> {
    let (left, version) = match key.split_once('/') {
        Some((left, version)) => (left, Some(version)),
        None => (key, None),
    };
    if let Some(v) = version {
        if v.contains('/') {
            return Err(format!("too many '/'; {SYNC_KEY_FORMAT}"));
        }
        if !is_dns_label(v) {
            return Err(format!(
                "version {v:?} is not a valid API version (lower-case DNS label such as v1 or v1beta1)"
            ));
        }
    }
    let Some((plural, group)) = left.split_once('.') else {
        return Err(format!(
            "a group is required (core types cannot be synced); {SYNC_KEY_FORMAT}"
        ));
    };
    if !is_dns_label(plural) {
        return Err(format!(
            "{plural:?} is not a valid plural resource name (lower-case DNS label); {SYNC_KEY_FORMAT}"
        ));
    }
    // CRD groups need at least one dot.
    if !group.contains('.') || !is_dns_subdomain(group) {
        return Err(format!(
            "group {group:?} is not a valid custom resource group (a lower-case DNS subdomain with at least one dot)"
        ));
    }
    Ok(SyncKey {
        plural: plural.to_owned(),
        group: group.to_owned(),
        version: version.map(str::to_owned),
    })
}

/// One step of a [`FieldPath`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathStep {
    /// A mapping key.
    Key(String),
    /// `[*]`: every element of a list.
    Each,
    /// `[n]`: one element of a list.
    Index(usize),
}

/// A field reference such as `spec.secretRef.name` or `spec.volumes[*].secretName`
/// (a leading `.` or `$.` is allowed, as in JSONPath).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldPath {
    pub text: String,
    pub steps: Vec<PathStep>,
}

impl FieldPath {
    pub fn parse(text: &str) -> Result<FieldPath, String> {
        let body = text
            .strip_prefix("$.")
            .or_else(|| text.strip_prefix('.'))
            .unwrap_or(text);
        if body.is_empty() {
            return Err("must name a field, for example spec.secretRef.name".into());
        }
        let mut steps = Vec::new();
        for part in body.split('.') {
            let (name, mut rest) = match part.find('[') {
                Some(i) => (&part[..i], &part[i..]),
                None => (part, ""),
            };
            if name.is_empty() && steps.is_empty() {
                return Err(format!("{text:?}: a path starts with a field name"));
            }
            if !name.is_empty() {
                steps.push(PathStep::Key(name.to_owned()));
            } else if rest.is_empty() {
                return Err(format!("{text:?}: empty field name"));
            }
            while !rest.is_empty() {
                let Some(close) = rest.find(']') else {
                    return Err(format!("{text:?}: '[' without ']'"));
                };
                let inner = &rest[1..close];
                if inner == "*" {
                    steps.push(PathStep::Each);
                } else if let Ok(n) = inner.parse::<usize>() {
                    steps.push(PathStep::Index(n));
                } else {
                    return Err(format!(
                        "{text:?}: only [*] and [<number>] are supported inside brackets"
                    ));
                }
                rest = &rest[close + 1..];
                if !rest.is_empty() && !rest.starts_with('[') {
                    return Err(format!("{text:?}: expected '.' or '[' after ']'"));
                }
            }
        }
        Ok(FieldPath {
            text: text.to_owned(),
            steps,
        })
    }
}

// ---------------------------------------------------------------------------------
// Reading (called from `Reader::config`).

impl Reader {
    pub(super) fn sync(&mut self, v: Option<&Value>) -> SyncConfig {
        let m = self.mapping(v, "sync", &["host", "toHost", "fromHost", "writeThrough"]);
        let hp = "sync.host";
        let host = self.mapping(
            m.and_then(|m| m.get("host")),
            hp,
            &["kubeconfig", "namespace"],
        );
        let host_kubeconfig = self.string(host, hp, "kubeconfig");
        let host_namespace = self.string(host, hp, "namespace");
        let write_through = self.write_through(m.and_then(|m| m.get("writeThrough")));
        let mut out = SyncConfig {
            host_kubeconfig,
            host_namespace,
            write_through,
            ..SyncConfig::default()
        };
        for direction in [Direction::ToHost, Direction::FromHost] {
            let dp = join("sync", direction.as_str());
            let d = self.mapping(
                m.and_then(|m| m.get(direction.as_str())),
                &dp,
                &["customResources"],
            );
            let entries = self.sync_entries(d.and_then(|d| d.get("customResources")), direction);
            match direction {
                Direction::ToHost => out.to_host = entries,
                Direction::FromHost => out.from_host = entries,
            }
        }
        out
    }

    fn write_through(&mut self, v: Option<&Value>) -> WriteThroughConfig {
        let p = "sync.writeThrough";
        let m = self.mapping(v, p, &["listenAddress", "service", "url"]);
        let sp = "sync.writeThrough.service";
        let service = self.mapping(
            m.and_then(|m| m.get("service")),
            sp,
            &["namespace", "name", "port"],
        );
        WriteThroughConfig {
            listen_address: self.string(m, p, "listenAddress"),
            service: service.map(|_| ServiceRefConfig {
                namespace: self.string(service, sp, "namespace"),
                name: self.string(service, sp, "name"),
                port: self.unsigned(service, sp, "port", PORT_RANGE),
            }),
            url: self.string(m, p, "url"),
        }
    }

    fn sync_entries(
        &mut self,
        v: Option<&Value>,
        direction: Direction,
    ) -> BTreeMap<String, SyncEntry> {
        let p = format!("sync.{}.customResources", direction.as_str());
        let m = match v {
            None | Some(Value::Null) => return BTreeMap::new(),
            Some(Value::Object(m)) => m,
            Some(other) => {
                self.err(p, format!("expected a mapping, found {}", type_name(other)));
                return BTreeMap::new();
            }
        };
        let allowed: &[&str] = match direction {
            Direction::ToHost => &["enabled", "scope", "patches"],
            Direction::FromHost => &["enabled", "scope", "patches", "mappings"],
        };
        let mut out = BTreeMap::new();
        for (key, entry) in m {
            let ep = sync_entry_path(direction, key);
            let e = self.mapping(Some(entry), &ep, allowed);
            let enabled = self.boolean(e, &ep, "enabled").unwrap_or(false);
            let scope = match self.string(e, &ep, "scope").as_deref() {
                None => None,
                Some("Namespaced") => Some(Scope::Namespaced),
                Some("Cluster") => Some(Scope::Cluster),
                Some(other) => {
                    self.err(
                        join(&ep, "scope"),
                        format!("unknown value {other:?}; expected Namespaced or Cluster"),
                    );
                    None
                }
            };
            let patches = self.patches(e.and_then(|e| e.get("patches")), &join(&ep, "patches"));
            let mp = join(&ep, "mappings");
            let mappings = self.mapping(e.and_then(|e| e.get("mappings")), &mp, &["byName"]);
            let by_name = mappings.map(|mm| self.by_name(mm.get("byName"), &join(&mp, "byName")));
            out.insert(
                key.clone(),
                SyncEntry {
                    enabled,
                    scope,
                    patches,
                    by_name,
                },
            );
        }
        out
    }

    fn patches(&mut self, v: Option<&Value>, p: &str) -> Vec<PatchEntry> {
        let items = match v {
            None | Some(Value::Null) => return Vec::new(),
            Some(Value::Array(a)) => a,
            Some(other) => {
                self.err(p, format!("expected a list, found {}", type_name(other)));
                return Vec::new();
            }
        };
        let mut out = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let ip = format!("{p}[{i}]");
            let m = self.mapping(Some(item), &ip, &["path", "reference"]);
            let path = self.string(m, &ip, "path").unwrap_or_default();
            let rp = join(&ip, "reference");
            let r = self.mapping(
                m.and_then(|m| m.get("reference")),
                &rp,
                &["apiVersion", "kind"],
            );
            let reference = r.map(|_| {
                (
                    self.string(r, &rp, "apiVersion").unwrap_or_default(),
                    self.string(r, &rp, "kind").unwrap_or_default(),
                )
            });
            out.push(PatchEntry { path, reference });
        }
        out
    }

    fn by_name(&mut self, v: Option<&Value>, p: &str) -> BTreeMap<String, String> {
        let m = match v {
            None | Some(Value::Null) => return BTreeMap::new(),
            Some(Value::Object(m)) => m,
            Some(other) => {
                self.err(p, format!("expected a mapping, found {}", type_name(other)));
                return BTreeMap::new();
            }
        };
        let mut out = BTreeMap::new();
        for (k, v) in m {
            match v {
                Value::String(s) => {
                    out.insert(k.clone(), s.clone());
                }
                other => self.err(
                    format!("{p}[{k:?}]"),
                    format!("expected a string, found {}", type_name(other)),
                ),
            }
        }
        out
    }
}

// ---------------------------------------------------------------------------------
// Validation.

/// Checks the sync rules; returns the plan (`None` when no entry is enabled) or every
/// problem found.
pub fn validate(config: &Config) -> Result<Option<SyncPlan>, Vec<ConfigError>> {
    let sync = &config.sync;
    let mut errs = Vec::new();
    let mut err = |k: String, m: String| errs.push(ConfigError::new(k, m));

    let proxied_groups: BTreeSet<String> = config
        .custom_resources
        .iter()
        .filter(|(_, e)| e.enabled)
        .filter_map(|(k, _)| super::parse_entry_key(k).ok())
        .map(|k| k.group)
        .collect();

    let mut resources = Vec::new();
    for direction in [Direction::ToHost, Direction::FromHost] {
        let entries = match direction {
            Direction::ToHost => &sync.to_host,
            Direction::FromHost => &sync.from_host,
        };
        for (key, entry) in entries {
            let ep = sync_entry_path(direction, key);
            let parsed = match parse_sync_key(key) {
                Ok(k) => k,
                Err(m) => {
                    err(ep, m);
                    continue;
                }
            };
            let scope = match (direction, entry.scope) {
                (Direction::ToHost, None | Some(Scope::Namespaced)) => Scope::Namespaced,
                (Direction::ToHost, Some(Scope::Cluster)) => {
                    err(
                        join(&ep, "scope"),
                        "toHost syncs namespaced types only: mirrors live in sync.host.namespace; use Namespaced or sync the type fromHost".into(),
                    );
                    Scope::Cluster
                }
                (Direction::FromHost, None | Some(Scope::Cluster)) => Scope::Cluster,
                (Direction::FromHost, Some(Scope::Namespaced)) => Scope::Namespaced,
            };
            let mut patches = Vec::new();
            for (i, patch) in entry.patches.iter().enumerate() {
                let pp = format!("{ep}.patches[{i}].path");
                if direction == Direction::FromHost {
                    err(
                        format!("{ep}.patches"),
                        "patches are supported for toHost only: fromHost copies keep their names"
                            .into(),
                    );
                    break;
                }
                match FieldPath::parse(&patch.path) {
                    Ok(path) if path.steps.first() == Some(&PathStep::Key("metadata".into())) => {
                        err(pp, "must not point into metadata: names in metadata are translated already".into())
                    }
                    Ok(path) => patches.push(path),
                    Err(m) => err(pp, m),
                }
            }
            let mut mappings = Vec::new();
            match (direction, scope, &entry.by_name) {
                (Direction::FromHost, Scope::Namespaced, None) => err(
                    join(&ep, "mappings"),
                    "is required for a Namespaced fromHost type: add mappings.byName, e.g. \"host-ns/*\": \"tenant-ns\"".into(),
                ),
                (Direction::FromHost, Scope::Namespaced, Some(by_name)) => {
                    if by_name.is_empty() {
                        err(
                            format!("{ep}.mappings.byName"),
                            "must map at least one host namespace or object".into(),
                        );
                    }
                    // A tenant object is the copy of one host object: a second mapping
                    // into the same tenant object (or wildcard into the same tenant
                    // namespace) would never be copied.
                    // A wildcard's target is a namespace (no `/`), an object's is
                    // `ns/name`: the target alone tells them apart.
                    let mut targets: BTreeMap<&str, &str> = BTreeMap::new();
                    for (from, to) in by_name {
                        let mp = format!("{ep}.mappings.byName[{from:?}]");
                        let mapping = match parse_mapping(from, to) {
                            Ok(m) => m,
                            Err(m) => {
                                err(mp, m);
                                continue;
                            }
                        };
                        // The first mapping into a target keeps it: a third one is
                        // told about the first, not about the refused second.
                        let Some(first) = targets.get(to.as_str()) else {
                            targets.insert(to, from);
                            mappings.push(mapping);
                            continue;
                        };
                        let problem = match mapping {
                            Mapping::Namespace { .. } => format!("copies into namespace {to:?} as {first:?} does; objects of the same name in both host namespaces would be one tenant object and only one of them copied: map one of them to another namespace"),
                            Mapping::Object { .. } => format!("copies into {to:?} as {first:?} does; a tenant object can be the copy of one host object only: map one of them to another name"),
                        };
                        err(mp, problem);
                    }
                }
                (Direction::FromHost, Scope::Cluster, Some(_)) => err(
                    join(&ep, "mappings"),
                    "is only for Namespaced types: a Cluster type is copied under its own name; remove mappings or set scope: Namespaced".into(),
                ),
                _ => {}
            }
            if !entry.enabled {
                continue;
            }
            if proxied_groups.contains(&parsed.group) {
                err(
                    ep.clone(),
                    format!(
                        "group {} is also proxied under experimental.proxy.customResources; a group is either proxied or synced, not both",
                        parsed.group
                    ),
                );
            }
            if direction == Direction::FromHost && enabled_to_host(sync, &parsed) {
                // Reported by `warnings`; the type is synced to the host only.
                continue;
            }
            resources.push(SyncResource {
                direction,
                key: key.clone(),
                plural: parsed.plural,
                group: parsed.group,
                version: parsed.version,
                scope,
                patches,
                mappings,
            });
        }
    }

    // Two keys of one direction for the same type (e.g. with and without a version)
    // would start two syncers fighting over the same objects.
    let mut seen: BTreeMap<(Direction, String, String), &str> = BTreeMap::new();
    for r in &resources {
        if let Some(first) = seen.insert((r.direction, r.plural.clone(), r.group.clone()), &r.key) {
            err(
                sync_entry_path(r.direction, &r.key),
                format!("configures the same type as {first:?}; keep one entry"),
            );
        }
    }

    // A reference's host name ends in `-x-<tenant>`: for a tenant name of these
    // shapes it could also be another tenant's object in the shared host
    // namespace. Such a name is a valid virtual cluster name, so only the
    // references are refused, here rather than on every object that has one.
    let with_patches = resources
        .iter()
        .find(|r| r.direction == Direction::ToHost && !r.patches.is_empty());
    let tenant = &config.client.name;
    if let (Some(entry), Some(why)) = (with_patches, tenant_name_ambiguity(tenant)) {
        let entry = sync_entry_path(Direction::ToHost, &entry.key);
        err(
            "client.name".into(),
            format!(
                "{tenant:?} cannot be used with patches ({entry} has some): {why}, so a \
                 reference's host name <name>-x-<namespace>-x-{tenant} could also be another \
                 tenant's object in the shared host namespace; remove the patches, or sync for \
                 a virtual cluster whose name has no \"-x-\" and does not start with \"x-\""
            ),
        );
    }

    let mut host_namespace = String::new();
    if !resources.is_empty() {
        // `crproxy run` loads it with every other kubeconfig, before the sync starts.
        if sync.host_kubeconfig.as_deref().is_none_or(str::is_empty) {
            err(
                "sync.host.kubeconfig".into(),
                "is required when a sync entry is enabled: the path of a kubeconfig for the host cluster".into(),
            );
        }
        let needs_namespace = resources.iter().any(|r| r.direction == Direction::ToHost);
        match sync.host_namespace.as_deref() {
            None | Some("") if needs_namespace => err(
                "sync.host.namespace".into(),
                "is required when a toHost entry is enabled: the tenant's namespace on the host, where toHost mirrors live".into(),
            ),
            None | Some("") => {}
            Some(ns) if !is_dns_label(ns) => err(
                "sync.host.namespace".into(),
                format!("{ns:?} is not a valid namespace name (lower-case DNS label)"),
            ),
            Some(ns) => host_namespace = ns.to_owned(),
        }
    }

    let write_through = validate_write_through(&sync.write_through, &mut errs);

    if !errs.is_empty() {
        return Err(errs);
    }
    let (Some(write_through), false) = (write_through, resources.is_empty()) else {
        return Ok(None);
    };
    Ok(Some(SyncPlan {
        tenant: config.client.name.clone(),
        tenant_project: config.client.project.clone(),
        host_namespace,
        resources,
        write_through,
    }))
}

/// Why `patches` references cannot be translated for a tenant named `tenant`,
/// `None` when they can. Host names are `<name>-x-<namespace>-x-<tenant>`, and
/// tenants may share a host namespace: a tenant name containing `-x-` or
/// starting with `x-` makes a reference's host name also the host name of
/// another tenant's object (tenant `c-x-d`'s `a` in `b` is tenant `d`'s `a` in
/// `b-x-c`; tenant `x-d`'s is tenant `d`'s `a` in `b-x`). One ending in `-x` is
/// harmless: nothing follows the tenant name.
pub fn tenant_name_ambiguity(tenant: &str) -> Option<&'static str> {
    if tenant.contains("-x-") {
        Some("the tenant name contains \"-x-\"")
    } else if tenant.starts_with("x-") {
        Some("the tenant name starts with \"x-\"")
    } else {
        None
    }
}

/// Checks `sync.writeThrough`; `None` when an error was pushed.
fn validate_write_through(
    config: &WriteThroughConfig,
    errs: &mut Vec<ConfigError>,
) -> Option<WriteThroughPlan> {
    let before = errs.len();
    let mut err = |k: &str, m: String| errs.push(ConfigError::new(k, m));
    let listen_text = config
        .listen_address
        .as_deref()
        .unwrap_or(DEFAULT_WEBHOOK_LISTEN);
    let listen = match listen_text.parse::<SocketAddr>() {
        Ok(a) => Some(a),
        Err(_) => {
            err(
                "sync.writeThrough.listenAddress",
                format!("{listen_text:?} is not <ip>:<port>, e.g. 0.0.0.0:9443"),
            );
            None
        }
    };
    let endpoint = match (&config.service, &config.url) {
        (Some(_), Some(_)) => {
            err(
                "sync.writeThrough",
                "set either service or url, not both: they are two ways to reach the same webhook"
                    .into(),
            );
            None
        }
        (None, None) => Some(WebhookEndpoint::Listener),
        (Some(service), None) => service_endpoint(service, &mut err),
        (None, Some(url)) => match parse_webhook_url(url) {
            Ok((url, host)) => Some(WebhookEndpoint::Url { url, host }),
            Err(m) => {
                err("sync.writeThrough.url", m);
                None
            }
        },
    };
    if let (Some(listen), Some(WebhookEndpoint::Service { .. } | WebhookEndpoint::Url { .. })) =
        (listen, &endpoint)
    {
        if listen.port() == 0 {
            err(
                "sync.writeThrough.listenAddress",
                "needs a fixed port when service or url is set: the tenant's API server is sent to that port".into(),
            );
        }
    }
    if errs.len() > before {
        return None;
    }
    Some(WriteThroughPlan {
        listen: listen?,
        endpoint: endpoint?,
    })
}

fn service_endpoint(
    service: &ServiceRefConfig,
    err: &mut impl FnMut(&str, String),
) -> Option<WebhookEndpoint> {
    let p = "sync.writeThrough.service";
    let mut field = |key: &str, value: &Option<String>| match value.as_deref() {
        None | Some("") => {
            err(
                &join(p, key),
                "is required: the selector-less Service in the tenant through which its API server reaches the webhook (crproxy points the Service's EndpointSlice at the leader, so only the leader gets reviews)".into(),
            );
            None
        }
        Some(v) if !is_dns_label(v) => {
            err(
                &join(p, key),
                format!("{v:?} is not a valid {key} (lower-case DNS label)"),
            );
            None
        }
        Some(v) => Some(v.to_owned()),
    };
    let namespace = field("namespace", &service.namespace);
    let name = field("name", &service.name);
    // Kubernetes' default for a webhook's service port.
    // The reader keeps the port within PORT_RANGE.
    let port = u16::try_from(service.port.unwrap_or(443)).ok();
    Some(WebhookEndpoint::Service {
        namespace: namespace?,
        name: name?,
        port: port?,
    })
}

/// Checks a webhook URL as Kubernetes does (`https`, a host, no user info, query or
/// fragment); returns it without a trailing `/` and its host (IPv6 without brackets).
pub fn parse_webhook_url(url: &str) -> Result<(String, String), String> {
    let rest = url.strip_prefix("https://").ok_or_else(|| {
        format!("{url:?} must start with https:// (the webhook is served over TLS)")
    })?;
    if url.contains(['?', '#']) {
        return Err(format!("{url:?} must not have a query or fragment"));
    }
    let authority = rest.split('/').next().unwrap_or_default();
    if authority.contains('@') {
        return Err(format!("{url:?} must not carry user info"));
    }
    let host = if let Some(v6) = authority.strip_prefix('[') {
        let (ip, after) = v6
            .split_once(']')
            .ok_or_else(|| format!("{url:?} has an unclosed [ in its host"))?;
        if ip.parse::<IpAddr>().is_err() {
            return Err(format!("{url:?}: {ip:?} is not an IPv6 address"));
        }
        check_port(url, after)?;
        ip.to_owned()
    } else {
        let (host, port) = match authority.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        };
        if let Some(port) = port {
            check_port(url, &format!(":{port}"))?;
        }
        if host.parse::<IpAddr>().is_err() && !is_dns_subdomain(host) {
            return Err(format!(
                "{url:?}: the host {host:?} is neither an IP address nor a DNS name"
            ));
        }
        host.to_owned()
    };
    Ok((url.trim_end_matches('/').to_owned(), host))
}

fn check_port(url: &str, after_host: &str) -> Result<(), String> {
    match after_host {
        "" => Ok(()),
        p => match p.strip_prefix(':').map(str::parse::<u16>) {
            Some(Ok(port)) if port > 0 => Ok(()),
            _ => Err(format!(
                "{url:?}: the port must be a number from 1 to 65535"
            )),
        },
    }
}

fn enabled_to_host(sync: &SyncConfig, key: &SyncKey) -> bool {
    sync.to_host.iter().any(|(k, e)| {
        e.enabled && parse_sync_key(k).is_ok_and(|t| t.plural == key.plural && t.group == key.group)
    })
}

/// Non-fatal findings for `check-config`: a type enabled in both directions is synced
/// to the host only.
pub fn warnings(sync: &SyncConfig) -> Vec<ConfigError> {
    let mut out = Vec::new();
    for (key, entry) in &sync.from_host {
        let Ok(parsed) = parse_sync_key(key) else {
            continue;
        };
        if entry.enabled && enabled_to_host(sync, &parsed) {
            out.push(ConfigError::new(
                sync_entry_path(Direction::FromHost, key),
                format!(
                    "{}.{} is also synced toHost; a type syncs in one direction only, so fromHost skips it",
                    parsed.plural, parsed.group
                ),
            ));
        }
    }
    out
}

fn parse_mapping(from: &str, to: &str) -> Result<Mapping, String> {
    let format = "use \"host-ns/*\": \"tenant-ns\" or \"host-ns/name\": \"tenant-ns/name\"";
    let Some((host_namespace, host_name)) = from.split_once('/') else {
        return Err(format!("the key needs a host namespace and '/'; {format}"));
    };
    if !is_dns_label(host_namespace) {
        return Err(format!(
            "{host_namespace:?} is not a valid namespace name; {format}"
        ));
    }
    if host_name == "*" {
        if !is_dns_label(to) {
            return Err(format!(
                "a namespace wildcard maps to a tenant namespace, and {to:?} is not a valid namespace name; {format}"
            ));
        }
        return Ok(Mapping::Namespace {
            host_namespace: host_namespace.to_owned(),
            tenant_namespace: to.to_owned(),
        });
    }
    if !is_dns_subdomain(host_name) {
        return Err(format!(
            "{host_name:?} is not a valid object name; {format}"
        ));
    }
    let Some((tenant_namespace, tenant_name)) = to.split_once('/') else {
        return Err(format!(
            "an object maps to \"tenant-ns/name\", found {to:?}; {format}"
        ));
    };
    if !is_dns_label(tenant_namespace) || !is_dns_subdomain(tenant_name) {
        return Err(format!(
            "{to:?} is not a valid \"namespace/name\"; {format}"
        ));
    }
    Ok(Mapping::Object {
        host_namespace: host_namespace.to_owned(),
        host_name: host_name.to_owned(),
        tenant_namespace: tenant_namespace.to_owned(),
        tenant_name: tenant_name.to_owned(),
    })
}
