//! handoff: Kubernetes admission webhooks that keep workloads whole while they move between
//! clusters. See docs/ARCHITECTURE.md for how it is built (the code's `docs/ARCHITECTURE.md §n`
//! citations are its sections); the binary's entry point is `src/main.rs`.

pub mod admission;
pub mod admission_policy;
pub mod certs;
pub mod config;
pub mod duration;
pub mod resources;
pub mod rules;
pub mod server;
pub mod state;
pub mod webhook;
pub mod window;
pub mod yaml;
