//! What the kernel says about a process: peak resident memory and CPU time.

use anyhow::{Context, Result, anyhow};

/// `VmHWM` of `/proc/<pid>/status`: the peak resident set size, in KiB.
pub fn peak_rss_kib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    status_field_kib(&status, "VmHWM").ok_or_else(|| anyhow!("no VmHWM in /proc/{pid}/status"))
}

/// User plus system CPU time of `pid` (fields 14 and 15 of `/proc/<pid>/stat`), in seconds.
pub fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat =
        std::fs::read_to_string(format!("/proc/{pid}/stat")).with_context(|| format!("reading /proc/{pid}/stat"))?;
    let ticks = stat_cpu_ticks(&stat).ok_or_else(|| anyhow!("cannot parse /proc/{pid}/stat"))?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let hz = if hz > 0 { hz as f64 } else { 100.0 };
    Ok(ticks as f64 / hz)
}

fn status_field_kib(status: &str, field: &str) -> Option<u64> {
    status.lines().find_map(|l| {
        let rest = l.strip_prefix(field)?.strip_prefix(':')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// utime + stime in clock ticks. The command name (field 2) may hold spaces and parentheses,
/// so fields are counted from the last `)`.
fn stat_cpu_ticks(stat: &str) -> Option<u64> {
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state): utime is field 14, stime field 15.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_status_and_stat() {
        let status = "Name:\tcapkr-manager\nVmPeak:\t  100 kB\nVmHWM:\t   23456 kB\nVmRSS:\t   20000 kB\n";
        assert_eq!(status_field_kib(status, "VmHWM"), Some(23456));
        assert_eq!(status_field_kib(status, "VmRSS"), Some(20000));
        assert_eq!(status_field_kib(status, "VmSwap"), None);
        let stat = "4242 (capkr (mgr) x) S 1 4242 4242 0 -1 4194560 1000 0 0 0 150 25 0 0 20 0 8 0 100 0 0";
        assert_eq!(stat_cpu_ticks(stat), Some(175));
    }

    #[test]
    fn reads_this_process() {
        let me = std::process::id();
        assert!(peak_rss_kib(me).unwrap() > 0);
        assert!(cpu_seconds(me).unwrap() >= 0.0);
    }
}
