//! Storage, pause and degrade behaviours of the controller on the real control plane.

use crate::controller::{condition, wait_for_ledger, wait_for_phase};
use crate::support::operator::shared;
use crate::support::{client_for, cluster_or_skip, eventually, kubectl, sample_database, TestNamespace};
use dbservice_operator::api::database_service::{DatabaseService, Phase};
use dbservice_operator::api::failover::Role;
use dbservice_operator::api::storage::VolumeReport;
use dbservice_operator::instance::kubernetes::KubeControlPlane;
use dbservice_operator::instance::ControlPlane;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Service};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, PropagationPolicy};
use kube::Api;
use std::time::{Duration, Instant};

fn claim_request(claim: &PersistentVolumeClaim) -> Option<String> {
    claim.spec.as_ref()?.resources.as_ref()?.requests.as_ref()?.get("storage").map(|quantity| quantity.0.clone())
}

#[tokio::test]
async fn a_wait_for_first_consumer_class_does_not_deadlock_provisioning() {
    let Some(kubeconfig) = cluster_or_skip("a_wait_for_first_consumer_class_does_not_deadlock_provisioning") else {
        return;
    };
    shared();
    let client = client_for(&kubeconfig).await;
    let namespace = TestNamespace::create(&client, "wffc").await;
    let api: Api<DatabaseService> = Api::namespaced(client.clone(), &namespace.name);
    let mut database = sample_database("lazy");
    database.spec.storage_class_name = Some("wait-for-consumer".into());
    api.create(&PostParams::default(), &database).await.unwrap();
    let running = wait_for_phase(&api, "lazy", Phase::Running, Duration::from_secs(120)).await;
    let storage = eventually("StorageReady=True", Duration::from_secs(60), || async {
        let database = api.get("lazy").await.ok()?;
        (condition(&database, "StorageReady")?.status == "True").then(|| database.status.unwrap().storage.unwrap())
    })
    .await;
    assert_eq!((storage.bound_claims, storage.expected_claims), (1, 1));
    assert_eq!(running.spec.storage_class_name.as_deref(), Some("wait-for-consumer"));
}

#[tokio::test]
async fn growing_storage_patches_each_claim_or_reports_a_class_that_cannot_grow() {
    let Some(kubeconfig) = cluster_or_skip("growing_storage_patches_each_claim_or_reports_a_class_that_cannot_grow")
    else {
        return;
    };
    shared();
    let client = client_for(&kubeconfig).await;
    let namespace = TestNamespace::create(&client, "grow").await;
    let ns = namespace.name.as_str();
    let api: Api<DatabaseService> = Api::namespaced(client.clone(), ns);
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    let mut growable = sample_database("roomy");
    growable.spec.replicas = Some(2);
    api.create(&PostParams::default(), &growable).await.unwrap();
    let mut fixed = sample_database("cramped");
    fixed.spec.storage_class_name = Some("fixed-size".into());
    api.create(&PostParams::default(), &fixed).await.unwrap();
    wait_for_phase(&api, "roomy", Phase::Running, Duration::from_secs(120)).await;
    wait_for_phase(&api, "cramped", Phase::Running, Duration::from_secs(120)).await;
    let grow = Patch::Merge(serde_json::json!({"spec": {"storageSize": "2Gi"}}));
    api.patch("roomy", &PatchParams::default(), &grow).await.unwrap();
    api.patch("cramped", &PatchParams::default(), &grow).await.unwrap();
    for claim in ["data-roomy-0", "data-roomy-1"] {
        eventually(&format!("{claim} asks for 2Gi"), Duration::from_secs(60), || async {
            (claim_request(&claims.get(claim).await.ok()?)?.as_str() == "2Gi").then_some(())
        })
        .await;
    }
    wait_for_ledger(&client, ns, "roomy", "StorageExpanded").await;
    let refused = eventually("StorageReady=False ExpansionNotSupported", Duration::from_secs(60), || async {
        let database = api.get("cramped").await.ok()?;
        let condition = condition(&database, "StorageReady")?.clone();
        (condition.reason == "ExpansionNotSupported").then_some(condition)
    })
    .await;
    assert!(refused.message.contains("fixed-size"), "{}", refused.message);
    assert_eq!(claim_request(&claims.get("data-cramped-0").await.unwrap()).as_deref(), Some("1Gi"));
}

/// Issue 42: an agent reporting its volume past `whenUsedPercent` makes the operator grow every
/// claim by the step (the real node proves the file systems grow: tests/real_node/storage_growth.rs).
#[tokio::test]
async fn a_volume_reported_past_its_threshold_grows_every_claim_by_the_step() {
    let test = "a_volume_reported_past_its_threshold_grows_every_claim_by_the_step";
    let Some(kubeconfig) = cluster_or_skip(test) else { return };
    shared();
    let client = client_for(&kubeconfig).await;
    let namespace = TestNamespace::create(&client, "growth").await;
    let ns = namespace.name.as_str();
    let api: Api<DatabaseService> = Api::namespaced(client.clone(), ns);
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    let mut database = sample_database("filling");
    database.spec.replicas = Some(2);
    database.spec.storage_growth = Some(serde_json::from_value(serde_json::json!({"limit": "4Gi"})).unwrap());
    api.create(&PostParams::default(), &database).await.unwrap();
    wait_for_phase(&api, "filling", Phase::Running, Duration::from_secs(120)).await;
    for (ordinal, role, used_percent) in [(0, Role::Primary, 85), (1, Role::Standby, 75)] {
        let pod = format!("filling-{ordinal}");
        let agent = KubeControlPlane::new(
            client.clone(),
            client.clone(),
            ns,
            "filling",
            &pod,
            5432,
            Duration::from_secs(15),
            Duration::from_secs(10),
        );
        let mut report = crate::placement::report(role, (role == Role::Standby).then_some(0x300_0000));
        report.volume = Some(VolumeReport { size_bytes: 1000 << 20, used_percent });
        agent.publish(&report).await.unwrap();
    }
    for claim in ["data-filling-0", "data-filling-1"] {
        eventually(&format!("{claim} asks for 1536Mi"), Duration::from_secs(60), || async {
            (claim_request(&claims.get(claim).await.ok()?)?.as_str() == "1536Mi").then_some(())
        })
        .await;
    }
    wait_for_ledger(&client, ns, "filling", "StorageGrown").await;
    // A class that cannot grow is told before any volume fills (no report needed).
    let mut fixed = sample_database("fixed");
    fixed.spec.storage_class_name = Some("fixed-size".into());
    fixed.spec.storage_growth = database.spec.storage_growth.clone();
    api.create(&PostParams::default(), &fixed).await.unwrap();
    let refused = eventually("StorageGrowth=False ExpansionNotSupported", Duration::from_secs(60), || async {
        let database = api.get("fixed").await.ok()?;
        let condition = condition(&database, "StorageGrowth")?.clone();
        (condition.reason == "ExpansionNotSupported").then_some(condition)
    })
    .await;
    assert!(refused.message.contains("fixed-size"), "{}", refused.message);
    wait_for_ledger(&client, ns, "fixed", "StorageGrowthImpossible").await;
    let storage = api.get("filling").await.unwrap().status.unwrap().storage.unwrap();
    assert_eq!((storage.grown_to.as_deref(), storage.requested.as_str()), (Some("1536Mi"), "1536Mi"), "{storage:?}");
}

#[tokio::test]
async fn a_paused_database_is_left_alone_until_resumed() {
    let Some(kubeconfig) = cluster_or_skip("a_paused_database_is_left_alone_until_resumed") else { return };
    shared();
    let client = client_for(&kubeconfig).await;
    let namespace = TestNamespace::create(&client, "paused").await;
    let ns = namespace.name.as_str();
    let api: Api<DatabaseService> = Api::namespaced(client.clone(), ns);
    api.create(&PostParams::default(), &sample_database("maint")).await.unwrap();
    wait_for_phase(&api, "maint", Phase::Running, Duration::from_secs(120)).await;
    api.patch("maint", &PatchParams::default(), &Patch::Merge(serde_json::json!({"spec": {"paused": true}})))
        .await
        .unwrap();
    eventually("Paused=True", Duration::from_secs(30), || async {
        let database = api.get("maint").await.ok()?;
        (condition(&database, "Paused")?.status == "True").then_some(())
    })
    .await;
    let services: Api<Service> = Api::namespaced(client.clone(), ns);
    services.delete("maint", &DeleteParams::default()).await.unwrap();
    // While paused, the deleted Service must stay deleted (checked for 15 s: three resync periods of the test operator's fastest requeue).
    let watched_until = Instant::now() + Duration::from_secs(15);
    while Instant::now() < watched_until {
        assert!(services.get_opt("maint").await.unwrap().is_none(), "a paused DatabaseService was reconciled");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    api.patch("maint", &PatchParams::default(), &Patch::Merge(serde_json::json!({"spec": {"paused": false}})))
        .await
        .unwrap();
    eventually("the Service recreated after resuming", Duration::from_secs(60), || async {
        services.get_opt("maint").await.ok()?
    })
    .await;
}

/// The taint of the nodes added for the degraded database, whose value is its namespace.
const EXTRA_NODE_TAINT: &str = "dbservice.dev/e2e-healing";

#[tokio::test]
async fn standbys_without_resources_are_scaled_away_and_restored() {
    let Some(kubeconfig) = cluster_or_skip("standbys_without_resources_are_scaled_away_and_restored") else { return };
    shared();
    let client = client_for(&kubeconfig).await;
    let namespace = TestNamespace::create(&client, "degrade").await;
    let ns = namespace.name.as_str();
    let api: Api<DatabaseService> = Api::namespaced(client.clone(), ns);
    // Nodes have 32 CPUs: with 20 CPUs each, one instance fits per node.
    let nodes = kubectl(&["get", "nodes", "-l", "type=kwok", "-o", "name"]).lines().count();
    let mut database = sample_database("hungry");
    database.spec.replicas = Some(nodes as i32 + 1);
    database.spec.resources =
        Some(serde_json::from_value(serde_json::json!({"requests": {"cpu": "20", "memory": "1Gi"}})).unwrap());
    // The extra nodes below are tainted for this database alone: another test's pod placed there
    // would be deleted with the node at the end, a pod replaced under that test (issue 39: the
    // quiet minute saw its pods replaced in a cluster where nobody touched them).
    database.spec.placement.tolerations = Some(vec![serde_json::from_value(serde_json::json!(
        {"key": EXTRA_NODE_TAINT, "operator": "Equal", "value": ns, "effect": "NoSchedule"}
    ))
    .unwrap()]);
    api.create(&PostParams::default(), &database).await.unwrap();
    let degraded = wait_for_phase(&api, "hungry", Phase::Degraded, Duration::from_secs(120)).await;
    // Other tests' pods may hold CPU too: at least the primary runs, and fewer than asked for.
    let running = degraded.status.as_ref().unwrap().degraded_replicas.expect("degradedReplicas set");
    assert!((1..=nodes as i32).contains(&running), "degraded to {running} instances");
    assert_eq!(condition(&degraded, "Degraded").unwrap().status, "True");
    wait_for_ledger(&client, ns, "hungry", "Degraded").await;
    // Resources return: a new node. The operator's probe restores every instance.
    let extra_nodes: Vec<String> =
        (0..=nodes as i32 - running).map(|index| format!("kwok-extra-{}-{index}", std::process::id())).collect();
    for node in &extra_nodes {
        let manifest = format!(
            "apiVersion: v1\nkind: Node\nmetadata:\n  name: {node}\n  annotations: {{kwok.x-k8s.io/node: fake}}\n  labels: {{type: kwok-extra, kubernetes.io/hostname: {node}}}\nspec:\n  taints: [{{key: {EXTRA_NODE_TAINT}, value: {ns}, effect: NoSchedule}}]\nstatus:\n  allocatable: {{cpu: '32', memory: 256Gi, pods: '110'}}\n  capacity: {{cpu: '32', memory: 256Gi, pods: '110'}}\n"
        );
        let path = std::env::temp_dir().join(format!("{node}.yaml"));
        std::fs::write(&path, manifest).unwrap();
        kubectl(&["apply", "-f", path.to_str().unwrap()]);
    }
    let restored = eventually("all instances restored", Duration::from_secs(120), || async {
        let database = api.get("hungry").await.ok()?;
        let status = database.status.clone()?;
        (status.phase == Some(Phase::Running) && status.ready_replicas == nodes as i32 + 1).then_some(database)
    })
    .await;
    for node in &extra_nodes {
        let _ = std::process::Command::new(crate::support::tool("kubectl"))
            .args(["delete", "node", node, "--wait=false"])
            .env("KUBECONFIG", &kubeconfig)
            .output();
    }
    assert_eq!(condition(&restored, "Degraded").unwrap().status, "False");
    wait_for_ledger(&client, ns, "hungry", "Recovered").await;
}

/// A StatefulSet made by an operator version that used OrderedReady (an immutable field) is
/// re-created with Parallel, its running pods adopted and none of them replaced.
#[tokio::test]
async fn an_ordered_ready_stateful_set_is_recreated_parallel_without_replacing_pods() {
    let Some(kubeconfig) =
        cluster_or_skip("an_ordered_ready_stateful_set_is_recreated_parallel_without_replacing_pods")
    else {
        return;
    };
    shared();
    let client = client_for(&kubeconfig).await;
    let namespace = TestNamespace::create(&client, "legacy").await;
    let ns = namespace.name.as_str();
    let api: Api<DatabaseService> = Api::namespaced(client.clone(), ns);
    let mut database = sample_database("legacy");
    database.spec.replicas = Some(2);
    api.create(&PostParams::default(), &database).await.unwrap();
    wait_for_phase(&api, "legacy", Phase::Running, Duration::from_secs(120)).await;
    let stateful_sets: Api<StatefulSet> = Api::namespaced(client.clone(), ns);
    let current = stateful_sets.get("legacy").await.unwrap();
    assert_eq!(current.spec.pod_management_policy.as_deref(), Some("Parallel"));

    // What an older operator left: the same StatefulSet with OrderedReady, made while paused.
    api.patch("legacy", &PatchParams::default(), &Patch::Merge(serde_json::json!({"spec": {"paused": true}})))
        .await
        .unwrap();
    eventually("Paused=True", Duration::from_secs(30), || async {
        let database = api.get("legacy").await.ok()?;
        (condition(&database, "Paused")?.status == "True").then_some(())
    })
    .await;
    let orphan = DeleteParams { propagation_policy: Some(PropagationPolicy::Orphan), ..Default::default() };
    stateful_sets.delete("legacy", &orphan).await.unwrap();
    eventually("the StatefulSet gone", Duration::from_secs(60), || async {
        stateful_sets.get_opt("legacy").await.ok()?.is_none().then_some(())
    })
    .await;
    let mut legacy = current.clone();
    legacy.metadata = kube::api::ObjectMeta {
        name: current.metadata.name.clone(),
        labels: current.metadata.labels.clone(),
        owner_references: current.metadata.owner_references.clone(),
        ..Default::default()
    };
    legacy.status = None;
    legacy.spec.pod_management_policy = Some("OrderedReady".into());
    let legacy = stateful_sets.create(&PostParams::default(), &legacy).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pod_uids = |owner: Option<String>| {
        let pods = pods.clone();
        async move {
            let mut uids = Vec::new();
            for name in ["legacy-0", "legacy-1"] {
                let pod = pods.get(name).await.ok()?;
                let owned = pod
                    .metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .any(|reference| Some(&reference.uid) == owner.as_ref());
                if owner.is_some() && !owned {
                    return None;
                }
                uids.push(pod.metadata.uid?);
            }
            Some(uids)
        }
    };
    let before = eventually("the pods adopted by the OrderedReady StatefulSet", Duration::from_secs(60), || {
        pod_uids(legacy.metadata.uid.clone())
    })
    .await;

    api.patch("legacy", &PatchParams::default(), &Patch::Merge(serde_json::json!({"spec": {"paused": false}})))
        .await
        .unwrap();
    let recreated = eventually("a Parallel StatefulSet in its place", Duration::from_secs(90), || async {
        let stateful_set = stateful_sets.get_opt("legacy").await.ok()??;
        (stateful_set.spec.pod_management_policy.as_deref() == Some("Parallel")).then_some(stateful_set)
    })
    .await;
    assert_ne!(recreated.metadata.uid, legacy.metadata.uid);
    let after = eventually("the pods adopted by the new StatefulSet", Duration::from_secs(90), || {
        pod_uids(recreated.metadata.uid.clone())
    })
    .await;
    assert_eq!(after, before, "no pod was replaced");
    wait_for_phase(&api, "legacy", Phase::Running, Duration::from_secs(60)).await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    for claim in ["data-legacy-0", "data-legacy-1"] {
        assert!(claims.get_opt(claim).await.unwrap().is_some(), "{claim} kept");
    }
}
