//! Settings the operator owns, put back after an `ALTER SYSTEM` (issue 37): a superuser (allowed
//! over the network by `spec.enableSuperuserAccess`) changes two of them, one the operator writes
//! into postgresql.auto.conf itself and one it leaves at the default; the agent puts both back
//! within a minute, the operator tells it once per revert (a Warning event and a ledger entry),
//! and a repeated `ALTER SYSTEM` is put back again.

use crate::environment::{
    admin_client, install_chart, psql, real_database, real_namespace, real_node_or_skip, wait_running, RealNode, Target,
};
use crate::failover::{ledger_entries, DATABASE};
use crate::postgres::kubectl_quiet;
use crate::support::eventually;
use dbservice_operator::api::database_service::DatabaseService;
use kube::api::PostParams;
use kube::Api;
use std::time::Duration;

/// The agent checks every 15 s: "within a minute", with room for a slow node.
const PUT_BACK_DEADLINE: Duration = Duration::from_secs(90);
/// The event's reason and the ledger entry's action.
const REVERTED: &str = "OwnedSettingReverted";
/// The operator writes `wal_retrieve_retry_interval = '1s'` into postgresql.auto.conf itself.
const WRITTEN: (&str, &str) = ("wal_retrieve_retry_interval", "1s");
/// Owned, not written by the operator without spec.backup: at its default.
const DEFAULTED: (&str, &str) = ("archive_timeout", "0");

/// `ALTER SYSTEM SET name = value` and a reload, each statement in its own psql (ALTER SYSTEM
/// cannot run in the implicit transaction of a multi-statement query), as the superuser.
async fn alter_system(client: &kube::Client, node: &RealNode, namespace: &str, changes: &[(&str, &str)]) {
    let statements = changes
        .iter()
        .map(|(name, value)| format!("alter system set {name} = '{value}'"))
        .chain(["select pg_reload_conf()".to_string()]);
    for sql in statements {
        psql(client, node, namespace, DATABASE, Target::SuperuserUri, &sql).await.expect(&sql);
    }
}

/// Both settings show the operator's values again, and postgresql.auto.conf holds nothing else
/// of theirs.
fn put_back(namespace: &str) -> Option<()> {
    let pod = format!("{DATABASE}-0");
    for (name, value) in [WRITTEN, DEFAULTED] {
        let shown = kubectl_quiet(namespace, &pod, &format!("show {name}"))?;
        if shown.trim() != value {
            return None;
        }
    }
    let in_auto_conf = kubectl_quiet(
        namespace,
        &pod,
        &format!(
            "select count(*) from pg_catalog.pg_file_settings where sourcefile like '%/postgresql.auto.conf' \
             and (name = '{}' or (name = '{}' and setting <> '{}'))",
            DEFAULTED.0, WRITTEN.0, WRITTEN.1
        ),
    )?;
    (in_auto_conf.trim() == "0").then_some(())
}

/// Warning events of the DatabaseService with the reason, with their notes.
fn warnings(namespace: &str) -> Vec<String> {
    let events = crate::failover::database_events(namespace, REVERTED);
    events.into_iter().filter(|(warning, _)| *warning).map(|(_, note)| note).collect()
}

#[tokio::test]
async fn owned_settings_changed_by_alter_system_are_put_back_with_a_warning_and_a_ledger_entry() {
    let Some(node) = real_node_or_skip("owned_settings_changed_by_alter_system_are_put_back") else { return };
    install_chart(node);
    let client = admin_client().await;
    let namespace = real_namespace(&client, "owned-settings").await;
    let ns = namespace.name.as_str();
    let databases: Api<DatabaseService> = Api::namespaced(client.clone(), ns);
    let mut database = real_database(node, DATABASE, 1, "Delete");
    database.spec.enable_superuser_access = Some(true);
    databases.create(&PostParams::default(), &database).await.unwrap();
    wait_running(&client, ns, DATABASE, 1, Duration::from_secs(240)).await;
    eventually("the superuser logs in over the network", Duration::from_secs(120), || async {
        psql(&client, node, ns, DATABASE, Target::SuperuserUri, "select 1").await.ok()
    })
    .await;
    // The operator's own settings are never taken for someone else's.
    assert_eq!(put_back(ns), Some(()), "the operator's values before any ALTER SYSTEM");
    assert!(ledger_entries(ns, REVERTED).is_empty(), "nothing reverted yet");

    alter_system(&client, node, ns, &[(WRITTEN.0, "7s"), (DEFAULTED.0, "5min")]).await;
    eventually("both settings put back", PUT_BACK_DEADLINE, || async { put_back(ns) }).await;
    // The agent may have checked between the two statements: one revert or two.
    let first = eventually("the ledger entries of the revert", PUT_BACK_DEADLINE, || async {
        let entries = ledger_entries(ns, REVERTED);
        let outcomes: String = entries.iter().map(|entry| entry.outcome.as_str()).collect();
        (outcomes.contains(DEFAULTED.0) && outcomes.contains(WRITTEN.0)).then_some(entries)
    })
    .await;
    assert!(first.len() <= 2, "at most one entry per revert: {first:?}");
    let outcomes: String = first.iter().map(|entry| entry.outcome.as_str()).collect();
    assert!(!outcomes.contains("5min") && !outcomes.contains("7s"), "names only: {first:?}");
    // A second revert within the series window counts as a repeat of the first event (the note
    // is not part of a series' key, as with kube's recorder): the first names one of the two
    // settings or both, the ledger has each.
    let notes = eventually("a Warning event on the DatabaseService", PUT_BACK_DEADLINE, || async {
        let notes = warnings(ns);
        (!notes.is_empty()).then_some(notes)
    })
    .await;
    assert!(notes[0].contains(DEFAULTED.0) || notes[0].contains(WRITTEN.0), "{notes:?}");

    // Again: put back again, told again, and each revert told once however many passes see it.
    alter_system(&client, node, ns, &[(DEFAULTED.0, "10min")]).await;
    eventually("the repeated change put back", PUT_BACK_DEADLINE, || async { put_back(ns) }).await;
    eventually("another ledger entry", PUT_BACK_DEADLINE, || async {
        (ledger_entries(ns, REVERTED).len() > first.len()).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(40)).await;
    let entries = ledger_entries(ns, REVERTED);
    assert_eq!(entries.len(), first.len() + 1, "one entry per revert: {entries:?}");
    let last = &entries[entries.len() - 1];
    assert!(last.outcome.contains(DEFAULTED.0) && !last.outcome.contains(WRITTEN.0), "{entries:?}");
}
