//! A StatefulSet whose immutable fields differ from the desired one (a StatefulSet made by an
//! older operator version) cannot be applied: the apiserver refuses the change. It is deleted
//! with its pods and ControllerRevisions orphaned, and re-created by the next pass under the
//! same name and selector; the StatefulSet controller adopts the running pods (their template
//! hash is unchanged, so none is replaced). PostgreSQL keeps running throughout; the volumes
//! are never touched.

use crate::operator::caches::diff::LiveValue;
use k8s_openapi::api::apps::v1::StatefulSet;
use kube::api::{DeleteParams, Preconditions, PropagationPolicy};
use kube::{Api, ResourceExt};
use serde_json::Value;

/// What the live StatefulSet needs before the desired one can be applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Replacement {
    /// Nothing: apply as usual.
    None,
    /// An immutable field differs (named): delete it with its pods orphaned.
    Orphan { field: &'static str, uid: String },
    /// An orphaning deletion is under way: wait until it is gone, then create.
    Pending,
}

/// Immutable StatefulSet spec fields the operator sets and may change between versions.
const IMMUTABLE_FIELDS: [(&str, &str); 2] = [("podManagementPolicy", "OrderedReady"), ("serviceName", "")];

/// Pure: compares the live StatefulSet (as JSON) with the desired one.
pub fn replacement(live: &Value, desired: &StatefulSet) -> Replacement {
    if !live["metadata"]["deletionTimestamp"].is_null() {
        return Replacement::Pending;
    }
    let desired_spec = serde_json::to_value(&desired.spec).unwrap_or_default();
    for (field, default) in IMMUTABLE_FIELDS {
        let Some(wanted) = desired_spec[field].as_str() else { continue };
        let current = live["spec"][field].as_str().unwrap_or(default);
        if current != wanted {
            let uid = live["metadata"]["uid"].as_str().unwrap_or_default().to_string();
            return Replacement::Orphan { field, uid };
        }
    }
    Replacement::None
}

/// Decides for the cached StatefulSet and deletes it (orphaning its pods) when needed. Returns
/// true when the desired StatefulSet must not be applied in this pass.
pub async fn replace_if_needed(
    api: &Api<StatefulSet>,
    live: &impl LiveValue,
    desired: &StatefulSet,
) -> Result<bool, kube::Error> {
    match replacement(&live.live_value(), desired) {
        Replacement::None => Ok(false),
        Replacement::Pending => Ok(true),
        Replacement::Orphan { field, uid } => {
            tracing::info!(stateful_set = %desired.name_any(), field, "immutable field changed: re-creating the StatefulSet, its pods orphaned and adopted back");
            let params = DeleteParams {
                propagation_policy: Some(PropagationPolicy::Orphan),
                // A StatefulSet re-created meanwhile by someone else is not ours to delete.
                preconditions: Some(Preconditions { uid: Some(uid), resource_version: None }),
                ..Default::default()
            };
            match api.delete(&desired.name_any(), &params).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(response)) if response.code == 404 => Ok(true),
                Err(error) => Err(error),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::StatefulSetSpec;
    use serde_json::json;

    fn desired(policy: &str) -> StatefulSet {
        StatefulSet {
            spec: StatefulSetSpec {
                pod_management_policy: Some(policy.into()),
                service_name: Some("orders-headless".into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn an_ordered_ready_stateful_set_is_replaced_for_parallel() {
        let live = json!({"metadata": {"uid": "u1"}, "spec": {"podManagementPolicy": "OrderedReady", "serviceName": "orders-headless"}});
        assert_eq!(
            replacement(&live, &desired("Parallel")),
            Replacement::Orphan { field: "podManagementPolicy", uid: "u1".into() }
        );
        // The apiserver's default is OrderedReady: a live object without the field is one too.
        let defaulted = json!({"metadata": {"uid": "u1"}, "spec": {"serviceName": "orders-headless"}});
        assert!(matches!(replacement(&defaulted, &desired("Parallel")), Replacement::Orphan { .. }));
    }

    #[test]
    fn a_matching_stateful_set_is_applied_and_one_being_deleted_is_waited_for() {
        let live = json!({"metadata": {"uid": "u1"}, "spec": {"podManagementPolicy": "Parallel", "serviceName": "orders-headless"}});
        assert_eq!(replacement(&live, &desired("Parallel")), Replacement::None);
        let deleting = json!({"metadata": {"uid": "u1", "deletionTimestamp": "2026-12-04T16:00:00Z"}, "spec": {}});
        assert_eq!(replacement(&deleting, &desired("Parallel")), Replacement::Pending);
    }

    #[test]
    fn a_changed_service_name_is_replaced_too() {
        let live =
            json!({"metadata": {"uid": "u2"}, "spec": {"podManagementPolicy": "Parallel", "serviceName": "orders"}});
        assert_eq!(
            replacement(&live, &desired("Parallel")),
            Replacement::Orphan { field: "serviceName", uid: "u2".into() }
        );
    }
}
