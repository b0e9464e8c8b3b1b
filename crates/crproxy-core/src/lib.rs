//! crproxy-core: types and pure logic shared by the proxy, the sync, the wiring,
//! the Kubernetes client glue and devcluster.
//! No I/O lives here: no sockets, no files, no clocks beyond what a caller passes in.

pub mod config;
pub mod deep_objects;
pub mod exposition;
pub mod go_text;
pub mod locks;
pub mod names;
pub mod ownership;
pub mod pki;
pub mod precondition;
pub mod reason;
pub mod request;
pub mod request_body;
pub mod selector;
pub mod skim;
pub mod status;
pub mod yaml_error;
