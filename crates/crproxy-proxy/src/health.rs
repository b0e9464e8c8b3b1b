//! Whether this proxy can serve: what `/readyz` and `/healthz` on the metrics
//! listener answer. `/livez` only says the process is alive.
//!
//! A proxy is ready when
//! - the front-proxy trust is loaded (before that the TLS handshake cannot verify
//!   the client's aggregator and every caller would get 401), and
//! - at least one target's peer cache has received a peer list (before that every
//!   request would be answered 503 for want of a peer).
//!
//! Until then the answer is 503 with one line per unmet condition, so `kubectl
//! describe pod` and `curl` show why.

use std::sync::Arc;

use http::StatusCode;

use crate::frontproxy::FrontProxyTrust;
use crate::pool::PeerPool;

/// The body of a ready answer.
pub const READY_BODY: &str = "ok";

/// What readiness looks at: the trust and every group/version's peer pool.
pub struct Readiness {
    /// `None` in a process that runs no proxy (sync only): nothing to trust.
    trust: Option<Arc<FrontProxyTrust>>,
    /// `(target label, pool)` per group/version.
    pools: Vec<(String, Arc<PeerPool>)>,
}

impl Readiness {
    pub fn new(trust: Arc<FrontProxyTrust>, pools: Vec<(String, Arc<PeerPool>)>) -> Arc<Self> {
        Arc::new(Self {
            trust: Some(trust),
            pools,
        })
    }

    /// A process that serves no proxy (`crproxy run` with only sync keys) has no
    /// proxy condition to wait for; its sync fails the process at start-up instead
    /// of serving half-ready.
    pub fn without_proxy() -> Arc<Self> {
        Arc::new(Self {
            trust: None,
            pools: Vec::new(),
        })
    }

    /// Why the proxy is not ready; empty when it is.
    pub fn unmet(&self) -> Vec<String> {
        let mut reasons = Vec::new();
        let Some(trust) = &self.trust else {
            return reasons;
        };
        if !trust.is_loaded() {
            reasons.push(
                "front-proxy trust not loaded: the client cluster's kube-system/extension-apiserver-authentication ConfigMap has not been read yet, so callers would get 401".to_string(),
            );
        }
        // `list_age` is set by the first publication: the cache has synced once.
        let synced = self
            .pools
            .iter()
            .any(|(_, pool)| pool.snapshot().list_age.is_some());
        if !synced {
            let mut targets: Vec<&str> = self.pools.iter().map(|(t, _)| t.as_str()).collect();
            targets.sort_unstable();
            targets.dedup();
            reasons.push(format!(
                "no target's peer cache has synced yet (targets: {}), so requests would get 503",
                targets.join(", ")
            ));
        }
        reasons
    }

    /// The status and plain-text body of `/readyz` and `/healthz`.
    pub fn answer(&self) -> (StatusCode, String) {
        let unmet = self.unmet();
        if unmet.is_empty() {
            (StatusCode::OK, READY_BODY.to_string())
        } else {
            let lines: Vec<String> = unmet.iter().map(|r| format!("not ready: {r}\n")).collect();
            (StatusCode::SERVICE_UNAVAILABLE, lines.concat())
        }
    }
}

#[cfg(test)]
mod tests;
