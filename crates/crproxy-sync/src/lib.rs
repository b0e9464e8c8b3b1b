//! Custom resource sync between a host cluster and a tenant cluster.
//!
//! * toHost: tenant objects of a type are mirrored into the tenant's namespace on the
//!   host (`sync.host.namespace`) under translated names, carrying annotations that
//!   identify the tenant object; spec flows down, status flows up, deletes propagate
//!   both ways, orphaned mirrors are garbage-collected.
//! * fromHost: host objects are copied into the tenant; tenant edits of a field stay
//!   until the host changes that field (three-way merge); tenant-created objects of
//!   the type are removed.
//!
//! * aggregated toHost types (served on the host by an extension API server): the
//!   tenant gets a generated schemaless CRD ([`aggregated`]), and creates/updates are
//!   written through to the host by a validating webhook before the tenant stores
//!   them ([`writethrough`]).
//!
//! Each synced type is resolved against the host once at start-up ([`crd`]); then one
//! syncer per type runs while this replica is the elected leader ([`run`]). Syncers
//! are level-based: a reconcile looks at both sides (reflector caches, confirmed by a
//! live read before anything is deleted) and is idempotent, so a restart in the
//! middle of anything simply converges.

pub mod aggregated;
pub mod crd;
mod error;
#[cfg(test)]
mod fake_api;
mod from_config;
pub mod from_host;
pub mod managed;
pub mod merge;
pub mod metrics;
pub mod names;
pub mod patches;
pub mod queue;
pub mod run;
pub mod to_host;
pub mod writethrough;

pub use error::SyncError;
pub use from_config::{start_from_config, SyncClusters, LEASE_DURATION};
pub use metrics::SyncMetrics;
pub use run::{start, SyncHandle, SyncOptions};
