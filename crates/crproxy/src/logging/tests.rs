use std::sync::{Arc, Mutex};

use super::*;

/// A writer the test reads back.
#[derive(Clone, Default)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Buffer {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The lines `emit` logs through [`JsonLines`].
fn logged(emit: impl FnOnce()) -> Vec<String> {
    let buffer = Buffer::default();
    let writer = buffer.clone();
    let subscriber = tracing_subscriber::fmt()
        .event_format(JsonLines)
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::with_default(subscriber, emit);
    let bytes = buffer.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
    String::from_utf8_lossy(&bytes)
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn the_target_field_appears_once_and_the_module_path_is_the_logger() {
    let lines = logged(|| {
        tracing::warn!(
            target: "crproxy_proxy::pool",
            host = "10.0.0.1:443",
            consecutiveFailures = 3u64,
            target = "default/target",
            "quarantining proxy target peer host after consecutive dial failures"
        );
    });
    assert_eq!(lines.len(), 1, "{lines:?}");
    let raw = &lines[0];
    assert_eq!(raw.matches("\"target\":").count(), 1, "{raw}");
    let line: Value = serde_json::from_str(raw).expect("one JSON object per line");
    assert_eq!(line["target"], "default/target");
    assert_eq!(line[LOGGER_KEY], "crproxy_proxy::pool");
    assert_eq!(line["level"], "WARN");
    assert_eq!(
        line["message"],
        "quarantining proxy target peer host after consecutive dial failures"
    );
    assert_eq!(line["host"], "10.0.0.1:443");
    assert_eq!(line["consecutiveFailures"], 3, "numbers stay numbers");
    assert!(line["timestamp"].as_str().is_some_and(|t| t.ends_with('Z')));
}

#[test]
fn fields_cannot_replace_the_line_keys() {
    let lines = logged(|| {
        tracing::info!(level = "forged", timestamp = 1u64, "hello");
    });
    let line: Value = serde_json::from_str(&lines[0]).expect("json");
    assert_eq!(line["level"], "INFO");
    assert!(line["timestamp"].is_string(), "{line}");
}
