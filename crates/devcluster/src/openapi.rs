//! TODO: openapi (being written)
