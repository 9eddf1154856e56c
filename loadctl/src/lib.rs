//! loadctl's parts: the API client, the tables, and the live terminal dashboard.
pub mod client;
pub mod dashboard;
pub mod kube_mode;
pub mod render;
pub mod resend;
