//! One module per ledger operation; each is one transaction (CONTRACT §3.9).
pub mod chunk;
pub mod claim;
mod complete;
pub mod create;
mod end;
pub mod manifest;
pub mod partition_fail;
pub mod read;
pub mod run_fail;
