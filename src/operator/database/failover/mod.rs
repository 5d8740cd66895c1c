//! Failover (issue 11): [`decide`] is the pure decision from what the API shows — persisted
//! failover status, pods, the reports instance agents publish on their pods, the primary Lease —
//! to what the operator does next; [`pass`] is the failover step of a reconcile pass around it
//! (observations in, status, journal and workload changes out). No client in here. Because every
//! input is in the API, an operator that restarts in the middle of a failover resumes from the
//! same state.
//!
//! Design and reasons: docs/failover.md.

pub mod clock;
pub mod decide;
pub mod drain;
pub mod lease_clock;
pub mod pass;

#[cfg(test)]
mod tests;

pub use decide::{decide, Action, Decision, Observed, Rejection};
