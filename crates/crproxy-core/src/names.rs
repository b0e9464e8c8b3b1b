//! Names and fixed strings that other systems match on: object names the leader
//! registers in the client cluster, the identity presented to the target, and the
//! placeholder host used before a peer is chosen. They are part of the compatibility
//! surface (runbooks and label queries depend on them), so they are built in one place.

use sha2::{Digest, Sha256};

/// Label carried by every object the wiring protects from deletion.
pub const PROTECTION_LABEL_KEY: &str = "vcluster.loft.sh/protected";
/// Value of [`PROTECTION_LABEL_KEY`] on proxy objects.
pub const PROTECTION_LABEL_VALUE: &str = "resource-proxy";
/// The ValidatingAdmissionPolicy that denies deleting protected objects.
pub const POLICY_NAME: &str = "vcluster-protected-apiservices";
/// Its binding.
pub const POLICY_BINDING_NAME: &str = "vcluster-protected-resource-proxy";
/// The text an operator sees when the policy denies a deletion.
pub const DELETION_DENIED_MESSAGE: &str = "deletion of vCluster-protected resources is denied; remove the corresponding entry from your vCluster configuration";
/// Namespace of the per-group/version Services in the client cluster.
pub const SERVICE_NAMESPACE: &str = "kube-system";

/// Where the registration Lease and the sync Leases live in their cluster.
pub const LEASE_NAMESPACE: &str = "kube-system";

/// Longest name [`shorten_with_hash`] keeps whole: the longest Service name
/// Kubernetes accepts (an RFC 1035 label).
pub const MAX_WHOLE_NAME: usize = 63;
/// Hex digits of the hash suffix used when a name is shortened.
const HASH_HEX_LEN: usize = 10;

/// The Service name for one group/version: `proxy-<group with dashes>-<version>`,
/// lower-case. Names over 63 characters are cut and suffixed with `-` and the first
/// 10 hex digits of the SHA-256 of the full name, so they stay unique and every
/// replica computes the same name.
pub fn service_name(group: &str, version: &str) -> String {
    shorten_with_hash(
        &format!("proxy-{}-{}", group.replace('.', "-"), version).to_ascii_lowercase(),
    )
}

/// `full` when it has at most 63 characters; else its first 52 characters (without a
/// trailing `-` or `.`), `-` and the first 10 hex digits of the SHA-256 of `full`, so
/// shortened names stay unique and every replica computes the same one.
pub fn shorten_with_hash(full: &str) -> String {
    if full.len() <= MAX_WHOLE_NAME {
        return full.to_owned();
    }
    let digest = Sha256::digest(full.as_bytes());
    let hex: String = digest
        .iter()
        .flat_map(|b| [b >> 4, b & 0xf])
        .take(HASH_HEX_LEN)
        .map(|n| char::from_digit(u32::from(n), 16).unwrap_or('0'))
        .collect();
    let keep = MAX_WHOLE_NAME - HASH_HEX_LEN - 1;
    // Cut on a char boundary so odd input cannot cause a panic.
    let mut cut = keep;
    while !full.is_char_boundary(cut) {
        cut -= 1;
    }
    let prefix = full[..cut].trim_end_matches(['-', '.']);
    format!("{prefix}-{hex}")
}

/// The APIService name: `<version>.<group>`.
pub fn apiservice_name(group: &str, version: &str) -> String {
    format!("{version}.{group}")
}

/// The Lease in the client's `kube-system` whose holder registers the proxy:
/// `crproxy-<client-name>`.
pub fn registration_lease_name(client_name: &str) -> String {
    format!("crproxy-{client_name}")
}

const SYNC_LEASE_PREFIX: &str = "crproxy-sync-";

/// The Lease the sync replicas of one tenant elect their leader with, in the tenant's
/// `kube-system`: `crproxy-sync-<tenant>`, shortened with a hash when long. Separate
/// from the registration Lease, so the proxy and the sync can run in different
/// processes.
pub fn sync_lease_name(tenant: &str) -> String {
    shorten_with_hash(&format!("{SYNC_LEASE_PREFIX}{tenant}"))
}

/// Whether a Lease in the client's `kube-system` is the proxy's registration Lease,
/// for a reader that does not know the client's name: named `crproxy-`, and not the
/// sync's (a client named `sync-…` can only be found by its name).
pub fn is_registration_lease_name(name: &str) -> bool {
    name.starts_with("crproxy-") && !name.starts_with(SYNC_LEASE_PREFIX)
}

/// The user name the target's RBAC sees for a client:
/// `loft:vcluster:<client-project-namespace>:<client-name>`.
pub fn target_identity(client_project_namespace: &str, client_name: &str) -> String {
    format!("loft:vcluster:{client_project_namespace}:{client_name}")
}

/// The upstream authority written into requests before a peer is chosen; `.invalid`
/// guarantees it can never resolve to a real host by accident.
pub fn placeholder_host(target_name: &str, target_project: &str) -> String {
    format!("kube.{target_name}.{target_project}.vcluster.invalid:443")
}

/// The `target` metric/log label: `<project>/<name>`.
pub fn target_label(project: &str, name: &str) -> String {
    format!("{project}/{name}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(group: &str, version: &str, expected: &str) {
        let got = service_name(group, version);
        assert_eq!(got, expected, "{group}/{version}");
        assert!(got.len() <= MAX_WHOLE_NAME);
        assert!(!got.starts_with('-') && !got.ends_with('-'));
    }

    #[test]
    fn service_names() {
        check("example.com", "v1", "proxy-example-com-v1");
        check("Example.COM", "V1", "proxy-example-com-v1");
        check(
            "stable.example.io",
            "v1beta1",
            "proxy-stable-example-io-v1beta1",
        );
        // 63 characters exactly: kept as is.
        let g = format!("{}.io", "a".repeat(63 - "proxy--io-v1".len()));
        let full = format!("proxy-{}-v1", g.replace('.', "-"));
        assert_eq!(full.len(), 63);
        check(&g, "v1", &full);
    }

    #[test]
    fn registration_and_sync_leases_are_told_apart_by_name() {
        assert!(is_registration_lease_name(&registration_lease_name("zeta")));
        assert!(is_registration_lease_name(&registration_lease_name(
            "team-a"
        )));
        assert!(!is_registration_lease_name(&sync_lease_name("zeta")));
        let long_tenant = "t".repeat(80);
        assert!(!is_registration_lease_name(&sync_lease_name(&long_tenant)));
        assert!(!is_registration_lease_name("kube-controller-manager"));
    }

    #[test]
    fn long_service_names_are_hashed() {
        let g = "a-very-long-group-name.with.many.segments.example.company.internal";
        let a = service_name(g, "v1alpha1");
        assert_eq!(a.len(), 63);
        assert_eq!(a, service_name(g, "v1alpha1"), "deterministic");
        assert_ne!(a, service_name(g, "v1alpha2"), "unique per version");
        let (prefix, hash) = a.rsplit_once('-').expect("suffix");
        assert_eq!(hash.len(), 10);
        assert!(hash
            .chars()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        assert!(format!("proxy-{}-v1alpha1", g.replace('.', "-")).starts_with(prefix));
        // Known value: first 10 hex digits of sha256 of the full name.
        let full = format!("proxy-{}-v1alpha1", g.replace('.', "-"));
        let digest = Sha256::digest(full.as_bytes());
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hash, &hex[..10]);
    }

    #[test]
    fn hashed_prefix_never_ends_with_dash() {
        // Arrange for the cut to land right after a dash.
        let keep = MAX_WHOLE_NAME - HASH_HEX_LEN - 1;
        let head = "a".repeat(keep - "proxy-".len() - 1);
        let g = format!("{head}.bbbbbbbbbbbbbbbbbbbb");
        let name = service_name(&g, "v1");
        assert!(!name.contains("--"), "{name}");
        assert!(name.len() <= 63);
    }

    #[test]
    fn fixed_formats() {
        assert_eq!(apiservice_name("example.com", "v1"), "v1.example.com");
        assert_eq!(
            target_identity("p-default", "client"),
            "loft:vcluster:p-default:client"
        );
        assert_eq!(
            placeholder_host("target", "default"),
            "kube.target.default.vcluster.invalid:443"
        );
        assert_eq!(target_label("default", "target"), "default/target");
    }
}
