//! TODO(helper): config
