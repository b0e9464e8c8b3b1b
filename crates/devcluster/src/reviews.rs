//! TODO: reviews (being written)
