//! Faults of the topology: two primaries lost within seconds (three instances), and a scale-down
//! that would remove the primary.

use super::Bed;
use crate::failover::{epoch_now, DATABASE, SETTLE_TIMEOUT};
use crate::support::eventually;
use dbservice_operator::api::failover::SWITCHOVER_ANNOTATION;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::Api;

#[tokio::test]
async fn two_primaries_lost_within_seconds_of_three_instances_and_a_scale_down_past_the_primary() {
    let fault = "two primary pods deleted within seconds (3 instances)";
    let Some(bed) = Bed::start(fault, 3).await else { return };
    let pods: Api<Pod> = Api::namespaced(bed.client.clone(), bed.ns());
    let first = bed.primary().await;
    let (since, failed_at) = (bed.last_id(), epoch_now());
    pods.delete(&first, &DeleteParams::default()).await.unwrap();
    let second = bed.primary_other_than(&first).await;
    pods.delete(&second, &DeleteParams::default()).await.unwrap();
    let outcome = bed.conclude(fault, failed_at, since).await;
    assert!(outcome.overlaps.is_empty(), "two writable primaries: {:?}", outcome.overlaps);

    // A scale-down that would remove the primary is refused until a switchover moved it.
    let mut primary = bed.primary().await;
    if primary.ends_with("-0") {
        let target = format!("{DATABASE}-2");
        let patch = Patch::Merge(serde_json::json!({"metadata": {"annotations": {SWITCHOVER_ANNOTATION: target}}}));
        bed.databases().patch(DATABASE, &PatchParams::default(), &patch).await.unwrap();
        primary = eventually("the switchover to the highest ordinal", SETTLE_TIMEOUT, || async {
            crate::failover::settled(&bed.client, bed.ns(), 3).await.filter(|now| *now == target)
        })
        .await;
    }
    let ordinal: i32 = primary.rsplit('-').next().unwrap().parse().unwrap();
    let patch = Patch::Merge(serde_json::json!({"spec": {"replicas": ordinal}}));
    let refused = bed.databases().patch(DATABASE, &PatchParams::default(), &patch).await.expect_err("refused");
    let message = refused.to_string();
    assert!(message.contains(&format!("would remove {primary}, the primary")), "{message}");
    assert!(message.contains("switch over first"), "{message}");
    let stateful_sets: Api<StatefulSet> = Api::namespaced(bed.client.clone(), bed.ns());
    let replicas = stateful_sets.get(DATABASE).await.unwrap().spec.replicas;
    assert_eq!(replicas, Some(3), "the StatefulSet keeps every instance");
}
