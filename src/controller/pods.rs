//! Pods: the role labels the standby Service selects on, and pods stuck broken on an old revision.

use super::reconcile::Journal;
use crate::controller::build::ROLE_LABEL;
use crate::controller::health::{self, PodHealth};
use crate::controller::{Context, ReconcileError};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;

/// Labels each pod with its role and deletes pods stuck not ready on an old image once the
/// template is current, so a rollout or rollback can proceed.
pub(super) async fn reconcile_pods(
    pods_api: &Api<Pod>,
    pods: &[Pod],
    health: &[PodHealth],
    image: &str,
    template_current: bool,
    journal: &mut Journal,
    context: &Context,
) -> Result<(), ReconcileError> {
    for (pod, pod_health) in pods.iter().zip(health) {
        if pod_health.terminating {
            continue;
        }
        let role = health::expected_role(&pod_health.name);
        if pod.labels().get(ROLE_LABEL).map(String::as_str) != Some(role) {
            let label = Patch::Merge(json!({"metadata": {"labels": {ROLE_LABEL: role}}}));
            match pods_api.patch(&pod_health.name, &PatchParams::default(), &label).await {
                Ok(_) => context.metrics.count_write("Pod", "label"),
                // The pod went away since we listed it (scale-down, restart): nothing to label.
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(error) => return Err(error.into()),
            }
        }
        if template_current && pod_health.image != image && !pod_health.ready && !pod_health.unschedulable {
            match pods_api.delete(&pod_health.name, &DeleteParams::default()).await {
                Ok(_) | Err(kube::Error::Api(_)) => {}
                Err(error) => return Err(error.into()),
            }
            context.metrics.count_write("Pod", "delete");
            journal.record(
                false,
                "ReplacedStuckPod",
                format!(
                    "pod {} was not ready on an old revision ({}); deleted so it comes back with {image}",
                    pod_health.name, pod_health.image
                ),
                None,
            );
        }
    }
    Ok(())
}
