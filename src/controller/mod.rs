//! The controller half of the binary: turns each DatabaseService into a running PostgreSQL and
//! keeps it that way. Only the leader runs it (see [`crate::leader`]).
//!
//! A pass is a pipeline of typed stages: [`observe`] (reflector caches, no GET or LIST) →
//! [`decide`] (pure) → [`build`] (pure) → [`apply`] (server-side apply, only what differs) →
//! [`publish`] (ledger, status, events: the only writer of status). Modules import downwards
//! only: names, journal, conditions and health are leaves; wiring is the root.

pub mod access;
pub mod apply;
pub mod archiving;
pub mod build;
pub mod children;
pub mod cleanup;
pub mod compact;
pub mod conditions;
pub mod context;
pub mod decide;
pub mod diff;
pub mod error;
pub mod events;
pub mod expectations;
pub mod failover;
pub mod health;
pub mod journal;
pub mod ledger;
pub mod names;
pub mod observe;
pub mod packed;
pub mod publish;
mod reconcile;
pub mod rolling;
pub mod rollout;
pub mod settings;
pub mod summary;
mod wiring;

#[cfg(test)]
mod decide_tests;

pub use context::Context;
pub use error::{ReconcileError, Step};
pub use settings::ControllerSettings;
pub(crate) use wiring::scoped;
pub use wiring::{run_while_leader, DatabaseSubscription};

use kube::Client;

/// The event publisher for this process.
pub fn recorder(client: Client, identity: &str) -> events::EventPublisher {
    events::EventPublisher::new(client, "dbservice-operator", identity)
}
