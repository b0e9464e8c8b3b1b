use super::*;

/// Everything the splitter makes of `stream` (with lines of at most `max_line`
/// bytes) when it arrives in chunks of `chunk` bytes: the lines, then the error
/// that ended them, if any.
fn split(stream: &[u8], chunk: usize, max_line: usize) -> (Vec<String>, Option<LineError>) {
    let mut splitter = WatchLines::new(max_line);
    let mut lines = Vec::new();
    for piece in stream.chunks(chunk) {
        splitter.push(piece);
        loop {
            match splitter.next_line() {
                Ok(Some(line)) => lines.push(String::from_utf8_lossy(&line).into_owned()),
                Ok(None) => break,
                Err(error) => return (lines, Some(error)),
            }
        }
    }
    (lines, None)
}

/// Checks that every chunking of `stream`, from one byte at a time to all at
/// once, gives `lines` and `error`.
fn check(stream: &str, max_line: usize, lines: &[&str], error: Option<LineError>) {
    for chunk in 1..=stream.len().max(1) {
        let got = split(stream.as_bytes(), chunk, max_line);
        assert_eq!(got.0, lines, "stream {stream:?} in chunks of {chunk}");
        assert_eq!(got.1, error, "stream {stream:?} in chunks of {chunk}");
    }
}

#[test]
fn any_chunking_gives_the_same_lines() {
    check("", 64, &[], None);
    check("{\"a\":1}\n", 64, &["{\"a\":1}"], None);
    check(
        "{\"a\":1}\n{\"b\":2}\n{\"c\":",
        64,
        &["{\"a\":1}", "{\"b\":2}"],
        None,
    );
    // An escaped newline inside a string is not a line end.
    check("{\"s\":\"x\\ny\"}\n", 64, &["{\"s\":\"x\\ny\"}"], None);
}

#[test]
fn blank_lines_are_skipped() {
    check("\n\n  \n\t\r\n", 64, &[], None);
    check(
        "\n{\"a\":1}\n \n{\"b\":2}\r\n\n",
        64,
        &["{\"a\":1}", "{\"b\":2}\r"],
        None,
    );
}

#[test]
fn a_line_over_the_limit_ends_the_stream_after_the_lines_before_it() {
    let too_long = Some(LineError::TooLong { limit: 4 });
    // Exactly at the limit is fine, one byte more is not, with or without its
    // newline having arrived.
    check("abcd\n", 4, &["abcd"], None);
    check("abcde\n", 4, &[], too_long.clone());
    check("ab\nabcde", 4, &["ab"], too_long.clone());
    check("ab\nabcdefgh\ncd\n", 4, &["ab"], too_long.clone());
    // The limit is per line, not per stream.
    check("abcd\nabcd\nabcd\n", 4, &["abcd", "abcd", "abcd"], None);
}

#[test]
fn the_splitter_keeps_answering_with_its_error() {
    let mut splitter = WatchLines::new(2);
    splitter.push(b"abc\nd\n");
    let too_long = Err(LineError::TooLong { limit: 2 });
    assert_eq!(splitter.next_line(), too_long);
    splitter.push(b"e\n");
    assert_eq!(splitter.next_line(), too_long);
}

#[test]
fn a_last_line_without_newline_is_held_back_as_unfinished() {
    let mut splitter = WatchLines::new(64);
    splitter.push(b"{\"a\":1}\n{\"type\":\"ADDED\"}");
    assert_eq!(
        splitter.next_line(),
        Ok(Some(Bytes::from_static(b"{\"a\":1}")))
    );
    assert_eq!(splitter.next_line(), Ok(None));
    assert_eq!(splitter.unfinished(), b"{\"type\":\"ADDED\"}");
    // Its newline arriving finishes it.
    splitter.push(b"\n");
    assert_eq!(
        splitter.next_line(),
        Ok(Some(Bytes::from_static(b"{\"type\":\"ADDED\"}")))
    );
    assert_eq!(splitter.unfinished(), b"");
}
