//! What every pass shares: the client, the recorder, the metrics, the settings, and (per
//! leadership term) the caches, the expectations and the leadership signal.

use crate::metrics::Metrics;
use crate::operator::caches::Stores;
use crate::operator::database::settings::ControllerSettings;
use crate::operator::events::EventPublisher;
use crate::operator::expectations::Expectations;
use kube::Client;
use std::sync::Arc;
use tokio::sync::watch;

/// Shared state of the controller, built once by `run`.
pub struct Context {
    /// Kubernetes client.
    pub client: Client,
    /// Event publisher.
    pub recorder: EventPublisher,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Tunables.
    pub settings: ControllerSettings,
    /// Failover timers on this process's clock (kept across leadership terms).
    pub failover_timers: crate::operator::database::failover::clock::TimerClock,
    /// The resourceVersions at which the database Secrets were found in today's form (so that
    /// a Secret's data is read once per change, not on every pass).
    pub checked_secrets: crate::operator::database::checked_secrets::CheckedSecrets,
}

/// State of one leadership term: the caches are built when leadership starts and dropped when it ends.
pub struct PassContext {
    /// The shared state.
    pub shared: Arc<Context>,
    /// The reflector caches every pass reads from.
    pub stores: Stores,
    /// Writes not yet seen in the caches.
    pub expectations: Expectations,
    /// True while this process may write (the leader); a pass is cancelled when it turns false.
    pub leading: watch::Receiver<bool>,
    /// Since when this term has seen each primary Lease's version (kept by a watch).
    pub lease_clock: Arc<crate::operator::database::failover::lease_clock::LeaseClock>,
}

impl PassContext {
    /// Whether this process may still write.
    pub fn may_write(&self) -> bool {
        *self.leading.borrow()
    }
}
