//! End-to-end support: the NiFi simulator ([`nifi`]) and the real node the system tests run
//! against ([`node`]).
pub mod nifi;
pub mod node;
