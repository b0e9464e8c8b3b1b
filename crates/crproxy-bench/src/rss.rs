//! Memory and CPU of processes, read from `/proc` (Linux only, like the rest of the
//! benchmark's measurements).
//!
//! Peak RSS comes from the kernel's own high-water mark (`VmHWM`), which catches
//! spikes a sampler would miss; writing `5` to `/proc/<pid>/clear_refs` resets it,
//! so one phase (listing 100 000 objects) can be measured on its own. Processes
//! with children (nginx: a master and workers) are measured as the sum over the
//! tree, by sampling. CPU time comes from the scheduler's nanosecond count
//! ([`CpuClock::Schedstat`]), with the 10 ms ticks of `/proc/<pid>/stat` as the
//! fallback on kernels without it. The machine's own CPU time ([`MachineTime`],
//! from `/proc/stat`) tells how much of it the hypervisor took.

use std::time::Duration;

use serde::Serialize;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Resident memory of one process, in KiB as the kernel reports it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Memory {
    /// `VmRSS`: resident now.
    pub rss_kib: u64,
    /// `VmHWM`: the peak since start or since the last [`reset_peak`].
    pub peak_kib: u64,
}

impl std::ops::Add for Memory {
    type Output = Memory;
    fn add(self, other: Memory) -> Memory {
        Memory {
            rss_kib: self.rss_kib + other.rss_kib,
            peak_kib: self.peak_kib + other.peak_kib,
        }
    }
}

/// Reads `VmRSS` and `VmHWM` from the text of `/proc/<pid>/status`.
pub fn parse_status(text: &str) -> Option<Memory> {
    let field = |name: &str| -> Option<u64> {
        text.lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.trim_start_matches(':').split_whitespace().next())
            .and_then(|n| n.parse().ok())
    };
    Some(Memory {
        rss_kib: field("VmRSS")?,
        peak_kib: field("VmHWM")?,
    })
}

/// The memory of `pid`, `None` when it is gone (or is a zombie, which has none).
pub fn memory(pid: u32) -> Option<Memory> {
    parse_status(&std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?)
}

/// The memory of `pid` and all its descendants, summed.
pub fn tree_memory(pid: u32) -> Option<Memory> {
    let mut total = memory(pid)?;
    for child in descendants(pid) {
        if let Some(m) = memory(child) {
            total = total + m;
        }
    }
    Some(total)
}

/// Resets the peak-RSS mark of a process we own; false when the kernel refused.
pub fn reset_peak(pid: u32) -> bool {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").is_ok()
}

/// Nanoseconds on CPU from the text of a task's `schedstat`: its first field
/// (the scheduler's `sum_exec_runtime`). `None` for malformed text.
pub fn parse_schedstat_ns(text: &str) -> Option<u64> {
    text.split_whitespace().next()?.parse().ok()
}

/// User plus system CPU time from the text of `/proc/<pid>/stat`, in clock ticks.
///
/// The command name (field 2) may hold spaces and parentheses, so fields are
/// counted from the last `)`.
pub fn parse_stat_ticks(text: &str) -> Option<u64> {
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state is field 3, utime field 14, stime field 15.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// Linux reports `/proc/<pid>/stat` CPU times in USER_HZ ticks, which is 100 on
/// every architecture this runs on.
const TICKS_PER_SECOND: u64 = 100;

/// Where CPU time is read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum CpuClock {
    /// The scheduler's own count in nanoseconds, summed over the threads of each
    /// process (`/proc/<pid>/task/<tid>/schedstat`).
    Schedstat,
    /// utime + stime of `/proc/<pid>/stat`: 10 ms ticks, too coarse for a
    /// request that costs tens of microseconds unless thousands are summed.
    StatTicks,
}

impl CpuClock {
    /// Schedstat when the kernel exposes it for `pid` (it needs
    /// CONFIG_SCHED_INFO), else the stat ticks.
    pub fn detect(pid: u32) -> Self {
        if process_schedstat_ns(pid).is_some() {
            CpuClock::Schedstat
        } else {
            CpuClock::StatTicks
        }
    }

    /// CPU time used so far by one process (all its threads).
    fn process(self, pid: u32) -> Option<Duration> {
        match self {
            CpuClock::Schedstat => process_schedstat_ns(pid).map(Duration::from_nanos),
            CpuClock::StatTicks => std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|t| parse_stat_ticks(&t))
                .map(|ticks| Duration::from_millis(ticks * 1000 / TICKS_PER_SECOND)),
        }
    }
}

/// The sum of `schedstat` over the threads of `pid`. `/proc/<pid>/schedstat`
/// alone counts only the thread-group leader (the kernel's sched-stats
/// documentation describes it per task), and crproxy does its work on tokio's
/// worker threads. Time of threads that already exited is not in the sum; the
/// processes measured here keep their threads. The count is exact for a thread
/// off the CPU and lags by at most a scheduler tick for one running, so it is read
/// between rounds, when the measured process is idle. `None` when the process is
/// gone or the kernel reports no schedstat (it then prints zeros).
fn process_schedstat_ns(pid: u32) -> Option<u64> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut total = 0u64;
    let mut read_any = false;
    for task in tasks.flatten() {
        if let Some(ns) = std::fs::read_to_string(task.path().join("schedstat"))
            .ok()
            .and_then(|t| parse_schedstat_ns(&t))
        {
            total += ns;
            read_any = true;
        }
    }
    (read_any && total > 0).then_some(total)
}

/// CPU time used so far by `pid` and its descendants (nginx: the master and its
/// workers), read with `clock`.
pub fn tree_cpu(pid: u32, clock: CpuClock) -> Option<Duration> {
    let mut total = clock.process(pid)?;
    for child in descendants(pid) {
        total += clock.process(child).unwrap_or_default();
    }
    Some(total)
}

/// Child pids listed by the kernel for each thread of `pid`.
fn children(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for task in tasks.flatten() {
        if let Ok(text) = std::fs::read_to_string(task.path().join("children")) {
            out.extend(
                text.split_whitespace()
                    .filter_map(|p| p.parse::<u32>().ok()),
            );
        }
    }
    out
}

/// The whole machine's CPU time, from the `cpu` line of `/proc/stat`, in ticks
/// summed over every CPU. On a virtual machine `steal` is time a CPU wanted to
/// run and the hypervisor gave to another guest: while it is high, every process
/// here (crproxy and nginx alike) gets less done per second of wall time and
/// more CPU per request, so rows measured then compare badly.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MachineTime {
    pub steal: u64,
    /// Time no process wanted a CPU (idle and iowait).
    pub idle: u64,
    /// Every state the line counts (user, nice, system, idle, iowait, irq,
    /// softirq, steal); guest time is inside user already.
    pub total: u64,
}

impl MachineTime {
    /// The time from `earlier` to `self`.
    pub fn since(self, earlier: MachineTime) -> MachineTime {
        MachineTime {
            steal: self.steal.saturating_sub(earlier.steal),
            idle: self.idle.saturating_sub(earlier.idle),
            total: self.total.saturating_sub(earlier.total),
        }
    }

    /// The CPU time every process on the machine used (neither idle nor stolen).
    pub fn busy(self) -> Duration {
        let ticks = self.total.saturating_sub(self.idle + self.steal);
        Duration::from_millis(ticks * 1000 / TICKS_PER_SECOND)
    }

    /// Steal as a share of all the time counted, in percent; `None` for a span
    /// too short to tell (fewer than [`MIN_TICKS_FOR_SHARE`] ticks).
    pub fn steal_percent(self) -> Option<f64> {
        (self.total >= MIN_TICKS_FOR_SHARE).then(|| self.steal as f64 * 100.0 / self.total as f64)
    }
}

impl std::ops::AddAssign for MachineTime {
    fn add_assign(&mut self, other: MachineTime) {
        self.steal += other.steal;
        self.idle += other.idle;
        self.total += other.total;
    }
}

/// A fifth of a CPU-second (the ticks of all CPUs summed): below it one tick
/// moves the share by more than 5 %. A full run's rows last longer; a `--quick`
/// row's rounds at 16 or 64 workers are often shorter, and report no share.
pub const MIN_TICKS_FOR_SHARE: u64 = 20;

/// Reads the aggregate `cpu` line of the text of `/proc/stat`. Kernels before
/// 2.6.11 print no steal column; the line is then refused rather than read as
/// no steal.
pub fn parse_proc_stat(text: &str) -> Option<MachineTime> {
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .take(8)
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    match fields.as_slice() {
        &[_user, _nice, _system, idle, iowait, _irq, _softirq, steal] => Some(MachineTime {
            steal,
            idle: idle + iowait,
            total: fields.iter().sum(),
        }),
        _ => None,
    }
}

/// The machine's CPU time so far; `None` where `/proc/stat` cannot be read.
pub fn machine_time() -> Option<MachineTime> {
    parse_proc_stat(&std::fs::read_to_string("/proc/stat").ok()?)
}

/// All descendants, breadth first; bounded so a fork bomb cannot hang the sampler.
fn descendants(pid: u32) -> Vec<u32> {
    const LIMIT: usize = 1024;
    let mut found = Vec::new();
    let mut queue = vec![pid];
    while let Some(next) = queue.pop() {
        for child in children(next) {
            if found.len() >= LIMIT {
                return found;
            }
            if !found.contains(&child) {
                found.push(child);
                queue.push(child);
            }
        }
    }
    found
}

/// Samples the summed RSS of a process tree until stopped and keeps the maximum.
pub struct Sampler {
    stop: watch::Sender<bool>,
    task: JoinHandle<u64>,
}

impl Sampler {
    /// Starts sampling `pid`'s tree every `interval`. Sampling ends when stopped or
    /// after `limit`, whichever comes first.
    pub fn start(pid: u32, interval: Duration, limit: Duration) -> Self {
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            let deadline = tokio::time::Instant::now() + limit;
            let mut max = 0;
            loop {
                if let Some(m) = tree_memory(pid) {
                    max = max.max(m.rss_kib);
                }
                tokio::select! {
                    _ = tokio::time::sleep(interval) => {}
                    _ = stopped.wait_for(|s| *s) => break,
                    _ = tokio::time::sleep_until(deadline) => break,
                }
            }
            if let Some(m) = tree_memory(pid) {
                max = max.max(m.rss_kib);
            }
            max
        });
        Self { stop, task }
    }

    /// Stops sampling; the largest summed RSS seen, in KiB.
    pub async fn stop(self) -> u64 {
        let _ = self.stop.send(true);
        self.task.await.unwrap_or(0)
    }
}

/// KiB as MiB, for reports.
pub fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

#[cfg(test)]
#[path = "rss/tests.rs"]
mod tests;
