//! The sweeper loop (CONTRACT §7.2): one fenced tick per `recovery.sweeper_interval` while leading,
//! and the backlog gauges (and the database's xid/MultiXact ages) refreshed every interval by
//! every process.
use crate::metrics::Metrics;
use ledger::{Fence, Ledger, LedgerError};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

pub struct Sweeper {
    pub ledger: Ledger,
    pub interval: Duration,
    pub metrics: Arc<Metrics>,
    pub deposed: crate::leadership::Deposed,
}

impl Sweeper {
    pub async fn run(
        self: Arc<Self>,
        fence: watch::Receiver<Option<Fence>>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let mut tick = tokio::time::interval(self.interval);
        loop {
            tokio::select! {
                _ = shutdown.changed() => break,
                _ = tick.tick() => {}
            }
            let current = fence.borrow().clone();
            if let Some(f) = current {
                self.tick(&f).await;
            }
            self.refresh_gauges().await;
        }
    }

    pub async fn tick(&self, fence: &Fence) {
        match self.ledger.sweep(fence).await {
            Ok(Some(report)) => {
                for (rule, n) in &report.actions {
                    self.metrics.sweeper_actions(rule, *n);
                }
                for (kind, n) in &report.dead_by_type {
                    for _ in 0..*n {
                        self.metrics.dispatch(kind, "dead");
                    }
                }
                if !report.actions.is_empty() {
                    tracing::warn!(event = "sweeper_actions", actions = ?report.actions, "sweeper acted");
                }
            }
            Ok(None) => tracing::debug!(
                event = "sweeper_skipped",
                "another sweeper holds the tick lock"
            ),
            Err(LedgerError::Fenced { .. }) => {
                tracing::warn!(
                    event = "fenced",
                    epoch = fence.epoch,
                    "sweeper tick refused: this process no longer leads"
                );
                self.deposed.report(fence.epoch);
            }
            Err(e) => tracing::error!(event = "sweeper_error", error = %e, "sweeper tick failed"),
        }
    }

    pub async fn refresh_gauges(&self) {
        match self.ledger.backlog_gauges().await {
            Ok(g) => {
                self.metrics.gauges(&g.dispatches, &g.runs);
                self.metrics.database_age(g.xid_age, g.mxid_age);
            }
            Err(e) => {
                tracing::warn!(event = "gauges_error", error = %e, "refreshing gauges failed")
            }
        }
        match self.ledger.alert_counts().await {
            Ok(counts) => self.metrics.monitor_alerts(&counts),
            Err(e) => tracing::warn!(
                event = "gauges_error",
                error = %e,
                "counting the monitor's alerts failed"
            ),
        }
    }
}
