//! `--supervise`: the operator as a child process of itself, started again when a signal kills it
//! (issue 28 item 2).
//!
//! A pod is Ready only while every one of its containers is: an operator container that dies (an
//! OOM kill, a SIGKILL) takes its pod, and with it the api-server beside it, out of the Service
//! until the kubelet has restarted it, after a back-off that grows 10 s, 20 s, 40 s… Measured on
//! the node: 21 s without a ready pod after one round of kills. Under supervision the container's
//! first process is a small supervisor that never does the operator's work; the work runs in a
//! child, which makes itself the OOM killer's first choice (`oom_score_adj` 500). A child killed
//! by a signal is started again at once (then after 1 s, doubling to 30 s while it keeps dying
//! within a minute); the container, and the pod's readiness, stay.
//!
//! What is not absorbed: a child that exits with an error status chose to (an invalid
//! configuration, a panic), and the supervisor exits with the same status, so that the kubelet's
//! restart count and CrashLoopBackOff still show it. SIGTERM and SIGINT are passed on to the
//! child, and the supervisor ends with the child's status.
use std::ffi::OsString;
use std::process::ExitCode;
use std::time::{Duration, Instant};
use tokio::signal::unix::{SignalKind, signal};

/// Set in the child's environment: how many times the supervisor has started it again.
pub const RESTARTS_ENV: &str = "LC_OPERATOR_RESTARTS";
/// The flag that asks for supervision; the child runs without it.
pub const FLAG: &str = "--supervise";
/// Its environment variable, removed from the child's environment.
pub const FLAG_ENV: &str = "LC_SUPERVISE";

const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// A child that ran this long before it was killed starts again at once.
const HEALTHY_RUN: Duration = Duration::from_secs(60);

/// The child's arguments: ours without the supervision flag.
pub fn child_args(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    args.into_iter().filter(|a| a != FLAG).collect()
}

/// In the child: the restart count the supervisor passed, and the OOM killer told to pick this
/// process before the supervisor (raising one's own score needs no privilege).
pub fn child_restarts() -> Option<u64> {
    let restarts = std::env::var(RESTARTS_ENV).ok()?.parse().ok()?;
    let _ = std::fs::write("/proc/self/oom_score_adj", "500");
    Some(restarts)
}

/// One log line in the format of the operator's JSON logs (the supervisor has no configuration,
/// so no logging setup of its own).
fn log(level: &str, event: &str, message: &str, extra: serde_json::Value) {
    let mut line = serde_json::json!({
        "timestamp": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
        "level": level, "message": message, "event": event,
        "target": "load_control_operator::supervisor",
    });
    if let (Some(line), Some(extra)) = (line.as_object_mut(), extra.as_object()) {
        line.extend(extra.clone());
    }
    println!("{line}");
}

fn forward(pid: Option<u32>, sig: libc::c_int) {
    if let Some(pid) = pid.and_then(|p| libc::pid_t::try_from(p).ok()) {
        // SAFETY: kill(2) with a pid we spawned and have not reaped yet.
        unsafe {
            libc::kill(pid, sig);
        }
    }
}

fn exit_code(status: std::process::ExitStatus) -> ExitCode {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        (None, Some(sig)) => ExitCode::from(u8::try_from(128 + sig).unwrap_or(1)),
        _ => ExitCode::FAILURE,
    }
}

/// Runs `exe args` until it ends other than by a signal, or until we are asked to stop.
pub async fn supervise(exe: std::path::PathBuf, args: Vec<OsString>) -> ExitCode {
    use std::os::unix::process::ExitStatusExt;
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        eprintln!("load-control-operator: cannot install signal handlers");
        return ExitCode::FAILURE;
    };
    let mut restarts: u64 = 0;
    let mut backoff = FIRST_BACKOFF;
    loop {
        let started = Instant::now();
        let mut child = match tokio::process::Command::new(&exe)
            .args(&args)
            .env(RESTARTS_ENV, restarts.to_string())
            .env_remove(FLAG_ENV)
            .spawn()
        {
            Ok(c) => c,
            Err(e) => {
                log(
                    "ERROR",
                    "operator_spawn_failed",
                    "cannot start the operator process; retrying",
                    serde_json::json!({"error": e.to_string(), "retry_in_s": backoff.as_secs()}),
                );
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = term.recv() => return ExitCode::SUCCESS,
                    _ = int.recv() => return ExitCode::SUCCESS,
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue;
            }
        };
        let pid = child.id();
        let status = tokio::select! {
            status = child.wait() => status,
            _ = term.recv() => {
                forward(pid, libc::SIGTERM);
                return child.wait().await.map_or(ExitCode::FAILURE, exit_code);
            }
            _ = int.recv() => {
                forward(pid, libc::SIGINT);
                return child.wait().await.map_or(ExitCode::FAILURE, exit_code);
            }
        };
        let status = match status {
            Ok(s) => s,
            Err(e) => {
                eprintln!("load-control-operator: waiting for the operator process: {e}");
                return ExitCode::FAILURE;
            }
        };
        let Some(sig) = status.signal() else {
            // It exited by itself: a stop it decided (an invalid configuration, a panic, or done).
            return exit_code(status);
        };
        let ran = started.elapsed();
        if ran >= HEALTHY_RUN {
            backoff = FIRST_BACKOFF;
        }
        let wait = if restarts == 0 || ran >= HEALTHY_RUN {
            Duration::ZERO
        } else {
            backoff
        };
        restarts += 1;
        log(
            "ERROR",
            "operator_process_killed",
            "the operator process was killed by a signal (an OOM kill?); starting it again: the container, and the api-server beside it, stay",
            serde_json::json!({"signal": sig, "pid": pid, "ran_s": ran.as_secs(),
                "restarts": restarts, "restart_in_s": wait.as_secs()}),
        );
        if !wait.is_zero() {
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = term.recv() => return ExitCode::SUCCESS,
            _ = int.recv() => return ExitCode::SUCCESS,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_child_runs_without_the_flag_and_keeps_the_rest() {
        let args: Vec<OsString> = ["--supervise", "--standalone", "--config", "--supervise-x"]
            .iter()
            .map(OsString::from)
            .collect();
        assert_eq!(
            child_args(args),
            ["--standalone", "--config", "--supervise-x"]
                .iter()
                .map(OsString::from)
                .collect::<Vec<_>>()
        );
    }
}
