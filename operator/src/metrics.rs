//! The operator process's Prometheus series (CONTRACT §9.1).
use ledger::RunStatus;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
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
struct KindLabel {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RuleLabel {
    rule: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReconcileLabels {
    controller: &'static str,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TaskLabel {
    task: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ControllerLabel {
    controller: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CertLabel {
    cert: &'static str,
}

fn reconcile_histogram() -> Histogram {
    Histogram::new([
        0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    ])
}

pub struct Metrics {
    registry: Registry,
    dispatch: Family<DispatchLabels, Counter>,
    backlog: Family<StatusLabel, Gauge>,
    active_runs: Family<StatusLabel, Gauge>,
    monitor_alerts: Family<KindLabel, Gauge>,
    sweeper_actions: Family<RuleLabel, Counter>,
    leader: Gauge,
    owned_by_other: Gauge,
    reconciles: Family<ReconcileLabels, Counter>,
    reconcile_seconds: Family<ControllerLabel, Histogram, fn() -> Histogram>,
    task_restarts: Family<TaskLabel, Counter>,
    process_restarts: Counter,
    kubernetes_access: Gauge,
    xid_age: Gauge,
    mxid_age: Gauge,
    orphan_undecided: Gauge,
    orphans_removed: Counter,
    ledger_went_back: Counter,
    certificate_expiry: Family<CertLabel, Gauge>,
    certificate_reload: Family<CertLabel, Gauge>,
    certificate_reload_failures: Family<CertLabel, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let m = Metrics {
            dispatch: Default::default(),
            backlog: Default::default(),
            active_runs: Default::default(),
            monitor_alerts: Default::default(),
            sweeper_actions: Default::default(),
            leader: Default::default(),
            owned_by_other: Default::default(),
            reconciles: Default::default(),
            reconcile_seconds: Family::new_with_constructor(
                reconcile_histogram as fn() -> Histogram,
            ),
            task_restarts: Default::default(),
            process_restarts: Default::default(),
            kubernetes_access: Default::default(),
            xid_age: Default::default(),
            mxid_age: Default::default(),
            orphan_undecided: Default::default(),
            orphans_removed: Default::default(),
            ledger_went_back: Default::default(),
            certificate_expiry: Default::default(),
            certificate_reload: Default::default(),
            certificate_reload_failures: Default::default(),
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
            "lca_monitor_alerts",
            "The monitor's alerts by kind, as loadctl monitor lists them: PUBLISH_UNKNOWN, DISPATCH_DEAD, RUN_FAILED (a run of the failed class ended within 24 h), RUN_STALE (an active run without progress beyond its job's stale threshold), CLEANUP_FAILED",
            m.monitor_alerts.clone(),
        );
        registry.register(
            "lca_sweeper_actions",
            "Sweeper actions by rule",
            m.sweeper_actions.clone(),
        );
        registry.register("lca_leader", "1 while this process leads", m.leader.clone());
        registry.register(
            "lca_ledger_owned_by_other",
            "1 while another load-control release (installation) owns this ledger database: this one does not lead (give each release its own database)",
            m.owned_by_other.clone(),
        );
        registry.register(
            "lca_reconcile",
            "Kubernetes reconciles by controller (loadjob, loadrun_mirror) and result (ok, or the error class: invalid, conflict, transient, not_leading)",
            m.reconciles.clone(),
        );
        registry.register(
            "lca_reconcile_seconds",
            "Duration of Kubernetes reconciles by controller",
            m.reconcile_seconds.clone(),
        );
        registry.register(
            "lca_operator_process_restarts",
            "Times the supervisor (--supervise, the chart's default) started the operator process again after a signal killed it (an OOM kill), since the container started",
            m.process_restarts.clone(),
        );
        registry.register(
            "lca_task_restarts",
            "Restarts of a supervised task (dispatcher, sweeper, loadjob_controller, loadrun_mirror, loadrun_listen, access_watch) after it ended or panicked",
            m.task_restarts.clone(),
        );
        registry.register(
            "lca_kubernetes_access",
            "1 while LoadJobs and LoadRuns are served and readable in the watched scope (Kubernetes mode)",
            m.kubernetes_access.clone(),
        );
        registry.register(
            "lca_database_xid_age",
            "Transaction-id age of the ledger's database, age(datfrozenxid): wraparound protection starts near 2^31",
            m.xid_age.clone(),
        );
        registry.register(
            "lca_database_mxid_age",
            "MultiXact age of the ledger's database, mxid_age(datminmxid)",
            m.mxid_age.clone(),
        );
        registry.register(
            "lca_orphan_sweep_undecided",
            "1 while the last orphan sweep could not tell which LoadJobs exist (the LoadJob kind not served): it marked no ledger job removed",
            m.orphan_undecided.clone(),
        );
        registry.register(
            "lca_orphan_jobs_removed",
            "Ledger jobs the orphan sweep marked removed (their LoadJob confirmed gone)",
            m.orphans_removed.clone(),
        );
        registry.register(
            "lca_ledger_went_back",
            "Times this process found the ledger holding an older past than it had seen (its clock or leader epoch lower): a restore from backup, or a failover to a standby that lacked commits. See the runbook \"After a restore\"",
            m.ledger_went_back.clone(),
        );
        registry.register(
            "lca_certificate_expiry_timestamp_seconds",
            "Unix time at which the certificate in use expires (its notAfter), by cert (nifi_client: the client certificate presented to NiFi)",
            m.certificate_expiry.clone(),
        );
        registry.register(
            "lca_certificate_last_reload_timestamp_seconds",
            "Unix time the certificate files in use were (re)loaded, by cert",
            m.certificate_reload.clone(),
        );
        registry.register(
            "lca_certificate_reload_failures",
            "Certificate files that could not be used (unreadable, or not a usable certificate and key): the previous ones stay in use",
            m.certificate_reload_failures.clone(),
        );
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

    /// One reconcile of `controller` that ended with `result` after `seconds`.
    pub fn reconciled(&self, controller: &'static str, result: &'static str, seconds: f64) {
        self.reconciles
            .get_or_create(&ReconcileLabels { controller, result })
            .inc();
        self.reconcile_seconds
            .get_or_create(&ControllerLabel { controller })
            .observe(seconds);
    }

    /// The supervisor's count of restarts before this process (set once, at start).
    pub fn process_restarts(&self, n: u64) {
        self.process_restarts.inc_by(n);
    }

    pub fn task_restarted(&self, task: &'static str) {
        self.task_restarts.get_or_create(&TaskLabel { task }).inc();
    }

    pub fn kubernetes_access(&self, ok: bool) {
        self.kubernetes_access.set(ok as i64);
    }

    /// One orphan sweep: whether it could not tell (the LoadJob kind not served), and how many
    /// jobs it marked removed.
    pub fn orphan_sweep(&self, undecided: bool, removed: u64) {
        self.orphan_undecided.set(undecided as i64);
        self.orphans_removed.inc_by(removed);
    }

    /// The ledger's count of times it was found gone back ([`ledger::Ledger::went_back_count`]),
    /// carried into the counter.
    pub fn ledger_went_back_to(&self, total: u64) {
        let counted = self.ledger_went_back.get();
        self.ledger_went_back.inc_by(total.saturating_sub(counted));
    }

    /// Certificate files of `cert` now in use; `not_after` is the certificate's expiry (none:
    /// only a CA bundle).
    pub fn certificate_reloaded(&self, cert: &'static str, not_after: Option<i64>) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        self.certificate_reload
            .get_or_create(&CertLabel { cert })
            .set(now);
        if let Some(t) = not_after {
            self.certificate_expiry
                .get_or_create(&CertLabel { cert })
                .set(t);
        }
    }

    pub fn certificate_reload_failed(&self, cert: &'static str) {
        self.certificate_reload_failures
            .get_or_create(&CertLabel { cert })
            .inc();
    }

    pub fn leading(&self, yes: bool) {
        self.leader.set(yes as i64);
    }

    /// Whether another installation's fresh claim owns the ledger (`lca_ledger_owned_by_other`).
    pub fn owned_by_other(&self, yes: bool) {
        self.owned_by_other.set(yes as i64);
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

    /// `lca_monitor_alerts{kind}`, every kind (zero included).
    pub fn monitor_alerts(&self, counts: &[(String, i64)]) {
        for (kind, n) in counts {
            self.monitor_alerts
                .get_or_create(&KindLabel { kind: kind.clone() })
                .set(*n);
        }
    }

    /// `lca_database_xid_age` and `lca_database_mxid_age`, refreshed with the other gauges.
    pub fn database_age(&self, xid_age: i64, mxid_age: i64) {
        self.xid_age.set(xid_age);
        self.mxid_age.set(mxid_age);
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}
