//! Which faults the simulator injects, how often, and how many it did inject (by kind).
use rand::Rng;
use std::collections::BTreeMap;
use std::sync::Mutex;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// The same request delivered twice at once.
    Duplicate,
    /// The request applied, its response lost, the call retried.
    LostResponse,
    /// A NiFi node dies after reporting part of a partition (the sweeper must reissue it).
    NodeCrash,
    /// A superseded owner reports after the partition was claimed again.
    LateReport,
    /// A publish whose outcome is unknown (PUBLISH_UNKNOWN).
    PublishUnknown,
}

#[derive(Debug, Default)]
pub struct Faults {
    pub duplicate: f64,
    pub lost_response: f64,
    pub node_crash: f64,
    pub late_report: f64,
    pub publish_unknown: f64,
    injected: Mutex<BTreeMap<FaultKind, u64>>,
}

impl Faults {
    pub fn new(
        duplicate: f64,
        lost_response: f64,
        node_crash: f64,
        late_report: f64,
        publish_unknown: f64,
    ) -> Faults {
        Faults {
            duplicate,
            lost_response,
            node_crash,
            late_report,
            publish_unknown,
            injected: Default::default(),
        }
    }

    fn rate(&self, kind: FaultKind) -> f64 {
        match kind {
            FaultKind::Duplicate => self.duplicate,
            FaultKind::LostResponse => self.lost_response,
            FaultKind::NodeCrash => self.node_crash,
            FaultKind::LateReport => self.late_report,
            FaultKind::PublishUnknown => self.publish_unknown,
        }
    }

    /// Draws whether to inject `kind` now, and counts it when it is.
    pub fn draw(&self, kind: FaultKind) -> bool {
        let rate = self.rate(kind);
        let hit = rate > 0.0 && rand::rng().random_bool(rate.min(1.0));
        if hit {
            self.record(kind);
        }
        hit
    }

    pub fn record(&self, kind: FaultKind) {
        *self.injected.lock().unwrap().entry(kind).or_default() += 1;
    }

    pub fn injected(&self) -> BTreeMap<FaultKind, u64> {
        self.injected.lock().unwrap().clone()
    }
}
