//! TODO: aggregation (being written)
