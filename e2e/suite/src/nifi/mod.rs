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
