//! Configuration and logging shared by `load-control-api` and `load-control-operator`
//! (CONTRACT §9.2, §10).
pub mod config;
mod error;
mod load;
pub mod logging;
pub mod redact;
pub mod reference;
