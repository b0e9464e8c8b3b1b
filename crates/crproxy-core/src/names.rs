//! TODO(helper): names
