//! The fault-injection suite (issue 21): real PostgreSQL in real pods under the operator, two
//! checkers running through every fault ([`checkers`]), and one test per fault. Each test prints
//! one line `[fault] <fault> | RTO <s> | acknowledged <n> | lost <n> | overlap <none|...>`, the
//! figures of the README's table (`make test`, or `cargo test --test real_node faults`).
//!
//! Faults run in their own namespaces, at most [`PARALLEL_FAULTS`] at a time: the real node has two
//! cores, and a fault measured on a starved machine measures the machine.

mod checkers;
mod drain;
pub mod host;
mod network;
mod operations;
mod stalls;
mod store;
mod topology;

use crate::environment::{
    admin_client, install_chart, real_database, real_namespace, real_node_or_skip, wait_running, RealNode,
};
use crate::failover::{figures, start_writer, wait_settled_instances, writer_log, DATABASE};
use crate::support::TestNamespace;
use checkers::{overlaps, pinned_log, start_pinned_writer, terms, Term};
use dbservice_operator::api::database_service::DatabaseService;
use dbservice_operator::api::synchronous::DataDurability;
use kube::api::PostParams;
use kube::Api;
use std::time::Duration;

/// The primary Lease's renew deadline (the default): a primary that cannot renew stops writing
/// this long after its last renewal was sent.
pub const RENEW_DEADLINE: Duration = dbservice_operator::lease::LeaseTimings::DEFAULT.renew_deadline;

/// Faults measured at the same time.
pub const PARALLEL_FAULTS: usize = 2;
static SLOTS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(PARALLEL_FAULTS);

/// One of the [`PARALLEL_FAULTS`] slots, with the operator's pods kept where they are while it is
/// held: a fault measured while a test restarts the operator (tests/real_node/operator.rs,
/// failover.rs) measures the restart instead (seen in CI: the leader changed 7 s into a stalled
/// primary's fault, no failover came before the fenced primary restarted, and the test waited for
/// one in vain).
pub struct FaultSlot {
    _permit: tokio::sync::SemaphorePermit<'static>,
    _operator_pods_stay: tokio::sync::RwLockReadGuard<'static, ()>,
}

/// A [`FaultSlot`], for a fault or another heavy test (the smoke set of a major) that must not
/// starve the faults measured beside it (seen in CI: four two-instance databases beside the
/// three-instance fault made its recovery hang, see the README's fault table).
pub async fn slot() -> FaultSlot {
    let permit = SLOTS.acquire().await.expect("the semaphore is never closed");
    let operator_pods_stay = crate::environment::operator_pods_lock().read().await;
    FaultSlot { _permit: permit, _operator_pods_stay: operator_pods_stay }
}

/// One database under both checkers, in its own namespace.
pub struct Bed {
    pub client: kube::Client,
    pub node: &'static RealNode,
    pub namespace: TestNamespace,
    pub instances: usize,
    _slot: FaultSlot,
}

/// What a fault cost.
#[derive(Debug)]
pub struct Outcome {
    /// From the fault to the first commit acknowledged through the Service after the outage.
    pub rto: f64,
    /// Commits the Service writer saw acknowledged since the fault.
    pub acknowledged: usize,
    /// Of those, missing on the final primary.
    pub lost: usize,
    /// Terms of different servers that overlapped (two writable primaries).
    pub overlaps: Vec<(Term, Term)>,
}

/// How a [`Bed`]'s database differs from the default one.
#[derive(Default)]
struct BedOptions<'a> {
    /// WAL archiving into this object store endpoint.
    store: Option<&'a str>,
    /// PostgreSQL version other than the node's default.
    version: Option<&'a str>,
    /// One instance on each real node.
    across_nodes: bool,
    /// Volumes of exactly the claimed size.
    sized_volumes: bool,
    /// `spec.failover.dataDurability` (default: the operator's).
    durability: Option<DataDurability>,
}

impl Bed {
    /// A database of `instances` on the real node with both writers committing; None when the
    /// test skips (no real node outside CI).
    pub async fn start(fault: &str, instances: usize) -> Option<Bed> {
        Bed::start_with(fault, instances, None).await
    }

    /// Like [`Bed::start`], with WAL archiving into `store` (an endpoint the pods reach).
    pub async fn start_with(fault: &str, instances: usize, store: Option<&str>) -> Option<Bed> {
        Bed::start_on(fault, instances, store, None).await
    }

    /// Like [`Bed::start_with`], on PostgreSQL `version` (one of the node's other versions)
    /// instead of the default one.
    pub async fn start_on(fault: &str, instances: usize, store: Option<&str>, version: Option<&str>) -> Option<Bed> {
        Bed::start_in(fault, instances, BedOptions { store, version, ..BedOptions::default() }).await
    }

    /// Like [`Bed::start_on`], on volumes of exactly `storageSize` (1 GiB) that a test can fill.
    pub async fn start_on_sized_volumes(fault: &str, instances: usize, version: Option<&str>) -> Option<Bed> {
        Bed::start_in(fault, instances, BedOptions { sized_volumes: true, version, ..BedOptions::default() }).await
    }

    /// Like [`Bed::start_with`], with `spec.failover.dataDurability: durability` when given.
    pub async fn start_with_durability(
        fault: &str,
        instances: usize,
        store: Option<&str>,
        durability: Option<DataDurability>,
    ) -> Option<Bed> {
        Bed::start_in(fault, instances, BedOptions { store, durability, ..BedOptions::default() }).await
    }

    /// Its instances' names (pods `NAME-0` …).
    pub fn instance_names(&self) -> Vec<String> {
        (0..self.instances).map(|ordinal| format!("{DATABASE}-{ordinal}")).collect()
    }

    /// Like [`Bed::start`], with `spec.failover.dataDurability: durability`.
    pub async fn start_durable(fault: &str, instances: usize, durability: DataDurability) -> Option<Bed> {
        Bed::start_in(fault, instances, BedOptions { durability: Some(durability), ..BedOptions::default() }).await
    }

    /// Two instances in the default mode, or three under `durability` (with two, `required` would
    /// make writes wait until a failed-over primary rejoins): the beds of the faults measured in
    /// every mode.
    pub async fn start_in_mode(fault: &str, durability: Option<DataDurability>) -> Option<Bed> {
        match durability {
            None => Bed::start(fault, 2).await,
            Some(mode) => Bed::start_durable(fault, 3, mode).await,
        }
    }

    /// Like [`Bed::start`], with the instances on both real nodes (one per node: a required
    /// anti-affinity) and the writers on the first one (`tests/cluster/second-node.sh`).
    pub async fn start_across_nodes(fault: &str, instances: usize) -> Option<Bed> {
        Bed::start_in(fault, instances, BedOptions { across_nodes: true, ..BedOptions::default() }).await
    }

    async fn start_in(fault: &str, instances: usize, options: BedOptions<'_>) -> Option<Bed> {
        let BedOptions { store, version, across_nodes, sized_volumes, durability } = options;
        let node = real_node_or_skip(fault)?;
        let slot = slot().await;
        install_chart(node);
        let client = admin_client().await;
        let namespace = if across_nodes {
            drain::two_node_namespace(&client, "fault").await
        } else {
            real_namespace(&client, "fault").await
        };
        let databases: Api<DatabaseService> = Api::namespaced(client.clone(), &namespace.name);
        let replicas = i32::try_from(instances).expect("a few instances");
        let mut database = real_database(node, DATABASE, replicas, "Delete");
        if let Some(version) = version {
            database.spec.version = version.to_string();
        }
        if let Some(durability) = durability {
            let failover = database.spec.failover.get_or_insert_with(Default::default);
            failover.data_durability = Some(durability);
        }
        if sized_volumes {
            database.spec.storage_class_name = Some(node.sized_storage_class.clone());
        }
        if across_nodes {
            database.spec.placement = serde_json::from_value(serde_json::json!({
                "enablePodAntiAffinity": "required",
                "tolerations": [{"key": drain::SECOND_NODE_TAINT, "operator": "Exists", "effect": "NoSchedule"}],
            }))
            .expect("a placement");
        }
        if let Some(endpoint) = store {
            crate::support::create_store_secret(&client, &namespace.name).await;
            database.spec.backup = Some(crate::backups::archiving(endpoint, &namespace.name));
        }
        databases.create(&PostParams::default(), &database).await.unwrap();
        wait_running(&client, &namespace.name, DATABASE, replicas, Duration::from_secs(300)).await;
        let bed = Bed { client, node, namespace, instances, _slot: slot };
        bed.primary().await;
        bed.synchronous_when_asked().await;
        start_writer(&bed.client, node, bed.ns()).await;
        start_pinned_writer(&bed.client, node, bed.ns(), instances).await;
        Some(bed)
    }

    /// Waits until the durability asked for is in force (see [`crate::failover::durability_in_force`]).
    async fn synchronous_when_asked(&self) {
        crate::failover::durability_in_force(&self.client, self.ns()).await;
    }

    /// Its namespace.
    pub fn ns(&self) -> &str {
        &self.namespace.name
    }

    /// The DatabaseServices of its namespace.
    pub fn databases(&self) -> Api<DatabaseService> {
        Api::namespaced(self.client.clone(), self.ns())
    }

    /// Asks for a switchover to `target` (the annotation a person sets).
    pub async fn request_switchover(&self, target: &str) {
        let annotation = dbservice_operator::api::failover::SWITCHOVER_ANNOTATION;
        let patch = kube::api::Patch::Merge(serde_json::json!({"metadata": {"annotations": {annotation: target}}}));
        self.databases().patch(DATABASE, &kube::api::PatchParams::default(), &patch).await.unwrap();
    }

    /// The other instance of a two-instance database.
    pub fn other_than(&self, primary: &str) -> String {
        crate::failover::other_of_two(primary)
    }

    /// Waits for one primary behind the Service and every other instance streaming; its name.
    pub async fn primary(&self) -> String {
        wait_settled_instances(&self.client, self.ns(), self.instances).await
    }

    /// Waits until the status names a current primary other than `primary` (a failover has
    /// promoted someone; the database need not have settled yet); its name.
    pub async fn primary_other_than(&self, primary: &str) -> String {
        crate::support::eventually("another primary", crate::failover::SETTLE_TIMEOUT, || async {
            let status = self.databases().get(DATABASE).await.ok()?.status?;
            status.failover.current_primary.filter(|now| now != primary)
        })
        .await
    }

    /// The Service writer's last attempt: the ids after it are the fault's.
    pub fn last_id(&self) -> i64 {
        crate::failover::last_id(self.ns())
    }

    /// Waits until the database has settled again and both writers committed after the fault;
    /// prints the fault's line and returns its figures.
    pub async fn conclude(&self, fault: &str, failed_at: f64, since_id: i64) -> Outcome {
        self.primary().await;
        let (rto, lost) = figures(&self.client, self.node, self.ns(), fault, failed_at, since_id).await;
        let acknowledged =
            writer_log(self.ns()).iter().filter(|attempt| attempt.acknowledged && attempt.id >= since_id).count();
        let commits =
            crate::support::eventually("pinned commits after the fault", Duration::from_secs(120), || async {
                let log = pinned_log(self.ns());
                log.iter().any(|commit| commit.at > failed_at + 1.0).then_some(log)
            })
            .await;
        let terms = terms(&commits);
        let overlaps = overlaps(&terms);
        let overlap = if overlaps.is_empty() {
            "none".to_string()
        } else {
            overlaps
                .iter()
                .map(|(earlier, later)| {
                    format!(
                        "{} (timeline {}) committed until {:.2}, {} (timeline {}) from {:.2}",
                        earlier.server, earlier.timeline, earlier.last, later.server, later.timeline, later.first
                    )
                })
                .collect::<Vec<_>>()
                .join("; ")
        };
        eprintln!("[fault] {fault} | RTO {rto:.1} s | acknowledged {acknowledged} | lost {lost} | overlap {overlap}");
        eprintln!("[fault] {fault}: terms {terms:?}");
        Outcome { rto, acknowledged, lost, overlaps }
    }
}
