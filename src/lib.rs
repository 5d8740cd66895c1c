//! dbservice-operator: admission webhooks and a self-healing controller for PostgreSQL,
//! in one binary. `main.rs` only parses the command line and calls into [`run`].
//!
//! The house, by who runs the code (a module imports only from its own layer or the ones below;
//! `tests/module_graph.rs` enforces the order and the absence of circles):
//!
//! 1. vocabulary, pure and shared: [`quantity`], [`lsn`], [`schedule`], [`lease`], [`certificates`];
//! 2. process plumbing: [`metrics`], [`client`];
//! 3. [`api`]: the CRD types of both kinds, their status, names and the pod contract, the CRD itself;
//! 4. [`store`]: the object-store engine (WAL archive, base backups, restore, catalogue, retention);
//! 5. [`admission`]: the one validation function, defaulting, the HTTPS webhook server;
//! 6. [`operator`]: the controllers (DatabaseService, backups), their caches, leader election;
//! 7. [`instance`]: the agent that runs in every database pod beside PostgreSQL; [`pooler`]: the
//!    agent beside PgBouncer in every pooler pod;
//! 8. the process: [`cli`], [`telemetry`], [`run`].

pub mod admission;
pub mod api;
pub mod certificates;
pub mod cli;
pub mod client;
pub mod instance;
pub mod lease;
pub mod lsn;
pub mod metrics;
pub mod operator;
pub mod passfile;
pub mod plugin;
pub mod pooler;
pub mod postgres_tls;
pub mod quantity;
pub mod run;
pub mod schedule;
pub mod store;
pub mod telemetry;
