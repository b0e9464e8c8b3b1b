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

/// The value of the one sample line that starts with `series` followed by a space.
fn sample(body: &str, series: &str) -> Option<String> {
    body.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .map(str::to_owned)
}

#[test]
fn resolved_series_count_into_the_family_past_their_limit_too() {
    let metrics = Metrics::new();
    let target = metrics.target("p/t");
    let codes = (200..200 + 2 * MAX_RESOLVED_SERIES as u16).collect::<Vec<_>>();
    for _ in 0..2 {
        for &code in &codes {
            // A fresh Arc each time: series are told apart by the text.
            target.request(&Arc::from("g/v1"), "get", code, Reason::Upstream);
        }
    }
    target.request(&Arc::from("other/v1"), "get", 200, Reason::Upstream);
    target.request_duration("get", 0.003);
    target.request_duration("get", 0.2);
    target.request_duration("list", 0.2);
    let group_version = Arc::<str>::from("g/v1");
    for result in ["hit", "hit", "miss"] {
        target.ownership_cache(&group_version, result);
    }
    let body = metrics.encode();
    for code in codes {
        let series = format!(
            "vcluster_proxy_request_total{{target=\"p/t\",group_version=\"g/v1\",\
             verb=\"get\",code=\"{code}\",reason=\"upstream\"}}"
        );
        assert_eq!(
            sample(&body, &series).as_deref(),
            Some("2"),
            "{series}\n{body}"
        );
    }
    let other = "vcluster_proxy_request_total{target=\"p/t\",group_version=\"other/v1\",\
                 verb=\"get\",code=\"200\",reason=\"upstream\"}";
    assert_eq!(sample(&body, other).as_deref(), Some("1"), "{body}");
    for (verb, count, fast) in [("get", "2", "1"), ("list", "1", "0")] {
        let labels = format!("target=\"p/t\",verb=\"{verb}\"");
        let count_series = format!("vcluster_proxy_request_duration_seconds_count{{{labels}}}");
        assert_eq!(
            sample(&body, &count_series).as_deref(),
            Some(count),
            "{body}"
        );
        let bucket =
            format!("vcluster_proxy_request_duration_seconds_bucket{{le=\"0.005\",{labels}}}");
        assert_eq!(sample(&body, &bucket).as_deref(), Some(fast), "{body}");
    }
    for (result, count) in [("hit", "2"), ("miss", "1")] {
        let series = format!(
            "crproxy_ownership_cache_lookups_total{{target=\"p/t\",group_version=\"g/v1\",result=\"{result}\"}}"
        );
        assert_eq!(sample(&body, &series).as_deref(), Some(count), "{body}");
    }
}
