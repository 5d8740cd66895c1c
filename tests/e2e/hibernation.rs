//! Hibernation against the real apiserver (kwok runs the pods): `spec.hibernated` stops every
//! instance and the pooler and keeps the claims, Secrets and Services; no scheduled backup is
//! created while it sleeps; the verbs that need instances and the changes nothing could carry
//! out are refused; waking brings the pods back and holds failover (the default delay is 0)
//! until the stopped primary reports again, with the same primary after.

use crate::controller::{condition, ledger_entries, wait_for_phase};
use crate::support::operator::shared;
use crate::support::{client_for, cluster_or_skip, database_from_yaml, eventually, TestNamespace};
use dbservice_operator::api::database_service::{DatabaseService, Phase};
use dbservice_operator::api::database_service_backup::DatabaseServiceBackup;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Secret, Service};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use std::collections::BTreeSet;
use std::time::Duration;

fn sleepy() -> DatabaseService {
    database_from_yaml(
        "apiVersion: dbservice.dev/v1\nkind: DatabaseService\nmetadata:\n  name: sleepy\nspec:\n  version: \"16.4\"\n  \
         storageSize: 1Gi\n  databaseName: app\n  username: app_user\n  replicas: 2\n  \
         resources: {requests: {cpu: 10m}}\n  pooler: {instances: 2}\n  \
         failover: {delaySeconds: 600}\n  backup:\n    \
         objectStore: {endpoint: \"http://127.0.0.1:9\", bucket: backups, path: sleepy, credentialsSecret: {name: s3}}\n    \
         schedule: \"* * * * *\"\n",
    )
}

/// The pods of the database and of its pooler (a scheduled backup's finished Job pod may stay).
async fn pods_of(client: &Client, namespace: &str) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let listed = pods.list(&ListParams::default()).await.map(|list| list.items).unwrap_or_default();
    let ours = |name: &str| ["sleepy-0", "sleepy-1"].contains(&name) || name.starts_with("sleepy-pooler-");
    listed.into_iter().filter(|pod| ours(&pod.name_any())).collect()
}

async fn backup_names(client: &Client, namespace: &str) -> BTreeSet<String> {
    let backups: Api<DatabaseServiceBackup> = Api::namespaced(client.clone(), namespace);
    backups.list(&ListParams::default()).await.unwrap().items.iter().map(ResourceExt::name_any).collect()
}

/// The uids of what hibernation keeps: claims, Secrets and Services.
async fn kept_uids(client: &Client, namespace: &str) -> BTreeSet<String> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let services: Api<Service> = Api::namespaced(client.clone(), namespace);
    let mut uids: BTreeSet<String> = BTreeSet::new();
    let params = ListParams::default();
    uids.extend(claims.list(&params).await.unwrap().items.iter().filter_map(|object| object.uid()));
    uids.extend(secrets.list(&params).await.unwrap().items.iter().filter_map(|object| object.uid()));
    uids.extend(services.list(&params).await.unwrap().items.iter().filter_map(|object| object.uid()));
    uids
}

#[tokio::test]
async fn hibernation_stops_the_pods_keeps_the_rest_and_waking_holds_failover_for_the_same_primary() {
    let test = "hibernation_stops_the_pods_keeps_the_rest_and_waking_holds_failover_for_the_same_primary";
    let Some(kubeconfig) = cluster_or_skip(test) else { return };
    shared();
    let client = client_for(&kubeconfig).await;
    let namespace = TestNamespace::create(&client, "hibernate").await;
    let ns = namespace.name.clone();
    crate::support::create_store_secret(&client, &ns).await;
    let databases: Api<DatabaseService> = Api::namespaced(client.clone(), &ns);
    databases.create(&PostParams::default(), &sleepy()).await.unwrap();
    wait_for_phase(&databases, "sleepy", Phase::Running, Duration::from_secs(180)).await;
    crate::placement::publish_primary_and_standby(&client, &ns, "sleepy").await;
    eventually("failover engaged", Duration::from_secs(60), || async {
        databases.get("sleepy").await.ok()?.status?.failover.timeline.map(drop)
    })
    .await;
    let kept = kept_uids(&client, &ns).await;

    let hibernated =
        dbservice_operator::plugin::hibernate(client.clone(), &ns, "sleepy", true, Some(Duration::from_secs(180)))
            .await
            .expect("hibernate --wait reaches Hibernated");
    assert!(hibernated.contains("Hibernated"), "{hibernated}");
    let asleep = databases.get("sleepy").await.unwrap();
    let status = asleep.status.clone().unwrap();
    assert_eq!(status.failover.current_primary.as_deref(), Some("sleepy-0"));
    assert_eq!(
        condition(&asleep, "Hibernated").map(|c| (c.status.as_str(), c.reason.as_str())),
        Some(("True", "Hibernated"))
    );
    let stateful_sets: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    assert_eq!(stateful_sets.get("sleepy").await.unwrap().spec.replicas, Some(0));
    let pooler = deployments.get("sleepy-pooler").await.unwrap();
    assert_eq!(pooler.spec.replicas, Some(0), "the pooler sleeps too");
    let no_pods = eventually("no pod left", Duration::from_secs(60), || async {
        pods_of(&client, &ns).await.is_empty().then_some(())
    });
    no_pods.await;
    assert!(kept.is_subset(&kept_uids(&client, &ns).await), "claims, Secrets and Services are kept");

    // What needs instances, or cannot be carried out without them, is refused while asleep.
    let refused = dbservice_operator::plugin::switchover(client.clone(), &ns, "sleepy", "1").await.unwrap_err();
    assert!(refused.to_string().contains("sleepy is hibernated"), "{refused}");
    let upgrade = Patch::Merge(serde_json::json!({"spec": {"version": "16.5"}}));
    let denied = databases.patch("sleepy", &PatchParams::default(), &upgrade).await.unwrap_err();
    assert!(denied.to_string().contains("cannot change while the database is hibernated"), "{denied}");

    // No scheduled backup while asleep: a whole cron minute and a scheduler look (15 s) pass.
    let before = backup_names(&client, &ns).await;
    tokio::time::sleep(Duration::from_secs(80)).await;
    assert_eq!(backup_names(&client, &ns).await, before, "no scheduled backup while hibernated");
    assert!(pods_of(&client, &ns).await.is_empty(), "nothing restarted the pods");

    // Wake with the default failover delay (0): without the hold, the primary that reports
    // nothing yet would be failed over in the first pass that sees its standby.
    let wake = Patch::Merge(serde_json::json!({"spec": {"hibernated": false, "failover": {"delaySeconds": 0}}}));
    databases.patch("sleepy", &PatchParams::default(), &wake).await.unwrap();
    let waking = eventually("both pods back and ready while waking", Duration::from_secs(120), || async {
        let database = databases.get("sleepy").await.ok()?;
        let waking = condition(&database, "Hibernated").is_some_and(|c| c.reason == "Waking");
        (waking && database.status.as_ref()?.ready_replicas == 2).then_some(database)
    })
    .await;
    let status = waking.status.unwrap();
    assert_eq!(
        (status.failover.current_primary.as_deref(), status.failover.target_primary.as_deref()),
        (Some("sleepy-0"), Some("sleepy-0")),
        "no failover while the primary starts"
    );
    crate::placement::publish_primary_and_standby(&client, &ns, "sleepy").await;
    let awake = eventually("the wake ends with the primary back", Duration::from_secs(60), || async {
        let database = databases.get("sleepy").await.ok()?;
        condition(&database, "Hibernated").is_none().then_some(database)
    })
    .await;
    assert_eq!(awake.status.unwrap().failover.current_primary.as_deref(), Some("sleepy-0"));
    assert_eq!(deployments.get("sleepy-pooler").await.unwrap().spec.replicas, Some(2));
    let actions: Vec<String> = ledger_entries(&client, &ns, "sleepy")
        .await
        .into_iter()
        .map(|entry| entry.action)
        .filter(|action| ["Hibernating", "Hibernated", "Waking", "Woken"].contains(&action.as_str()))
        .collect();
    assert_eq!(actions, ["Hibernating", "Hibernated", "Waking", "Woken"]);
}
