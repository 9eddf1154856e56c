//! The operator process's Prometheus series (CONTRACT §9.1).
use ledger::RunStatus;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DispatchLabels {
    r#type: String,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabel {
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RuleLabel {
    rule: String,
}

pub struct Metrics {
    registry: Registry,
    dispatch: Family<DispatchLabels, Counter>,
    backlog: Family<StatusLabel, Gauge>,
    active_runs: Family<StatusLabel, Gauge>,
    sweeper_actions: Family<RuleLabel, Counter>,
    leader: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let m = Metrics {
            dispatch: Default::default(),
            backlog: Default::default(),
            active_runs: Default::default(),
            sweeper_actions: Default::default(),
            leader: Default::default(),
            registry: Registry::default(),
        };
        registry.register(
            "lca_dispatch",
            "Dispatch outcomes by type and result",
            m.dispatch.clone(),
        );
        registry.register(
            "lca_dispatch_backlog",
            "Outbox rows by status (raw ledger counts)",
            m.backlog.clone(),
        );
        registry.register(
            "lca_active_runs",
            "Runs by status (all 17 statuses)",
            m.active_runs.clone(),
        );
        registry.register(
            "lca_sweeper_actions",
            "Sweeper actions by rule",
            m.sweeper_actions.clone(),
        );
        registry.register("lca_leader", "1 while this process leads", m.leader.clone());
        Metrics { registry, ..m }
    }
}

impl Metrics {
    pub fn dispatch(&self, kind: &str, result: &'static str) {
        self.dispatch
            .get_or_create(&DispatchLabels {
                r#type: kind.to_string(),
                result,
            })
            .inc();
    }

    pub fn sweeper_actions(&self, rule: &str, n: u64) {
        self.sweeper_actions
            .get_or_create(&RuleLabel {
                rule: rule.to_string(),
            })
            .inc_by(n);
    }

    pub fn leading(&self, yes: bool) {
        self.leader.set(yes as i64);
    }

    /// Zero-filled: PENDING/SENT/DEAD and all 17 run statuses always appear.
    pub fn gauges(&self, dispatches: &[(String, i64)], runs: &[(String, i64)]) {
        for s in ["PENDING", "SENT", "DEAD"] {
            let n = dispatches
                .iter()
                .find(|(k, _)| k == s)
                .map_or(0, |(_, n)| *n);
            self.backlog
                .get_or_create(&StatusLabel { status: s.into() })
                .set(n);
        }
        for s in RunStatus::ALL {
            let n = runs
                .iter()
                .find(|(k, _)| k == s.as_str())
                .map_or(0, |(_, n)| *n);
            self.active_runs
                .get_or_create(&StatusLabel {
                    status: s.as_str().into(),
                })
                .set(n);
        }
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}
