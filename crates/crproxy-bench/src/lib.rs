//! crproxy-bench: how much crproxy costs compared with talking to the target
//! directly and with a plain reverse proxy (nginx), on one machine, in one run.
//!
//! The pieces, bottom up: [`stats`] (percentiles, medians), [`rss`] (memory and
//! CPU from `/proc`), [`driver`] (the one load driver all paths share),
//! [`nginx`] (the comparison proxy), [`report`] (table and JSON).

pub mod child;
pub mod driver;
pub mod nginx;
pub mod report;
pub mod rss;
pub mod stats;
pub mod watch;
pub mod workload;
