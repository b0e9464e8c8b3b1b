//! TODO: authn (being written)
