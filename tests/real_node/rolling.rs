//! Rolling changes switchover-first on the real node (issue 11): a settings change to a database of
//! two instances under the writer of tests/real_node/failover.rs. The standby's pod is replaced
//! first, then the operator switches over to it, and only then is the old primary's pod replaced;
//! no acknowledged commit is lost.

use crate::environment::{admin_client, install_chart, real_database, real_namespace, real_node_or_skip, wait_running};
use crate::failover::{
    epoch_now, figures, last_id, ledger_entries, start_writer, wait_settled_instances, DATABASE, SETTLE_TIMEOUT,
};
use dbservice_operator::api::database_service::DatabaseService;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use std::collections::BTreeMap;
use std::time::Duration;

#[tokio::test]
async fn a_settings_change_replaces_the_standby_then_switches_over_then_replaces_the_old_primary() {
    let Some(node) = real_node_or_skip("a_settings_change_replaces_the_standby_then_switches_over") else {
        return;
    };
    install_chart(node);
    let client = admin_client().await;
    let namespace = real_namespace(&client, "rolling").await;
    let ns = namespace.name.as_str();
    let databases: Api<DatabaseService> = Api::namespaced(client.clone(), ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    databases.create(&PostParams::default(), &real_database(node, DATABASE, 2, "Delete")).await.unwrap();
    wait_running(&client, ns, DATABASE, 2, Duration::from_secs(300)).await;
    let primary = wait_settled_instances(&client, ns, 2).await;
    let standby = crate::failover::other_of_two(&primary);
    start_writer(&client, node, ns).await;
    let original: BTreeMap<String, String> = pods
        .list(&ListParams::default().labels(&format!("app.kubernetes.io/instance={DATABASE}")))
        .await
        .unwrap()
        .items
        .iter()
        .filter(|pod| pod.name_any().starts_with(&format!("{DATABASE}-")))
        .map(|pod| (pod.name_any(), pod.uid().unwrap()))
        .collect();
    assert_eq!(original.len(), 2, "{original:?}");

    // A settings change: new resource requests, so a new pod template revision.
    let since = last_id(ns);
    let changed_at = epoch_now();
    let patch =
        Patch::Merge(serde_json::json!({"spec": {"resources": {"requests": {"cpu": "50m", "memory": "128Mi"}}}}));
    databases.patch(DATABASE, &PatchParams::default(), &patch).await.unwrap();

    // Watch, every 250 ms, when each original pod goes and when the primary changes.
    let mut replaced_at: BTreeMap<String, f64> = BTreeMap::new();
    let mut primary_changed_at = None;
    let deadline = std::time::Instant::now() + SETTLE_TIMEOUT;
    loop {
        assert!(std::time::Instant::now() < deadline, "rolling change not done: replaced {replaced_at:?}");
        let now = epoch_now();
        for (name, uid) in &original {
            let live = pods.get_opt(name).await.ok().flatten();
            let gone =
                live.is_none_or(|pod| pod.uid().as_ref() != Some(uid) || pod.metadata.deletion_timestamp.is_some());
            if gone {
                replaced_at.entry(name.clone()).or_insert(now);
            }
        }
        let current = databases.get(DATABASE).await.ok().and_then(|database| database.status?.failover.current_primary);
        if primary_changed_at.is_none() && current.as_deref().is_some_and(|current| current != primary) {
            primary_changed_at = Some(now);
        }
        if replaced_at.len() == 2 && crate::failover::settled(&client, ns, 2).await.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let primary_changed_at = primary_changed_at.expect("the primary changed");
    let at = |name: &str| replaced_at[name] - changed_at;
    eprintln!(
        "[figure] rolling change: standby {standby} replaced at +{:.1} s, switchover to it seen at +{:.1} s, \
         old primary {primary} replaced at +{:.1} s",
        at(&standby),
        primary_changed_at - changed_at,
        at(&primary)
    );
    assert!(replaced_at[&standby] < primary_changed_at, "the standby is replaced before the switchover");
    assert!(primary_changed_at <= replaced_at[&primary], "the old primary's pod is replaced only after the switchover");
    let new_primary = wait_settled_instances(&client, ns, 2).await;
    assert_eq!(new_primary, standby, "the updated standby is the primary");
    let (rto, lost) = figures(&client, node, ns, "rolling change (switchover-first)", changed_at, since).await;
    assert_eq!(lost, 0, "a switchover-first rolling change lost {lost} acknowledged commits");
    eprintln!(
        "[figure] rolling change: the first commit after the switchover's outage came {rto:.2} s after the change"
    );
    let switchovers = ledger_entries(ns, "Switchover");
    assert_eq!(switchovers.len(), 1, "{switchovers:?}");
    let _ = pods.delete("writer", &DeleteParams::default()).await;
}
