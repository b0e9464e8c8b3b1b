//! The outcome-reason vocabulary shared by every `vcluster_proxy_*` series that has a
//! `reason` label. The strings are part of the compatibility surface: operators paste
//! alert rules and dashboards that match on them, so they never change.

use std::fmt;

/// Why a proxied request, dial or discovery fallback ended the way it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reason {
    /// Default: the target produced the response, or a proxy-local failure had no
    /// more specific reason.
    Upstream,
    /// No peer list has arrived since start, or the latest list is empty.
    NoPeer,
    /// The peer subscription has been down for longer than the staleness tolerance.
    StalePeers,
    /// Every peer is quarantined, or the only candidate is mid-trial.
    AllQuarantined,
    /// The 5 s peer dial timeout expired.
    Timeout,
    /// A deadline the proxy set expired (usually the 60 s non-watch cap).
    Deadline,
    /// The caller went away before the dial finished.
    Canceled,
    /// The peer left the peer list while it was being dialled.
    PeerDeparted,
    /// The local network server failed before any peer was contacted.
    TsServerUnavailable,
    /// Any other dial error.
    Error,
    /// Owned mode hid an object that lacks the client's ownership labels.
    OwnershipMasked,
    /// The ownership check could not be completed.
    OwnershipCheckFailed,
    /// A namespaced write named a namespace missing on the client.
    NamespaceMissing,
    /// A connection upgrade was refused.
    UpgradeRejected,
    /// A proxied discovery request failed with 401, 404 or 5xx after the peer check.
    UpstreamError,
}

impl Reason {
    /// Every reason, in the order the operations guide lists them.
    pub const ALL: [Reason; 15] = [
        Reason::Upstream,
        Reason::NoPeer,
        Reason::StalePeers,
        Reason::AllQuarantined,
        Reason::Timeout,
        Reason::Deadline,
        Reason::Canceled,
        Reason::PeerDeparted,
        Reason::TsServerUnavailable,
        Reason::Error,
        Reason::OwnershipMasked,
        Reason::OwnershipCheckFailed,
        Reason::NamespaceMissing,
        Reason::UpgradeRejected,
        Reason::UpstreamError,
    ];

    /// The label value, exactly as documented.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Upstream => "upstream",
            Reason::NoPeer => "no_peer",
            Reason::StalePeers => "stale_peers",
            Reason::AllQuarantined => "all_quarantined",
            Reason::Timeout => "timeout",
            Reason::Deadline => "deadline",
            Reason::Canceled => "canceled",
            Reason::PeerDeparted => "peer_departed",
            Reason::TsServerUnavailable => "ts_server_unavailable",
            Reason::Error => "error",
            Reason::OwnershipMasked => "ownership_masked",
            Reason::OwnershipCheckFailed => "ownership_check_failed",
            Reason::NamespaceMissing => "namespace_missing",
            Reason::UpgradeRejected => "upgrade_rejected",
            Reason::UpstreamError => "upstream_error",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::Reason;

    #[test]
    fn label_values_are_the_documented_vocabulary() {
        let values: Vec<&str> = Reason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(
            values,
            [
                "upstream",
                "no_peer",
                "stale_peers",
                "all_quarantined",
                "timeout",
                "deadline",
                "canceled",
                "peer_departed",
                "ts_server_unavailable",
                "error",
                "ownership_masked",
                "ownership_check_failed",
                "namespace_missing",
                "upgrade_rejected",
                "upstream_error",
            ]
        );
    }
}
