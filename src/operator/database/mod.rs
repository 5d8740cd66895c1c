//! The controller half of the binary: turns each DatabaseService into a running PostgreSQL and
//! keeps it that way. Only the leader runs it (see [`crate::operator::leader`]).
//!
//! A pass is a pipeline of typed stages: [`observe`] (reflector caches, no GET or LIST) →
//! [`decide`] (pure) → [`build`] (pure) → [`apply`] (server-side apply, only what differs) →
//! [`publish`] (ledger, status, events: the only writer of status). Modules import downwards
//! only: names, journal, conditions and health are leaves; wiring is the root.

pub mod access;
pub mod apply;
pub mod archiving;
pub mod build;
pub mod cleanup;
pub mod decide;
pub mod error;
pub mod failover;
pub mod healing;
pub mod observe;
pub mod pod_health;
pub mod pod_replacement;
mod reconcile;
pub mod recovery;
pub mod settings;
pub mod summary;
pub mod wiring;

#[cfg(test)]
mod decide_tests;
