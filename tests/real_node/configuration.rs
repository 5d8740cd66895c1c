//! spec.postgresql and spec.bootstrap.initdb on real PostgreSQL (issue 23): initdb options take
//! effect, a reload-only parameter reaches every instance without a restart, a restart-only one
//! rolls the instances switchover-first under the writer with no acknowledged commit lost, and
//! a pg_hba rule of the spec is enforced.

use crate::environment::{admin_client, install_chart, real_database, real_namespace, real_node_or_skip, wait_running};
use crate::failover::{epoch_now, figures, last_id, start_writer, wait_settled_instances, DATABASE};
use crate::postgres::kubectl_quiet;
use crate::support::eventually;
use dbservice_operator::api::database_service::DatabaseService;
use dbservice_operator::api::postgresql::{InitdbSpec, PostgresqlSpec};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use std::time::Duration;

const INSTANCES: [&str; 2] = ["ha-0", "ha-1"];

/// `SHOW name` on every instance, once each answers.
fn shown_everywhere(namespace: &str, name: &str) -> Option<Vec<String>> {
    answered_everywhere(namespace, &format!("show {name}"))
}

/// `query`'s answer on every instance, or None when one does not answer.
fn answered_everywhere(namespace: &str, query: &str) -> Option<Vec<String>> {
    INSTANCES.iter().map(|pod| kubectl_quiet(namespace, pod, query).map(|value| value.trim().to_string())).collect()
}

/// The instances' pod UIDs (empty strings for pods not there at the moment).
async fn uids(pods: &Api<Pod>) -> Vec<String> {
    let mut uids = Vec::new();
    for name in INSTANCES {
        uids.push(pods.get_opt(name).await.ok().flatten().and_then(|pod| pod.uid()).unwrap_or_default());
    }
    uids
}

/// A network login inside instance `pod` as the application role into `database` (TLS, the
/// password from the pod's credentials file); its error text when refused.
fn network_login(namespace: &str, pod: &str, database: &str) -> Result<(), String> {
    crate::environment::network_login(
        namespace,
        pod,
        "$APPLICATION_USER",
        "$(cat /dbservice/credentials/password)",
        database,
    )
}

#[tokio::test]
async fn parameters_reload_or_roll_switchover_first_and_initdb_and_pg_hba_take_effect() {
    let Some(node) = real_node_or_skip("parameters_reload_or_roll_switchover_first") else { return };
    install_chart(node);
    let client = admin_client().await;
    let namespace = real_namespace(&client, "configuration").await;
    let ns = namespace.name.as_str();
    let databases: Api<DatabaseService> = Api::namespaced(client.clone(), ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let mut database = real_database(node, DATABASE, 2, "Delete");
    database.spec.postgresql = Some(PostgresqlSpec {
        parameters: [("work_mem".to_string(), "8MB".to_string())].into(),
        pg_hba: vec!["hostssl postgres all all reject".into()],
    });
    database.spec.bootstrap = Some(dbservice_operator::api::backup::BootstrapSpec {
        import: None,
        recovery: None,
        initdb: Some(InitdbSpec { data_checksums: Some(true), locale: Some("C".into()), ..Default::default() }),
    });
    databases.create(&PostParams::default(), &database).await.unwrap();
    wait_running(&client, ns, DATABASE, 2, Duration::from_secs(300)).await;
    wait_settled_instances(&client, ns, 2).await;

    // initdb options: checksums and the locale, on the primary and on its clone.
    let checksums = eventually("data checksums on every instance", Duration::from_secs(60), || async {
        shown_everywhere(ns, "data_checksums")
    })
    .await;
    assert_eq!(checksums, ["on", "on"]);
    // The database's collation (the lc_collate setting is gone since PostgreSQL 16).
    let collation = "select datcollate from pg_database where datname = current_database()";
    assert_eq!(answered_everywhere(ns, collation).unwrap(), ["C", "C"]);
    assert_eq!(shown_everywhere(ns, "work_mem").unwrap(), ["8MB", "8MB"]);

    // The spec's pg_hba rule: the application may log into its database, not into postgres.
    for pod in INSTANCES {
        assert_eq!(network_login(ns, pod, "app"), Ok(()), "{pod}");
        let refused = network_login(ns, pod, "postgres").expect_err("refused by the spec's rule");
        assert!(refused.contains("pg_hba.conf rejects connection"), "{pod}: {refused}");
    }

    start_writer(&client, node, ns).await;
    let before = uids(&pods).await;

    // A reload-only parameter: every instance shows it, no pod restarts.
    let patch = Patch::Merge(serde_json::json!({"spec": {"postgresql": {"parameters": {"work_mem": "16MB"}}}}));
    databases.patch(DATABASE, &PatchParams::default(), &patch).await.unwrap();
    eventually("work_mem reloaded on every instance", Duration::from_secs(60), || async {
        shown_everywhere(ns, "work_mem").filter(|values| values.iter().all(|value| value == "16MB"))
    })
    .await;
    eventually("the status shows the parameters applied everywhere", Duration::from_secs(60), || async {
        let status = databases.get(DATABASE).await.ok()?.status?;
        status.instances.iter().all(|instance| instance.parameters_applied == Some(true)).then_some(())
    })
    .await;
    assert_eq!(uids(&pods).await, before, "a reload-only change restarted a pod");

    // A restart-only parameter: the instances roll (standby first, a switchover, the old primary),
    // every instance runs it afterwards, and the writer lost nothing.
    let since = last_id(ns);
    let changed_at = epoch_now();
    let patch = Patch::Merge(
        serde_json::json!({"spec": {"postgresql": {"parameters": {"work_mem": "16MB", "max_connections": "120"}}}}),
    );
    databases.patch(DATABASE, &PatchParams::default(), &patch).await.unwrap();
    // The old primary restarts once as a standby after the switchover (and shows the new value
    // then); the rollout is done once both pods are new.
    eventually("both pods replaced", Duration::from_secs(300), || async {
        let now = uids(&pods).await;
        before.iter().zip(&now).all(|(old, new)| old != new).then_some(())
    })
    .await;
    wait_settled_instances(&client, ns, 2).await;
    let values = eventually("every instance answering", Duration::from_secs(60), || async {
        shown_everywhere(ns, "max_connections")
    })
    .await;
    assert_eq!(values, ["120", "120"]);
    eventually("no restart pending in the status", Duration::from_secs(60), || async {
        let status = databases.get(DATABASE).await.ok()?.status?;
        status.instances.iter().all(|instance| instance.pending_restart.is_empty() && instance.ready).then_some(())
    })
    .await;
    let (_, lost) = figures(&client, node, ns, "restart-only parameter rolled", changed_at, since).await;
    assert_eq!(lost, 0, "acknowledged commits lost during the parameter rollout");
}
