//! Library side of the `crproxy` command: the pieces the end-to-end tests start
//! exactly as the command does.

pub mod build_kind;
#[cfg(feature = "dev")]
pub mod devenv;
#[cfg(feature = "dev")]
pub mod devsync;
pub mod doctor;
pub mod logging;
pub mod report;
pub mod run;
pub mod runtime;
