//! A NiFi simulator for load-control. It plays the process groups of CONTRACT §0.2 over the real
//! HTTP API, with the contract's bodies (the manifest's numbers as strings, as NiFi's
//! AttributesToJSON sends them), and PG-05 as strict as NiFi (§12). Faults: duplicate delivery,
//! lost responses, late reports of superseded owners, nodes crashing mid-partition, publishes of
//! unknown outcome, a slow or refusing PG-05.
//!
//! | PG | what the simulator does |
//! |---|---|
//! | PG-05 | [`receiver`]: receives dispatches, answers 202, starts PG-40 or PG-20 |
//! | PG-10 | creates each run and registers its manifest |
//! | PG-20 | N nodes, two concurrent calls each: claim partitions, report chunks |
//! | PG-40 | acknowledges VALIDATE_RUN, sends STAGING metrics, asks for the verdict |
//! | PG-50 | claims the publish and reports its outcome |
//! | PG-60 | sends TARGET metrics and reports success |
//! | PG-90 | reports failures (`/fail`) |
pub mod api;
pub mod faults;
mod flows;
pub mod receiver;

pub use flows::{Plan, Simulation, Summary, complete_published};

/// The chaos suites' fault mix (issue 10): 20 % duplicates, 10 % lost responses, 10 % of
/// partitions on a node that crashes halfway, and every superseded owner reporting late.
pub const CHAOS_FAULTS: &[&str] = &[
    "--duplicate",
    "0.2",
    "--lost-response",
    "0.1",
    "--node-crash",
    "0.1",
    "--late-report",
    "1.0",
];

/// The parts of a simulation's summary that explain a failure, a few short lines each: the whole
/// summary is one line of hundreds of run ids, which CI's excerpt of a failed run cuts away.
pub fn what_went_wrong(summary: &serde_json::Value) -> String {
    let mut lines = vec![format!("final status: {}", summary["final_status"])];
    for (name, value) in [
        ("anomalies", &summary["anomalies"]),
        ("unfinished", &summary["unfinished"]),
        ("gave up", &summary["gave_up"]),
        ("PG-05 rejected", &summary["receiver"]["rejected"]),
    ] {
        let items = value.as_array().map(Vec::as_slice).unwrap_or_default();
        lines.push(format!("{name}: {}", items.len()));
        for item in items.iter().take(5) {
            let text = item
                .as_str()
                .map(str::to_string)
                .unwrap_or(item.to_string());
            lines.push(format!("  {}", text.chars().take(300).collect::<String>()));
        }
    }
    lines.push(format!("failed attempts: {}", summary["failed_attempts"]));
    lines.join("\n")
}
