//! End-to-end support: the NiFi simulator ([`nifi`]) and the real node the system tests run
//! against ([`node`]).
pub mod bench;
pub mod check;
pub mod lock_watch;
pub mod nifi;
pub mod node;
pub mod oracle;
pub mod release;
pub mod replicated;
pub mod standalone;
