//! TODO: patch (being written)
