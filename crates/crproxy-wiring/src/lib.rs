//! crproxy-wiring
