//! TODO(helper): ownership
