//! Build (pure): the PodDisruptionBudgets of a database's instances. `NAME-primary` selects the
//! pod labelled primary and, while the database has a standby, allows no eviction: a drain waits
//! until the operator has switched over (the primary is then a standby). `NAME-standbys` allows
//! one standby at a time (at least all standbys but one stay). Both always exist (an owner reference removes them with the database),
//! so that scaling to one instance or turning them off changes them instead of deleting them: a
//! budget that would block a single instance's drain forever allows it.

use crate::api::database_service::DatabaseService;
use crate::api::names::{selector_labels, ChildNames, PRIMARY_ROLE, ROLE_LABEL, STANDBY_ROLE};
use crate::operator::database::build::metadata;
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;

fn budget(database: &DatabaseService, name: String, role: &str, min_available: i32) -> PodDisruptionBudget {
    let mut selected = selector_labels(&database.name_any());
    selected.insert(ROLE_LABEL.into(), role.into());
    PodDisruptionBudget {
        metadata: metadata(database, name),
        spec: Some(PodDisruptionBudgetSpec {
            selector: Some(LabelSelector { match_labels: Some(selected), ..Default::default() }),
            // A count, not maxUnavailable: that one is taken against the StatefulSet's replicas,
            // of which each budget selects only a part (the disruption controller would count
            // three expected pods for the two standbys and allow no eviction at all).
            min_available: Some(IntOrString::Int(min_available)),
            // A standby that is not ready (still catching up) may be evicted: it serves nobody.
            unhealthy_pod_eviction_policy: Some("AlwaysAllow".into()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The primary's and the standbys' budgets for `replicas` instances.
pub fn disruption_budgets(database: &DatabaseService, replicas: i32) -> Vec<PodDisruptionBudget> {
    let name = database.name_any();
    let enabled = database.spec.placement.disruption_budget_enabled();
    let primary = i32::from(enabled && replicas > 1);
    let standbys = if enabled { (replicas - 2).max(0) } else { 0 };
    vec![
        budget(database, ChildNames::primary_disruption_budget(&name), PRIMARY_ROLE, primary),
        budget(database, ChildNames::standby_disruption_budget(&name), STANDBY_ROLE, standbys),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn database(extra: serde_json::Value) -> DatabaseService {
        crate::operator::database::build::test_database(extra)
    }

    fn min_available(budgets: &[PodDisruptionBudget]) -> Vec<(String, IntOrString)> {
        budgets
            .iter()
            .map(|budget| (budget.name_any(), budget.spec.as_ref().unwrap().min_available.clone().unwrap()))
            .collect()
    }

    #[test]
    fn with_a_standby_the_primary_is_never_evicted_and_standbys_go_one_at_a_time() {
        let budgets = disruption_budgets(&database(serde_json::json!({})), 3);
        // Three instances: the primary stays, one of the two standbys may go.
        assert_eq!(
            min_available(&budgets),
            vec![("orders-primary".into(), IntOrString::Int(1)), ("orders-standbys".into(), IntOrString::Int(1))]
        );
        let two = min_available(&disruption_budgets(&database(serde_json::json!({})), 2));
        assert_eq!((two[0].1.clone(), two[1].1.clone()), (IntOrString::Int(1), IntOrString::Int(0)));
        let selector = budgets[0].spec.as_ref().unwrap().selector.as_ref().unwrap().match_labels.clone().unwrap();
        assert_eq!(selector["dbservice.dev/role"], "primary");
        assert_eq!(selector["app.kubernetes.io/instance"], "orders");
        assert_eq!(budgets[0].metadata.owner_references.as_ref().unwrap()[0].uid, "u-1");
    }

    #[test]
    fn a_single_instance_or_disabled_budgets_block_no_drain() {
        let none = IntOrString::Int(0);
        let single = min_available(&disruption_budgets(&database(serde_json::json!({})), 1));
        assert_eq!(single[0].1, none);
        let disabled =
            min_available(&disruption_budgets(&database(serde_json::json!({"enablePodDisruptionBudget": false})), 3));
        assert_eq!((disabled[0].1.clone(), disabled[1].1.clone()), (none.clone(), none));
    }
}
