use super::*;

/// The spec's log table ("peer cache did not sync in time for the startup probe":
/// no peer list within 1 minute of startup) names the value itself, so the tests
/// that pass their own timeout cannot catch a change of it.
#[test]
fn the_startup_sync_timeout_is_the_specs_one_minute() {
    assert_eq!(STARTUP_SYNC_TIMEOUT, Duration::from_secs(60));
}
