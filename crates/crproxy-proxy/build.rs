//! Marks the promtool tests ignored where promtool is missing outside CI (see
//! crates/test-support/src/tool.rs).

#[path = "../test-support/src/tool.rs"]
mod tool;

fn main() {
    tool::emit_missing_cfg("promtool", "promtool_missing");
}
