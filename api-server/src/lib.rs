//! The load-control HTTP API (CONTRACT §3–§4): NiFi- and operator-facing endpoints over the ledger.
pub mod access;
pub mod app;
pub mod auth;
pub mod bodies;
pub mod edge;
pub mod error;
pub mod extract;
pub mod handlers;
pub mod input;
pub mod keep_alive;
pub mod metrics;
pub mod openapi;
pub mod requests;
pub mod server;
pub mod watched_body;
pub use lcconfig::{config, logging};
pub use serving_tls::{reload, tls};
