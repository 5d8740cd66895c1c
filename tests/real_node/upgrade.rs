//! In-place major upgrades on the real node (issue 24): a two-instance database of 15 under the fault suite's two writers is upgraded to 17 by changing `spec.version`: a
//! backup first, the primary upgraded with pg_upgrade, the standby cloned again; every
//! acknowledged commit is on the new primary, no two servers accepted writes, both instances run
//! 17 and stream, and a backup after the upgrade (into the new archive) completes. An upgrade that
//! pg_upgrade refuses (an extension the new image lacks) or that the volume has no room for rolls
//! back to 15 on the untouched data. Lines `[upgrade]` give the figures.

use crate::failover::{epoch_now, ledger_entries, DATABASE};
use crate::faults::Bed;
use crate::object_store::{moto_server, skip_or_fail, Store};
use crate::support::eventually;
use dbservice_operator::api::backup::{BootstrapSpec, RecoverySpec};
use dbservice_operator::api::database_service::DatabaseService;
use dbservice_operator::api::database_service_backup::{DatabaseServiceBackup, DatabaseServiceBackupSpec};
use dbservice_operator::api::major_upgrade::{MajorUpgradePhase, MajorUpgradeStatus};
use kube::api::{Patch, PatchParams, PostParams};
use kube::Api;
use std::time::Duration;

/// Longest wait for an upgrade (backup, pg_upgrade, the standby's clone) on a busy 2-core machine.
const UPGRADE_TIMEOUT: Duration = Duration::from_secs(600);

async fn change_version(databases: &Api<DatabaseService>, version: &str, method: Option<&str>) {
    // The image was defaulted from the version: it follows the new one (the mutating webhook).
    let patch = Patch::Merge(serde_json::json!({"spec": {"version": version, "image": null, "upgradeMethod": method}}));
    databases.patch(DATABASE, &PatchParams::default(), &patch).await.unwrap();
}

async fn upgrade_ended(databases: &Api<DatabaseService>, phase: MajorUpgradePhase) -> MajorUpgradeStatus {
    upgrade_to_ended(databases, None, phase).await
}

/// The end of the upgrade to `to_version` (any upgrade when `None`), which must be `phase`.
async fn upgrade_to_ended(
    databases: &Api<DatabaseService>,
    to_version: Option<&str>,
    phase: MajorUpgradePhase,
) -> MajorUpgradeStatus {
    eventually(&format!("the major upgrade {phase:?}"), UPGRADE_TIMEOUT, || async {
        let status = databases.get(DATABASE).await.ok()?.status?;
        let upgrade = status.major_upgrade.filter(|upgrade| to_version.is_none_or(|to| upgrade.to_version == to))?;
        if matches!(upgrade.phase, MajorUpgradePhase::Completed | MajorUpgradePhase::RolledBack) {
            assert_eq!(upgrade.phase, phase, "{upgrade:?}");
            return Some(upgrade);
        }
        None
    })
    .await
}

fn server_major(bed: &Bed, pod: &str) -> u32 {
    let number: u32 =
        crate::environment::psql_in_instance(bed.ns(), pod, "show server_version_num").trim().parse().unwrap();
    number / 10_000
}

#[tokio::test]
async fn a_database_on_15_is_upgraded_in_place_to_17_keeping_every_commit() {
    let fault = "major upgrade 15 to 17 (copy mode)";
    let Some(moto) = moto_server() else {
        return skip_or_fail("no moto_server (python3 -m pip install 'moto[server]')");
    };
    let work = tempfile::Builder::new().prefix("dbservice-upgrade-").tempdir_in("/tmp").unwrap();
    let store = Store::start_on(&moto, &work.path().join("moto.log"), crate::backups::BRIDGE_ADDRESS).await;
    let Some(node) = crate::environment::real_node_or_skip(fault) else { return };
    let from = node.version_of(15);
    let Some(bed) = Bed::start_on(fault, 2, Some(&store.endpoint), Some(&from)).await else { return };
    let target = node.version_of(17);
    let primary = bed.primary().await;
    let (since, failed_at) = (bed.last_id(), epoch_now());
    change_version(&bed.databases(), &target, None).await;
    let upgrade = upgrade_ended(&bed.databases(), MajorUpgradePhase::Completed).await;
    let outcome = bed.conclude(fault, failed_at, since).await;
    assert_eq!(outcome.lost, 0, "{fault}: {outcome:?}");
    assert!(outcome.overlaps.is_empty(), "{fault}: two writable primaries: {:?}", outcome.overlaps);
    assert_eq!(upgrade.primary, primary, "{upgrade:?}");
    assert!(upgrade.steps.iter().any(|step| step.name == "pg_upgrade"), "{upgrade:?}");
    let downtime = upgrade.downtime_milliseconds.expect("the downtime is measured");
    // Every instance runs the new major, and the standby streams from the new primary.
    let new_primary = bed.primary().await;
    for pod in [format!("{DATABASE}-0"), format!("{DATABASE}-1")] {
        assert_eq!(server_major(&bed, &pod), 17, "{pod}");
    }
    assert!(ledger_entries(bed.ns(), "FailoverStarted").is_empty(), "the upgrade must not fail over");
    let upgraded = ledger_entries(bed.ns(), "MajorUpgraded");
    assert_eq!(upgraded.len(), 1, "{upgraded:?}");
    assert!(upgraded[0].outcome.contains("pg_upgrade"), "the ledger keeps each step's time: {upgraded:?}");
    // The backup before the upgrade completed, and one after it goes into the new archive.
    let backups: Api<DatabaseServiceBackup> = Api::namespaced(bed.client.clone(), bed.ns());
    let before = crate::recovery::completed(&backups, &format!("{DATABASE}-before-pg17")).await;
    assert_eq!(before.postgres_major_version, Some(15), "{before:?}");
    crate::environment::psql_in_instance(
        bed.ns(),
        &new_primary,
        "create table upgraded (note text); insert into upgraded values ('written on 17')",
    );
    let spec = DatabaseServiceBackupSpec { database_service: DATABASE.into(), target: None };
    backups.create(&PostParams::default(), &DatabaseServiceBackup::new("after", spec)).await.unwrap();
    let after = crate::recovery::completed(&backups, "after").await;
    assert_eq!(after.postgres_major_version, Some(17), "{after:?}");
    let status = bed.databases().get(DATABASE).await.unwrap().status.unwrap();
    let server_name = format!("{}-pg17", bed.ns());
    assert_eq!(status.archive_server_name.as_deref(), Some(server_name.as_str()));
    assert_eq!(after.server_name, status.archive_server_name, "{after:?}");
    // That backup recovers: a new database of 17 from the new archive, with the row written on 17.
    let mut restored = crate::environment::real_database(bed.node, "restored", 1, "Delete");
    restored.spec.version = target.clone();
    restored.spec.bootstrap = Some(BootstrapSpec {
        import: None,
        initdb: None,
        recovery: Some(RecoverySpec {
            source: crate::backups::object_store(&store.endpoint, &server_name),
            backup_id: after.backup_id.clone(),
            target: None,
            allow_non_empty_archive: None,
        }),
    });
    bed.databases().create(&PostParams::default(), &restored).await.unwrap();
    crate::environment::wait_running(&bed.client, bed.ns(), "restored", 1, Duration::from_secs(300)).await;
    let note = crate::environment::psql_in_instance(bed.ns(), "restored-0", "select note from upgraded");
    assert_eq!(note.trim(), "written on 17");
    assert_eq!(server_major(&bed, "restored-0"), 17);
    let steps: Vec<String> =
        upgrade.steps.iter().map(|step| format!("{} {:.1} s", step.name, step.milliseconds as f64 / 1000.0)).collect();
    eprintln!(
        "[upgrade] 15 to {target}, copy mode, 2 instances under the writers: primary {primary} down {:.1} s ({}); \
         acknowledged {} lost {}; new primary {new_primary}; analyze {:?}",
        downtime as f64 / 1000.0,
        steps.join(", "),
        outcome.acknowledged,
        outcome.lost,
        upgrade.analyze,
    );
}

#[tokio::test]
async fn an_upgrade_to_an_image_without_an_extension_in_use_rolls_back_to_15_on_the_untouched_data() {
    let fault = "major upgrade 15 to 17 with an extension 17 lacks";
    let Some(node) = crate::environment::real_node_or_skip(fault) else { return };
    let Some(bed) = Bed::start_on(fault, 2, None, Some(&node.version_of(15))).await else { return };
    let target = node.version_of(17);
    let primary = bed.primary().await;
    // adminpack ships with 15 and is gone from 17: its library is missing in the new image, and
    // pg_upgrade --check refuses.
    crate::environment::psql_in_instance(
        bed.ns(),
        &primary,
        "create extension adminpack; create table kept (note text); insert into kept values ('written on 15')",
    );
    let (since, failed_at) = (bed.last_id(), epoch_now());
    change_version(&bed.databases(), &target, None).await;
    let upgrade = upgrade_ended(&bed.databases(), MajorUpgradePhase::RolledBack).await;
    let message = upgrade.message.clone().unwrap_or_default();
    assert!(
        message.contains("loadable libraries") && message.contains("adminpack"),
        "pg_upgrade's reason, with the library: {upgrade:?}"
    );
    let outcome = rolled_back_to_15(&bed, fault, &primary, failed_at, since).await;
    let note = crate::environment::psql_in_instance(bed.ns(), &primary, "select note from kept");
    assert_eq!(note.trim(), "written on 15");
    eprintln!(
        "[upgrade] refused 15 to {target}: rolled back in {:.1} s of outage, acknowledged {} lost {}: {message}",
        outcome.rto, outcome.acknowledged, outcome.lost
    );
}

#[tokio::test]
async fn a_copy_mode_upgrade_on_a_volume_without_room_for_the_copy_rolls_back_to_15_with_its_data() {
    let fault = "major upgrade 15 to 17 on a full volume (copy mode)";
    let Some(node) = crate::environment::real_node_or_skip(fault) else { return };
    let Some(bed) = Bed::start_on_sized_volumes(fault, 2, Some(&node.version_of(15))).await else { return };
    let target = node.version_of(17);
    let primary = bed.primary().await;
    // About 600 MB of rows on the primary's 1 GiB volume: a second copy does not fit.
    let rows = 5_000_000;
    load_unlogged_rows(&bed, &primary, rows);
    let size = crate::environment::psql_in_instance(
        bed.ns(),
        &primary,
        "select pg_size_pretty(pg_database_size(current_database()))",
    );
    let (since, failed_at) = (bed.last_id(), epoch_now());
    change_version(&bed.databases(), &target, None).await;
    let upgrade = upgrade_ended(&bed.databases(), MajorUpgradePhase::RolledBack).await;
    let message = upgrade.message.clone().unwrap_or_default();
    assert!(message.contains("not enough free space") && message.contains("upgradeMethod: link"), "{upgrade:?}");
    let outcome = rolled_back_to_15(&bed, fault, &primary, failed_at, since).await;
    let count = crate::environment::psql_in_instance(bed.ns(), &primary, "select count(*) from bulk");
    assert_eq!(count.trim(), rows.to_string(), "the rows of the unlogged table survived the clean stops");
    eprintln!(
        "[upgrade] full volume (database {}), 15 to {target}: rolled back in {:.1} s of outage, acknowledged {} lost {}: {message}",
        size.trim(),
        outcome.rto,
        outcome.acknowledged,
        outcome.lost
    );
}

/// `rows` rows of about 120 bytes in table `bulk` on `primary`. Unlogged, so that the load
/// writes no WAL (which would fill a sized volume before the upgrade); pg_upgrade copies
/// unlogged tables like any other.
fn load_unlogged_rows(bed: &Bed, primary: &str, rows: u64) {
    crate::environment::psql_in_instance(
        bed.ns(),
        primary,
        &format!("create unlogged table bulk as select n::bigint, repeat('x', 80) as filler from generate_series(1, {rows}) n"),
    );
}

/// Whether `pod` runs pg_upgrade itself (not its `--check`): the free-space check is behind it.
fn pg_upgrade_runs(namespace: &str, pod: &str) -> bool {
    let script = r#"for cmdline in /proc/[0-9]*/cmdline; do
  line=$(tr '\0' ' ' < "$cmdline" 2>/dev/null) || continue
  case "$line" in *pg_upgrade\ *--check*) ;; */pg_upgrade\ *) echo running ;; esac
done; true"#;
    // The pod is replaced on the way (the new major's image): not there yet is not running.
    let output = std::process::Command::new(crate::support::tool("kubectl"))
        .args(["-n", namespace, "exec", pod, "-c", "postgres", "--", "/bin/bash", "-c", script])
        .env("KUBECONFIG", crate::support::admin_kubeconfig().expect("cluster"))
        .output()
        .expect("kubectl runs");
    String::from_utf8_lossy(&output.stdout).contains("running")
}

/// Fills the data volume but for LEAVE_MIB MiB, with a file beside the data directory.
const FILL_VOLUME: &str = r#"set -e
volume=/var/lib/postgresql/data
free_kib=$(busybox df -k "$volume" | busybox awk 'NR == 2 {print $4}')
busybox fallocate -l $(( (free_kib - LEAVE_MIB * 1024) * 1024 )) "$volume/dbservice-e2e-filler"
busybox df -k "$volume" | busybox awk 'NR == 2 {print $4}'"#;

/// The volume fills while pg_upgrade runs (its free-space check passed, then something, here a
/// file another process writes, takes the room the copy needed): pg_upgrade fails, its new
/// cluster is removed, and 15 runs again on the untouched data with every commit.
#[tokio::test]
async fn an_upgrade_whose_volume_fills_during_pg_upgrade_rolls_back_to_15_with_its_data() {
    let fault = "major upgrade 15 to 17, the volume filled during pg_upgrade (copy mode)";
    let Some(node) = crate::environment::real_node_or_skip(fault) else { return };
    let Some(bed) = Bed::start_on_sized_volumes(fault, 2, Some(&node.version_of(15))).await else { return };
    let target = node.version_of(17);
    let primary = bed.primary().await;
    // About 250 MB on the 1 GiB volume: a second copy fits, so the free-space check passes.
    let rows = 2_000_000;
    load_unlogged_rows(&bed, &primary, rows);
    let (since, failed_at) = (bed.last_id(), epoch_now());
    change_version(&bed.databases(), &target, Some("copy")).await;
    let (ns, pod) = (bed.ns().to_string(), primary.clone());
    eventually("pg_upgrade running on the primary", UPGRADE_TIMEOUT, || {
        let (ns, pod) = (ns.clone(), pod.clone());
        async move { pg_upgrade_runs(&ns, &pod).then_some(()) }
    })
    .await;
    let left = crate::support::kubectl(&[
        "-n",
        bed.ns(),
        "exec",
        &primary,
        "-c",
        "postgres",
        "--",
        "/bin/bash",
        "-c",
        &FILL_VOLUME.replace("LEAVE_MIB", "8"),
    ]);
    eprintln!("[upgrade] volume filled during pg_upgrade: {} KiB left", left.trim());
    let upgrade = upgrade_ended(&bed.databases(), MajorUpgradePhase::RolledBack).await;
    let message = upgrade.message.clone().unwrap_or_default();
    assert!(message.contains("No space left on device"), "pg_upgrade failed for the full volume: {upgrade:?}");
    // The other process gives its room back; the database must not have needed it to roll back.
    crate::failover::exec_in(bed.ns(), &primary, "rm /var/lib/postgresql/data/dbservice-e2e-filler");
    let outcome = rolled_back_to_15(&bed, fault, &primary, failed_at, since).await;
    let count = crate::environment::psql_in_instance(bed.ns(), &primary, "select count(*) from bulk");
    assert_eq!(count.trim(), rows.to_string(), "every row of the table pg_upgrade was copying");
    let leftovers = crate::support::kubectl(&[
        "-n",
        bed.ns(),
        "exec",
        &primary,
        "-c",
        "postgres",
        "--",
        "ls",
        "/var/lib/postgresql/data",
    ]);
    assert!(!leftovers.contains("pgdata.next"), "the new cluster was removed: {leftovers}");
    eprintln!(
        "[upgrade] volume filled during pg_upgrade, 15 to {target}: rolled back in {:.1} s of outage, acknowledged {} lost {}: {message}",
        outcome.rto, outcome.acknowledged, outcome.lost
    );
}

/// After a rolled-back upgrade: nothing acknowledged was lost, no two primaries, the old primary
/// runs 15 again (every instance does), the RolledBack condition says UpgradeFailed, and there
/// was no failover.
async fn rolled_back_to_15(
    bed: &Bed,
    fault: &str,
    primary: &str,
    failed_at: f64,
    since: i64,
) -> crate::faults::Outcome {
    let outcome = bed.conclude(fault, failed_at, since).await;
    assert_eq!(outcome.lost, 0, "{fault}: {outcome:?}");
    assert!(outcome.overlaps.is_empty(), "{fault}: two writable primaries: {:?}", outcome.overlaps);
    let back = bed.primary().await;
    assert_eq!(back, primary, "the old primary runs again on its own data");
    for pod in [format!("{DATABASE}-0"), format!("{DATABASE}-1")] {
        assert_eq!(server_major(bed, &pod), 15, "{pod}");
    }
    let status = bed.databases().get(DATABASE).await.unwrap().status.unwrap();
    let rolled_back = status.conditions.iter().find(|condition| condition.type_ == "RolledBack").expect("RolledBack");
    assert_eq!(rolled_back.reason, "UpgradeFailed", "{rolled_back:?}");
    assert!(ledger_entries(bed.ns(), "FailoverStarted").is_empty(), "the rollback must not fail over");
    outcome
}

/// Loads about `DBSERVICE_UPGRADE_MEGABYTES` (default 0) of rows into the primary, for the
/// downtime figures of a larger database.
fn load(bed: &Bed, primary: &str) -> u64 {
    let megabytes: u64 =
        std::env::var("DBSERVICE_UPGRADE_MEGABYTES").ok().and_then(|value| value.parse().ok()).unwrap_or(0);
    if megabytes > 0 {
        // About 100 bytes a row on disk.
        let statement = format!(
            "create table bulk as select n::bigint, repeat('x', 40) as filler from generate_series(1, {}) n",
            megabytes * 10_000
        );
        crate::environment::psql_in_instance(bed.ns(), primary, &statement);
    }
    megabytes
}

/// One database of two instances under the writers taken along `path` (majors), link and copy
/// mode in turn: every step Completed on both instances, no acknowledged commit lost, never two
/// writable primaries, no failover.
async fn upgrade_along(path: &[u32]) {
    let steps: Vec<String> = path.iter().map(u32::to_string).collect();
    let fault = format!("major upgrades {}", steps.join(" to "));
    let fault = fault.as_str();
    let Some(node) = crate::environment::real_node_or_skip(fault) else { return };
    let Some(bed) = Bed::start_on(fault, 2, None, Some(&node.version_of(path[0]))).await else { return };
    for (index, major) in path[1..].iter().copied().enumerate() {
        let method = if index % 2 == 0 { "link" } else { "copy" };
        let target = node.version_of(major);
        let step = format!("major upgrade to {target} ({method} mode)");
        let (since, failed_at) = (bed.last_id(), epoch_now());
        change_version(&bed.databases(), &target, Some(method)).await;
        let upgrade = upgrade_to_ended(&bed.databases(), Some(&target), MajorUpgradePhase::Completed).await;
        let outcome = bed.conclude(&step, failed_at, since).await;
        assert_eq!(outcome.lost, 0, "{step}: {outcome:?}");
        assert!(outcome.overlaps.is_empty(), "{step}: two writable primaries: {:?}", outcome.overlaps);
        for pod in [format!("{DATABASE}-0"), format!("{DATABASE}-1")] {
            assert_eq!(server_major(&bed, &pod), major, "{step}: {pod}");
        }
        eprintln!(
            "[upgrade] {} to {target}, {method} mode: primary down {:.1} s; acknowledged {} lost {}",
            upgrade.from_version,
            upgrade.downtime_milliseconds.unwrap_or_default() as f64 / 1000.0,
            outcome.acknowledged,
            outcome.lost,
        );
    }
    assert!(ledger_entries(bed.ns(), "FailoverStarted").is_empty(), "an upgrade must not fail over");
    assert_eq!(ledger_entries(bed.ns(), "MajorUpgraded").len(), path.len() - 1);
}

/// Every one-major step admission accepts, in pods, one after another on one database under the
/// writers: 14 to 15 (link), 15 to 16 (copy), 16 to 17 (link), 17 to 18 (copy). With the jumps
/// below (14 to 16, 16 to 18, 14 to 17, 15 to 18, 15 to 17 and 14 to 18), every upward pair
/// admission accepts runs in pods, and every image as the old and as the new major; every pair
/// also runs through the agent's pg_upgrade in tests/major_upgrade_loopback.rs.
#[tokio::test]
async fn a_database_on_14_is_upgraded_one_major_at_a_time_to_18_keeping_every_commit() {
    upgrade_along(&[14, 15, 16, 17, 18]).await;
}

/// The jumps 14 to 16 (link) and 16 to 18 (copy), one after the other.
#[tokio::test]
async fn a_database_on_14_jumps_to_16_then_to_18_keeping_every_commit() {
    upgrade_along(&[14, 16, 18]).await;
}

/// The jump 14 to 17 (link).
#[tokio::test]
async fn a_database_on_14_jumps_to_17_keeping_every_commit() {
    upgrade_along(&[14, 17]).await;
}

/// The jump 15 to 18 (link).
#[tokio::test]
async fn a_database_on_15_jumps_to_18_keeping_every_commit() {
    upgrade_along(&[15, 18]).await;
}

#[tokio::test]
async fn a_database_on_14_is_upgraded_in_place_to_18_in_link_mode() {
    // DBSERVICE_UPGRADE_METHOD=copy runs it in copy mode (for the figures).
    let method = std::env::var("DBSERVICE_UPGRADE_METHOD").unwrap_or_else(|_| "link".into());
    let fault = format!("major upgrade 14 to 18 ({method} mode)");
    let fault = fault.as_str();
    let Some(node) = crate::environment::real_node_or_skip(fault) else { return };
    let (from, to) = (node.version_of(14), node.version_of(18));
    let Some(bed) = Bed::start_on(fault, 2, None, Some(&from)).await else { return };
    let primary = bed.primary().await;
    let megabytes = load(&bed, &primary);
    if megabytes > 0 {
        // The standby streams the load before the upgrade starts.
        bed.primary().await;
    }
    let (since, failed_at) = (bed.last_id(), epoch_now());
    change_version(&bed.databases(), &to, Some(&method)).await;
    let upgrade = upgrade_ended(&bed.databases(), MajorUpgradePhase::Completed).await;
    let outcome = bed.conclude(fault, failed_at, since).await;
    assert_eq!(outcome.lost, 0, "{fault}: {outcome:?}");
    assert!(outcome.overlaps.is_empty(), "{fault}: two writable primaries: {:?}", outcome.overlaps);
    bed.primary().await;
    for pod in [format!("{DATABASE}-0"), format!("{DATABASE}-1")] {
        assert_eq!(server_major(&bed, &pod), 18, "{pod}");
    }
    assert!(ledger_entries(bed.ns(), "FailoverStarted").is_empty(), "the upgrade must not fail over");
    let steps: Vec<String> =
        upgrade.steps.iter().map(|step| format!("{} {:.1} s", step.name, step.milliseconds as f64 / 1000.0)).collect();
    eprintln!(
        "[upgrade] {from} to {to}, {method} mode, {megabytes} MB loaded, 2 instances under the writers: primary {primary} \
         down {:.1} s ({}); acknowledged {} lost {}",
        upgrade.downtime_milliseconds.unwrap_or_default() as f64 / 1000.0,
        steps.join(", "),
        outcome.acknowledged,
        outcome.lost,
    );
}
