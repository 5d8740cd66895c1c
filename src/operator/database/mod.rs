//! The DatabaseService controller: turns each DatabaseService into a running PostgreSQL and
//! keeps it that way. Only the leader runs it (see [`crate::operator::leader`]).
//!
//! A pass is a pipeline of typed stages: [`observe`] (reflector caches, no GET or LIST) →
//! [`decide`] (pure: [`healing`], [`failover`], [`archiving`], [`recovery`], [`summary`]) →
//! [`build`] (pure) → [`apply`] (server-side apply, only what differs; returns an
//! [`Applied`](decide::Applied) report that decide turns into events and ledger entries) →
//! [`crate::operator::publish`] (ledger, status, events: the only writer of status, for
//! [`cleanup`] too). [`wiring`] builds the Controller and its watches.

pub mod access;
pub mod apply;
pub mod archiving;
pub mod build;
pub mod certificates;
pub mod checked_secrets;
pub mod cleanup;
pub mod credentials_form;
pub mod decide;
pub mod discarded;
pub mod durability;
pub mod error;
pub mod failover;
pub mod healing;
pub mod hibernation;
pub mod lease_watch;
pub mod major_upgrade;
pub mod observe;
pub mod owned_settings;
pub mod pod_health;
pub mod pod_replacement;
pub mod pooler;
mod reconcile;
pub mod recovery;
pub mod recovery_source;
pub mod requests;
pub mod settings;
pub mod stateful_set_replacement;
pub mod storage_growth;
pub mod summary;
pub mod wiring;

#[cfg(test)]
mod decide_tests;
