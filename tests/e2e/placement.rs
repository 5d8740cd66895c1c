//! Placement and drains against the real apiserver, scheduler and disruption controller, on two
//! kwok nodes of each test's own (tainted and labelled for it, so no other test's pods land there
//! and a cordon disturbs nobody else):
//! - `nodeSelector`, `tolerations` and the default anti-affinity reach the pods, which spread;
//! - the PodDisruptionBudgets refuse the primary's eviction, and the disruption controller
//!   allows one standby's;
//! - a required anti-affinity with fewer nodes than instances leaves one Pending, and the database
//!   degrades with the scheduler's reason in its condition;
//! - a cordon of the primary's node starts a switchover to a standby on the other node. No
//!   PostgreSQL runs under kwok: the agents' reports are written with the agent's own Kubernetes
//!   code, as in archiving.rs; the switchover itself is proven on the real node.

use crate::controller::{wait_for_event, wait_for_phase};
use crate::support::operator::shared;
use crate::support::{client_for, cluster_or_skip, database_from_yaml, eventually, TestNamespace};
use dbservice_operator::api::database_service::{DatabaseService, Phase};
use dbservice_operator::api::failover::{InstanceReport, Role, TransitionKind};
use dbservice_operator::api::placement::PodAntiAffinity;
use dbservice_operator::instance::kubernetes::KubeControlPlane;
use dbservice_operator::instance::ControlPlane;
use dbservice_operator::lsn::Lsn;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{EvictParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use std::collections::BTreeSet;
use std::time::Duration;

const TAINT: &str = "dbservice.dev/e2e-placement";

/// Two kwok nodes only the test's database tolerates and selects; removed when dropped. They are
/// not labelled `type=kwok`: other tests count those nodes for capacity (healing.rs).
struct TestNodes {
    names: Vec<String>,
}

impl TestNodes {
    async fn create(client: &Client, namespace: &str) -> TestNodes {
        let nodes: Api<Node> = Api::all(client.clone());
        let names: Vec<String> = ["a", "b"].iter().map(|suffix| format!("{namespace}-{suffix}")).collect();
        for name in &names {
            let node: Node = serde_json::from_value(serde_json::json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "annotations": {"kwok.x-k8s.io/node": "fake"},
                             "labels": {"kubernetes.io/hostname": name, TAINT: namespace}},
                "spec": {"taints": [{"key": TAINT, "value": namespace, "effect": "NoSchedule"}]},
                "status": {"allocatable": {"cpu": "32", "memory": "256Gi", "pods": "110"},
                           "capacity": {"cpu": "32", "memory": "256Gi", "pods": "110"}}
            }))
            .unwrap();
            nodes.create(&PostParams::default(), &node).await.unwrap();
        }
        for name in &names {
            eventually(&format!("node {name} Ready"), Duration::from_secs(60), || async {
                let node = nodes.get(name).await.ok()?;
                let conditions = node.status?.conditions?;
                conditions
                    .iter()
                    .any(|condition| condition.type_ == "Ready" && condition.status == "True")
                    .then_some(())
            })
            .await;
        }
        TestNodes { names }
    }
}

impl Drop for TestNodes {
    fn drop(&mut self) {
        // kubectl, not the test's client: its connection task lives on the runtime being dropped.
        let mut arguments =
            vec!["delete".to_string(), "node".into(), "--wait=false".into(), "--ignore-not-found".into()];
        arguments.extend(self.names.iter().cloned());
        let _ = std::process::Command::new(crate::support::tool("kubectl"))
            .args(&arguments)
            .env("KUBECONFIG", crate::support::admin_kubeconfig().unwrap_or_default())
            .output();
    }
}

fn placed_database(name: &str, namespace: &str, replicas: i32) -> DatabaseService {
    database_from_yaml(&format!(
        "apiVersion: dbservice.dev/v1\nkind: DatabaseService\nmetadata:\n  name: {name}\nspec:\n  version: \"16.4\"\n  \
         storageSize: 1Gi\n  databaseName: app\n  username: app_user\n  replicas: {replicas}\n  \
         nodeSelector: {{\"{TAINT}\": \"{namespace}\"}}\n  \
         tolerations: [{{key: \"{TAINT}\", operator: Equal, value: \"{namespace}\", effect: NoSchedule}}]\n"
    ))
}

fn node_of(pod: &Pod) -> String {
    pod.spec.as_ref().and_then(|spec| spec.node_name.clone()).unwrap_or_default()
}

async fn running_pods(client: &Client, namespace: &str, database: &str, count: usize) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    eventually(&format!("{count} running pods of {database}"), Duration::from_secs(120), || async {
        let listed = pods.list(&Default::default()).await.ok()?.items;
        let running: Vec<Pod> = listed
            .into_iter()
            .filter(|pod| pod.metadata.name.as_deref().is_some_and(|name| name.starts_with(&format!("{database}-"))))
            .filter(|pod| pod.status.as_ref().and_then(|status| status.phase.as_deref()) == Some("Running"))
            .collect();
        (running.len() == count).then_some(running)
    })
    .await
}

async fn evict(client: &Client, namespace: &str, pod: &str) -> Result<(), kube::Error> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    pods.evict(pod, &EvictParams::default()).await.map(drop)
}

fn refused_by_budget(result: &Result<(), kube::Error>) -> bool {
    matches!(result, Err(kube::Error::Api(status)) if status.code == 429)
}

/// A running placed database `name` of `replicas` instances on the test's own two nodes.
struct PlacedDatabase {
    client: Client,
    nodes: TestNodes,
    namespace: TestNamespace,
    databases: Api<DatabaseService>,
    pods: Vec<Pod>,
}

/// A database placed on test nodes of its own and Running; `adjust` changes its spec first.
async fn placed_and_running(
    kubeconfig: &std::path::Path,
    prefix: &str,
    name: &str,
    replicas: i32,
    adjust: impl FnOnce(&mut DatabaseService),
) -> PlacedDatabase {
    let _environment = shared();
    let client = client_for(kubeconfig).await;
    let namespace = TestNamespace::create(&client, prefix).await;
    let ns = namespace.name.clone();
    let nodes = TestNodes::create(&client, &ns).await;
    let databases: Api<DatabaseService> = Api::namespaced(client.clone(), &ns);
    let mut database = placed_database(name, &ns, replicas);
    adjust(&mut database);
    databases.create(&PostParams::default(), &database).await.unwrap();
    wait_for_phase(&databases, name, Phase::Running, Duration::from_secs(180)).await;
    let pods = running_pods(&client, &ns, name, replicas as usize).await;
    PlacedDatabase { client, nodes, namespace, databases, pods }
}

#[tokio::test]
async fn placement_reaches_the_pods_and_the_budgets_keep_the_primary_and_let_one_standby_go() {
    let test = "placement_reaches_the_pods_and_the_budgets_keep_the_primary_and_let_one_standby_go";
    let Some(kubeconfig) = cluster_or_skip(test) else { return };
    let PlacedDatabase { client, nodes, namespace, databases, pods } =
        placed_and_running(&kubeconfig, "placement", "spread", 3, |_| {}).await;
    let ns = namespace.name.as_str();
    let used: BTreeSet<String> = pods.iter().map(node_of).collect();
    assert!(used.iter().all(|node| nodes.names.contains(node)), "only the selected, tolerated nodes: {used:?}");
    assert_eq!(used.len(), 2, "the preferred anti-affinity spreads three instances over both nodes: {used:?}");
    let spec = pods[0].spec.clone().unwrap();
    let preferred =
        spec.affinity.unwrap().pod_anti_affinity.unwrap().preferred_during_scheduling_ignored_during_execution.unwrap();
    assert_eq!(preferred[0].pod_affinity_term.topology_key, "kubernetes.io/hostname");
    assert!(spec.tolerations.unwrap().iter().any(|toleration| toleration.key.as_deref() == Some(TAINT)));

    let budgets: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), ns);
    // The disruption controller has counted the pods: one primary, two standbys, one may go.
    eventually("the budgets' status", Duration::from_secs(60), || async {
        let primary = budgets.get("spread-primary").await.ok()?.status?;
        let standbys = budgets.get("spread-standbys").await.ok()?.status?;
        let counted =
            (primary.expected_pods, primary.disruptions_allowed, standbys.expected_pods, standbys.disruptions_allowed);
        (counted == (Some(1), Some(0), Some(2), Some(1))).then_some(())
    })
    .await;
    // Evictions answered once: kube-client retries a 429 by default, until the budget allows it.
    let client = crate::support::client_without_retries(&kubeconfig).await;
    assert!(
        refused_by_budget(&evict(&client, ns, "spread-0").await),
        "the primary is never evicted while a standby exists"
    );
    // One standby may go.
    evict(&client, ns, "spread-1").await.expect("one standby may be evicted");
    crate::controller::delete_and_wait_gone(&databases, "spread").await;
}

/// Publishes the reports the agents of `database` would under kwok (which runs none): `NAME-0` a
/// ready primary, `NAME-1` a standby streaming from it.
pub async fn publish_primary_and_standby(client: &Client, namespace: &str, database: &str) {
    for (ordinal, role, received) in [(0, Role::Primary, None), (1, Role::Standby, Some(0x300_0000))] {
        let pod = format!("{database}-{ordinal}");
        let agent = KubeControlPlane::new(
            client.clone(),
            client.clone(),
            namespace,
            database,
            &pod,
            5432,
            Duration::from_secs(15),
            Duration::from_secs(10),
        );
        agent.publish(&report(role, received)).await.unwrap();
    }
}

/// A report as an agent publishes it, for tests that run no agent (kwok).
pub fn report(role: Role, received: Option<u64>) -> InstanceReport {
    InstanceReport {
        role,
        timeline: 1,
        received_lsn: received.map(Lsn),
        replay_lsn: received.map(Lsn),
        wal_receiver: role == Role::Standby,
        postgres_ready: true,
        fenced: false,
        disk_full: false,
        shutdown_checkpoint_lsn: None,
        parameters: None,
        pending_restart: Vec::new(),
        declared: None,
        import: None,
        major_upgrade: None,
        owned_settings_reverted: None,
        waits_for: None,
        discarded_on_rejoin: None,
        reloaded: None,
        volume: None,
        archiving: None,
    }
}

#[tokio::test]
async fn a_cordon_of_the_primarys_node_starts_a_switchover_to_a_standby_on_another_node() {
    let test = "a_cordon_of_the_primarys_node_starts_a_switchover_to_a_standby_on_another_node";
    let Some(kubeconfig) = cluster_or_skip(test) else { return };
    let PlacedDatabase { client, nodes: _nodes, namespace, databases, pods } =
        placed_and_running(&kubeconfig, "drain", "drained", 2, |database| {
            // No agent keeps these pods' reports fresh and kwok's nodes may miss a heartbeat under
            // load, which makes the primary's pod unready for a moment: with the default delay (0)
            // that starts a failover, not the drain's switchover this test is about (seen in CI).
            database.spec.failover = Some(serde_json::from_value(serde_json::json!({"delaySeconds": 600})).unwrap());
        })
        .await;
    let ns = namespace.name.as_str();
    let node = |pod: &str| node_of(pods.iter().find(|found| found.metadata.name.as_deref() == Some(pod)).unwrap());
    assert_ne!(node("drained-0"), node("drained-1"), "the instances are on different nodes");
    publish_primary_and_standby(&client, ns, "drained").await;
    eventually("failover engaged (the primary seen healthy)", Duration::from_secs(60), || async {
        let status = databases.get("drained").await.ok()?.status?;
        status.failover.timeline.is_some().then_some(())
    })
    .await;

    let nodes: Api<Node> = Api::all(client.clone());
    let cordon = Patch::Merge(serde_json::json!({"spec": {"unschedulable": true}}));
    nodes.patch(&node("drained-0"), &PatchParams::default(), &cordon).await.unwrap();
    let status = eventually("a switchover to drained-1", Duration::from_secs(60), || async {
        let status = databases.get("drained").await.ok()?.status?;
        (status.failover.target_primary.as_deref() == Some("drained-1")).then_some(status)
    })
    .await;
    let transition = status.failover.transition.expect("a transition under way");
    assert_eq!((transition.kind, transition.from.as_str()), (TransitionKind::Switchover, "drained-0"));
    wait_for_event(&client, ns, "drained", "DrainSwitchover").await;
    crate::controller::delete_and_wait_gone(&databases, "drained").await;
}

#[tokio::test]
async fn a_required_anti_affinity_with_too_few_nodes_degrades_with_the_schedulers_reason() {
    let test = "a_required_anti_affinity_with_too_few_nodes_degrades_with_the_schedulers_reason";
    let Some(kubeconfig) = cluster_or_skip(test) else { return };
    let _environment = shared();
    let client = client_for(&kubeconfig).await;
    let namespace = TestNamespace::create(&client, "required").await;
    let ns = namespace.name.clone();
    let _nodes = TestNodes::create(&client, &ns).await;
    let databases: Api<DatabaseService> = Api::namespaced(client.clone(), &ns);
    let mut database = placed_database("apart", &ns, 3);
    database.spec.placement.enable_pod_anti_affinity = Some(PodAntiAffinity::Required);
    databases.create(&PostParams::default(), &database).await.unwrap();
    // Which instance the scheduler leaves Pending is its choice (the pods are created at once).
    // Under load a claim may bind late, and the first degrade quotes that; the restore probe then
    // asks for every instance again, and the anti-affinity is what is left.
    let status = eventually("Degraded for the anti-affinity", Duration::from_secs(420), || async {
        let status = databases.get("apart").await.ok()?.status?;
        let degraded = status.conditions.iter().find(|condition| condition.type_ == "Degraded")?;
        let quoted = degraded.status == "True"
            && degraded.message.contains("cannot be scheduled")
            && degraded.message.contains("anti-affinity");
        (quoted && status.phase == Some(Phase::Degraded)).then_some(status)
    })
    .await;
    // Those that run are on different nodes.
    let running = status.degraded_replicas.expect("degradedReplicas set");
    let pods = running_pods(&client, &ns, "apart", running as usize).await;
    let used: BTreeSet<String> = pods.iter().map(node_of).collect();
    assert_eq!(used.len(), pods.len(), "{used:?}");
    crate::controller::delete_and_wait_gone(&databases, "apart").await;
}
