//! The command's async runtime (crproxy-bench builds its own with it too):
//! tokio's multi-threaded scheduler, one worker thread per CPU the process may
//! use (cgroup CPU limits count), or as many as `TOKIO_WORKER_THREADS` says.
//!
//! The variable is read here, not left to tokio: tokio panics on a value it
//! cannot use, which would end the command with a backtrace instead of one line
//! naming the variable. docs/operations.md ("Worker threads") says when fewer
//! threads than CPUs pay off.

use std::ffi::OsString;

/// The environment variable tokio itself reads for the worker count.
pub const WORKER_THREADS_VAR: &str = "TOKIO_WORKER_THREADS";

/// Why the runtime could not be built.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("{WORKER_THREADS_VAR} must be a whole number of threads above 0, not {0:?}")]
    WorkerThreads(String),
    #[error("cannot start the async runtime: {0}")]
    Build(std::io::Error),
}

/// Builds the runtime the command runs on, with the worker count the
/// environment asks for.
pub fn build() -> Result<tokio::runtime::Runtime, RuntimeError> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(threads) = worker_threads(std::env::var_os(WORKER_THREADS_VAR))? {
        builder.worker_threads(threads);
    }
    builder.enable_all().build().map_err(RuntimeError::Build)
}

/// The worker count a `TOKIO_WORKER_THREADS` value asks for: `None` when it is
/// not set (tokio's default), an error for anything but a number above 0, which
/// is what tokio accepts.
fn worker_threads(value: Option<OsString>) -> Result<Option<usize>, RuntimeError> {
    let Some(value) = value else {
        return Ok(None);
    };
    let refused = || RuntimeError::WorkerThreads(value.to_string_lossy().into_owned());
    let text = value.to_str().ok_or_else(refused)?;
    match text.parse::<usize>() {
        Ok(threads) if threads > 0 => Ok(Some(threads)),
        _ => Err(refused()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unset_leaves_the_count_to_tokio() {
        assert_eq!(worker_threads(None).expect("unset is fine"), None);
    }

    #[test]
    fn a_positive_number_is_the_count() {
        for (text, threads) in [("1", 1), ("2", 2), ("64", 64)] {
            let parsed = worker_threads(Some(text.into())).expect(text);
            assert_eq!(parsed, Some(threads), "{text}");
        }
    }

    #[test]
    fn anything_else_is_refused_with_the_variable_and_the_value() {
        for text in [
            "0",
            "",
            "abc",
            " 2",
            "2 ",
            "-1",
            "1.5",
            "99999999999999999999999",
        ] {
            let error = worker_threads(Some(text.into())).expect_err(text);
            let message = error.to_string();
            assert!(
                message.starts_with("TOKIO_WORKER_THREADS must be"),
                "{message}"
            );
            assert!(message.contains(&format!("{text:?}")), "{message}");
        }
    }

    #[cfg(unix)]
    #[test]
    fn a_value_that_is_not_unicode_is_refused() {
        use std::os::unix::ffi::OsStringExt;
        let value = OsString::from_vec(vec![b'2', 0xff]);
        assert!(worker_threads(Some(value)).is_err());
    }
}
