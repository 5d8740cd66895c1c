//! Build (pure): the database pods' NetworkPolicy, when the operator is asked for one
//! (`--database-network-policies`): PostgreSQL's port open to the database's own pods (streaming,
//! cloning, rewinding) and to the namespace's pods the client selector matches (all of them when
//! it is empty: backup Jobs are among them), the agent's metrics port to every pod of the cluster
//! (Prometheus usually runs in a namespace of its own; the metrics carry no secret), nothing else.

use crate::api::database_service::DatabaseService;
use crate::api::names::{selector_labels, INSTANCE_LABEL};
use crate::api::pod::{METRICS_PORT, POSTGRES_PORT};
use crate::operator::database::build::metadata;
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;
use std::collections::BTreeMap;

/// NetworkPolicy NAME for the pods of `database`; `clients` selects the pods of the namespace
/// that may connect (empty: every pod of the namespace).
pub fn network_policy(database: &DatabaseService, clients: &BTreeMap<String, String>) -> NetworkPolicy {
    let name = database.name_any();
    let peer = |labels: BTreeMap<String, String>| NetworkPolicyPeer {
        pod_selector: Some(LabelSelector { match_labels: Some(labels), ..Default::default() }),
        ..Default::default()
    };
    let siblings = peer([(INSTANCE_LABEL.to_string(), name.clone())].into());
    let port = |number| {
        Some(vec![NetworkPolicyPort {
            port: Some(IntOrString::Int(number)),
            protocol: Some("TCP".into()),
            ..Default::default()
        }])
    };
    let every_namespace =
        NetworkPolicyPeer { namespace_selector: Some(LabelSelector::default()), ..Default::default() };
    NetworkPolicy {
        metadata: metadata(database, name.clone()),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector { match_labels: Some(selector_labels(&name)), ..Default::default() }),
            policy_types: Some(vec!["Ingress".into()]),
            ingress: Some(vec![
                NetworkPolicyIngressRule {
                    from: Some(vec![siblings, peer(clients.clone())]),
                    ports: port(POSTGRES_PORT),
                },
                NetworkPolicyIngressRule { from: Some(vec![every_namespace]), ports: port(METRICS_PORT) },
            ]),
            ..Default::default()
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_postgres_from_siblings_and_the_selected_clients_is_let_in() {
        let mut database = DatabaseService::new("orders", Default::default());
        database.metadata.namespace = Some("shop".into());
        database.metadata.uid = Some("u-1".into());
        let policy = network_policy(&database, &[("role".to_string(), "api".to_string())].into());
        let spec = policy.spec.unwrap();
        assert_eq!(spec.pod_selector.unwrap().match_labels.unwrap()[INSTANCE_LABEL], "orders");
        assert_eq!(spec.policy_types.unwrap(), ["Ingress"]);
        let rules = spec.ingress.unwrap();
        assert_eq!(rules.len(), 2);
        // The metrics port, from anywhere in the cluster (Prometheus).
        assert_eq!(rules[1].ports.clone().unwrap()[0].port, Some(IntOrString::Int(METRICS_PORT)));
        assert!(rules[1].from.clone().unwrap()[0].namespace_selector.is_some());
        let from = rules[0].from.clone().unwrap();
        let selected: Vec<BTreeMap<String, String>> =
            from.iter().map(|peer| peer.pod_selector.clone().unwrap().match_labels.unwrap()).collect();
        assert_eq!(selected[0][INSTANCE_LABEL], "orders");
        assert_eq!(selected[1]["role"], "api");
        // No namespace selector: peers of this namespace only.
        assert!(from.iter().all(|peer| peer.namespace_selector.is_none() && peer.ip_block.is_none()));
        let ports = rules[0].ports.clone().unwrap();
        assert_eq!(ports[0].port, Some(IntOrString::Int(POSTGRES_PORT)));
        assert_eq!(policy.metadata.owner_references.unwrap()[0].uid, "u-1");
    }
}
