//! Automatic volume growth (issue 42) on the real node: a database of two instances on growable
//! volumes (XFS file systems of exactly their claim, which the test provisioner grows online as a
//! CSI driver would) with `spec.storageGrowth`. Filling the primary's volume past the threshold
//! grows every claim by the step, the file systems the pods see grow with them, PostgreSQL keeps
//! taking writes, and the ledger and Events say so; at the limit growth stops and says that once.

use crate::environment::{
    admin_client, install_chart, psql_in_instance, real_database, real_namespace, real_node_or_skip, wait_running,
};
use crate::support::{eventually, kubectl};
use dbservice_operator::api::database_service::DatabaseService;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{ListParams, PostParams};
use kube::{Api, Client};
use std::time::{Duration, Instant};

/// The fault beds' name, which the failover helpers (settled, other_of_two) look for.
use crate::failover::DATABASE;
/// The manual's bound from a volume past the threshold to every claim at its new size
/// (docs/manual/src/operations/storage.md).
const GROWN_WITHIN: Duration = Duration::from_secs(60);
const MIB: u64 = 1024 * 1024;

/// The claims' requested and actual sizes, in MiB, sorted by claim.
async fn claim_sizes(client: &Client, namespace: &str) -> Vec<(u64, u64)> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
    let selector = format!("app.kubernetes.io/instance={DATABASE}");
    let mut listed = claims.list(&ListParams::default().labels(&selector)).await.unwrap().items;
    listed.sort_by_key(|claim| claim.metadata.name.clone());
    let mib = |quantity: Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity>| {
        quantity.map_or(0, |quantity| dbservice_operator::quantity::parse_bytes(&quantity.0).unwrap_or(0) as u64 / MIB)
    };
    listed
        .iter()
        .map(|claim| {
            let requested =
                claim.spec.as_ref().and_then(|spec| spec.resources.as_ref()?.requests.as_ref()?.get("storage"));
            let capacity = claim.status.as_ref().and_then(|status| status.capacity.as_ref()?.get("storage"));
            (mib(requested), mib(capacity))
        })
        .collect()
}

/// The data volume's size and use as `df` in the pod sees them, in KiB (`df -Pk`: the image's
/// busybox has no `--output`).
fn volume_in_pod(namespace: &str, pod: &str) -> (u64, u64) {
    let text =
        kubectl(&["-n", namespace, "exec", pod, "-c", "postgres", "--", "df", "-Pk", "/var/lib/postgresql/data"]);
    let line = text.lines().last().unwrap_or_default();
    let mut numbers = line.split_whitespace().skip(1).map(|number| number.parse::<u64>().unwrap_or(0));
    (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0))
}

/// Fills `pod`'s data volume to `percent` with a file beside the data directory (at 100 %, to the
/// last byte: the write that finds no room ends the fill).
fn fill(namespace: &str, pod: &str, percent: u64, file: &str) {
    let (size, used) = volume_in_pod(namespace, pod);
    let more = (size * percent / 100).saturating_sub(used);
    let write = format!("head -c {} /dev/zero > /var/lib/postgresql/data/{file}; sync; true", more * 1024);
    kubectl(&["-n", namespace, "exec", pod, "-c", "postgres", "--", "sh", "-c", &write]);
}

/// Waits until every claim has `mib` requested and in its status; how long that took.
async fn grown_to(client: &Client, namespace: &str, mib: u64, since: Instant) -> Duration {
    eventually(&format!("every claim at {mib} MiB"), GROWN_WITHIN * 2, || async {
        let sizes = claim_sizes(client, namespace).await;
        (sizes.len() == 2 && sizes.iter().all(|&(requested, capacity)| requested == mib && capacity == mib))
            .then_some(())
    })
    .await;
    since.elapsed()
}

#[tokio::test]
async fn full_volumes_grow_by_the_step_up_to_the_limit_under_a_writing_database() {
    let test = "full_volumes_grow_by_the_step_up_to_the_limit_under_a_writing_database";
    let Some(node) = real_node_or_skip(test) else { return };
    let _slot = crate::faults::slot().await;
    install_chart(node);
    let client = admin_client().await;
    let namespace = real_namespace(&client, "growth").await;
    let ns = namespace.name.as_str();
    let databases: Api<DatabaseService> = Api::namespaced(client.clone(), ns);
    let mut database = real_database(node, DATABASE, 2, "Delete");
    database.spec.storage_class_name = Some(node.growable_storage_class.clone());
    database.spec.storage_growth = Some(
        serde_json::from_value(serde_json::json!({"limit": "2Gi", "whenUsedPercent": 80, "stepPercent": 50})).unwrap(),
    );
    databases.create(&PostParams::default(), &database).await.unwrap();
    wait_running(&client, ns, DATABASE, 2, Duration::from_secs(300)).await;
    let primary = crate::failover::wait_settled_instances(&client, ns, 2).await;
    psql_in_instance(
        ns,
        &primary,
        "create table kept as select i, md5(i::text) as note from generate_series(1, 5000) i",
    );
    // Stored as written (no compression), so that a batch of rows takes the room it says.
    psql_in_instance(ns, &primary, "alter table kept alter column note set storage external");
    assert_eq!(claim_sizes(&client, ns).await, vec![(1024, 1024), (1024, 1024)], "1Gi claims before any growth");
    let (size_before, _) = volume_in_pod(ns, &primary);

    // 1. The volume 75 % full by a file, then a writer takes it past 80 %: every claim grows by
    // half, 1Gi to 1536Mi, and no write is refused.
    fill(ns, &primary, 75, "filler-1");
    let writing = Instant::now();
    let mut batches = 0;
    let took = loop {
        let sizes = claim_sizes(&client, ns).await;
        if sizes.iter().all(|&(requested, capacity)| requested == 1536 && capacity == 1536) {
            break writing.elapsed();
        }
        assert!(writing.elapsed() < GROWN_WITHIN * 2, "the claims did not grow while written: {sizes:?}");
        // 4 MB of rows (and as much WAL) a batch; psql fails the test on any refused write.
        psql_in_instance(ns, &primary, "insert into kept select i, repeat('x', 4000) from generate_series(1, 1000) i");
        batches += 1;
    };
    let (size_after, used_after) = volume_in_pod(ns, &primary);
    eprintln!(
        "[figure] storage growth: 1Gi to 1536Mi {:.1} s after a writer started past 75% ({batches} batches of 4 MB, \
         none refused); the pod's file system {size_before} KiB to {size_after} KiB ({used_after} KiB used)",
        took.as_secs_f64()
    );
    assert!(took <= GROWN_WITHIN, "grown after {took:?} (at most {GROWN_WITHIN:?})");
    assert!(
        size_after > size_before * 14 / 10,
        "the file system grew with its claim: {size_before} to {size_after} KiB"
    );
    let standby = crate::failover::other_of_two(&primary);
    let (standby_size, _) = volume_in_pod(ns, &standby);
    assert!(standby_size > size_before * 14 / 10, "the standby's file system grew too: {standby_size} KiB");
    let entries = crate::support::ledger_entries(&client, ns, DATABASE).await;
    let grown = entries.iter().find(|entry| entry.action == "StorageGrown").expect("a StorageGrown ledger entry");
    assert_eq!((grown.from.as_str(), grown.to.as_str()), ("1Gi", "1536Mi"), "{grown:?}");
    assert!(grown.outcome.starts_with(&primary), "the instance that filled is named: {grown:?}");
    let rows = psql_in_instance(ns, &primary, "select count(*) from kept");

    // 2. The volume filled to the last byte: PostgreSQL cannot write, the volumes grow to the limit
    // (the next step would pass it), and it takes writes again with every row it had.
    let full = Instant::now();
    fill(ns, &primary, 100, "filler-2");
    let took = grown_to(&client, ns, 2048, full).await;
    let back = eventually("writes taken again after the growth", Duration::from_secs(120), || async {
        let sql = "insert into kept values (0, 'after'); select count(*) from kept";
        crate::environment::try_psql_in_instance(ns, &primary, sql).filter(|out| !out.trim().is_empty())
    })
    .await;
    eprintln!(
        "[figure] storage growth: a volume filled to 100% grew to 2Gi {:.1} s later; writes taken again after {:.1} s",
        took.as_secs_f64(),
        full.elapsed().as_secs_f64()
    );
    let before: u64 = rows.trim().parse().unwrap();
    let after: u64 = back.trim().lines().last().unwrap_or_default().parse().unwrap();
    assert_eq!(after, before + 1, "every row kept through the full volume");

    // 3. Full at the limit: no growth, a Warning event and a ledger entry, once.
    fill(ns, &primary, 90, "filler-3");
    eventually("StorageGrowthLimitReached in the ledger", Duration::from_secs(60), || async {
        crate::support::ledger_entries(&client, ns, DATABASE)
            .await
            .iter()
            .any(|entry| entry.action == "StorageGrowthLimitReached")
            .then_some(())
    })
    .await;
    let reasons = kubectl(&["-n", ns, "get", "events", "-o", "jsonpath={.items[*].reason}"]);
    assert!(reasons.contains("StorageGrowthLimitReached"), "a Warning event at the limit: {reasons}");
    assert_eq!(claim_sizes(&client, ns).await, vec![(2048, 2048), (2048, 2048)], "never past the limit");
    let status = databases.get(DATABASE).await.unwrap().status.unwrap().storage.unwrap();
    assert_eq!(status.grown_to.as_deref(), Some("2Gi"), "{status:?}");
    assert_eq!(status.at_limit, Some(true), "{status:?}");
    let database = databases.get(DATABASE).await.unwrap();
    let condition =
        database.status.unwrap().conditions.into_iter().find(|condition| condition.type_ == "StorageGrowth");
    let condition = condition.expect("condition StorageGrowth");
    assert_eq!((condition.status.as_str(), condition.reason.as_str()), ("False", "LimitReached"), "{condition:?}");
    let growths = crate::support::ledger_entries(&client, ns, DATABASE)
        .await
        .iter()
        .filter(|entry| entry.action.starts_with("StorageGrow"))
        .count();
    assert_eq!(growths, 3, "two growths and one limit reached, each told once");
    for file in ["filler-1", "filler-2", "filler-3"] {
        kubectl(&[
            "-n",
            ns,
            "exec",
            &primary,
            "-c",
            "postgres",
            "--",
            "rm",
            "-f",
            &format!("/var/lib/postgresql/data/{file}"),
        ]);
    }

    // 4. Space freed: the reached limit no longer holds (True, AtLimit), without an event; a
    // volume that fills again would be told again.
    eventually("StorageGrowth True (AtLimit) once space is freed", Duration::from_secs(60), || async {
        let status = databases.get(DATABASE).await.ok()?.status?;
        let condition = status.conditions.iter().find(|condition| condition.type_ == "StorageGrowth")?;
        let cleared = status.storage.as_ref()?.at_limit.is_none();
        (condition.status == "True" && condition.reason == "AtLimit" && cleared).then_some(())
    })
    .await;
    let told = crate::support::ledger_entries(&client, ns, DATABASE).await;
    assert_eq!(told.iter().filter(|entry| entry.action.starts_with("StorageGrow")).count(), 3, "freeing is quiet");
}
