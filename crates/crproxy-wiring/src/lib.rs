//! Control-plane wiring in the client cluster: leader election on a Lease, and, by the
//! leader only, registration of the per-group/version Service and APIService plus the
//! admission policy that protects them from deletion.

mod error;
mod leader;
// TEMPORARY: until crproxy_core::names is on main; then `use crproxy_core::names;`.
mod names_fallback;
use names_fallback as names;

pub use error::WiringError;
pub use leader::{default_identity, micro_time, LeaderElector, LeaderHandle, LeaseConfig};
mod register;
pub use register::{
    desired_apiservice, desired_binding, desired_policy, desired_service, protection_expression,
    register_all, spawn_registrar, RegistrarConfig, Registration, ServiceMode,
    GROUP_PRIORITY_MINIMUM, VERSION_PRIORITY,
};
