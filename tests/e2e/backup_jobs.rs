//! Backup objects against the real apiserver and controller-manager (kwok runs the pods): a
//! DatabaseServiceBackup produces a Job of the expected shape, backups of one database run one
//! at a time, a finished Job sets the backup's phase (kwok completes Job pods without a
//! termination message, so the backup must fail with a clear message), events and ledger
//! entries are written, history limits delete old backups with their Jobs, and
//! `spec.backup.schedule` creates backup objects at the cron times.

use crate::support::operator::{shared, OperatorProcess, ISOLATION_LABEL};
use crate::support::{client_for, cluster_or_skip, database_from_yaml, eventually, kubectl, TestNamespace};
use dbservice_operator::api::database_service::DatabaseService;
use dbservice_operator::api::database_service_backup::{BackupPhase, DatabaseServiceBackup, DatabaseServiceBackupSpec};
use dbservice_operator::operator::backup::scheduler::SCHEDULED_AT_ANNOTATION;
use dbservice_operator::operator::ledger::{parse, LEDGER_KEY};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Event};
use kube::api::{ListParams, PostParams};
use kube::{Api, ResourceExt};
use std::time::Duration;

/// The operator image every test operator is started with (support/operator.rs).
const INSTANCE_IMAGE: &str = "localhost/dbservice-operator:kwok";

fn isolated_operator(namespace: &str) -> OperatorProcess {
    crate::support::operator::isolated_operator(namespace, "backup-jobs", vec![])
}

fn database(name: &str, namespace: &str, schedule: Option<&str>) -> DatabaseService {
    let schedule = schedule.map(|schedule| format!("    schedule: \"{schedule}\"\n")).unwrap_or_default();
    database_from_yaml(&format!(
        "apiVersion: dbservice.dev/v1\nkind: DatabaseService\nmetadata:\n  name: {name}\n  labels: {{{ISOLATION_LABEL}: {namespace}}}\n\
         spec:\n  version: \"16.4\"\n  storageSize: 1Gi\n  replicas: 2\n  databaseName: app\n  username: app_user\n  backup:\n    \
         objectStore: {{endpoint: \"http://127.0.0.1:9\", bucket: backups, path: prod, credentialsSecret: {{name: s3}}}}\n    \
         retentionPolicy: 7d\n    successfulBackupsHistoryLimit: 1\n    failedBackupsHistoryLimit: 1\n{schedule}"
    ))
}

fn backup(name: &str, database: &str) -> DatabaseServiceBackup {
    DatabaseServiceBackup::new(name, DatabaseServiceBackupSpec { database_service: database.into(), target: None })
}

async fn phase(api: &Api<DatabaseServiceBackup>, name: &str) -> Option<(BackupPhase, String)> {
    let status = api.get_opt(name).await.ok()??.status?;
    Some((status.phase?, status.message.unwrap_or_default()))
}

#[tokio::test]
async fn backup_objects_run_as_jobs_one_at_a_time_with_status_events_ledger_and_history_limits() {
    let Some(kubeconfig) =
        cluster_or_skip("backup_objects_run_as_jobs_one_at_a_time_with_status_events_ledger_and_history_limits")
    else {
        return;
    };
    shared();
    kubectl(&["wait", "--for=condition=Established", "crd/databaseservicebackups.dbservice.dev", "--timeout=60s"]);
    let client = client_for(&kubeconfig).await;
    let namespace = TestNamespace::create(&client, "backup-jobs").await;
    let ns = namespace.name.clone();
    let operator = isolated_operator(&ns);
    let databases: Api<DatabaseService> = Api::namespaced(client.clone(), &ns);
    databases.create(&PostParams::default(), &database("orders", &ns, None)).await.unwrap();
    let backups: Api<DatabaseServiceBackup> = Api::namespaced(client.clone(), &ns);
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
    backups.create(&PostParams::default(), &backup("first", "orders")).await.unwrap();
    backups.create(&PostParams::default(), &backup("second", "orders")).await.unwrap();

    // The first backup gets a Job of the expected shape.
    let first_uid = backups.get("first").await.unwrap().uid().unwrap();
    let job = eventually("the first backup's Job", Duration::from_secs(60), || async {
        jobs.list(&ListParams::default()).await.ok()?.items.into_iter().find(|job| {
            job.owner_references().iter().any(|owner| owner.uid == first_uid && owner.controller == Some(true))
        })
    })
    .await;
    let spec = job.spec.as_ref().unwrap();
    assert_eq!(spec.backoff_limit, Some(0));
    assert!(spec.active_deadline_seconds.is_some());
    let pod = spec.template.spec.as_ref().unwrap();
    assert_eq!(pod.init_containers.as_ref().unwrap()[0].image.as_deref(), Some(INSTANCE_IMAGE));
    let container = &pod.containers[0];
    assert_eq!(container.image.as_deref(), Some("postgres:16.4"));
    let environment = container.env.as_ref().unwrap();
    let value = |name: &str| {
        environment.iter().find(|variable| variable.name == name).and_then(|variable| variable.value.clone())
    };
    assert_eq!(value("PGHOST").as_deref(), Some(format!("orders-replicas.{ns}.svc").as_str()));
    assert_eq!(value("DBSERVICE_BACKUP_RETENTION").as_deref(), Some("7d"));
    // Passwords only as files: no variable carries one (those ending in _FILE name the file).
    assert!(environment
        .iter()
        .filter(|variable| variable.name.contains("PASSWORD") && !variable.name.ends_with("_FILE"))
        .all(|variable| variable.value.is_none()));
    assert_eq!(value("DBSERVICE_BACKUP_PASSWORD_FILE").as_deref(), Some("/dbservice/replication/password"));

    // One Job per database at a time: the second backup's Job is created only after the
    // first Job finished.
    let first_job_name = job.name_any();
    let first_finished = eventually("the first Job to finish", Duration::from_secs(90), || async {
        let job = jobs.get_opt(&first_job_name).await.ok()??;
        let conditions = job.status?.conditions?;
        let finished = conditions.into_iter().find(|condition| {
            (condition.type_ == "Complete" || condition.type_ == "Failed") && condition.status == "True"
        })?;
        finished.last_transition_time.map(|time| time.0)
    })
    .await;
    let second_uid = backups.get("second").await.unwrap().uid().unwrap();
    let second_job = eventually("the second backup's Job", Duration::from_secs(90), || async {
        jobs.list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find(|job| job.owner_references().iter().any(|owner| owner.uid == second_uid))
    })
    .await;
    let second_created = second_job.creation_timestamp().unwrap().0;
    assert!(
        second_created >= first_finished,
        "second Job created at {second_created}, first finished at {first_finished}"
    );

    // kwok completes the Job's pod without a summary: the backup fails, saying so.
    let (first_phase, message) = eventually("the first backup to finish", Duration::from_secs(90), || async {
        phase(&backups, "first").await.filter(|(phase, _)| phase.is_terminal())
    })
    .await;
    assert_eq!(first_phase, BackupPhase::Failed, "{message}");
    assert!(message.contains("no backup summary"), "{message}");

    // Then the second runs and fails the same way; the failed history limit (1) deletes the
    // first backup object and its Job.
    eventually("the second backup to finish", Duration::from_secs(90), || async {
        phase(&backups, "second").await.filter(|(phase, _)| phase.is_terminal())
    })
    .await;
    eventually("the first backup object deleted by the history limit", Duration::from_secs(60), || async {
        backups.get_opt("first").await.ok()?.is_none().then_some(())
    })
    .await;
    eventually("the first backup's Job deleted with it", Duration::from_secs(60), || async {
        jobs.get_opt(&first_job_name).await.ok()?.map_or(Some(()), |job| job.metadata.deletion_timestamp.map(|_| ()))
    })
    .await;
    assert!(backups.get_opt("second").await.unwrap().is_some(), "the newest failed backup is kept");

    // Events on the backup and entries in the database's ledger.
    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    eventually("a BackupFailed event", Duration::from_secs(30), || async {
        let listed = events.list(&ListParams::default()).await.ok()?;
        listed.items.iter().any(|event| event.reason.as_deref() == Some("BackupFailed")).then_some(())
    })
    .await;
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let entries = eventually("BackupFailed in the ledger", Duration::from_secs(30), || async {
        let ledger = config_maps.get_opt("orders-ledger").await.ok()??;
        let entries = parse(ledger.data?.get(LEDGER_KEY)?);
        (entries.iter().filter(|entry| entry.action == "BackupFailed").count() >= 2).then_some(entries)
    })
    .await;
    assert!(entries.iter().any(|entry| entry.outcome.contains("second")), "{entries:#?}");
    drop(operator);
}

#[tokio::test]
async fn a_schedule_creates_backup_objects_at_the_cron_times() {
    let Some(kubeconfig) = cluster_or_skip("a_schedule_creates_backup_objects_at_the_cron_times") else {
        return;
    };
    shared();
    kubectl(&["wait", "--for=condition=Established", "crd/databaseservicebackups.dbservice.dev", "--timeout=60s"]);
    let client = client_for(&kubeconfig).await;
    let namespace = TestNamespace::create(&client, "backup-schedule").await;
    let ns = namespace.name.clone();
    let operator = isolated_operator(&ns);
    let databases: Api<DatabaseService> = Api::namespaced(client.clone(), &ns);
    let created = databases.create(&PostParams::default(), &database("nightly", &ns, Some("* * * * *"))).await.unwrap();
    let backups: Api<DatabaseServiceBackup> = Api::namespaced(client.clone(), &ns);
    // The first cron time after creation is at most a minute away; the scheduler looks every 15 s.
    let scheduled = eventually("a scheduled backup object", Duration::from_secs(100), || async {
        backups.list(&ListParams::default()).await.ok()?.items.into_iter().next()
    })
    .await;
    let at = scheduled.annotations().get(SCHEDULED_AT_ANNOTATION).cloned().expect("scheduled-at annotation");
    let at = chrono::DateTime::parse_from_rfc3339(&at).unwrap().to_utc();
    assert_eq!(scheduled.name_any(), format!("nightly-{}", at.format("%Y%m%d%H%M")));
    assert_eq!(scheduled.spec.database_service, "nightly");
    let owner = &scheduled.owner_references()[0];
    assert_eq!((owner.kind.as_str(), owner.uid.as_str()), ("DatabaseService", created.uid().unwrap().as_str()));
    // Exactly one object per cron time: never two for the same minute.
    let listed = backups.list(&ListParams::default()).await.unwrap().items;
    let mut names: Vec<String> = listed.iter().map(ResourceExt::name_any).collect();
    names.dedup();
    assert_eq!(names.len(), listed.len());
    drop(operator);
}
