//! Observing health: pure functions from the live pods, StatefulSet and PVCs to facts the
//! reconciler decides on (ready, crash-looping, unschedulable, rolled out, volumes bound).

use chrono::{DateTime, Utc};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::ResourceExt;

/// Health of one pod.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodHealth {
    /// Pod name.
    pub name: String,
    /// StatefulSet ordinal.
    pub ordinal: i32,
    /// Passing its readiness probe.
    pub ready: bool,
    /// A container waits in CrashLoopBackOff (or keeps restarting).
    pub crash_looping: bool,
    /// The scheduler cannot place it (lack of resources).
    pub unschedulable: bool,
    /// Since when the pod has been unschedulable or not ready (condition transition time).
    pub unhealthy_since: Option<DateTime<Utc>>,
    /// Image of the postgres container.
    pub image: String,
    /// The scheduler's reason when it cannot place the pod (its `PodScheduled` message).
    pub unschedulable_reason: Option<String>,
    /// Being deleted.
    pub terminating: bool,
}

/// Reads the health of one pod from its status.
pub fn pod_health(pod: &Pod) -> PodHealth {
    let name = pod.name_any();
    let status = pod.status.clone().unwrap_or_default();
    let conditions = status.conditions.unwrap_or_default();
    let condition = |kind: &str| conditions.iter().find(|condition| condition.type_ == kind);
    let ready = condition("Ready").is_some_and(|condition| condition.status == "True");
    let unschedulable = condition("PodScheduled")
        .is_some_and(|condition| condition.status == "False" && condition.reason.as_deref() == Some("Unschedulable"));
    let crash_looping = status.container_statuses.unwrap_or_default().iter().any(|container| {
        container.state.as_ref().and_then(|state| state.waiting.as_ref()).and_then(|waiting| waiting.reason.as_deref())
            == Some("CrashLoopBackOff")
    });
    let since_condition = if unschedulable { condition("PodScheduled") } else { condition("Ready") };
    let unhealthy_since = if ready {
        None
    } else {
        since_condition
            .and_then(|condition| condition.last_transition_time.as_ref())
            .and_then(|time| DateTime::from_timestamp(time.0.as_second(), 0))
            .or_else(|| {
                pod.metadata
                    .creation_timestamp
                    .as_ref()
                    .and_then(|time| DateTime::from_timestamp(time.0.as_second(), 0))
            })
    };
    let image = pod
        .spec
        .as_ref()
        .and_then(|spec| spec.containers.iter().find(|container| container.name == "postgres"))
        .and_then(|container| container.image.clone())
        .unwrap_or_default();
    PodHealth {
        ordinal: crate::api::names::instance_ordinal(&name).unwrap_or(-1),
        name,
        ready,
        crash_looping,
        unschedulable,
        unhealthy_since,
        image,
        unschedulable_reason: condition("PodScheduled")
            .filter(|_| unschedulable)
            .and_then(|condition| condition.message.clone()),
        terminating: pod.metadata.deletion_timestamp.is_some(),
    }
}

/// Whether the StatefulSet runs `image` on `replicas` ready pods with nothing left to roll.
pub fn rolled_out(stateful_set: Option<&StatefulSet>, pods: &[PodHealth], image: &str, replicas: i32) -> bool {
    let Some(stateful_set) = stateful_set else {
        return false;
    };
    let status = stateful_set.status.clone().unwrap_or_default();
    let observed = status.observed_generation.unwrap_or(0) >= stateful_set.metadata.generation.unwrap_or(0);
    // With updateStrategy OnDelete the StatefulSet controller never advances currentRevision:
    // every replica on the update revision is what says the rollout is done.
    let same_revision = status.update_revision.is_some()
        && (status.current_revision == status.update_revision || status.updated_replicas.unwrap_or(0) >= replicas);
    let live_pods: Vec<&PodHealth> = pods.iter().filter(|pod| !pod.terminating && pod.ordinal < replicas).collect();
    observed
        && same_revision
        && status.ready_replicas.unwrap_or(0) >= replicas
        && live_pods.len() as i32 == replicas
        && live_pods.iter().all(|pod| pod.ready && pod.image == image)
}

/// Pods that need a restart: crash-looping or not ready for longer than `threshold_seconds`.
pub fn unhealthy_pods(pods: &[PodHealth], now: DateTime<Utc>, threshold_seconds: i64) -> Vec<&PodHealth> {
    pods.iter()
        .filter(|pod| !pod.terminating && !pod.unschedulable)
        .filter(|pod| {
            pod.crash_looping
                || pod.unhealthy_since.is_some_and(|since| (now - since).num_seconds() >= threshold_seconds)
        })
        .collect()
}

/// How many leading instances (ordinals 0..n) to keep when some instance has been unschedulable
/// for at least `threshold_seconds`: up to the first stuck standby, or only the primary when the
/// primary itself is stuck (removing standbys frees resources for it). None when nothing is stuck.
pub fn schedulable_prefix(
    pods: &[PodHealth],
    replicas: i32,
    now: DateTime<Utc>,
    threshold_seconds: i64,
) -> Option<i32> {
    let stuck: Vec<i32> = pods
        .iter()
        .filter(|pod| pod.ordinal >= 0 && pod.ordinal < replicas && pod.unschedulable)
        .filter(|pod| pod.unhealthy_since.is_some_and(|since| (now - since).num_seconds() >= threshold_seconds))
        .map(|pod| pod.ordinal)
        .collect();
    stuck.into_iter().min().map(|first| first.max(1))
}

/// How many of `claims` are bound.
pub fn claims_bound<'a>(claims: impl IntoIterator<Item = &'a PersistentVolumeClaim>) -> i32 {
    claims
        .into_iter()
        .filter(|claim| claim.status.as_ref().and_then(|status| status.phase.as_deref()) == Some("Bound"))
        .count() as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ordinal: i32, unschedulable_for: Option<i64>, now: DateTime<Utc>) -> PodHealth {
        PodHealth {
            name: format!("db-{ordinal}"),
            ordinal,
            ready: unschedulable_for.is_none(),
            crash_looping: false,
            unschedulable: unschedulable_for.is_some(),
            unhealthy_since: unschedulable_for.map(|seconds| now - chrono::Duration::seconds(seconds)),
            image: "postgres:16.4".into(),
            unschedulable_reason: None,
            terminating: false,
        }
    }

    #[test]
    fn a_stuck_standby_keeps_the_instances_before_it() {
        let now = Utc::now();
        let pods = [pod(0, None, now), pod(1, None, now), pod(2, Some(120), now)];
        assert_eq!(schedulable_prefix(&pods, 3, now, 60), Some(2));
    }

    #[test]
    fn a_stuck_primary_keeps_only_the_primary() {
        let now = Utc::now();
        let pods = [pod(0, Some(120), now), pod(1, None, now)];
        assert_eq!(schedulable_prefix(&pods, 2, now, 60), Some(1));
    }

    #[test]
    fn nothing_is_degraded_before_the_threshold_or_when_all_are_scheduled() {
        let now = Utc::now();
        assert_eq!(schedulable_prefix(&[pod(0, None, now), pod(1, Some(10), now)], 2, now, 60), None);
        assert_eq!(schedulable_prefix(&[pod(0, None, now), pod(1, None, now)], 2, now, 60), None);
    }
}
