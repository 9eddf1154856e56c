//! CPU time and memory of processes, read from `/proc` (Linux).
use std::path::Path;

/// Clock ticks per second of `/proc/<pid>/stat` (USER_HZ; 100 on every Linux this runs on, but
/// asked rather than assumed).
fn ticks_per_second() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// The fields of `/proc/<pid>/stat` after the command name (field 3, the state, is index 0).
fn stat_fields(pid: u32) -> Option<Vec<u64>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 1..];
    Some(
        rest.split_whitespace()
            .map(|f| f.parse::<i64>().map(|v| v.max(0) as u64).unwrap_or(0))
            .collect(),
    )
}

/// utime + stime (+ cutime + cstime: children that were waited for) in ticks.
fn ticks(pid: u32, with_waited_children: bool) -> u64 {
    stat_fields(pid)
        .map(|f| {
            let own = f[11] + f[12];
            if with_waited_children {
                own + f[13] + f[14]
            } else {
                own
            }
        })
        .unwrap_or(0)
}

fn live_children(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| stat_fields(*p).is_some_and(|f| f[1] == pid as u64))
        .collect()
}

/// CPU seconds used so far by `pid` and every child it has (PostgreSQL: the postmaster, its live
/// backends, and the backends that already exited).
pub fn tree_cpu_seconds(pid: u32) -> f64 {
    let total = ticks(pid, true)
        + live_children(pid)
            .into_iter()
            .map(|c| ticks(c, false))
            .sum::<u64>();
    total as f64 / ticks_per_second()
}

/// (VmRSS, VmHWM) of `pid` in KiB: the resident set now and its peak.
pub fn rss_kib(pid: u32) -> Option<(u64, u64)> {
    let status =
        std::fs::read_to_string(Path::new("/proc").join(pid.to_string()).join("status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_cpu_time_and_memory() {
        let me = std::process::id();
        let spin = std::time::Instant::now();
        let mut x = 0u64;
        while spin.elapsed() < std::time::Duration::from_millis(50) {
            x = x.wrapping_add(std::hint::black_box(1));
        }
        assert!(x > 0);
        assert!(tree_cpu_seconds(me) > 0.0);
        let (rss, peak) = rss_kib(me).expect("status");
        assert!(rss > 0 && peak >= rss);
    }
}
