//! TODO(helper): selector
