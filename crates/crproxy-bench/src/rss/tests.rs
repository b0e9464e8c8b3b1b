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
fn schedstat_is_read_from_its_first_field() {
    let check = |text: &str, expected: Option<u64>| {
        assert_eq!(parse_schedstat_ns(text), expected, "{text:?}");
    };
    check("58618169 123440077 191\n", Some(58_618_169));
    check("0 0 0\n", Some(0));
    check("", None);
    check("-5 1 1", None);
    check("garbage 1 2", None);
}

/// The parser on the kernel's real file: this thread's count grows while it
/// works, in nanoseconds (well below a 10 ms tick).
#[test]
fn schedstat_of_this_thread_counts_nanoseconds() {
    let read = || {
        let text = std::fs::read_to_string("/proc/thread-self/schedstat").expect("schedstat");
        parse_schedstat_ns(&text).expect("a number of ns")
    };
    let me = std::process::id();
    if CpuClock::detect(me) == CpuClock::StatTicks {
        eprintln!("this kernel reports no schedstat; the stat-tick fallback is used");
        return;
    }
    // The kernel folds a running thread's time in at each tick and when it
    // leaves the CPU, so a new test thread may still read 0 here.
    let before = read();
    // Work until the count moves by at least 1 ms, bounded by 5 s of wall time.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let mut work = 0u64;
    let mut after = before;
    while after < before + 1_000_000 && std::time::Instant::now() < deadline {
        for i in 0..100_000u64 {
            work = work.wrapping_mul(31).wrapping_add(std::hint::black_box(i));
        }
        after = read();
    }
    std::hint::black_box(work);
    assert!(after >= before + 1_000_000, "{before} -> {after} ns");
    // The process total covers this thread.
    let process = process_schedstat_ns(me).expect("process schedstat");
    assert!(
        process >= after,
        "process {process} ns < this thread {after} ns"
    );
}

#[test]
fn this_process_is_measurable() {
    let me = std::process::id();
    let m = memory(me).expect("own status");
    assert!(m.rss_kib > 0 && m.peak_kib >= m.rss_kib, "{m:?}");
    assert!(tree_cpu(me, CpuClock::StatTicks).is_some());
    assert!(tree_cpu(me, CpuClock::detect(me)).is_some());
    // The tree covers this process. Compared by peak, which only grows: this
    // process's RSS may shrink between the two reads while other tests free
    // memory (a CI run failed on exactly that).
    let tree = tree_memory(me).expect("tree");
    assert!(
        tree.rss_kib > 0 && tree.peak_kib >= m.peak_kib,
        "{tree:?} against {m:?}"
    );
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

#[test]
fn machine_time_is_read_from_the_aggregate_cpu_line() {
    let check = |text: &str, expected: Option<(u64, u64, u64)>| {
        let read = parse_proc_stat(text).map(|t| (t.steal, t.idle, t.total));
        assert_eq!(read, expected, "{text:?}");
    };
    // user nice system idle iowait irq softirq steal guest guest_nice
    check(
        "cpu  100 0 50 800 10 0 5 35 0 0\ncpu0 50 0 25 400 5 0 2 18 0 0\n",
        Some((35, 810, 1000)),
    );
    // The per-CPU lines are not the aggregate one.
    check("cpu0 50 0 25 400 5 0 2 18 0 0\n", None);
    // No steal column (kernels before 2.6.11) or a field that is not a count.
    check("cpu  100 0 50 800 10 0 5\n", None);
    check("cpu  100 0 50 800 10 0 5 x 0 0\n", None);
    check("", None);
}

#[test]
fn steal_is_a_share_of_the_span_between_two_readings() {
    let earlier = MachineTime {
        steal: 100,
        idle: 5_000,
        total: 10_000,
    };
    let later = MachineTime {
        steal: 130,
        idle: 5_050,
        total: 10_200,
    };
    let span = later.since(earlier);
    assert_eq!(
        span,
        MachineTime {
            steal: 30,
            idle: 50,
            total: 200
        }
    );
    assert_eq!(span.steal_percent(), Some(15.0));
    // 120 ticks of 10 ms were neither idle nor stolen.
    assert_eq!(span.busy(), Duration::from_millis(1_200));
    // Too short a span to tell; a counter that went backwards counts as none.
    let short = MachineTime {
        steal: 1,
        idle: 0,
        total: MIN_TICKS_FOR_SHARE - 1,
    };
    assert_eq!(short.steal_percent(), None);
    assert_eq!(earlier.since(later), MachineTime::default());
    let mut sum = span;
    sum += span;
    assert_eq!(sum.steal_percent(), Some(15.0));
}

#[test]
fn this_machine_reports_its_time() {
    let first = machine_time().expect("/proc/stat is readable on Linux");
    assert!(first.total > 0, "{first:?}");
    assert!(first.steal + first.idle <= first.total, "{first:?}");
}
