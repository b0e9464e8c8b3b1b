use super::*;

#[test]
fn status_fields_are_read_in_kib() {
    let text = "Name:\tcrproxy\nVmPeak:\t  999 kB\nVmHWM:\t   20480 kB\nVmRSS:\t   10240 kB\nThreads:\t3\n";
    assert_eq!(
        parse_status(text),
        Some(Memory {
            rss_kib: 10240,
            peak_kib: 20480
        })
    );
    // A zombie has no memory lines.
    assert_eq!(parse_status("Name:\tx\nState:\tZ (zombie)\n"), None);
}

#[test]
fn cpu_ticks_survive_odd_command_names() {
    let check = |text: &str, expected: Option<u64>| {
        assert_eq!(parse_stat_ticks(text), expected, "{text}");
    };
    check(
        "42 (nginx) S 1 42 42 0 -1 4194560 100 0 0 0 7 3 0 0 20 0 1 0 100 1000 200",
        Some(10),
    );
    check(
        "42 (a (b) c) R 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 1 0 100 1000 200",
        Some(300),
    );
    check("42 (short) S 1", None);
    check("garbage", None);
}

#[test]
fn this_process_is_measurable() {
    let me = std::process::id();
    let m = memory(me).expect("own status");
    assert!(m.rss_kib > 0 && m.peak_kib >= m.rss_kib, "{m:?}");
    assert!(tree_cpu(me).is_some());
    assert!(tree_memory(me).expect("tree").rss_kib >= m.rss_kib);
}

#[tokio::test]
async fn the_sampler_sees_this_process() {
    let sampler = Sampler::start(
        std::process::id(),
        Duration::from_millis(5),
        Duration::from_secs(5),
    );
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(sampler.stop().await > 0);
}
