//! TEMPORARY private copy of `crproxy_core::names` (being written on the core branch,
//! not yet merged to main). Same names, same algorithm, so switching is a one-line
//! `use` change in lib.rs; delete this file then.

use sha2::{Digest, Sha256};

pub const PROTECTION_LABEL_KEY: &str = "vcluster.loft.sh/protected";
pub const PROTECTION_LABEL_VALUE: &str = "resource-proxy";
pub const POLICY_NAME: &str = "vcluster-protected-apiservices";
pub const POLICY_BINDING_NAME: &str = "vcluster-protected-resource-proxy";
pub const DELETION_DENIED_MESSAGE: &str = "deletion of vCluster-protected resources is denied; remove the corresponding entry from your vCluster configuration";

const MAX_SERVICE_NAME: usize = 63;
const HASH_HEX_LEN: usize = 10;

/// `proxy-<group with dashes>-<version>`, cut and hash-suffixed past 63 characters.
pub fn service_name(group: &str, version: &str) -> String {
    let full = format!("proxy-{}-{}", group.replace('.', "-"), version).to_ascii_lowercase();
    if full.len() <= MAX_SERVICE_NAME {
        return full;
    }
    let digest = Sha256::digest(full.as_bytes());
    let hex: String = digest
        .iter()
        .flat_map(|b| [b >> 4, b & 0xf])
        .take(HASH_HEX_LEN)
        .map(|n| char::from_digit(u32::from(n), 16).unwrap_or('0'))
        .collect();
    let mut cut = MAX_SERVICE_NAME - HASH_HEX_LEN - 1;
    while !full.is_char_boundary(cut) {
        cut -= 1;
    }
    let prefix = full[..cut].trim_end_matches(['-', '.']);
    format!("{prefix}-{hex}")
}

/// `<version>.<group>`.
pub fn apiservice_name(group: &str, version: &str) -> String {
    format!("{version}.{group}")
}
