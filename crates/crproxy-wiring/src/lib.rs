//! Control-plane wiring in the client cluster: leader election on a Lease, and, by the
//! leader only, registration of the per-group/version Service and APIService plus the
//! admission policy that protects them from deletion.
//!
//! Every replica serves; only the leader writes registration objects. Object names and
//! the protection label come from `crproxy_core::names`, the one place they are defined.
//! The API conversations go through kube-rs (`objects`), with clients built by
//! `crproxy_kube::kube_client`.

mod error;
mod leader;
mod objects;
mod register;
mod wiring;

use crproxy_core::names;

pub use error::WiringError;
pub use leader::{
    default_identity, micro_time, ElectionEnded, LeaderElector, LeaderHandle, Leadership,
    LeadershipChanges, LeaseConfig, LeaseObserver,
};
pub use register::{
    binding_drifted, desired_apiservice, desired_binding, desired_policy, desired_service,
    policy_drifted, protection_expression, register_all, spawn_registrar, RegistrarConfig,
    Registration, ServiceMode, GROUP_PRIORITY_MINIMUM, VERSION_PRIORITY,
};
pub use wiring::{spawn_wiring, WiringHandle};
