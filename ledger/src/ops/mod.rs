//! One module per ledger operation; each is one transaction (CONTRACT §3.9).
pub mod chunk;
pub mod claim;
pub mod cleanup;
mod complete;
pub mod create;
pub mod dispatch;
pub mod jobs;
pub mod leader;
pub mod manifest;
pub mod monitor;
pub mod operator;
pub mod partition_fail;
pub mod publish;
pub mod read;
pub mod run_fail;
pub mod sweeper;
mod transition;
pub mod validation;
