//! Leader election through a `coordination.k8s.io` Lease, the client-go way, without split brain.
//!
//! - The holder leads until a *deadline*: the moment its last successful renewal was sent plus
//!   [`STEP_DOWN_FRACTION`] of the duration. The deadline ends leadership whatever the renewal
//!   call is doing (erroring, retrying, hanging): the call is raced against it and dropped.
//! - Lease calls go through their own client: a short timeout and no retries (kube's default
//!   client retries 429/503/504 for minutes and has no read timeout).
//! - Followers time expiry from when *they* observed the Lease change, never from the holder's
//!   `renewTime` (another machine's clock). The holder's deadline counts from before it sent the
//!   renewal, so it always ends before any follower may take over: a follower sees the renewal
//!   no earlier than it was sent and waits the full duration from then.
//! - On step-down, writes stop at once: [`crate::client::CallGuardLayer`] refuses new writes of
//!   the controller's client and cancels those in flight, so in-flight reconciles fail before
//!   they write again.
//! - The Lease is released on shutdown so that a successor (polling every second) takes over
//!   within about a second.
//!
//! Written here rather than taken from kube-lease-manager because that crate's followers sleep
//! until the Lease expires (a released Lease is only noticed a full duration later) and its
//! holder does not report a failed renewal on its state channel.

use crate::metrics::Metrics;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;
use tokio::sync::watch;
use tokio::time::Instant;

/// How often a follower looks at the Lease.
const FOLLOWER_POLL: Duration = Duration::from_secs(1);
/// Leadership ends this fraction of the duration after the last successful renewal was sent.
pub const STEP_DOWN_FRACTION: f64 = 0.7;

/// Settings of one elector.
#[derive(Clone, Debug)]
pub struct LeaderElection {
    /// Namespace of the Lease (the operator's own).
    pub namespace: String,
    /// Lease name.
    pub lease_name: String,
    /// This process's identity (its pod name).
    pub identity: String,
    /// Lease duration.
    pub lease_duration: Duration,
}

/// One round with the Lease failed.
#[derive(Debug, Error)]
pub enum LeaseRoundError {
    /// The apiserver answered with an error or could not be reached.
    #[error("lease request failed: {0}")]
    Api(#[from] kube::Error),
    /// The round did not finish within the per-round timeout.
    #[error("lease request timed out after {0:?}")]
    Timeout(Duration),
}

/// What a follower last saw of the Lease, and when (on its own clock).
#[derive(Debug, Clone, PartialEq)]
struct Observation {
    holder: String,
    renew_time: Option<MicroTime>,
    duration_seconds: i32,
    transitions: Option<i32>,
}

#[derive(Debug, Default)]
struct Observed {
    last: Option<(Observation, Instant)>,
}

impl Observed {
    /// Records the Lease as seen now; returns whether it is free to take.
    fn free(&mut self, spec: &LeaseSpec) -> bool {
        let observation = Observation {
            holder: spec.holder_identity.clone().unwrap_or_default(),
            renew_time: spec.renew_time.clone(),
            duration_seconds: spec.lease_duration_seconds.unwrap_or(0),
            transitions: spec.lease_transitions,
        };
        if observation.holder.is_empty() {
            return true;
        }
        let seen_at = match &self.last {
            Some((last, seen_at)) if *last == observation => *seen_at,
            _ => {
                self.last = Some((observation.clone(), Instant::now()));
                Instant::now()
            }
        };
        crate::lease::expired(seen_at.elapsed(), Duration::from_secs(observation.duration_seconds.max(0) as u64))
    }
}

fn now() -> MicroTime {
    MicroTime(Timestamp::now())
}

/// Sleeps until `deadline`, or forever without one.
async fn until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

impl LeaderElection {
    /// Time one round (a GET and a PUT) may take: a fifth of the duration, at most 5 s.
    pub fn round_timeout(&self) -> Duration {
        (self.lease_duration / 5).min(Duration::from_secs(5))
    }

    /// How long after the last successful renewal leadership ends.
    pub fn step_down_after(&self) -> Duration {
        self.lease_duration.mul_f64(STEP_DOWN_FRACTION)
    }

    /// The Lease client: short timeouts and no retries, so no call outlives the deadline.
    pub fn lease_client(&self, config: &kube::Config) -> Result<Client, kube::Error> {
        let mut config = config.clone();
        config.default_retry = false;
        config.connect_timeout = Some(self.round_timeout());
        config.read_timeout = Some(self.round_timeout());
        config.write_timeout = Some(self.round_timeout());
        config.reset_reader_on_write = true;
        Client::try_from(config)
    }

    /// Runs until `shutdown` turns true, publishing leadership on the returned channel (true
    /// while leading). On shutdown the Lease is released if held.
    pub fn spawn(
        self,
        config: &kube::Config,
        metrics: Arc<Metrics>,
        shutdown: watch::Receiver<bool>,
    ) -> Result<(watch::Receiver<bool>, tokio::task::JoinHandle<()>), kube::Error> {
        let client = self.lease_client(config)?;
        let (sender, receiver) = watch::channel(false);
        let handle = tokio::spawn(async move { self.run(client, metrics, sender, shutdown).await });
        Ok((receiver, handle))
    }

    async fn run(
        self,
        client: Client,
        metrics: Arc<Metrics>,
        leader: watch::Sender<bool>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let leases: Api<Lease> = Api::namespaced(client, &self.namespace);
        let renew_every = self.lease_duration / 3;
        let retry_every = (self.lease_duration / 10).max(Duration::from_millis(200));
        let mut observed = Observed::default();
        // Some(deadline) while leading.
        let mut leading_until: Option<Instant> = None;
        loop {
            let sent_at = Instant::now();
            let round = tokio::time::timeout(self.round_timeout(), self.try_acquire_or_renew(&leases, &mut observed));
            let outcome = tokio::select! {
                outcome = round => Some(outcome),
                _ = until(leading_until) => None,
                _ = shutdown.wait_for(|stop| *stop) => break,
            };
            let wait = match outcome {
                // The deadline passed while the round was still running: the round is dropped.
                None => {
                    leading_until = None;
                    FOLLOWER_POLL
                }
                Some(Ok(Ok(true))) => {
                    leading_until = Some(sent_at + self.step_down_after());
                    renew_every
                }
                Some(Ok(Ok(false))) => {
                    leading_until = None;
                    FOLLOWER_POLL
                }
                Some(Ok(Err(error))) => self.failed(LeaseRoundError::Api(error), leading_until, retry_every),
                Some(Err(_)) => self.failed(LeaseRoundError::Timeout(self.round_timeout()), leading_until, retry_every),
            };
            self.publish(&leader, &metrics, leading_until.is_some());
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = until(leading_until) => {
                    leading_until = None;
                    self.publish(&leader, &metrics, false);
                }
                _ = shutdown.wait_for(|stop| *stop) => break,
            }
        }
        if *leader.borrow() {
            self.publish(&leader, &metrics, false);
            match tokio::time::timeout(self.round_timeout(), self.release(&leases)).await {
                Ok(Ok(())) => tracing::info!(identity = %self.identity, "released the leader Lease"),
                Ok(Err(error)) => tracing::warn!(%error, "could not release the leader Lease; it will expire"),
                Err(_) => tracing::warn!("releasing the leader Lease timed out; it will expire"),
            }
        }
    }

    fn failed(&self, error: LeaseRoundError, leading_until: Option<Instant>, retry_every: Duration) -> Duration {
        tracing::warn!(%error, lease = %self.lease_name, "cannot renew or acquire the leader Lease");
        if leading_until.is_some() {
            retry_every
        } else {
            FOLLOWER_POLL
        }
    }

    fn publish(&self, leader: &watch::Sender<bool>, metrics: &Metrics, leading: bool) {
        if *leader.borrow() == leading {
            return;
        }
        metrics.leader.set(i64::from(leading));
        metrics.leadership_changes.inc();
        if leading {
            tracing::info!(identity = %self.identity, lease = %self.lease_name, "became the leader");
        } else {
            tracing::warn!(identity = %self.identity, lease = %self.lease_name, "lost leadership; stopping the controller");
        }
        let _ = leader.send(leading);
    }

    /// One round: returns whether we hold the Lease afterwards.
    async fn try_acquire_or_renew(&self, leases: &Api<Lease>, observed: &mut Observed) -> Result<bool, kube::Error> {
        let duration_seconds = self.lease_duration.as_secs() as i32;
        let Some(mut lease) = leases.get_opt(&self.lease_name).await? else {
            let lease = Lease {
                metadata: ObjectMeta { name: Some(self.lease_name.clone()), ..Default::default() },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    lease_duration_seconds: Some(duration_seconds),
                    acquire_time: Some(now()),
                    renew_time: Some(now()),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return match leases.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
                Err(error) => Err(error),
            };
        };
        let mut spec = lease.spec.clone().unwrap_or_default();
        let ours = spec.holder_identity.as_deref() == Some(self.identity.as_str());
        if !ours && !observed.free(&spec) {
            return Ok(false);
        }
        if !ours {
            spec.holder_identity = Some(self.identity.clone());
            spec.acquire_time = Some(now());
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        spec.renew_time = Some(now());
        spec.lease_duration_seconds = Some(duration_seconds);
        lease.spec = Some(spec);
        // replace carries the resourceVersion we read: a concurrent acquirer gets a 409.
        match leases.replace(&self.lease_name, &PostParams::default(), &lease).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
            Err(error) => Err(error),
        }
    }

    async fn release(&self, leases: &Api<Lease>) -> Result<(), kube::Error> {
        let Some(mut lease) = leases.get_opt(&self.lease_name).await? else {
            return Ok(());
        };
        let mut spec = lease.spec.clone().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(now());
        lease.spec = Some(spec);
        leases.replace(&self.lease_name, &PostParams::default(), &lease).await.map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 26: a term that never finishes on its own (a Controller waiting for a cache whose
    /// first list will never complete) is dropped TERM_DRAIN after the end of the term, so the
    /// process can exit.
    #[tokio::test(start_paused = true)]
    async fn a_term_that_does_not_stop_is_dropped_after_the_drain_time() {
        let (leader_sender, leader) = watch::channel(true);
        let (shutdown_sender, shutdown) = watch::channel(false);
        let started = Instant::now();
        let dropped = Arc::new(std::sync::atomic::AtomicBool::new(false));
        struct Guard(Arc<std::sync::atomic::AtomicBool>);
        impl Drop for Guard {
            fn drop(&mut self) {
                self.0.store(true, std::sync::atomic::Ordering::SeqCst);
            }
        }
        let running = tokio::spawn(run_each_term("stuck", leader, shutdown, {
            let dropped = dropped.clone();
            move |_end| {
                let guard = Guard(dropped.clone());
                async move {
                    let _guard = guard;
                    std::future::pending::<()>().await
                }
            }
        }));
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(!running.is_finished(), "the term runs while it leads");
        shutdown_sender.send(true).unwrap();
        let stopping = Instant::now();
        running.await.unwrap();
        assert!(dropped.load(std::sync::atomic::Ordering::SeqCst), "the stuck term was dropped");
        let took = stopping.elapsed();
        assert!(took >= TERM_DRAIN && took < TERM_DRAIN + Duration::from_millis(100), "stopped after {took:?}");
        assert!(started.elapsed() >= Duration::from_secs(60));
        drop(leader_sender);
    }

    fn spec(holder: &str, renewed_seconds: i64) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(1),
            renew_time: Some(MicroTime(Timestamp::from_second(renewed_seconds).unwrap())),
            ..Default::default()
        }
    }

    /// A renewTime far in the past (a holder with a slow clock) does not make the Lease free:
    /// only the follower's own observation of it counts.
    #[tokio::test(start_paused = true)]
    async fn followers_time_expiry_from_their_own_observation() {
        let mut observed = Observed::default();
        assert!(!observed.free(&spec("other", 0)), "free on first sight despite an ancient renewTime");
        tokio::time::advance(Duration::from_millis(900)).await;
        assert!(!observed.free(&spec("other", 0)));
        // A renewal restarts the follower's clock.
        assert!(!observed.free(&spec("other", 1)));
        tokio::time::advance(Duration::from_millis(900)).await;
        assert!(!observed.free(&spec("other", 1)));
        tokio::time::advance(Duration::from_millis(200)).await;
        assert!(observed.free(&spec("other", 1)));
        assert!(observed.free(&LeaseSpec::default()), "a released Lease is free at once");
    }
}

/// The end of one leadership term: leadership lost, or the process shutting down.
#[derive(Clone)]
pub struct TermEnd {
    leader: watch::Receiver<bool>,
    shutdown: watch::Receiver<bool>,
}

impl TermEnd {
    /// Completes when the term ends.
    pub async fn reached(mut self) {
        tokio::select! {
            _ = self.leader.wait_for(|leading| !*leading) => {}
            _ = self.shutdown.wait_for(|stop| *stop) => {}
        }
    }
}

/// How long a term may take to stop after it ended before it is dropped.
pub const TERM_DRAIN: Duration = Duration::from_secs(3);

/// Runs `term` once per leadership term: each time `leader` turns true, `term` runs until it
/// returns (it is handed the [`TermEnd`] to stop on); returns when `shutdown` turns true.
pub async fn run_each_term<Term, Running>(
    what: &str,
    mut leader: watch::Receiver<bool>,
    mut shutdown: watch::Receiver<bool>,
    mut term: Term,
) where
    Term: FnMut(TermEnd) -> Running,
    Running: std::future::Future<Output = ()>,
{
    loop {
        tokio::select! {
            _ = leader.wait_for(|leading| *leading) => {}
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
        tracing::info!("starting the {what}");
        let end = TermEnd { leader: leader.clone(), shutdown: shutdown.clone() };
        let running = term(end.clone());
        tokio::pin!(running);
        // Passes in flight are cancelled when the term ends, but a term can still wait on things
        // nobody drives any more (a cache that never finished its first list): past the drain
        // time it is dropped, which cancels whatever it still runs.
        tokio::select! {
            _ = &mut running => tracing::info!("{what} stopped"),
            _ = async { end.reached().await; tokio::time::sleep(TERM_DRAIN).await } => {
                tracing::warn!("{what} did not stop within {TERM_DRAIN:?} of the end of the term; dropped");
            }
        }
        if *shutdown.borrow() {
            return;
        }
    }
}
