//! Rolling changes switchover-first (issue 11, cnpg#7888): the StatefulSet's update strategy is
//! `OnDelete`, and the operator replaces the pods of an old revision itself: standbys first (the
//! highest ordinal first, one at a time, each Ready and streaming again before the next), then a
//! planned switchover to an updated standby (no acknowledged commit lost), then the old primary,
//! by then a standby. Pure: from the pods' revisions and health to the next step.
//!
//! Before failover is engaged (a database still starting, or pods without agents as under kwok)
//! there are no roles to respect: pods are replaced from the highest ordinal, one at a time, once
//! every pod is Ready, which is what the StatefulSet's own RollingUpdate does.

use crate::api::failover::{FailoverStatus, Role};
use crate::operator::database::failover::pass::report_of;
use crate::operator::database::pod_health::PodHealth;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use std::sync::Arc;

/// Pod label of the StatefulSet revision a pod was created from.
const REVISION_LABEL: &str = "controller-revision-hash";

/// One instance as the rolling update sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RollingInstance {
    /// Pod name.
    pub name: String,
    /// StatefulSet ordinal.
    pub ordinal: i32,
    /// Its pod runs the StatefulSet's update revision.
    pub updated: bool,
    /// Its pod exists and is not being deleted.
    pub present: bool,
    /// Its pod exists, is Ready and is not being deleted.
    pub ready: bool,
    /// Standby: its agent reports it streaming from the primary.
    pub streaming: bool,
}

/// What the rolling update does next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RollingStep {
    /// Every pod runs the update revision.
    Done,
    /// A pod is not back yet (or a change is in progress): nothing this pass.
    Wait,
    /// Delete this pod; the StatefulSet recreates it from the update revision.
    Replace(String),
    /// Only the primary is left on the old revision: switch over to this updated standby first.
    SwitchoverTo(String),
}

/// The next step. `primary` is the settled current primary (None while a failover or switchover
/// is in progress, or before failover is engaged, `engaged` false).
pub fn next_step(instances: &[RollingInstance], primary: Option<&str>, engaged: bool) -> RollingStep {
    if instances.iter().all(|instance| instance.updated) {
        return RollingStep::Done;
    }
    // A pod that is not Ready on the old revision serves nothing: replacing it cannot make things
    // worse, and waiting for it would block the change (and the restarts it carries) for good. A
    // primary is left to failover, which turns it into a standby first.
    let stuck = instances.iter().find(|instance| {
        instance.present
            && !instance.ready
            && !instance.updated
            && (!engaged || primary.is_some_and(|primary| primary != instance.name))
    });
    if let Some(stuck) = stuck {
        return RollingStep::Replace(stuck.name.clone());
    }
    if instances.iter().any(|instance| !instance.ready) {
        return RollingStep::Wait;
    }
    let highest_outdated = |include_primary: bool| {
        instances
            .iter()
            .filter(|instance| !instance.updated && (include_primary || Some(instance.name.as_str()) != primary))
            .max_by_key(|instance| instance.ordinal)
            .map(|instance| RollingStep::Replace(instance.name.clone()))
    };
    if !engaged {
        return highest_outdated(true).unwrap_or(RollingStep::Wait);
    }
    let Some(primary) = primary else { return RollingStep::Wait };
    if instances.iter().any(|instance| instance.name != primary && !instance.streaming) {
        return RollingStep::Wait;
    }
    if let Some(step) = highest_outdated(false) {
        return step;
    }
    // Only the primary is outdated: hand over to the lowest updated standby; alone, it restarts.
    instances
        .iter()
        .filter(|instance| instance.updated && instance.name != primary)
        .min_by_key(|instance| instance.ordinal)
        .map_or_else(
            || RollingStep::Replace(primary.to_string()),
            |target| RollingStep::SwitchoverTo(target.name.clone()),
        )
}

/// The next step of an in-place major upgrade (or its rollback): `primary` first, whatever the
/// standbys do (it is down on purpose and failover is held), then, once it is Ready, each
/// outdated standby, one at a time (each clones the new primary afresh).
pub fn primary_first_step(instances: &[RollingInstance], primary: &str) -> RollingStep {
    if instances.iter().all(|instance| instance.updated) {
        return RollingStep::Done;
    }
    let Some(first) = instances.iter().find(|instance| instance.name == primary) else { return RollingStep::Wait };
    if !first.updated {
        return if first.present { RollingStep::Replace(primary.to_string()) } else { RollingStep::Wait };
    }
    if !first.ready || instances.iter().any(|instance| instance.updated && !instance.ready) {
        return RollingStep::Wait;
    }
    instances
        .iter()
        .filter(|instance| !instance.updated && instance.present)
        .max_by_key(|instance| instance.ordinal)
        .map_or(RollingStep::Wait, |instance| RollingStep::Replace(instance.name.clone()))
}

/// The rolling step of this pass, from the cached pods and StatefulSet and the failover status as
/// stored. Nothing while the template changes this pass or the StatefulSet controller has not yet
/// seen the current template. `primary_first`: a major upgrade's order (see
/// [`primary_first_step`]).
pub fn rolling_step(
    pods: &[Arc<Pod>],
    health: &[PodHealth],
    stateful_set: Option<&StatefulSet>,
    failover: &FailoverStatus,
    template_current: bool,
    primary_first: Option<&str>,
) -> RollingStep {
    let Some(stateful_set) = stateful_set.filter(|_| template_current) else { return RollingStep::Wait };
    let status = stateful_set.status.clone().unwrap_or_default();
    if status.observed_generation.unwrap_or(0) < stateful_set.metadata.generation.unwrap_or(0) {
        return RollingStep::Wait;
    }
    let Some(update_revision) = status.update_revision else { return RollingStep::Wait };
    let name = stateful_set.name_any();
    let replicas = stateful_set.spec.replicas.unwrap_or(1);
    let instances: Vec<RollingInstance> = (0..replicas)
        .map(|ordinal| {
            let pod_name = format!("{name}-{ordinal}");
            let found = pods.iter().zip(health).find(|(pod, _)| pod.name_any() == pod_name);
            let present = found.is_some_and(|(_, health)| !health.terminating);
            let report = found.and_then(|(pod, _)| report_of(pod));
            RollingInstance {
                ordinal,
                updated: found.is_some_and(|(pod, _)| pod.labels().get(REVISION_LABEL) == Some(&update_revision)),
                present,
                ready: present && found.is_some_and(|(_, health)| health.ready),
                streaming: report
                    .is_some_and(|report| report.role == Role::Standby && report.wal_receiver && report.postgres_ready),
                name: pod_name,
            }
        })
        .collect();
    let settled = failover.current_primary.is_some()
        && failover.target_primary == failover.current_primary
        && failover.transition.is_none()
        && failover.primary_failing_since.is_none();
    if let Some(primary) = primary_first {
        return primary_first_step(&instances, primary);
    }
    let primary = failover.current_primary.as_deref().filter(|_| settled);
    next_step(&instances, primary, failover.timeline.is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn instance(ordinal: i32, updated: bool) -> RollingInstance {
        RollingInstance { name: format!("db-{ordinal}"), ordinal, updated, present: true, ready: true, streaming: true }
    }

    #[test]
    fn standbys_first_highest_ordinal_first_then_a_switchover_then_the_old_primary() {
        let mut instances = vec![instance(0, false), instance(1, false), instance(2, false)];
        let mut primary = "db-0".to_string();
        let mut steps = Vec::new();
        loop {
            let step = next_step(&instances, Some(&primary), true);
            steps.push(step.clone());
            match step {
                RollingStep::Done | RollingStep::Wait => break,
                RollingStep::Replace(name) => {
                    instances.iter_mut().find(|instance| instance.name == name).unwrap().updated = true;
                }
                RollingStep::SwitchoverTo(name) => primary = name,
            }
        }
        assert_eq!(
            steps,
            vec![
                RollingStep::Replace("db-2".into()),
                RollingStep::Replace("db-1".into()),
                RollingStep::SwitchoverTo("db-1".into()),
                RollingStep::Replace("db-0".into()),
                RollingStep::Done,
            ]
        );
    }

    #[test]
    fn the_primary_is_never_replaced_while_a_standby_could_take_over() {
        // Primary on the highest ordinal: the standbys below it go first all the same.
        let instances = vec![instance(0, false), instance(1, true), instance(2, false)];
        assert_eq!(next_step(&instances, Some("db-2"), true), RollingStep::Replace("db-0".into()));
        let instances = vec![instance(0, true), instance(1, true), instance(2, false)];
        assert_eq!(next_step(&instances, Some("db-2"), true), RollingStep::SwitchoverTo("db-0".into()));
    }

    #[test]
    fn a_standby_stuck_on_the_old_revision_is_replaced_at_once() {
        let mut instances = vec![instance(0, false), instance(1, false), instance(2, false)];
        instances[1].ready = false;
        assert_eq!(next_step(&instances, Some("db-0"), true), RollingStep::Replace("db-1".into()));
        // Not the primary: failover deals with it.
        instances[1].ready = true;
        instances[0].ready = false;
        assert_eq!(next_step(&instances, Some("db-0"), true), RollingStep::Wait);
        // A pod being deleted or not yet created is waited for.
        instances[0].ready = true;
        instances[2].ready = false;
        instances[2].present = false;
        assert_eq!(next_step(&instances, Some("db-0"), true), RollingStep::Wait);
    }

    #[test]
    fn waits_for_every_pod_ready_and_every_standby_streaming() {
        let mut instances = vec![instance(0, false), instance(1, true), instance(2, false)];
        instances[1].ready = false;
        assert_eq!(next_step(&instances, Some("db-0"), true), RollingStep::Wait);
        instances[1].ready = true;
        instances[1].streaming = false;
        assert_eq!(next_step(&instances, Some("db-0"), true), RollingStep::Wait);
        // A change in progress: no settled primary.
        instances[1].streaming = true;
        assert_eq!(next_step(&instances, None, true), RollingStep::Wait);
    }

    #[test]
    fn a_single_instance_is_replaced_in_place_and_nothing_is_done_when_all_are_updated() {
        assert_eq!(next_step(&[instance(0, false)], Some("db-0"), true), RollingStep::Replace("db-0".into()));
        assert_eq!(next_step(&[instance(0, true), instance(1, true)], Some("db-0"), true), RollingStep::Done);
    }

    #[test]
    fn a_major_upgrade_replaces_the_primary_first_then_each_standby_once_it_is_back() {
        let mut instances = vec![instance(0, false), instance(1, false), instance(2, false)];
        instances[1].streaming = false;
        assert_eq!(primary_first_step(&instances, "db-1"), RollingStep::Replace("db-1".into()));
        instances[1].updated = true;
        instances[1].ready = false;
        assert_eq!(primary_first_step(&instances, "db-1"), RollingStep::Wait);
        instances[1].ready = true;
        // Standbys of the old major no longer stream: they are replaced all the same.
        instances[2].streaming = false;
        assert_eq!(primary_first_step(&instances, "db-1"), RollingStep::Replace("db-2".into()));
        instances[2].updated = true;
        instances[2].ready = false;
        assert_eq!(primary_first_step(&instances, "db-1"), RollingStep::Wait);
        instances[2].ready = true;
        assert_eq!(primary_first_step(&instances, "db-1"), RollingStep::Replace("db-0".into()));
        instances[0].updated = true;
        assert_eq!(primary_first_step(&instances, "db-1"), RollingStep::Done);
    }

    #[test]
    fn before_failover_is_engaged_pods_roll_like_a_statefulset_rolling_update() {
        let instances = vec![instance(0, false), instance(1, false)];
        assert_eq!(next_step(&instances, None, false), RollingStep::Replace("db-1".into()));
        let mut instances = vec![instance(0, false), instance(1, true)];
        assert_eq!(next_step(&instances, None, false), RollingStep::Replace("db-0".into()));
        instances[1].ready = false;
        assert_eq!(next_step(&instances, None, false), RollingStep::Wait);
    }
}
