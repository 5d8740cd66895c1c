//! README promises of the reconcile pipeline that need a real control plane: an invalid object
//! stored while the webhook was absent, giving up after three failed restarts, and a DatabaseService
//! re-created right after deletion (the caches still hold the old children for a moment).

use crate::controller::{condition, delete_and_wait_gone, ledger_entries, wait_for_phase, CRASHING_IMAGE_REPOSITORY};
use crate::support::operator::{shared, ISOLATION_LABEL, RELEASE_NAMESPACE};
use crate::support::{client_for, cluster_or_skip, eventually, sample_database, TestNamespace};
use dbservice_operator::api::database_service::{DatabaseService, DeletionPolicy, Phase};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use std::time::Duration;

#[tokio::test]
async fn an_invalid_object_stored_without_the_webhook_gets_invalid_spec_and_no_children() {
    let Some(kubeconfig) =
        cluster_or_skip("an_invalid_object_stored_without_the_webhook_gets_invalid_spec_and_no_children")
    else {
        return;
    };
    shared();
    let client = client_for(&kubeconfig).await;
    // The release namespace is excluded from admission (webhook.excludeReleaseNamespace), so this
    // object is stored exactly as if the webhook had been absent; the controller still reconciles it.
    let name = format!("unchecked-{}", std::process::id());
    let api: Api<DatabaseService> = Api::namespaced(client.clone(), RELEASE_NAMESPACE);
    let mut database = sample_database(&name);
    database.spec.username = "postgres".into(); // reserved: the webhook would deny it
    api.create(&PostParams::default(), &database).await.unwrap();
    let failed = wait_for_phase(&api, &name, Phase::Failed, Duration::from_secs(60)).await;
    let invalid = condition(&failed, "InvalidSpec").expect("InvalidSpec condition").clone();
    assert_eq!((invalid.status.as_str(), invalid.reason.as_str()), ("True", "ValidationFailed"));
    assert!(invalid.message.contains("username"), "{}", invalid.message);
    let stateful_sets: Api<StatefulSet> = Api::namespaced(client.clone(), RELEASE_NAMESPACE);
    assert!(stateful_sets.get_opt(&name).await.unwrap().is_none(), "an invalid spec must build nothing");
    let entries = ledger_entries(&client, RELEASE_NAMESPACE, &name).await;
    assert!(entries.iter().any(|entry| entry.action == "InvalidSpec"), "{entries:?}");
    delete_and_wait_gone(&api, &name).await;
}

/// Issue 37: the chart's `operator.allowedImagePrefixes` is enforced by the controller too. An
/// object admitted by a webhook without the policy (as one stored before the policy was set) gets
/// InvalidSpec and no children from an operator with it; once its image is from an allowed
/// registry, the controller builds it.
#[tokio::test]
async fn an_image_outside_the_allowed_prefixes_admitted_elsewhere_gets_invalid_spec_and_no_children() {
    let test = "an_image_outside_the_allowed_prefixes_admitted_elsewhere_gets_invalid_spec_and_no_children";
    let Some(kubeconfig) = cluster_or_skip(test) else { return };
    shared();
    let client = client_for(&kubeconfig).await;
    let namespace = TestNamespace::create(&client, "image-policy").await;
    let ns = namespace.name.as_str();
    let policy = "--allowed-image-prefixes=registry.corp.example/".to_string();
    let _operator = crate::support::operator::isolated_operator(ns, "image-policy", vec![policy]);
    let api: Api<DatabaseService> = Api::namespaced(client.clone(), ns);
    let mut database = sample_database("outsider");
    database.labels_mut().insert(ISOLATION_LABEL.into(), ns.into());
    database.spec.image = Some("docker.io/library/postgres:16.4".into());
    api.create(&PostParams::default(), &database).await.expect("the suite's webhook has no image policy");
    let failed = wait_for_phase(&api, "outsider", Phase::Failed, Duration::from_secs(60)).await;
    let invalid = condition(&failed, "InvalidSpec").expect("InvalidSpec condition").clone();
    assert_eq!((invalid.status.as_str(), invalid.reason.as_str()), ("True", "ValidationFailed"));
    assert!(invalid.message.contains("registry.corp.example/"), "names the allowed prefixes: {}", invalid.message);
    let stateful_sets: Api<StatefulSet> = Api::namespaced(client.clone(), ns);
    assert!(stateful_sets.get_opt("outsider").await.unwrap().is_none(), "a refused image must build nothing");

    let allowed = serde_json::json!({"spec": {"image": "registry.corp.example/postgres:16.4"}});
    api.patch("outsider", &PatchParams::default(), &Patch::Merge(&allowed)).await.unwrap();
    let built = eventually("the StatefulSet of an allowed image", Duration::from_secs(60), || async {
        stateful_sets.get_opt("outsider").await.ok()?
    })
    .await;
    let pod = built.spec.template.spec.unwrap();
    let postgres = pod.containers.iter().find(|container| container.name == "postgres").unwrap();
    assert_eq!(postgres.image.as_deref(), Some("registry.corp.example/postgres:16.4"));
    // The status follows the children in the same pass.
    eventually("InvalidSpec gone once the image is allowed", Duration::from_secs(30), || async {
        let now = api.get("outsider").await.ok()?;
        condition(&now, "InvalidSpec").is_none_or(|invalid| invalid.status == "False").then_some(())
    })
    .await;
}

#[tokio::test]
async fn three_failed_restarts_make_the_phase_failed() {
    let Some(kubeconfig) = cluster_or_skip("three_failed_restarts_make_the_phase_failed") else { return };
    shared();
    let client = client_for(&kubeconfig).await;
    let namespace = TestNamespace::create(&client, "failed").await;
    let ns = namespace.name.as_str();
    let api: Api<DatabaseService> = Api::namespaced(client.clone(), ns);
    let mut database = sample_database("doomed");
    database.spec.image = Some(format!("{CRASHING_IMAGE_REPOSITORY}:16.4"));
    api.create(&PostParams::default(), &database).await.unwrap();
    // The suite's operator restarts after 5 s unhealthy with a 10 s backoff that doubles: three
    // restarts within about 75 s, then the phase must be Failed.
    let failed = wait_for_phase(&api, "doomed", Phase::Failed, Duration::from_secs(180)).await;
    let status = failed.status.clone().unwrap();
    assert!(status.restart_count >= 3, "Failed after {} restarts", status.restart_count);
    let restarts = ledger_entries(&client, ns, "doomed").await.into_iter().filter(|entry| entry.action == "Restarted");
    assert!(restarts.count() >= 3, "three restarts in the ledger before Failed");
    assert_eq!(condition(&failed, "Ready").map(|ready| ready.status.as_str()), Some("False"));
}

#[tokio::test]
async fn a_database_recreated_right_after_deletion_gets_exactly_one_set_of_children() {
    let Some(kubeconfig) =
        cluster_or_skip("a_database_recreated_right_after_deletion_gets_exactly_one_set_of_children")
    else {
        return;
    };
    shared();
    let client = client_for(&kubeconfig).await;
    let namespace = TestNamespace::create(&client, "recreate").await;
    let ns = namespace.name.as_str();
    let api: Api<DatabaseService> = Api::namespaced(client.clone(), ns);
    let mut database = sample_database("phoenix");
    database.spec.deletion_policy = Some(DeletionPolicy::Delete);
    api.create(&PostParams::default(), &database).await.unwrap();
    wait_for_phase(&api, "phoenix", Phase::Running, Duration::from_secs(120)).await;
    // Delete and re-create at once: the operator's caches still hold the old children (owned by
    // the old uid, being garbage-collected) when the new object arrives.
    delete_and_wait_gone(&api, "phoenix").await;
    let created = api.create(&PostParams::default(), &database).await.unwrap();
    let uid = created.uid().unwrap();
    wait_for_phase(&api, "phoenix", Phase::Running, Duration::from_secs(180)).await;
    let selector = ListParams::default().labels("app.kubernetes.io/instance=phoenix");
    // Settled: garbage collection of the old children is done and nothing is missing.
    let (stateful_sets, services, config_maps) = eventually(
        "one StatefulSet, three Services and the scripts and ledger ConfigMaps, all owned by the new object",
        Duration::from_secs(60),
        || async {
            let stateful_sets = Api::<StatefulSet>::namespaced(client.clone(), ns).list(&selector).await.ok()?.items;
            let services = Api::<Service>::namespaced(client.clone(), ns).list(&selector).await.ok()?.items;
            let config_maps = Api::<ConfigMap>::namespaced(client.clone(), ns).list(&selector).await.ok()?.items;
            let owned_by_new = |references: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference]| {
                references.iter().all(|reference| reference.uid == uid) && !references.is_empty()
            };
            let settled = stateful_sets.len() == 1
                && services.len() == 3
                && config_maps.iter().filter(|map| map.name_any() == "phoenix-scripts").count() == 1
                && stateful_sets.iter().all(|object| owned_by_new(object.owner_references()))
                && services.iter().all(|object| owned_by_new(object.owner_references()))
                && config_maps.iter().all(|object| owned_by_new(object.owner_references()));
            settled.then_some((stateful_sets, services, config_maps))
        },
    )
    .await;
    assert_eq!(stateful_sets[0].metadata.deletion_timestamp, None);
    assert!(services.iter().all(|service| service.metadata.deletion_timestamp.is_none()));
    assert!(config_maps.iter().all(|config_map| config_map.metadata.deletion_timestamp.is_none()));
    // Still Running after the dust settled: no child was lost to the old object's garbage collection.
    wait_for_phase(&api, "phoenix", Phase::Running, Duration::from_secs(60)).await;
}
