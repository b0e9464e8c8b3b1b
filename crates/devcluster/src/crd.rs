//! TODO: crd (being written)
