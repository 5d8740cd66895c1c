//! The ground the suite stands on: CRD established, objects stored, pods run, volumes bind.

use crate::support::{client_for, cluster_or_skip, eventually, operator::shared, sample_database, TestNamespace};
use dbservice_operator::api::database_service::DatabaseService;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ListParams, PostParams};
use kube::Api;
use std::time::Duration;

#[tokio::test]
async fn crd_is_established_and_a_database_service_is_stored() {
    let Some(kubeconfig) = cluster_or_skip("crd_is_established_and_a_database_service_is_stored") else { return };
    assert!(shared().operator.is_leader(), "the suite's operator holds the chart's Lease");
    let client = client_for(&kubeconfig).await;
    let definitions: Api<CustomResourceDefinition> = Api::all(client.clone());
    let definition = definitions.get("databaseservices.dbservice.dev").await.unwrap();
    let established = definition
        .status
        .unwrap()
        .conditions
        .unwrap_or_default()
        .iter()
        .any(|condition| condition.type_ == "Established" && condition.status == "True");
    assert!(established, "CRD not Established");
    let namespace = TestNamespace::create(&client, "smoke").await;
    let api: Api<DatabaseService> = Api::namespaced(client.clone(), &namespace.name);
    api.create(&PostParams::default(), &sample_database("stored")).await.unwrap();
    let read = api.get("stored").await.unwrap();
    assert_eq!(read.spec.version, "16.4");
    assert_eq!(read.spec.database_name, "app");
}

#[tokio::test]
async fn a_hand_made_deployment_gets_running_pods_through_kwok() {
    let Some(kubeconfig) = cluster_or_skip("a_hand_made_deployment_gets_running_pods_through_kwok") else { return };
    let client = client_for(&kubeconfig).await;
    let namespace = TestNamespace::create(&client, "pods").await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &namespace.name);
    let deployment: Deployment = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web"},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "web", "image": "nginx:1.27"}]}}}
    }))
    .unwrap();
    deployments.create(&PostParams::default(), &deployment).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace.name);
    eventually("2 Running and Ready pods", Duration::from_secs(90), || async {
        let list = pods.list(&ListParams::default().labels("app=web")).await.ok()?;
        let ready = list
            .items
            .iter()
            .filter(|pod| {
                let status = pod.status.clone().unwrap_or_default();
                status.phase.as_deref() == Some("Running")
                    && status
                        .conditions
                        .unwrap_or_default()
                        .iter()
                        .any(|condition| condition.type_ == "Ready" && condition.status == "True")
            })
            .count();
        (ready == 2).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_claim_on_the_default_storage_class_binds() {
    let Some(kubeconfig) = cluster_or_skip("a_claim_on_the_default_storage_class_binds") else { return };
    let client = client_for(&kubeconfig).await;
    let namespace = TestNamespace::create(&client, "pvc").await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &namespace.name);
    let claim: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
    }))
    .unwrap();
    claims.create(&PostParams::default(), &claim).await.unwrap();
    eventually("the claim Bound", Duration::from_secs(90), || async {
        let claim = claims.get("data").await.ok()?;
        (claim.status?.phase.as_deref() == Some("Bound")).then_some(())
    })
    .await;
}
