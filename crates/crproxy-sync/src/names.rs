//! Names, labels and annotations of synced objects: the to-host name translation,
//! the identity annotations that say which tenant object a host mirror belongs to,
//! and crproxy's own bookkeeping annotations on tenant objects.

use std::collections::BTreeMap;

use serde_json::Value;

use crproxy_core::config::sync::tenant_name_ambiguity;
use crproxy_core::names::shorten_with_hash;

/// Tenant object name, on the host mirror.
pub const OBJECT_NAME: &str = "vcluster.loft.sh/object-name";
/// Tenant object namespace, on the host mirror.
pub const OBJECT_NAMESPACE: &str = "vcluster.loft.sh/object-namespace";
/// Tenant object uid, on the host mirror: with name and namespace, the identity that
/// decides whether a host object belongs to a tenant object.
pub const OBJECT_UID: &str = "vcluster.loft.sh/object-uid";
/// Group, version and kind of the tenant object, on the host mirror.
pub const OBJECT_KIND: &str = "vcluster.loft.sh/object-kind";
/// The host object's name (on host mirrors and on fromHost copies).
pub const OBJECT_HOST_NAME: &str = "vcluster.loft.sh/object-host-name";
/// The host object's namespace (on host mirrors and on fromHost copies).
pub const OBJECT_HOST_NAMESPACE: &str = "vcluster.loft.sh/object-host-namespace";
/// The tenant that owns a host mirror.
pub const MANAGED_BY: &str = "vcluster.loft.sh/managed-by";
/// On a host mirror: the Platform project of the tenant that owns it. Tenants
/// are named per project, so two of one name may share a host namespace; with
/// [`MANAGED_BY`] this says whose mirror it is. A mirror written before crproxy
/// recorded it has none: its tenant of any project may replace it (and so record
/// the project), but none deletes it ([`records_project`]).
pub const TENANT_PROJECT: &str = "crproxy.dev/tenant-project";
/// The tenant namespace of a host mirror's tenant object.
pub const NAMESPACE_LABEL: &str = "vcluster.loft.sh/namespace";

/// On a host mirror and a fromHost copy: the label keys crproxy wrote there (copied
/// from the other side, and its own), sorted and newline-separated, as vcluster
/// records them. A replace removes a recorded key the source no longer has and keeps
/// every key that is not recorded: someone else's ([`crate::managed`]).
pub const MANAGED_LABELS: &str = "vcluster.loft.sh/managed-labels";
/// On a host mirror: the annotation keys crproxy wrote there, as [`MANAGED_LABELS`].
pub const MANAGED_ANNOTATIONS: &str = "vcluster.loft.sh/managed-annotations";

/// On a tenant object synced to the host: `<tenant object uid>/<mirror uid>`, written
/// once its mirror exists (see [`mirror_record`]). A tenant object that carries its
/// own record but whose mirror is gone had the mirror deleted on the host, which
/// deletes the tenant object too; one without it was never mirrored.
pub const MIRROR_UID: &str = "crproxy.dev/host-mirror";
/// On a fromHost copy in the tenant: the host fields as last synced, in JSON, the
/// base of the three-way merge that keeps tenant edits until the host changes them.
pub const LAST_HOST_STATE: &str = "crproxy.dev/last-synced-host-state";

/// Annotations never copied between clusters: bookkeeping of one side only. The
/// stand-in marker is crproxy's word that it read an object without its content;
/// set by a tenant and copied, it would make the mirror look like a stand-in to
/// every later step (`too_deep` for good, and write-through's 500).
pub const NOT_COPIED: [&str; 4] = [
    MIRROR_UID,
    LAST_HOST_STATE,
    "kubectl.kubernetes.io/last-applied-configuration",
    crproxy_core::deep_objects::TOO_DEEP_ANNOTATION,
];

/// The [`MIRROR_UID`] value for a tenant object and its mirror.
pub fn mirror_record(tenant_uid: &str, mirror_uid: &str) -> String {
    format!("{tenant_uid}/{mirror_uid}")
}

/// Longest label value Kubernetes accepts.
const MAX_LABEL_VALUE: usize = 63;

/// The host name of a tenant object: `<name>-x-<namespace>-x-<tenant>`, shortened to
/// 63 characters with a stable hash suffix when longer.
pub fn host_name(name: &str, namespace: &str, tenant: &str) -> String {
    shorten_with_hash(&format!("{name}-x-{namespace}-x-{tenant}"))
}

/// Why a reference to `name` in `namespace` of `tenant` has no host name of its
/// own, `None` when it has.
///
/// `<name>-x-<namespace>-x-<tenant>` reads back only when it can be split one
/// way, and tenants may share a host namespace, so the tenant part counts too:
/// a name containing `-x-` or ending in `-x`, a namespace containing `-x-`,
/// starting with `x-` or ending in `-x`, or a tenant name containing `-x-` or
/// starting with `x-` ([`tenant_name_ambiguity`], which the configuration
/// refuses with patches) makes it also the translation of another object (`a`
/// in `b-x-c` and `a-x-b` in `c` are both `a-x-b-x-c-x-<tenant>`; `a` in `b-x`
/// of tenant `d` is `a` in `b` of tenant `x-d`). Without those, every `-x-` of
/// the joined text is a separator, so the triple is the only one with that host
/// name whatever the other object's names are. Names that Kubernetes accepts
/// never start or end with `-`, so no `-x-` can span a separator otherwise;
/// nothing precedes the name or follows the tenant, so a name starting with
/// `x-` or a tenant ending in `-x` is harmless.
pub fn ambiguity(name: &str, namespace: &str, tenant: &str) -> Option<&'static str> {
    if name.contains("-x-") {
        Some("the name contains \"-x-\"")
    } else if name.ends_with("-x") {
        Some("the name ends in \"-x\"")
    } else if namespace.contains("-x-") {
        Some("the namespace contains \"-x-\"")
    } else if namespace.starts_with("x-") {
        Some("the namespace starts with \"x-\"")
    } else if namespace.ends_with("-x") {
        Some("the namespace ends in \"-x\"")
    } else {
        tenant_name_ambiguity(tenant)
    }
}

/// Why [`reference_host_name`] refuses: its host name would be cut to 52
/// characters and a 40-bit hash, which a tenant can make meet another object's
/// with about 2^40 hashes (minutes on a GPU).
pub const SHORTENED: &str = "the host name would be shortened";

/// The host name of the object a `patches` field names: [`host_name`], unless
/// the translation is [`ambiguity`]'s or would be shortened ([`SHORTENED`]),
/// when the host object could be another tenant's or another tenant
/// namespace's (which the host controller would then read with its own rights).
/// An empty reference names no object (an unset `secretRef.name`, say) and
/// stays empty, so the host controller reads it as the tenant meant it.
pub fn reference_host_name(
    name: &str,
    namespace: &str,
    tenant: &str,
) -> Result<String, &'static str> {
    if name.is_empty() {
        return Ok(String::new());
    }
    if let Some(why) = ambiguity(name, namespace, tenant) {
        return Err(why);
    }
    // What `host_name` gives when it keeps the text whole.
    let host = format!("{name}-x-{namespace}-x-{tenant}");
    if host.len() > crproxy_core::names::MAX_WHOLE_NAME {
        return Err(SHORTENED);
    }
    Ok(host)
}

/// The tenant name behind `host`, when `host` is an unshortened translation of an
/// object in `namespace`.
pub fn tenant_name_of<'a>(host: &'a str, namespace: &str, tenant: &str) -> Option<&'a str> {
    host.strip_suffix(&format!("-x-{namespace}-x-{tenant}"))
        .filter(|name| !name.is_empty())
}

/// The name a reference to `host` names in `namespace` (used to translate
/// references back): [`tenant_name_of`], when [`reference_host_name`] would
/// translate that name to `host`. So the way back never gives a name the way
/// there refuses, e.g. tenant `c-x-d`'s `a` in `b` for tenant `d`'s host
/// object `a-x-b-x-c-x-d`.
pub fn reference_name_of<'a>(host: &'a str, namespace: &str, tenant: &str) -> Option<&'a str> {
    tenant_name_of(host, namespace, tenant)
        .filter(|name| reference_host_name(name, namespace, tenant).is_ok())
}

/// A label value: as is when it fits, else shortened with a hash suffix.
pub fn label_value(value: &str) -> String {
    if value.len() <= MAX_LABEL_VALUE {
        value.to_owned()
    } else {
        shorten_with_hash(value)
    }
}

/// The value of the `object-kind` annotation, `<group>/<version>, Kind=<kind>`.
pub fn kind_annotation(api_version: &str, kind: &str) -> String {
    format!("{api_version}, Kind={kind}")
}

/// The identity annotations and labels every host mirror carries.
pub struct MirrorIdentity<'a> {
    pub tenant: &'a str,
    pub project: &'a str,
    pub name: &'a str,
    pub namespace: &'a str,
    pub uid: &'a str,
    pub api_version: &'a str,
    pub kind: &'a str,
    pub host_name: &'a str,
    pub host_namespace: &'a str,
}

/// Whether the host object `mirror` is the mirror that `desired` (a mirror as
/// write-through builds it, carrying [`MirrorIdentity`]'s keys) replaces: written
/// for the same tenant, of the same tenant object, this incarnation of it. Any
/// other object under the name (another tenant's, one crproxy did not write, an
/// older incarnation's mirror) is never replaced.
pub fn same_mirror(mirror: &Value, desired: &Value) -> bool {
    let wanted = identity(desired);
    wanted.iter().all(|key| key.is_string())
        && identity(mirror) == wanted
        && projects_agree(project(mirror), project(desired))
}

/// Whether the host object `mirror` was written for `tenant` of `project`, of its
/// object `namespace/name`, in any incarnation (the uid is not compared).
pub fn mirrors(mirror: &Value, tenant: &str, project: &str, namespace: &str, name: &str) -> bool {
    let [managed_by, object_name, object_namespace, _uid] = identity(mirror);
    *managed_by == label_value(tenant)
        && object_name == name
        && object_namespace == namespace
        && of_project(mirror, project)
}

/// Whether the host object `mirror` belongs to a tenant of `project` by its
/// [`TENANT_PROJECT`] (see [`recorded_project_admits`]).
pub fn of_project(mirror: &Value, project: &str) -> bool {
    match self::project(mirror) {
        Value::Null => recorded_project_admits(None, project),
        Value::String(recorded) => recorded_project_admits(Some(recorded), project),
        // Not an annotation kube would store: never this project's.
        _ => false,
    }
}

/// Whether a host object recording `recorded` in its [`TENANT_PROJECT`] (`None`:
/// no such annotation) may belong to a tenant of `project`: another project's
/// tenant of the same name may share the host namespace, and a mirror without
/// the annotation predates it.
pub fn recorded_project_admits(recorded: Option<&str>, project: &str) -> bool {
    recorded.is_none_or(|recorded| recorded == project)
}

/// Whether the host object `mirror` records `project` as its tenant's: what a
/// mirror must show before its tenant's syncer deletes it. One that records
/// none, written before the record, may be a namesake's in another project.
pub fn records_project(mirror: &Value, project: &str) -> bool {
    *self::project(mirror) == project
}

/// The [`TENANT_PROJECT`] an object records (`Null` when none).
fn project(object: &Value) -> &Value {
    &object["metadata"]["annotations"][TENANT_PROJECT]
}

/// Whether two recorded projects name the same one, an object recording none
/// (written before the project was) agreeing with any.
fn projects_agree(a: &Value, b: &Value) -> bool {
    a.is_null() || b.is_null() || a == b
}

/// What says which tenant object a host object mirrors: the [`MANAGED_BY`] label
/// and the [`OBJECT_NAME`], [`OBJECT_NAMESPACE`] and [`OBJECT_UID`] annotations.
fn identity(object: &Value) -> [&Value; 4] {
    let metadata = &object["metadata"];
    [
        &metadata["labels"][MANAGED_BY],
        &metadata["annotations"][OBJECT_NAME],
        &metadata["annotations"][OBJECT_NAMESPACE],
        &metadata["annotations"][OBJECT_UID],
    ]
}

impl MirrorIdentity<'_> {
    pub fn annotations(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (OBJECT_NAME.to_owned(), self.name.to_owned()),
            (OBJECT_NAMESPACE.to_owned(), self.namespace.to_owned()),
            (OBJECT_UID.to_owned(), self.uid.to_owned()),
            (TENANT_PROJECT.to_owned(), self.project.to_owned()),
            (
                OBJECT_KIND.to_owned(),
                kind_annotation(self.api_version, self.kind),
            ),
            (OBJECT_HOST_NAME.to_owned(), self.host_name.to_owned()),
            (
                OBJECT_HOST_NAMESPACE.to_owned(),
                self.host_namespace.to_owned(),
            ),
        ])
    }

    pub fn labels(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (MANAGED_BY.to_owned(), label_value(self.tenant)),
            (NAMESPACE_LABEL.to_owned(), label_value(self.namespace)),
        ])
    }
}

#[cfg(test)]
mod tests;
