//! What the operator's `/healthz` tells the kubelet and an on-call engineer: whether the process
//! is alive in the sense that matters (its leadership task is running; a wedged event loop does
//! not answer at all) and, as detail that never fails the probe, what it is waiting for
//! (Kubernetes access it cannot have yet) and which leader tasks keep failing (`crashLooping`).
//! Liveness fails only when restarting the container is the cure. A restarted operator container
//! makes its pod unready, taking the healthy api-server beside it out of the Service, so a task
//! that keeps failing (its supervisor already restarts it with backoff), a missing CRD, a 403 or
//! an API server that is away are reported and waited out, never answered with a restart.
use crate::metrics::Metrics;
use serde_json::{Value, json};
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A task restarted this many times within [`CRASH_LOOP_WINDOW`] is crash-looping: named in
/// `/healthz` (`crashLooping`, still 200) and logged at ERROR; liveness is not affected.
pub const CRASH_LOOP_RESTARTS: usize = 5;
pub const CRASH_LOOP_WINDOW: Duration = Duration::from_secs(300);

#[derive(Default)]
struct TaskRecord {
    restarts: u64,
    recent: VecDeque<Instant>,
    last_error: Option<String>,
}

#[derive(Default)]
struct State {
    kubernetes: Option<String>,
    /// What the process waits for before its work can start (a Kubernetes client it cannot
    /// build yet): `/readyz` fails with it, liveness does not.
    starting: Option<String>,
    tasks: BTreeMap<&'static str, TaskRecord>,
    fatal: Option<String>,
}

#[derive(Clone)]
pub struct Health {
    state: Arc<Mutex<State>>,
    metrics: Arc<Metrics>,
}

impl Health {
    pub fn new(metrics: Arc<Metrics>) -> Health {
        Health {
            state: Default::default(),
            metrics,
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What keeps the Kubernetes work from being done (None: nothing).
    pub fn kubernetes(&self, problem: Option<String>) {
        self.metrics.kubernetes_access(problem.is_none());
        self.state().kubernetes = problem;
    }

    /// What keeps the process from starting its work (None: it has started it).
    pub fn starting(&self, waiting_for: Option<String>) {
        self.state().starting = waiting_for;
    }

    /// What the process still waits for before it can start its work, if anything.
    pub fn waiting_for(&self) -> Option<String> {
        self.state().starting.clone()
    }

    /// `task` ended or panicked and is being restarted; returns its restarts in the window.
    pub fn task_failed(&self, task: &'static str, error: &str) -> usize {
        self.metrics.task_restarted(task);
        let mut state = self.state();
        let record = state.tasks.entry(task).or_default();
        let now = Instant::now();
        record.restarts += 1;
        record.recent.push_back(now);
        while record
            .recent
            .front()
            .is_some_and(|t| now.duration_since(*t) > CRASH_LOOP_WINDOW)
        {
            record.recent.pop_front();
        }
        record.last_error = Some(error.to_string());
        record.recent.len()
    }

    /// The process cannot go on (its leadership task died): liveness fails until it exits.
    pub fn fatal(&self, why: String) {
        self.state().fatal = Some(why);
    }

    /// (alive, the JSON body of `/healthz`).
    pub fn report(&self) -> (bool, Value) {
        let state = self.state();
        let now = Instant::now();
        let looping: Vec<&str> = state
            .tasks
            .iter()
            .filter(|(_, r)| {
                r.recent
                    .iter()
                    .filter(|t| now.duration_since(**t) <= CRASH_LOOP_WINDOW)
                    .count()
                    >= CRASH_LOOP_RESTARTS
            })
            .map(|(name, _)| *name)
            .collect();
        // A crash loop is a signal for people (the body, `lca_task_restarts_total`, the log),
        // not for the kubelet: restarting the container would take the pod out of the Service.
        let alive = state.fatal.is_none();
        let tasks: serde_json::Map<String, Value> = state
            .tasks
            .iter()
            .map(|(name, r)| {
                (
                    name.to_string(),
                    json!({"restarts": r.restarts, "lastError": r.last_error}),
                )
            })
            .collect();
        let mut body = json!({
            "status": if !alive { "failing" } else if looping.is_empty() { "ok" } else { "degraded" },
            "kubernetes": state.kubernetes.as_deref().unwrap_or("ok"),
        });
        if !tasks.is_empty() {
            body["tasks"] = Value::Object(tasks);
        }
        if let Some(w) = &state.starting {
            body["waitingFor"] = json!(w);
        }
        if let Some(f) = &state.fatal {
            body["fatal"] = json!(f);
        }
        if !looping.is_empty() {
            body["crashLooping"] = json!(looping);
        }
        (alive, body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waiting_for_kubernetes_is_reported_but_alive() {
        let h = Health::new(Arc::new(Metrics::default()));
        h.kubernetes(Some("the LoadJob custom resource is not installed".into()));
        let (alive, body) = h.report();
        assert!(alive, "{body}");
        assert!(
            body["kubernetes"]
                .as_str()
                .unwrap()
                .contains("not installed")
        );
        h.kubernetes(None);
        assert_eq!(h.report().1["kubernetes"], "ok");
        // No Kubernetes client yet: alive, the reason named (and /readyz fails on it).
        h.starting(Some("no Kubernetes client: connection refused".into()));
        let (alive, body) = h.report();
        assert!(alive, "{body}");
        assert!(body["waitingFor"].as_str().unwrap().contains("refused"));
        assert!(h.waiting_for().is_some());
        h.starting(None);
        assert!(h.report().1.get("waitingFor").is_none());
        assert!(h.waiting_for().is_none());
    }

    #[test]
    fn a_crash_loop_is_reported_but_alive_and_only_a_fatal_state_fails_liveness() {
        let h = Health::new(Arc::new(Metrics::default()));
        for n in 1..CRASH_LOOP_RESTARTS {
            assert_eq!(h.task_failed("mirror", "panicked"), n);
            assert!(h.report().1.get("crashLooping").is_none(), "{n} restarts");
        }
        h.task_failed("mirror", "panicked");
        let (alive, body) = h.report();
        assert!(alive, "{body}");
        assert_eq!(body["status"], "degraded");
        assert_eq!(body["crashLooping"], json!(["mirror"]));
        assert_eq!(body["tasks"]["mirror"]["restarts"], CRASH_LOOP_RESTARTS);

        let h = Health::new(Arc::new(Metrics::default()));
        h.fatal("the leadership task died".into());
        assert!(!h.report().0);
    }
}
