//! The HTTPS side of load-control's listeners, one implementation for both processes: the
//! api-server's `server.port`, and the operator's metrics and health listener with
//! `worker.metrics_tls` (the same certificate, key and client-certificate check).
pub mod reload;
pub mod tls;
