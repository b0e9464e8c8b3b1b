//! TODO: rbac (being written)
