//! Pure object rules shared by the verbs: name validation, system metadata on
//! create, what an update may change, generation, finalizers.

use crate::error::{ApiError, Cause};
use crate::registry::ResourceInfo;
use serde_json::{json, Map, Value};

pub fn now() -> String {
    chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

pub fn new_uid() -> String {
    uuid::Uuid::new_v4().to_string()
}

const SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";

const DNS1035_MSG: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')";

/// Whether `s` matches the RFC 1123 label pattern `[a-z0-9]([-a-z0-9]*[a-z0-9])?`,
/// whatever its length.
fn matches_label(s: &[u8]) -> bool {
    let alnum = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    s.first().is_some_and(alnum)
        && s.last().is_some_and(alnum)
        && s.iter().all(|c| alnum(c) || *c == b'-')
}

/// Whether `s` matches the RFC 1123 subdomain pattern: labels joined by dots.
fn matches_subdomain(s: &[u8]) -> bool {
    s.split(|c| *c == b'.').all(matches_label)
}

/// apimachinery's `IsDNS1035Label` (`pkg/util/validation/validation.go`), which
/// kube's `ValidateServiceName` is: the 63-byte bound and the pattern
/// `[a-z]([-a-z0-9]*[a-z0-9])?` are checked apart and each failure reported on
/// its own, so a well-formed 64-byte name gets the length message alone.
fn dns1035_label_errors(name: &str) -> Vec<String> {
    let mut out = Vec::new();
    if name.len() > 63 {
        out.push("must be no more than 63 characters".to_string());
    }
    if !matches_label(name.as_bytes()) || !name.starts_with(|c: char| c.is_ascii_lowercase()) {
        out.push(DNS1035_MSG.to_string());
    }
    out
}

/// apimachinery's `IsDNS1123Label` (same file), which kube's
/// `ValidateNamespaceName` is: the 63-byte bound and the label pattern checked
/// apart; a name that fails the label pattern but is a well-formed subdomain
/// can only be failing on its dots, and kube says just that instead of quoting
/// the pattern.
fn dns1123_label_errors(name: &str) -> Vec<String> {
    let mut out = Vec::new();
    if name.len() > 63 {
        out.push("must be no more than 63 characters".to_string());
    }
    if !matches_label(name.as_bytes()) {
        if matches_subdomain(name.as_bytes()) {
            out.push("must not contain dots".to_string());
        } else {
            out.push(LABEL_MSG.to_string());
        }
    }
    out
}

/// Messages for an invalid object name of this resource (empty when valid).
pub fn name_errors(info: &ResourceInfo, name: &str) -> Vec<String> {
    if info.group == "rbac.authorization.k8s.io" {
        // RBAC objects accept any path segment name (system:masters-like names).
        if name == "." || name == ".." {
            return vec![format!("may not be '{name}'")];
        }
        if let Some(c) = ['/', '%'].into_iter().find(|c| name.contains(*c)) {
            return vec![format!("may not contain '{c}'")];
        }
        return vec![];
    }
    if info.group.is_empty() && info.resource == "services" {
        return dns1035_label_errors(name);
    }
    // Only the core group's namespaces: a custom resource whose plural happens
    // to be `namespaces` is named as any other custom resource.
    if info.is_namespace() {
        return dns1123_label_errors(name);
    }
    // Custom resources, and the built-ins here whose kube validation names them
    // as DNS subdomains, are checked with apimachinery's `NameIsDNSSubdomain`
    // (apiextensions-apiserver's `customResourceValidator.Validate` in
    // `registry/customresource/validator.go` passes it for every custom
    // resource), which is `IsDNS1123Subdomain`: a 253-byte bound on the whole
    // name and the subdomain pattern, each reported on its own, and no bound on
    // a single dot-separated label. kube checks an APIService's name as a path
    // segment that must read `version.group` instead; devcluster checks it as a
    // subdomain too, so a name kube refuses for not being `version.group` gets
    // the subdomain message here.
    dns1123_subdomain_errors(name.as_bytes())
}

/// apimachinery's `NameIsDNSSubdomain(prefix, true)` for a `generateName`:
/// `IsDNS1123Subdomain` of the prefix with a trailing dash masked. kube's
/// `maskTrailingDash` drops the character before the dash too and puts one `a`
/// in their place (`name[:len(name)-2] + "a"`), on bytes. A lone "-" makes
/// kube's slice start before the string and the handler panic; devcluster
/// checks it as it is.
pub fn generate_name_errors(prefix: &str) -> Vec<String> {
    let bytes = prefix.as_bytes();
    match bytes.len().checked_sub(2) {
        Some(kept) if bytes.ends_with(b"-") => {
            let mut masked = bytes[..kept].to_vec();
            masked.push(b'a');
            dns1123_subdomain_errors(&masked)
        }
        _ => dns1123_subdomain_errors(bytes),
    }
}

/// apimachinery's `IsDNS1123Subdomain`: at most 253 bytes, and matching
/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*` (which
/// bounds no label's length), each reported on its own.
fn dns1123_subdomain_errors(name: &[u8]) -> Vec<String> {
    let mut out = Vec::new();
    if name.len() > 253 {
        out.push("must be no more than 253 characters".to_string());
    }
    if !matches_subdomain(name) {
        out.push(SUBDOMAIN_MSG.to_string());
    }
    out
}

/// The random suffix kube appends to `generateName`.
pub fn generate_name(prefix: &str) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let bytes = uuid::Uuid::new_v4();
    let suffix: String = bytes
        .as_bytes()
        .iter()
        .take(5)
        .map(|b| ALPHABET[(*b as usize) % ALPHABET.len()] as char)
        .collect();
    // kube keeps at most 58 characters of the prefix (63 minus the suffix); cut on
    // a character boundary, the prefix comes from the client.
    let prefix: String = prefix.chars().take(63 - 5).collect();
    format!("{prefix}{suffix}")
}

/// `metadata` of an object as a mutable map (created when missing); `None` only
/// when the object itself is not a JSON object.
pub fn metadata_mut(obj: &mut Value) -> Option<&mut Map<String, Value>> {
    let m = obj.as_object_mut()?;
    let meta = m.entry("metadata").or_insert_with(|| json!({}));
    if !meta.is_object() {
        *meta = json!({});
    }
    meta.as_object_mut()
}

/// Everything outside `metadata` (and `status` when `version` has a status
/// subresource, or for a built-in): a change here bumps `generation`.
pub fn spec_part(info: &ResourceInfo, version: &str, obj: &Value) -> Value {
    let mut v = obj.clone();
    if let Some(m) = v.as_object_mut() {
        m.remove("metadata");
        m.remove("apiVersion");
        m.remove("kind");
        if info.has_status(version) || !info.is_crd() {
            m.remove("status");
        }
    }
    v
}

fn finalizers(obj: &Value) -> Vec<String> {
    obj.get("metadata")
        .and_then(|m| m.get("finalizers"))
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

pub fn has_finalizers(obj: &Value) -> bool {
    !finalizers(obj).is_empty()
}

/// Whether a namespace's own finalizers (`spec.finalizers`, the namespace
/// controller's `kubernetes`) are all gone.
pub fn namespace_finalized(ns: &Value) -> bool {
    ns.pointer("/spec/finalizers")
        .and_then(Value::as_array)
        .is_none_or(Vec::is_empty)
}

/// Whether an object being deleted may leave storage now: no finalizers left,
/// and for a namespace none of its own either (kube's
/// ShouldDeleteNamespaceDuringUpdate).
pub fn may_go(obj: &Value, is_namespace: bool) -> bool {
    is_deleting(obj) && !has_finalizers(obj) && (!is_namespace || namespace_finalized(obj))
}

/// Sets a namespace's `spec.finalizers` to `finalizers` (`spec: {}` when there
/// are none, as kube writes it).
pub fn set_namespace_finalizers(namespace: &mut Value, finalizers: Option<Value>) {
    let spec = match finalizers.filter(|f| f.as_array().is_some_and(|a| !a.is_empty())) {
        Some(finalizers) => json!({"finalizers": finalizers}),
        None => json!({}),
    };
    if let Some(m) = namespace.as_object_mut() {
        m.insert("spec".into(), spec);
    }
}

pub fn is_deleting(obj: &Value) -> bool {
    obj.get("metadata")
        .and_then(|m| m.get("deletionTimestamp"))
        .is_some_and(|v| !v.is_null())
}

/// Copies the fields only the server sets from the stored object into an update,
/// bumps generation when the spec changed (as seen through `version`, the
/// request's), and refuses new finalizers on an object that is being deleted.
pub fn prepare_update(
    info: &ResourceInfo,
    version: &str,
    current: &Value,
    new: &mut Value,
) -> Result<(), ApiError> {
    if !new.is_object() {
        return Err(ApiError::bad_request("the object must be a JSON object"));
    }
    let cur_meta = current
        .get("metadata")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    if let Some(meta) = metadata_mut(new) {
        for key in [
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
            "name",
            "namespace",
        ] {
            match cur_meta.get(key) {
                Some(v) => {
                    meta.insert(key.into(), v.clone());
                }
                None => {
                    meta.remove(key);
                }
            }
        }
        if meta.get("managedFields").is_none() {
            if let Some(mf) = cur_meta.get("managedFields") {
                meta.insert("managedFields".into(), mf.clone());
            }
        }
    }
    if is_deleting(current) {
        let old = finalizers(current);
        let added: Vec<String> = finalizers(new)
            .into_iter()
            .filter(|f| !old.contains(f))
            .collect();
        if !added.is_empty() {
            let list = added
                .iter()
                .map(|f| format!("{f:?}"))
                .collect::<Vec<_>>()
                .join(", ");
            let msg = format!(
                "Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers []string{{{list}}}"
            );
            let cause = Cause::new("FieldValueForbidden", msg, "metadata.finalizers");
            return Err(ApiError::invalid(
                &info.group,
                &info.kind,
                crate::store::meta_str(current, "name"),
                vec![cause.clone(), cause],
            ));
        }
    }
    if info.has_generation || info.is_crd() {
        let cur_gen = cur_meta
            .get("generation")
            .and_then(Value::as_i64)
            .unwrap_or(1);
        let bumped = spec_part(info, version, current) != spec_part(info, version, new);
        if let Some(meta) = metadata_mut(new) {
            meta.insert(
                "generation".into(),
                json!(if bumped { cur_gen + 1 } else { cur_gen }),
            );
        }
    }
    Ok(())
}

/// Whether two versions of an object differ in anything but resourceVersion (an
/// update that changes nothing is not written; managedFields only change when
/// something else did, or when a new manager takes ownership).
pub fn same_object(a: &Value, b: &Value) -> bool {
    strip_volatile(a) == strip_volatile(b)
}

fn strip_volatile(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("resourceVersion");
    }
    v
}

/// Writes a JSON path like `.spec.replicas`, creating objects on the way.
pub fn set_path(obj: &mut Value, path: &str, value: Value) {
    let segs: Vec<&str> = path
        .trim_start_matches('.')
        .split('.')
        .filter(|s| !s.is_empty())
        .collect();
    let mut cur = obj;
    for (i, seg) in segs.iter().enumerate() {
        if !cur.is_object() {
            *cur = json!({});
        }
        let Some(m) = cur.as_object_mut() else { return };
        if i == segs.len() - 1 {
            m.insert(seg.to_string(), value);
            return;
        }
        cur = m.entry(seg.to_string()).or_insert_with(|| json!({}));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::Registry;

    #[test]
    fn names_are_validated_per_resource() {
        let r = Registry::new();
        let cm = r.get("", "configmaps").expect("cm");
        let ns = r.get("", "namespaces").expect("ns");
        let role = r.get("rbac.authorization.k8s.io", "roles").expect("role");
        let check = |info: &ResourceInfo, name: &str, ok: bool| {
            assert_eq!(
                name_errors(info, name).is_empty(),
                ok,
                "{}/{name}",
                info.resource
            )
        };
        check(&cm, "my.config-1", true);
        check(&cm, "Not_A_Valid_Name", false);
        check(&cm, "-x", false);
        check(&ns, "a.b", false);
        check(&ns, "team-a", true);
        check(&role, "system:controller:x", true);
        let svc = r.get("", "services").expect("svc");
        check(&svc, "proxy-example-com-v1", true);
        check(&svc, "1proxy", false);
        check(&svc, &"a".repeat(64), false);
        check(&role, "a/b", false);
        assert_eq!(name_errors(&cm, "Bad")[0], SUBDOMAIN_MSG);
    }

    /// A custom resource as the registry would hold one from a CRD.
    fn crontabs(r: &Registry) -> ResourceInfo {
        let mut info = (*r.get("", "configmaps").expect("cm")).clone();
        info.group = "stable.example.com".into();
        info.resource = "crontabs".into();
        info.kind = "CronTab".into();
        info.source = crate::registry::Source::Crd("crontabs.stable.example.com".into());
        info
    }

    /// `name`'s messages as a name of `info`'s resource are `expected`.
    fn check(info: &ResourceInfo, name: &str, expected: &[&str]) {
        assert_eq!(
            name_errors(info, name),
            expected,
            "{}/{name}",
            info.resource
        )
    }

    #[test]
    fn subdomain_names_bound_the_whole_name_and_no_single_label() {
        let r = Registry::new();
        let cm = r.get("", "configmaps").expect("cm");
        let ct = crontabs(&r);
        // IsDNS1123Subdomain has no 63-byte bound on a label.
        check(&ct, &"a".repeat(100), &[]);
        check(&ct, &format!("{}.{}", "a".repeat(64), "b".repeat(188)), &[]);
        check(&cm, &"a".repeat(253), &[]);
        // Too long but well formed: the length alone, as kube reports it.
        let too_long = "must be no more than 253 characters";
        check(&ct, &"a".repeat(254), &[too_long]);
        check(&cm, &format!("{}.b", "a".repeat(252)), &[too_long]);
        check(
            &ct,
            &format!("{}-", "a".repeat(254)),
            &[too_long, SUBDOMAIN_MSG],
        );
        check(&ct, "a..b", &[SUBDOMAIN_MSG]);
    }

    #[test]
    fn label_names_report_each_failure_as_kube_does() {
        let r = Registry::new();
        let ns = r.get("", "namespaces").expect("ns");
        let svc = r.get("", "services").expect("svc");
        let too_long = "must be no more than 63 characters";
        // Well formed but too long: the length alone.
        check(&ns, &"a".repeat(64), &[too_long]);
        check(&svc, &"a".repeat(64), &[too_long]);
        // Both wrong: both messages, length first.
        check(&ns, &format!("{}-", "a".repeat(63)), &[too_long, LABEL_MSG]);
        check(
            &svc,
            &format!("1{}", "a".repeat(63)),
            &[too_long, DNS1035_MSG],
        );
        // A namespace name that is a subdomain is told about its dots.
        check(&ns, "a.b", &["must not contain dots"]);
        check(
            &ns,
            &format!("{}.b", "a".repeat(63)),
            &[too_long, "must not contain dots"],
        );
        check(&ns, "a..b", &[LABEL_MSG]);
        check(&svc, "a.b", &[DNS1035_MSG]);
        // A custom resource called `namespaces` is named as a subdomain.
        let mut custom = crontabs(&r);
        custom.resource = "namespaces".into();
        check(&custom, "a.b", &[]);
    }

    #[test]
    fn generation_bumps_only_on_spec_changes() {
        let r = Registry::new();
        let deploy = r.get("apps", "deployments").expect("deploy");
        let cur = json!({"metadata": {"name": "d", "generation": 3, "uid": "u"}, "spec": {"replicas": 1}, "status": {"x": 1}});
        let mut labels_only = json!({"metadata": {"name": "d", "labels": {"a": "b"}}, "spec": {"replicas": 1}, "status": {"x": 2}});
        prepare_update(&deploy, "v1", &cur, &mut labels_only).expect("ok");
        assert_eq!(labels_only["metadata"]["generation"], 3);
        assert_eq!(labels_only["metadata"]["uid"], "u");
        let mut spec = json!({"metadata": {"name": "d"}, "spec": {"replicas": 2}});
        prepare_update(&deploy, "v1", &cur, &mut spec).expect("ok");
        assert_eq!(spec["metadata"]["generation"], 4);
    }

    #[test]
    fn new_finalizers_are_refused_while_deleting() {
        let r = Registry::new();
        let cm = r.get("", "configmaps").expect("cm");
        let cur = json!({"metadata": {"name": "c", "deletionTimestamp": "t", "finalizers": ["a"]}});
        let mut new = json!({"metadata": {"name": "c", "finalizers": ["a", "b"]}});
        let err = prepare_update(&cm, "v1", &cur, &mut new).expect_err("refused");
        assert_eq!(err.code, 422);
        assert!(
            err.message
                .ends_with("found new finalizers []string{\"b\"}"),
            "{}",
            err.message
        );
        let mut fewer = json!({"metadata": {"name": "c", "finalizers": []}});
        prepare_update(&cm, "v1", &cur, &mut fewer).expect("removing is fine");
    }

    #[test]
    fn generated_names_keep_a_bounded_prefix() {
        let name = generate_name("web-");
        assert!(name.starts_with("web-") && name.len() == 9, "{name}");
        let long = generate_name(&"é".repeat(100));
        assert_eq!(long.chars().count(), 63);
    }

    #[test]
    fn paths_are_written() {
        let mut v = json!({"spec": {}});
        set_path(&mut v, ".spec.replicas", json!(3));
        set_path(&mut v, ".status.replicas", json!(1));
        assert_eq!(
            v,
            json!({"spec": {"replicas": 3}, "status": {"replicas": 1}})
        );
    }
}
