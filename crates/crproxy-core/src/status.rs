//! TODO(helper): status
