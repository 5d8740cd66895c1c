//! A planned switchover before a drain (issue 21): `kubectl drain` cordons the node first, then
//! evicts its pods, and the primary's PodDisruptionBudget refuses the primary's eviction while the
//! database has a standby. The operator sees the cordon and switches over to a standby on a node
//! that is not cordoned; the former primary is then a standby, which its budget lets go.

use crate::api::failover::{FailoverStatus, Role};
use crate::operator::database::failover::pass::report_of;
use crate::operator::database::pod_health::PodHealth;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use std::collections::BTreeSet;
use std::sync::Arc;

fn node_of(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref()?.node_name.as_deref()
}

/// The standby to switch over to because the primary's node is cordoned: the ready, streaming
/// standby on a node that is not cordoned with the most WAL received. None while a change is
/// under way, when the primary's node is not cordoned, or when no standby qualifies (the drain
/// then waits on the budget, as it should).
pub fn drain_switchover(
    status: &FailoverStatus,
    pods: &[Arc<Pod>],
    health: &[PodHealth],
    cordoned: &BTreeSet<String>,
) -> Option<String> {
    let primary = status.current_primary.as_deref()?;
    if status.target_primary.as_deref() != Some(primary) || status.transition.is_some() || cordoned.is_empty() {
        return None;
    }
    let primary_pod = pods.iter().find(|pod| pod.name_any() == primary)?;
    if !node_of(primary_pod).is_some_and(|node| cordoned.contains(node)) {
        return None;
    }
    pods.iter()
        .zip(health)
        .filter(|(pod, health)| pod.name_any() != primary && health.ready && !health.terminating)
        .filter(|(pod, _)| node_of(pod).is_some_and(|node| !cordoned.contains(node)))
        .filter_map(|(pod, _)| {
            let report = report_of(pod)?;
            (report.role == Role::Standby && report.postgres_ready && report.wal_receiver)
                .then(|| (report.received_lsn, pod.name_any()))
        })
        .max()
        .map(|(_, name)| name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::failover::{InstanceReport, INSTANCE_REPORT_ANNOTATION};
    use crate::lsn::Lsn;

    fn pod(name: &str, node: &str, report: Option<InstanceReport>) -> Arc<Pod> {
        let mut pod = Pod::default();
        pod.metadata.name = Some(name.into());
        pod.spec = Some(k8s_openapi::api::core::v1::PodSpec { node_name: Some(node.into()), ..Default::default() });
        if let Some(report) = report {
            pod.metadata.annotations =
                Some([(INSTANCE_REPORT_ANNOTATION.to_string(), serde_json::to_string(&report).unwrap())].into());
        }
        Arc::new(pod)
    }

    fn standby(received: u64) -> InstanceReport {
        InstanceReport {
            role: Role::Standby,
            timeline: 1,
            received_lsn: Some(Lsn(received)),
            replay_lsn: None,
            wal_receiver: true,
            postgres_ready: true,
            fenced: false,
            disk_full: false,
            shutdown_checkpoint_lsn: None,
            parameters: None,
            pending_restart: Vec::new(),
            declared: None,
            import: None,
            major_upgrade: None,
            owned_settings_reverted: None,
            waits_for: None,
            discarded_on_rejoin: None,
            reloaded: None,
            volume: None,
            archiving: None,
        }
    }

    fn healthy(count: usize) -> Vec<PodHealth> {
        (0..count).map(|_| PodHealth { ready: true, ..PodHealth::default() }).collect()
    }

    fn settled(primary: &str) -> FailoverStatus {
        FailoverStatus {
            current_primary: Some(primary.into()),
            target_primary: Some(primary.into()),
            timeline: Some(1),
            ..Default::default()
        }
    }

    #[test]
    fn a_cordoned_primary_node_switches_to_the_most_advanced_standby_elsewhere() {
        let pods = [
            pod("db-0", "a", None),
            pod("db-1", "b", Some(standby(100))),
            pod("db-2", "c", Some(standby(200))),
            pod("db-3", "a", Some(standby(300))), // on the cordoned node too
        ];
        let cordoned = BTreeSet::from(["a".to_string()]);
        assert_eq!(drain_switchover(&settled("db-0"), &pods, &healthy(4), &cordoned), Some("db-2".into()));
        // Not cordoned, or cordoned elsewhere: nothing.
        assert_eq!(drain_switchover(&settled("db-0"), &pods, &healthy(4), &BTreeSet::new()), None);
        let elsewhere = BTreeSet::from(["b".to_string()]);
        assert_eq!(drain_switchover(&settled("db-0"), &pods, &healthy(4), &elsewhere), None);
    }

    #[test]
    fn no_switchover_without_a_healthy_streaming_standby_or_during_a_change() {
        let cordoned = BTreeSet::from(["a".to_string()]);
        let not_streaming = InstanceReport { wal_receiver: false, ..standby(100) };
        let pods = [pod("db-0", "a", None), pod("db-1", "b", Some(not_streaming)), pod("db-2", "c", None)];
        assert_eq!(drain_switchover(&settled("db-0"), &pods, &healthy(3), &cordoned), None);
        let pods = [pod("db-0", "a", None), pod("db-1", "b", Some(standby(1)))];
        let not_ready = vec![PodHealth { ready: true, ..PodHealth::default() }, PodHealth::default()];
        assert_eq!(drain_switchover(&settled("db-0"), &pods, &not_ready, &cordoned), None);
        let changing = FailoverStatus { target_primary: Some("db-1".into()), ..settled("db-0") };
        assert_eq!(drain_switchover(&changing, &pods, &healthy(2), &cordoned), None);
        assert_eq!(drain_switchover(&settled("db-0"), &pods, &healthy(2), &cordoned), Some("db-1".into()));
    }
}
