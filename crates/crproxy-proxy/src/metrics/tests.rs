use super::*;

#[test]
fn openmetrics_is_rewritten_to_the_prometheus_text_format() {
    let input = "# HELP a_requests Requests.\n# TYPE a_requests counter\n\
                 a_requests_total{x=\"1\"} 2\n# HELP b_seconds Latency.\n\
                 # TYPE b_seconds histogram\n# UNIT b_seconds seconds\n\
                 b_seconds_count 1\n# TYPE c gauge\nc 3\n# EOF\n";
    let expected = "# HELP a_requests_total Requests.\n# TYPE a_requests_total counter\n\
                    a_requests_total{x=\"1\"} 2\n# HELP b_seconds Latency.\n\
                    # TYPE b_seconds histogram\nb_seconds_count 1\n# TYPE c gauge\nc 3\n";
    assert_eq!(openmetrics_to_prometheus_text(input), expected);
}

#[test]
fn the_accept_header_picks_the_format() {
    let metrics = Metrics::new();
    metrics.target("p/t").peer_quarantined();
    for (accept, content_type, counter_type_line) in [
        (
            Some("application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"),
            OPENMETRICS_CONTENT_TYPE,
            "# TYPE vcluster_proxy_peer_quarantines counter",
        ),
        (
            Some("text/plain"),
            PROMETHEUS_TEXT_CONTENT_TYPE,
            "# TYPE vcluster_proxy_peer_quarantines_total counter",
        ),
        (
            None,
            PROMETHEUS_TEXT_CONTENT_TYPE,
            "# TYPE vcluster_proxy_peer_quarantines_total counter",
        ),
    ] {
        let (body, ct) = metrics.encode_for_accept(accept);
        assert_eq!(ct, content_type);
        assert!(body.lines().any(|l| l == counter_type_line), "{body}");
    }
}
