use super::*;

fn check_seq(line: &str, marker: &str, expected: Option<u64>) {
    assert_eq!(event_seq(line.as_bytes(), marker), expected, "{line}");
}

#[test]
fn the_sequence_is_read_from_the_object_name() {
    let event = r#"{"type":"ADDED","object":{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"ev-crproxy-1000-17","namespace":"w"}}}"#;
    check_seq(event, "ev-crproxy-1000-", Some(17));
    check_seq(event, "ev-direct-1000-", None);
    check_seq(event, "ev-crproxy-1-", None);
    check_seq(r#"{"metadata":{"name":"ev-x-"}}"#, "ev-x-", None);
    check_seq(r#"{"metadata":{"name":"ev-x-5"#, "ev-x-", Some(5));
    check_seq("", "ev-x-", None);
}

#[test]
fn lines_are_reassembled_across_frames() {
    let mut splitter = LineSplitter::default();
    let mut lines: Vec<String> = Vec::new();
    for frame in ["{\"a\":", "1}\n{\"b\"", ":2}\n{\"c\":3}\n{\"d\""] {
        splitter.push(frame.as_bytes(), |line| {
            lines.push(String::from_utf8(line.to_vec()).expect("utf8"))
        });
    }
    assert_eq!(lines, ["{\"a\":1}", "{\"b\":2}", "{\"c\":3}"]);
}
