//! Election and registration started and stopped together, as one process runs them.

use crate::leader::{LeaderElector, LeaderHandle, LeaseConfig};
use crate::register::{spawn_registrar, RegistrarConfig, Registration};
use kube::Client;
use std::time::Duration;
use tokio::task::JoinHandle;

/// A running election plus its registrar.
#[derive(Debug)]
pub struct WiringHandle {
    leader: LeaderHandle,
    registrar: JoinHandle<()>,
}

impl WiringHandle {
    /// Wraps an election and a registrar started separately.
    pub fn new(leader: LeaderHandle, registrar: JoinHandle<()>) -> WiringHandle {
        WiringHandle { leader, registrar }
    }

    /// The election, to observe leadership (metrics, readiness).
    pub fn leader(&self) -> &LeaderHandle {
        &self.leader
    }

    /// Stops registering first (so nothing is written after leadership is given up),
    /// then releases the Lease so another replica takes over at its next retry.
    pub async fn stop(self) {
        self.registrar.abort();
        let _ = self.registrar.await;
        self.leader.release().await;
    }

    /// Stops like a crashed process: registration ends and the lease is left to
    /// expire, so another replica takes over only after the lease duration.
    pub fn abort(self) {
        self.registrar.abort();
        self.leader.abort();
    }
}

/// Starts leader election with `lease` and a registrar that, while leading, keeps
/// `regs` registered, repairing every `interval`.
pub fn spawn_wiring(
    client: Client,
    lease: LeaseConfig,
    cfg: RegistrarConfig,
    regs: Vec<Registration>,
    interval: Duration,
) -> WiringHandle {
    let leader = LeaderElector::spawn(client.clone(), lease);
    let registrar = spawn_registrar(client, cfg, regs, leader.clone(), interval);
    WiringHandle { leader, registrar }
}
