//! The database pods' NetworkPolicy against the real apiserver: made by an operator started with
//! `--database-network-policies`, letting in the database's own pods and the selected clients.

use crate::controller::wait_for_phase;
use crate::support::operator::{isolated_operator, ISOLATION_LABEL};
use crate::support::{client_for, cluster_or_skip, eventually, sample_database, TestNamespace};
use dbservice_operator::api::database_service::{DatabaseService, Phase};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::PostParams;
use kube::Api;
use std::time::Duration;

#[tokio::test]
async fn an_operator_asked_for_network_policies_lets_in_only_siblings_and_selected_clients() {
    let Some(kubeconfig) =
        cluster_or_skip("an_operator_asked_for_network_policies_lets_in_only_siblings_and_selected_clients")
    else {
        return;
    };
    let client = client_for(&kubeconfig).await;
    let namespace = TestNamespace::create(&client, "netpol").await;
    let ns = namespace.name.clone();
    let arguments = vec!["--database-network-policies".into(), "--database-client-selector=tier=api".into()];
    let operator = isolated_operator(&ns, "netpol", arguments);
    let api: Api<DatabaseService> = Api::namespaced(client.clone(), &ns);
    let mut database = sample_database("guarded");
    database.metadata.labels = Some([(ISOLATION_LABEL.to_string(), ns.clone())].into());
    api.create(&PostParams::default(), &database).await.unwrap();
    wait_for_phase(&api, "guarded", Phase::Running, Duration::from_secs(120)).await;
    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), &ns);
    let policy = eventually("the NetworkPolicy", Duration::from_secs(30), || async {
        policies.get_opt("guarded").await.ok().flatten()
    })
    .await;
    let spec = policy.spec.unwrap();
    let selected = spec.pod_selector.unwrap().match_labels.unwrap();
    assert_eq!(selected["app.kubernetes.io/instance"], "guarded", "the database's pods");
    let rules = spec.ingress.unwrap();
    let peers: Vec<_> = rules[0]
        .from
        .clone()
        .unwrap()
        .into_iter()
        .map(|peer| peer.pod_selector.unwrap().match_labels.unwrap())
        .collect();
    assert_eq!(peers[0]["app.kubernetes.io/instance"], "guarded", "siblings: {peers:?}");
    assert_eq!(peers[1].get("tier").map(String::as_str), Some("api"), "clients: {peers:?}");
    assert_eq!(
        rules[0].ports.clone().unwrap()[0].port,
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(5432))
    );
    crate::controller::delete_and_wait_gone(&api, "guarded").await;
    drop(operator);
}
