//! Leader election through a `coordination.k8s.io` Lease, the client-go way: acquire when the
//! Lease is free or expired (optimistic concurrency on resourceVersion), renew every third of
//! the duration, step down *before* the Lease could expire when renewals fail, and release it on
//! shutdown so that a successor (polling every second) takes over within about a second.
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
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// How often a follower looks at the Lease.
const FOLLOWER_POLL: Duration = Duration::from_secs(1);

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

fn now() -> MicroTime {
    MicroTime(Timestamp::now())
}

fn expired(spec: &LeaseSpec) -> bool {
    let Some(renewed) = spec.renew_time.as_ref().or(spec.acquire_time.as_ref()) else {
        return true;
    };
    let duration = spec.lease_duration_seconds.unwrap_or(0).max(0) as i64;
    renewed.0.as_second() + duration < Timestamp::now().as_second()
}

impl LeaderElection {
    /// Runs until `shutdown` turns true, publishing leadership on the returned channel.
    /// On shutdown the Lease is released if held.
    pub fn spawn(
        self,
        client: Client,
        metrics: Arc<Metrics>,
        shutdown: watch::Receiver<bool>,
    ) -> (watch::Receiver<bool>, tokio::task::JoinHandle<()>) {
        let (sender, receiver) = watch::channel(false);
        let handle = tokio::spawn(async move { self.run(client, metrics, sender, shutdown).await });
        (receiver, handle)
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
        // Step down with a margin so that we stop writing before anyone else may take over.
        let give_up_after = self.lease_duration.mul_f64(0.7);
        let mut last_renewal: Option<Instant> = None;
        loop {
            let holding = match self.try_acquire_or_renew(&leases).await {
                Ok(holding) => {
                    if holding {
                        last_renewal = Some(Instant::now());
                    }
                    holding
                }
                Err(error) => {
                    tracing::warn!(%error, lease = %self.lease_name, "cannot renew or acquire the leader Lease");
                    last_renewal.is_some_and(|renewed| renewed.elapsed() < give_up_after)
                }
            };
            if !holding {
                last_renewal = None;
            }
            if *leader.borrow() != holding {
                metrics.leader.set(i64::from(holding));
                metrics.leadership_changes.inc();
                if holding {
                    tracing::info!(identity = %self.identity, lease = %self.lease_name, "became the leader");
                } else {
                    tracing::warn!(identity = %self.identity, lease = %self.lease_name, "lost leadership; stopping the controller");
                }
                let _ = leader.send(holding);
            }
            let wait = if holding { renew_every } else { FOLLOWER_POLL };
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = shutdown.wait_for(|stop| *stop) => break,
            }
        }
        if *leader.borrow() {
            let _ = leader.send(false);
            metrics.leader.set(0);
            metrics.leadership_changes.inc();
            match self.release(&leases).await {
                Ok(()) => tracing::info!(identity = %self.identity, "released the leader Lease"),
                Err(error) => tracing::warn!(%error, "could not release the leader Lease; it will expire"),
            }
        }
    }

    /// One round: returns whether we hold the Lease afterwards.
    async fn try_acquire_or_renew(&self, leases: &Api<Lease>) -> Result<bool, kube::Error> {
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
        let free = spec.holder_identity.as_deref().unwrap_or("").is_empty() || expired(&spec);
        if !ours && !free {
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
