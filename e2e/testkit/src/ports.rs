//! Ports for the processes a test starts (a binary's listener, etcd, a PostgreSQL that comes up
//! late), chosen before the process runs.
//!
//! The usual trick (bind port 0, read the port, close) races: the kernel may give the same port
//! to the next port-0 bind of this very test process (an in-process server, another test's pick)
//! before the child has bound it, and the child then serves nothing or a sibling's port answers in
//! its place. Ports here come from below the kernel's ephemeral range (which port-0 binds and
//! outgoing connections draw from), are handed out at most once per test process, and are checked
//! to be bindable at the time of the pick.
use std::collections::BTreeSet;
use std::net::TcpListener;
use std::sync::Mutex;

/// Below Linux's default ephemeral range (32768–60999) and Kubernetes' NodePort range
/// (30000–32767); above the well-known and most registered service ports.
const FIRST: u16 = 20_000;
const END: u16 = 30_000;

static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

/// A loopback TCP port that nothing listens on now, that the kernel does not hand to port-0
/// binds, and that this process has not handed out before.
pub fn free_port() -> u16 {
    // A start that differs between test processes, so that two running at once rarely probe the
    // same ports in the same order.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    free_port_from(std::process::id().wrapping_mul(7_919) ^ nanos)
}

/// The first port from `start` (an offset into the range, wrapping) that is free and not yet
/// handed out.
fn free_port_from(start: u32) -> u16 {
    let mut handed = HANDED_OUT.lock().unwrap_or_else(|p| p.into_inner());
    let span = u32::from(END - FIRST);
    let start = start % span;
    for i in 0..span {
        let port = FIRST + ((start + i) % span) as u16;
        if handed.contains(&port) {
            continue;
        }
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            handed.insert(port);
            return port;
        }
    }
    panic!("no free loopback port in {FIRST}..{END}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_never_handed_out_twice_and_stay_outside_the_ephemeral_range() {
        let ports: Vec<u16> = (0..500).map(|_| free_port()).collect();
        let distinct: BTreeSet<u16> = ports.iter().copied().collect();
        assert_eq!(distinct.len(), ports.len());
        assert!(ports.iter().all(|p| (FIRST..END).contains(p)), "{ports:?}");
    }

    #[test]
    fn a_port_something_listens_on_is_skipped() {
        // Ports 9,000 places into the range, away from what the other test hands out first.
        let start = 9_000;
        let held: Vec<TcpListener> = (0..20)
            .filter_map(|i| TcpListener::bind(("127.0.0.1", FIRST + start + i)).ok())
            .collect();
        assert!(!held.is_empty(), "nothing to hold near {}", FIRST + start);
        let held: BTreeSet<u16> = held
            .iter()
            .map(|l| l.local_addr().unwrap().port())
            .collect();
        let got = free_port_from(u32::from(start));
        assert!(!held.contains(&got), "{got} is listened on");
        assert!(got >= FIRST + start, "{got}");
    }
}
