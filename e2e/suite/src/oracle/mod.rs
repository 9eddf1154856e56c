//! An executable model of CONTRACT.md's effects (GitHub issue 38, item 1) and a seeded
//! generator that compares the real system with it after every request.
//!
//! * [`model`], [`ops_run`], [`ops_extract`], [`ops_late`], [`reads`], [`manifest_rules`]: the
//!   model — the contract's rows (§1) and, for each request of §4, the expected status, the
//!   whole JSON body and the rows afterwards. Written from the contract's words, not from the
//!   ledger's code.
//! * [`request`], [`wire`], [`bodies`], [`generator`], [`generator_runs`]: requests as values, their wire forms (§3.2), and
//!   seeded sequences of them.
//! * [`compare`], [`snapshot`]: answers and rows compared field by field; timestamps by
//!   NULL-ness and by the wall-clock window of the request that wrote them, then held fixed;
//!   server-generated ids learned once and then held fixed.
//! * [`driver`]: the real api-server binary over real HTTP on a real PostgreSQL.
//!
//! Readings chosen where the contract is silent or ambiguous are marked "Ambiguity" in the
//! comments where the model makes them.
pub mod bodies;
pub mod compare;
pub mod driver;
pub mod generator;
pub mod generator_runs;
pub mod manifest_rules;
pub mod model;
pub mod ops_extract;
pub mod ops_late;
pub mod ops_run;
pub mod reads;
pub mod request;
pub mod snapshot;
pub mod wire;
