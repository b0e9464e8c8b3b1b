//! The example server's Gateways on disk, so that a restarted `crproxy dev` finds
//! the objects it acknowledged.
//!
//! The file is one JSON document `{"resourceVersion": "<n>", "items": [...]}`,
//! replaced as a whole (temporary file, fsync, rename): a reader sees the old state
//! or the new one, never a torn write. A writer task saves the latest state after
//! each change; a write request is answered only once a save covering it finished,
//! so an acknowledged change survives even a kill.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use tokio::sync::watch;

/// What a loaded file holds.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Saved {
    /// The last resourceVersion handed out.
    pub rv: u64,
    pub items: Vec<Value>,
}

/// Why the state file cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("the example API server's state file {path}: {problem} (move it away to start empty)")]
pub struct StateFileError {
    path: PathBuf,
    problem: String,
}

/// Reads `path`; a missing file is an empty store.
pub(super) async fn load(path: &Path) -> Result<Saved, StateFileError> {
    let error = |problem: String| StateFileError {
        path: path.to_path_buf(),
        problem,
    };
    let bytes = match tokio::fs::read(path).await {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Saved::default()),
        Err(e) => return Err(error(e.to_string())),
    };
    decode(&bytes).map_err(error)
}

fn decode(bytes: &[u8]) -> Result<Saved, String> {
    let document: Value = serde_json::from_slice(bytes).map_err(|e| format!("not JSON: {e}"))?;
    let rv = document["resourceVersion"]
        .as_str()
        .and_then(|v| v.parse::<u64>().ok())
        .ok_or("resourceVersion is not a number in a string")?;
    let items = document["items"]
        .as_array()
        .ok_or("items is not a list")?
        .clone();
    if items.iter().any(|i| {
        i["metadata"]["name"].as_str().is_none() || i["metadata"]["namespace"].as_str().is_none()
    }) {
        return Err("an item has no metadata.name or metadata.namespace".into());
    }
    Ok(Saved { rv, items })
}

pub(super) fn encode(rv: u64, items: &[&Value]) -> Vec<u8> {
    json!({"resourceVersion": rv.to_string(), "items": items})
        .to_string()
        .into_bytes()
}

/// Replaces `path` with `bytes` atomically (blocking: run off the runtime).
fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = path.with_extension("json.tmp");
    let mut file = std::fs::File::create(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)?;
    // The rename itself is durable once the directory is.
    std::fs::File::open(dir)?.sync_all()
}

/// The outcome of the latest save.
#[derive(Debug, Clone, Default)]
pub(super) struct SaveState {
    /// The resourceVersion the latest attempt covered.
    pub rv: u64,
    /// Why it failed, when it did.
    pub error: Option<String>,
}

/// Saves snapshots as they are requested, latest first; ends when `requests` closes.
/// `snapshot` returns the store's resourceVersion and encoded contents, `None` once
/// the store is gone (nothing is written then).
pub(super) async fn writer(
    path: PathBuf,
    mut requests: watch::Receiver<u64>,
    saved: watch::Sender<SaveState>,
    snapshot: impl Fn() -> Option<(u64, Vec<u8>)>,
) {
    while requests.changed().await.is_ok() {
        let Some((rv, bytes)) = snapshot() else {
            return;
        };
        let target = path.clone();
        let result = tokio::task::spawn_blocking(move || write_atomically(&target, &bytes)).await;
        let error = match result {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e.to_string()),
            Err(e) => Some(e.to_string()),
        };
        if let Some(e) = &error {
            tracing::warn!(path = %path.display(), error = %e, "example API server: saving the Gateways failed");
        }
        saved.send_replace(SaveState { rv, error });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_saved_store_loads_back_and_a_missing_file_is_empty() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("host/gateways.json");
        assert_eq!(
            load(&path).await.expect("missing is empty"),
            Saved::default()
        );
        let gw =
            json!({"metadata": {"name": "a", "namespace": "n", "uid": "u"}, "spec": {"port": 1}});
        write_atomically(&path, &encode(7, &[&gw])).expect("written");
        assert_eq!(
            load(&path).await.expect("loads"),
            Saved {
                rv: 7,
                items: vec![gw]
            }
        );
        assert!(!path.with_extension("json.tmp").exists());
    }

    #[test]
    fn a_damaged_file_is_refused_with_the_problem() {
        for (text, problem) in [
            ("{", "not JSON"),
            (r#"{"resourceVersion": 3, "items": []}"#, "resourceVersion"),
            (
                r#"{"resourceVersion": "3", "items": {}}"#,
                "items is not a list",
            ),
            (
                r#"{"resourceVersion": "3", "items": [{"metadata": {"name": "a"}}]}"#,
                "metadata.namespace",
            ),
        ] {
            let got = decode(text.as_bytes()).expect_err(text);
            assert!(got.contains(problem), "{text}: {got}");
        }
    }
}
