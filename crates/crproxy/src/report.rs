//! How the command reports a failure: one readable line.

/// The error and its causes on one line, `outer: cause: cause`, leaving out a
/// cause whose text the line already carries (many library errors repeat their
/// source in their own message) and folding multi-line messages.
pub fn error_line(error: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in error.chain() {
        let text = one_line(&cause.to_string());
        if text.is_empty() || line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

/// `text` on one line: its lines, and the runs of white space in them, joined by
/// single spaces, so a multi-line library message fits a one-line report.
pub fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot listen on 127.0.0.1:6443: {source}")]
    struct Bind {
        #[source]
        source: std::io::Error,
    }

    #[test]
    fn a_cause_the_message_already_carries_is_not_repeated() {
        let io = std::io::Error::new(std::io::ErrorKind::AddrInUse, "Address already in use");
        let error =
            anyhow::Error::new(Bind { source: io }).context("starting the client devcluster");
        assert_eq!(
            error_line(&error),
            "starting the client devcluster: cannot listen on 127.0.0.1:6443: Address already in use"
        );
    }

    #[test]
    fn causes_are_joined_on_one_line() {
        let error = anyhow::anyhow!("first\nsecond line").context("outer");
        assert_eq!(error_line(&error), "outer: first second line");
    }
}
