//! Build (pure): where the instances' pods may run, from `spec.affinity`, `tolerations`,
//! `nodeSelector`, `topologySpreadConstraints`, `priorityClassName`, plus the operator's
//! anti-affinity between the instances of one database (see [`crate::api::placement`]).

use crate::api::database_service::DatabaseService;
use crate::api::names::selector_labels;
use crate::api::placement::PodAntiAffinity;
use k8s_openapi::api::core::v1::{
    PodAffinityTerm, PodAntiAffinity as PodAntiAffinityRules, PodSpec, WeightedPodAffinityTerm,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::ResourceExt;

/// Weight of the preferred anti-affinity: the strongest, so that it wins over a user's weaker
/// preferences but never over their required rules.
const PREFERRED_WEIGHT: i32 = 100;

/// Sets the scheduling fields of an instance's pod.
pub fn add_placement(pod: &mut PodSpec, database: &DatabaseService) {
    let placement = &database.spec.placement;
    pod.tolerations = placement.tolerations.clone();
    pod.node_selector = placement.node_selector.clone();
    pod.topology_spread_constraints = placement.topology_spread_constraints.clone();
    pod.priority_class_name = placement.priority_class_name.clone();
    let mut affinity = placement.affinity.clone().unwrap_or_default();
    let term = PodAffinityTerm {
        label_selector: Some(LabelSelector {
            match_labels: Some(selector_labels(&database.name_any())),
            ..Default::default()
        }),
        topology_key: placement.anti_affinity_topology_key().to_string(),
        ..Default::default()
    };
    let mode = placement.anti_affinity();
    if mode != PodAntiAffinity::Disabled {
        let rules = affinity.pod_anti_affinity.get_or_insert_with(PodAntiAffinityRules::default);
        if mode == PodAntiAffinity::Required {
            rules.required_during_scheduling_ignored_during_execution.get_or_insert_with(Vec::new).push(term);
        } else {
            rules
                .preferred_during_scheduling_ignored_during_execution
                .get_or_insert_with(Vec::new)
                .push(WeightedPodAffinityTerm { weight: PREFERRED_WEIGHT, pod_affinity_term: term });
        }
    }
    let empty =
        affinity.node_affinity.is_none() && affinity.pod_affinity.is_none() && affinity.pod_anti_affinity.is_none();
    pod.affinity = (!empty).then_some(affinity);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn database(extra: serde_json::Value) -> DatabaseService {
        crate::operator::database::build::test_database(extra)
    }

    fn placed(spec: serde_json::Value) -> PodSpec {
        let mut pod = PodSpec::default();
        add_placement(&mut pod, &database(spec));
        pod
    }

    #[test]
    fn by_default_instances_prefer_different_nodes() {
        let pod = placed(serde_json::json!({}));
        let rules = pod.affinity.unwrap().pod_anti_affinity.unwrap();
        let preferred = rules.preferred_during_scheduling_ignored_during_execution.unwrap();
        assert_eq!(preferred.len(), 1);
        assert_eq!(preferred[0].weight, 100);
        assert_eq!(preferred[0].pod_affinity_term.topology_key, "kubernetes.io/hostname");
        let selector = preferred[0].pod_affinity_term.label_selector.as_ref().unwrap();
        assert_eq!(selector.match_labels.as_ref().unwrap()["app.kubernetes.io/instance"], "orders");
        assert!(rules.required_during_scheduling_ignored_during_execution.is_none());
        assert!(pod.tolerations.is_none() && pod.node_selector.is_none() && pod.priority_class_name.is_none());
    }

    #[test]
    fn required_anti_affinity_is_added_to_the_users_own_rules() {
        let pod = placed(serde_json::json!({
            "enablePodAntiAffinity": "required",
            "podAntiAffinityTopologyKey": "topology.kubernetes.io/zone",
            "affinity": {
                "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]}]}},
                "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                    {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "cache"}}}]}
            },
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "db", "effect": "NoSchedule"}],
            "nodeSelector": {"pool": "databases"},
            "priorityClassName": "databases",
            "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway"}]
        }));
        let affinity = pod.affinity.unwrap();
        assert!(affinity.node_affinity.is_some());
        let required = affinity.pod_anti_affinity.unwrap().required_during_scheduling_ignored_during_execution.unwrap();
        assert_eq!(required.len(), 2, "the user's rule and ours");
        assert_eq!(required[1].topology_key, "topology.kubernetes.io/zone");
        assert_eq!(pod.tolerations.unwrap()[0].key.as_deref(), Some("dedicated"));
        assert_eq!(pod.node_selector.unwrap()["pool"], "databases");
        assert_eq!(pod.priority_class_name.as_deref(), Some("databases"));
        assert_eq!(pod.topology_spread_constraints.unwrap()[0].max_skew, 1);
    }

    #[test]
    fn disabled_anti_affinity_leaves_no_affinity_at_all() {
        assert_eq!(placed(serde_json::json!({"enablePodAntiAffinity": "disabled"})).affinity, None);
    }
}
