use super::*;

#[test]
fn parses_labels_values_and_escapes() {
    let samples =
        parse("# TYPE x gauge\nx{a=\"1\",b=\"q\\\"uote\"} 2\ny 3.5\nz{a=\"1\",} 4 1700000000\n");
    assert_eq!(samples.len(), 3);
    assert_eq!(samples[0].labels["b"], "q\"uote");
    assert_eq!(samples[0].value, 2.0);
    assert_eq!(samples[1].name, "y");
    assert_eq!(samples[2].value, 4.0);
}

/// A line whose metric or label names the format does not allow is skipped,
/// not read as the sample its pieces would make.
#[test]
fn lines_with_names_the_format_does_not_allow_are_skipped() {
    let check = |line: &str, read: bool| {
        assert_eq!(parse(line).len(), usize::from(read), "{line:?}");
    };
    check("up 1", true);
    check("a:b_c9{le=\"+Inf\",_x=\"\"} 2", true);
    check("  indented 3", true);
    // An OpenMetrics exemplar after the value belongs to the sample.
    check("x_total 3 # {trace_id=\"a\"} 1", true);
    check("x_total{a=\"b\"} 3 # {trace_id=\"a\"} 1", true);
    check("9lives 1", false);
    check("a-b 1", false);
    check("a b{x=\"1\"} 2", false);
    check("{x=\"1\"} 2", false);
    check("x{a:b=\"1\"} 2", false);
    check("x{\u{b},c=\"1\"} 2", false);
    check("x{=\"1\"} 2", false);
}
