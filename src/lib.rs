//! dbservice-operator: admission webhooks and a self-healing controller for PostgreSQL,
//! in one binary. `main.rs` only parses the command line and calls into [`run`].

pub mod api;
pub mod backup;
pub mod certificates;
pub mod cli;
pub mod client;
pub mod controller;
pub mod crd;
pub mod failover;
pub mod instance;
pub mod leader;
pub mod metrics;
pub mod mutation;
pub mod quantity;
pub mod run;
pub mod telemetry;
pub mod validation;
pub mod webhook;
pub mod yaml;
