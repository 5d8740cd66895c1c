//! Hibernation (issue 42) on the real node: a database of two instances with a pooler and rows
//! is hibernated (no pod of it left, its claims kept) and woken: the same rows through the same
//! pooler Service, the same primary, the application's credentials and Services unchanged, the
//! ledger telling both. How long each takes is measured and held to the manual's bound.

use crate::environment::{
    admin_client, install_chart, psql, real_database, real_namespace, real_node_or_skip, wait_running, Target,
};
use crate::support::eventually;
use dbservice_operator::api::database_service::DatabaseService;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Secret, Service};
use kube::api::{ListParams, PostParams};
use kube::{Api, Client, ResourceExt};
use std::time::{Duration, Instant};

const DATABASE: &str = "sleepy";
const POOLER: &str = "sleepy-pooler";
/// The manual's bounds (docs/manual/src/operations/hibernation.md).
const HIBERNATE_WITHIN: Duration = Duration::from_secs(90);
const WAKE_WITHIN: Duration = Duration::from_secs(180);

async fn pods_of_database(client: &Client, namespace: &str) -> Vec<String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let selector = format!("app.kubernetes.io/instance={DATABASE}");
    let listed = pods.list(&ListParams::default().labels(&selector)).await.unwrap().items;
    listed.iter().map(ResourceExt::name_any).collect()
}

/// What the application holds on to: its Secret's data and version, and each Service's uid and
/// cluster IP.
async fn application_view(client: &Client, namespace: &str) -> (String, String, Vec<(String, String)>) {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let credentials = secrets.get(&format!("{DATABASE}-credentials")).await.unwrap();
    let data = serde_json::to_string(&credentials.data).unwrap();
    let services: Api<Service> = Api::namespaced(client.clone(), namespace);
    let mut kept = Vec::new();
    for name in [DATABASE.to_string(), format!("{DATABASE}-pooler")] {
        let service = services.get(&name).await.unwrap();
        let ip = service.spec.and_then(|spec| spec.cluster_ip).unwrap_or_default();
        kept.push((service.metadata.uid.unwrap_or_default(), ip));
    }
    (data, credentials.resource_version().unwrap_or_default(), kept)
}

async fn ledger_actions(client: &Client, namespace: &str) -> Vec<String> {
    let entries = crate::support::ledger_entries(client, namespace, DATABASE).await;
    entries.into_iter().map(|entry| entry.action).collect()
}

#[tokio::test]
async fn a_hibernated_database_wakes_with_its_rows_primary_credentials_and_services() {
    let Some(node) = real_node_or_skip("a_hibernated_database_wakes_with_its_rows_primary_credentials_and_services")
    else {
        return;
    };
    let _slot = crate::faults::slot().await;
    install_chart(node);
    let client = admin_client().await;
    let namespace = real_namespace(&client, "hibernate").await;
    let ns = namespace.name.as_str();
    let databases: Api<DatabaseService> = Api::namespaced(client.clone(), ns);
    let mut database = real_database(node, DATABASE, 2, "Delete");
    database.spec.pooler =
        Some(serde_json::from_value(serde_json::json!({"instances": 2, "image": node.pgbouncer_image})).unwrap());
    databases.create(&PostParams::default(), &database).await.unwrap();
    wait_running(&client, ns, DATABASE, 2, Duration::from_secs(300)).await;
    eventually("both pooler pods ready", Duration::from_secs(180), || async {
        (databases.get(DATABASE).await.ok()?.status?.pooler?.ready_instances == 2).then_some(())
    })
    .await;
    let rows = "create table kept (id int primary key, note text); \
                insert into kept select i, md5(i::text) from generate_series(1, 5000) i; \
                select count(*), md5(string_agg(note, '' order by id)) from kept";
    let before = psql(&client, node, ns, DATABASE, Target::Service(POOLER), rows)
        .await
        .expect("rows written through the pooler");
    let primary = databases.get(DATABASE).await.unwrap().status.unwrap().failover.current_primary;
    let application = application_view(&client, ns).await;

    let started = Instant::now();
    let told = dbservice_operator::plugin::hibernate(client.clone(), ns, DATABASE, true, Some(HIBERNATE_WITHIN))
        .await
        .expect("hibernated within the bound");
    let hibernated_in = started.elapsed();
    assert!(told.contains("Hibernated"), "{told}");
    assert_eq!(pods_of_database(&client, ns).await, Vec::<String>::new(), "no pod of the database or its pooler");
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    assert_eq!(claims.list(&ListParams::default()).await.unwrap().items.len(), 2, "both volumes kept");

    let started = Instant::now();
    dbservice_operator::plugin::hibernate(client.clone(), ns, DATABASE, false, Some(WAKE_WITHIN))
        .await
        .expect("Running again within the bound");
    let woken = eventually("the wake ended with the primary back", WAKE_WITHIN, || async {
        let database = databases.get(DATABASE).await.ok()?;
        let status = database.status?;
        status.conditions.iter().all(|condition| condition.type_ != "Hibernated").then_some(status)
    })
    .await;
    let woken_in = started.elapsed();
    assert_eq!(woken.failover.current_primary, primary, "the same primary");
    eventually("both pooler pods ready again", Duration::from_secs(180), || async {
        (databases.get(DATABASE).await.ok()?.status?.pooler?.ready_instances == 2).then_some(())
    })
    .await;
    let check = "select count(*), md5(string_agg(note, '' order by id)) from kept";
    let after = psql(&client, node, ns, DATABASE, Target::Service(POOLER), check)
        .await
        .expect("the rows read through the pooler");
    assert!(before.ends_with(&after) && after.contains("5000"), "before: {before}\nafter: {after}");
    psql(&client, node, ns, DATABASE, Target::Service(POOLER), "insert into kept values (5001, 'awake')")
        .await
        .expect("writable");
    assert_eq!(application_view(&client, ns).await, application, "credentials and Services unchanged");
    let actions = ledger_actions(&client, ns).await;
    let told: Vec<&String> = actions
        .iter()
        .filter(|action| ["Hibernating", "Hibernated", "Waking", "Woken"].contains(&action.as_str()))
        .collect();
    assert_eq!(told, ["Hibernating", "Hibernated", "Waking", "Woken"]);
    eprintln!(
        "[figure] hibernation of 2 instances and 2 pooler pods: {:.1} s to Hibernated; wake: {:.1} s to the primary back",
        hibernated_in.as_secs_f64(),
        woken_in.as_secs_f64()
    );
}
