//! TODO(helper): request
