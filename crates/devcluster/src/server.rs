//! TODO: server
