//! The operator process (ARCHITECTURE "operator", CONTRACT §6–§7): leadership with a fencing
//! epoch, the dispatcher that delivers outbox rows to NiFi PG-05, and the sweeper. Every ledger
//! write goes through one fenced ledger operation; this crate only decides when to call them and
//! makes the HTTP calls in between.
pub mod dispatcher;
pub mod health;
pub mod kube_context;
pub mod leadership;
pub mod lease;
pub mod loadjob_controller;
pub mod loadrun_mirror;
pub mod loadrun_requests;
pub mod metrics;
pub mod metrics_listener;
pub mod mirror_queue;
pub mod nifi_tls;
pub mod orphan_jobs;
pub mod process;
pub mod scope;
pub mod supervisor;
pub mod sweeper;
pub mod uninstall;
