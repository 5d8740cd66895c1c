//! Build (pure): the StatefulSet running PostgreSQL, assembled from its parts (containers,
//! volumes, security), then decorated for archiving and recovery.

use crate::api::database_service::DatabaseService;
use crate::api::names::{labels, selector_labels, ChildNames};
use crate::api::pod::{RESTART_ANNOTATION, RESTART_PARAMETERS_ANNOTATION};
use crate::operator::database::build::container::{agent_init_container, postgres_container};
use crate::operator::database::build::security::database_pod_security_context;
use crate::operator::database::build::volumes::{claim_template, pod_volumes};
use crate::operator::database::build::{archiving, major_upgrade, metadata, placement, recovery, WorkloadInputs};
use k8s_openapi::api::apps::v1::{
    StatefulSet, StatefulSetPersistentVolumeClaimRetentionPolicy, StatefulSetSpec, StatefulSetUpdateStrategy,
};
use k8s_openapi::api::core::v1::{PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use kube::ResourceExt;
use std::collections::BTreeMap;

/// The pod template: labels, the restart stamp, and the pod.
fn pod_template(database: &DatabaseService, inputs: &WorkloadInputs) -> PodTemplateSpec {
    let name = database.name_any();
    let with_agent = inputs.instance_image.is_some();
    let mut annotations: BTreeMap<String, String> =
        inputs.restarted_at.iter().map(|restarted_at| (RESTART_ANNOTATION.to_string(), restarted_at.clone())).collect();
    // Only the parameters a reload cannot apply roll the pods (the agents reload the others);
    // none set, no annotation, so that databases made before it do not roll.
    let major = crate::api::version::major_version(&database.spec.version).unwrap_or_default();
    let restart_parameters = crate::api::postgresql::restart_parameters(major, &database.spec.parameters());
    if !restart_parameters.is_empty() {
        annotations.insert(
            RESTART_PARAMETERS_ANNOTATION.to_string(),
            crate::api::postgresql::fingerprint(&restart_parameters),
        );
    }
    let mut pod = PodSpec {
        containers: vec![postgres_container(database, inputs)],
        init_containers: inputs.instance_image.as_deref().map(|image| vec![agent_init_container(image)]),
        // Only the agent talks to the API, with its own least-privilege account.
        service_account_name: with_agent.then(|| ChildNames::instance_account(&name)),
        automount_service_account_token: Some(with_agent),
        enable_service_links: Some(false),
        termination_grace_period_seconds: Some(30),
        security_context: Some(database_pod_security_context()),
        volumes: Some(pod_volumes(database, with_agent)),
        ..Default::default()
    };
    // Archiving and recovery need our binary in the pod, so they follow spec.backup and
    // spec.bootstrap.recovery only when the operator knows its image.
    placement::add_placement(&mut pod, database);
    if with_agent {
        archiving::add_archiving(&mut pod, database);
        recovery::add_recovery(&mut pod, database);
        major_upgrade::add_major_upgrade(&mut pod, database, inputs);
    }
    PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(labels(&name)),
            annotations: (!annotations.is_empty()).then_some(annotations),
            ..Default::default()
        }),
        spec: Some(pod),
    }
}

/// The StatefulSet running PostgreSQL.
pub fn stateful_set(database: &DatabaseService, inputs: &WorkloadInputs) -> StatefulSet {
    let name = database.name_any();
    StatefulSet {
        metadata: metadata(database, name.clone()),
        spec: StatefulSetSpec {
            replicas: Some(inputs.replicas),
            service_name: Some(ChildNames::headless_service(&name)),
            selector: LabelSelector { match_labels: Some(selector_labels(&name)), ..Default::default() },
            // Parallel: a missing pod is re-created whatever state the others are in. With
            // OrderedReady a standby stuck mid-clone (its source lost) blocked the re-creation of
            // a higher ordinal that held the only copy of the newest commits. Order is the
            // agents' business anyway: a standby waits for a named primary before it clones.
            pod_management_policy: Some("Parallel".into()),
            // The operator replaces pods itself, standbys first and the primary only after a
            // switchover (operator::database::pod_replacement); a RollingUpdate would replace the
            // primary's pod whenever its ordinal comes up.
            update_strategy: Some(StatefulSetUpdateStrategy { type_: Some("OnDelete".into()), rolling_update: None }),
            // Never delete data volumes on scale-down or deletion: the finalizer decides.
            persistent_volume_claim_retention_policy: Some(StatefulSetPersistentVolumeClaimRetentionPolicy {
                when_deleted: Some("Retain".into()),
                when_scaled: Some("Retain".into()),
            }),
            template: pod_template(database, inputs),
            volume_claim_templates: Some(vec![claim_template(database, inputs)]),
            ..Default::default()
        },
        ..Default::default()
    }
}
