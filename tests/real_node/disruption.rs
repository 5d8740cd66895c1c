//! The PodDisruptionBudgets on real pods (issue 39): of three instances, the primary's eviction is
//! refused, one standby's is allowed, and the other standby's is refused for as long as the first
//! is away (its pod stopping PostgreSQL, then back but not yet Ready); once the first is Ready
//! again, the second may go. Under kwok a recreated pod is Ready at once, so only real pods show
//! the "while the first is away" part.

use crate::environment::{admin_client, install_chart, real_database, real_namespace, real_node_or_skip, wait_running};
use crate::failover::{wait_settled_instances, DATABASE};
use crate::support::eventually;
use dbservice_operator::api::database_service::DatabaseService;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{EvictParams, PostParams};
use kube::{Api, ResourceExt};
use std::time::{Duration, Instant};

fn refused_by_budget(result: &Result<(), kube::Error>) -> bool {
    matches!(result, Err(kube::Error::Api(status)) if status.code == 429)
}

async fn evict(pods: &Api<Pod>, name: &str) -> Result<(), kube::Error> {
    pods.evict(name, &EvictParams::default()).await.map(drop)
}

/// True when pod `name` exists with another uid than `gone` and is Ready.
async fn back_and_ready(pods: &Api<Pod>, name: &str, gone: &str) -> bool {
    let Ok(Some(pod)) = pods.get_opt(name).await else { return false };
    let ready = pod
        .status
        .as_ref()
        .and_then(|status| status.conditions.as_ref())
        .is_some_and(|conditions| conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    pod.uid().as_deref() != Some(gone) && ready
}

#[tokio::test]
async fn standbys_are_evicted_one_at_a_time_and_the_second_waits_while_the_first_is_away() {
    let test = "standbys_are_evicted_one_at_a_time_and_the_second_waits_while_the_first_is_away";
    let Some(node) = real_node_or_skip(test) else { return };
    install_chart(node);
    let client = admin_client().await;
    let namespace = real_namespace(&client, "budget").await;
    let ns = namespace.name.as_str();
    let databases: Api<DatabaseService> = Api::namespaced(client.clone(), ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    databases.create(&PostParams::default(), &real_database(node, DATABASE, 3, "Delete")).await.unwrap();
    wait_running(&client, ns, DATABASE, 3, Duration::from_secs(300)).await;
    let primary = wait_settled_instances(&client, ns, 3).await;
    let standbys: Vec<String> =
        (0..3).map(|ordinal| format!("{DATABASE}-{ordinal}")).filter(|name| *name != primary).collect();

    let budgets: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), ns);
    eventually(
        "the budgets count one primary and two standbys, one of which may go",
        Duration::from_secs(60),
        || async {
            let primary = budgets.get(&format!("{DATABASE}-primary")).await.ok()?.status?;
            let standbys = budgets.get(&format!("{DATABASE}-standbys")).await.ok()?.status?;
            let counted = (
                primary.expected_pods,
                primary.disruptions_allowed,
                standbys.expected_pods,
                standbys.disruptions_allowed,
            );
            (counted == (Some(1), Some(0), Some(2), Some(1))).then_some(())
        },
    )
    .await;
    assert!(refused_by_budget(&evict(&pods, &primary).await), "the primary is never evicted while a standby exists");

    let (first, second) = (&standbys[0], &standbys[1]);
    let first_uid = pods.get(first).await.unwrap().uid().unwrap();
    evict(&pods, first).await.expect("one standby may be evicted");
    let evicted_at = Instant::now();
    // While the first is away, every attempt on the second is refused (one that went through
    // would leave the database with its primary alone).
    let mut refused = 0;
    while !back_and_ready(&pods, first, &first_uid).await {
        assert!(evicted_at.elapsed() < Duration::from_secs(300), "{first} did not come back Ready within 300 s");
        let attempt = evict(&pods, second).await;
        assert!(
            refused_by_budget(&attempt),
            "{second} was evicted while {first} was away ({:?} after its eviction): {attempt:?}",
            evicted_at.elapsed()
        );
        refused += 1;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let away = evicted_at.elapsed();
    eprintln!("{first} away for {away:?}; {refused} evictions of {second} refused meanwhile");
    assert!(refused >= 1, "{first} was back before the second eviction could be tried");
    // Back and Ready: the budget lets the second go (once the disruption controller has recounted).
    eventually("the second standby's eviction allowed once the first is back", Duration::from_secs(60), || async {
        evict(&pods, second).await.ok()
    })
    .await;
}
