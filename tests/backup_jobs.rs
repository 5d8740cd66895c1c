//! Pure tests of the backup controller: the Job built for a backup object (from the fixtures in
//! tests/fixtures/backup), the status read from a finished Job, and the scheduler's choice.

use dbservice_operator::api::database_service::DatabaseService;
use dbservice_operator::api::database_service_backup::{BackupPhase, BackupTarget, DatabaseServiceBackup};
use dbservice_operator::operator::backup::job::{
    backup_job, job_name, BuildBackupJobError, BACKUP_DEADLINE_SECONDS, COMPONENT_LABEL, DATABASE_LABEL,
};
use dbservice_operator::operator::backup::scheduler::{next_scheduled_run, scheduled_backup, SCHEDULED_AT_ANNOTATION};
use dbservice_operator::operator::backup::status::{finished_status, job_outcome, termination_message, JobOutcome};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Container, EnvVar, Pod};
use std::path::Path;
use std::sync::Arc;

const INSTANCE_IMAGE: &str = "localhost/dbservice-operator:dev";

fn read<T: serde::de::DeserializeOwned>(file: &str) -> T {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/backup").join(file);
    serde_saphyr::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap_or_else(|error| panic!("{file}: {error}"))
}

fn database() -> DatabaseService {
    read("database.yaml")
}

fn backup() -> DatabaseServiceBackup {
    read("backup.yaml")
}

fn container(job: &Job) -> &Container {
    &job.spec.as_ref().unwrap().template.spec.as_ref().unwrap().containers[0]
}

fn variable<'a>(container: &'a Container, name: &str) -> &'a EnvVar {
    container.env.as_ref().unwrap().iter().find(|variable| variable.name == name).unwrap_or_else(|| panic!("no {name}"))
}

fn value(container: &Container, name: &str) -> String {
    variable(container, name).value.clone().unwrap_or_else(|| panic!("{name} has no plain value"))
}

fn secret_reference(container: &Container, name: &str) -> (String, String) {
    let selector = variable(container, name).value_from.as_ref().unwrap().secret_key_ref.as_ref().unwrap();
    (selector.name.clone(), selector.key.clone())
}

#[test]
fn the_job_runs_our_binary_in_the_database_image_against_the_standby_service() {
    let job = backup_job(&backup(), &database(), INSTANCE_IMAGE).unwrap();
    assert_eq!(job.metadata.name.as_deref(), Some("orders-before-upgrade-0b6a4f1e"));
    assert_eq!(job.metadata.namespace.as_deref(), Some("shop"));
    let owner = &job.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), owner.controller),
        ("DatabaseServiceBackup", "orders-before-upgrade", Some(true))
    );
    let labels = job.metadata.labels.as_ref().unwrap();
    assert_eq!(labels.get(DATABASE_LABEL).map(String::as_str), Some("orders"));
    assert_eq!(labels.get(COMPONENT_LABEL).map(String::as_str), Some("backup"));
    let spec = job.spec.as_ref().unwrap();
    assert_eq!(spec.backoff_limit, Some(0));
    assert_eq!(spec.active_deadline_seconds, Some(BACKUP_DEADLINE_SECONDS));
    let pod = spec.template.spec.as_ref().unwrap();
    assert_eq!(pod.restart_policy.as_deref(), Some("Never"));
    assert_eq!(pod.automount_service_account_token, Some(false));
    // The pods are not PostgreSQL instances: the DatabaseService controller must not count them.
    let pod_labels = spec.template.metadata.as_ref().unwrap().labels.as_ref().unwrap();
    assert!(!pod_labels.contains_key("app.kubernetes.io/instance"), "{pod_labels:?}");
    assert!(!pod_labels.contains_key("app.kubernetes.io/managed-by"), "{pod_labels:?}");
    let init = &pod.init_containers.as_ref().unwrap()[0];
    assert_eq!(init.name, "install-dbservice");
    assert_eq!(init.image.as_deref(), Some(INSTANCE_IMAGE));

    let backup = container(&job);
    assert_eq!(backup.image.as_deref(), Some("postgres:16.6"));
    assert_eq!(backup.command.as_ref().unwrap(), &["/dbservice/bin/dbservice-operator", "backup"]);
    assert_eq!(backup.termination_message_policy.as_deref(), Some("FallbackToLogsOnError"));
    assert_eq!(value(backup, "PGHOST"), "orders-replicas.shop.svc");
    assert_eq!(value(backup, "DBSERVICE_BACKUP_SWITCH_WAL_HOST"), "orders.shop.svc");
    assert_eq!(value(backup, "DBSERVICE_BACKUP_RETENTION"), "30d");
    assert_eq!(value(backup, "DBSERVICE_BACKUP_SUMMARY_FILE"), "/dev/termination-log");
    assert_eq!(value(backup, "DBSERVICE_S3_ENDPOINT"), "http://10.85.0.1:9000");
    assert_eq!(value(backup, "DBSERVICE_BACKUP_SERVER_NAME"), "orders");
    assert_eq!(value(backup, "DBSERVICE_S3_CA_FILE"), "/dbservice/s3-ca/ca.crt");
    assert_eq!(secret_reference(backup, "PGUSER"), ("orders-replication".into(), "username".into()));
    assert_eq!(value(backup, "DBSERVICE_BACKUP_PASSWORD_FILE"), "/dbservice/replication/password");
    // pg_switch_wal() as the replication role too: the application's password is not the Job's.
    let names: Vec<&str> = backup.env.as_ref().unwrap().iter().map(|variable| variable.name.as_str()).collect();
    assert!(!names.contains(&"DBSERVICE_BACKUP_SWITCH_WAL_PASSWORD"), "{names:?}");
    assert_eq!(value(backup, "DBSERVICE_S3_SECRET_ACCESS_KEY_FILE"), "/dbservice/s3-credentials/secretAccessKey");
    assert!(!names.contains(&"AWS_SECRET_ACCESS_KEY"), "the store's keys are files: {names:?}");
    assert!(!names.contains(&"PGPASSWORD"), "the replication password is a file: {names:?}");
    // The server verified over TLS by the database's CA.
    assert_eq!(value(backup, "PGSSLMODE"), "verify-full");
    assert_eq!(value(backup, "PGSSLROOTCERT"), "/dbservice/database-ca/ca.crt");
    // Credentials only by reference; archiving's entrypoint settings are not the Job's business.
    for variable in backup.env.as_ref().unwrap() {
        let secret = ["PASSWORD", "SECRET", "ACCESS_KEY", "PGUSER"].iter().any(|word| variable.name.contains(word))
            && !variable.name.ends_with("_FILE");
        assert!(!secret || variable.value.is_none(), "{} carries a value", variable.name);
        assert!(!variable.name.starts_with("DBSERVICE_ARCHIVE_"), "{}", variable.name);
    }
    let text = serde_json::to_string(&job).unwrap();
    assert!(!text.contains("very-secret"), "no secret value is ever in the Job");
}

#[test]
fn the_primary_is_copied_when_asked_or_when_there_is_no_standby() {
    let mut primary = backup();
    primary.spec.target = Some(BackupTarget::Primary);
    let job = backup_job(&primary, &database(), INSTANCE_IMAGE).unwrap();
    assert_eq!(value(container(&job), "PGHOST"), "orders.shop.svc");
    let mut single = database();
    single.spec.replicas = Some(1);
    let job = backup_job(&backup(), &single, INSTANCE_IMAGE).unwrap();
    assert_eq!(value(container(&job), "PGHOST"), "orders.shop.svc");
}

#[test]
fn a_job_cannot_be_built_without_a_store_or_an_instance_image() {
    let mut plain = database();
    plain.spec.backup = None;
    assert_eq!(
        backup_job(&backup(), &plain, INSTANCE_IMAGE).unwrap_err(),
        BuildBackupJobError::NoObjectStore("orders".into())
    );
    let error = backup_job(&backup(), &database(), "").unwrap_err();
    assert_eq!(error, BuildBackupJobError::NoInstanceImage);
    assert!(error.to_string().contains("--instance-image"), "{error}");
}

#[test]
fn job_names_fit_a_label_value_and_differ_per_uid() {
    let mut long = backup();
    long.metadata.name = Some("x".repeat(200));
    let name = job_name(&long);
    assert!(name.len() <= 63, "{name}");
    let mut again = long.clone();
    again.metadata.uid = Some("ffffffff-0000-0000-0000-000000000000".into());
    assert_ne!(job_name(&again), name);
}

#[derive(serde::Deserialize)]
struct Finished {
    job: Job,
    pod: Pod,
}

#[test]
fn a_succeeded_job_fills_the_status_from_its_termination_message() {
    let finished: Finished = read("job-succeeded.yaml");
    let outcome = job_outcome(&finished.job);
    assert_eq!(outcome, JobOutcome::Succeeded);
    let message = termination_message(&[finished.pod]);
    let status = finished_status("orders-before-upgrade-0b6a4f1e", &outcome, message.as_deref());
    assert_eq!(status.phase, Some(BackupPhase::Completed));
    assert_eq!(status.backup_id.as_deref(), Some("20261201T010000Z"));
    assert_eq!(status.begin_lsn.as_deref(), Some("0/5000028"));
    assert_eq!(status.end_lsn.as_deref(), Some("0/5000138"));
    assert_eq!(status.begin_wal.as_deref(), Some("000000010000000000000005"));
    assert_eq!(status.start_time.as_deref(), Some("2026-12-01T01:00:00Z"));
    assert_eq!(status.end_time.as_deref(), Some("2026-12-01T01:04:30Z"));
    assert_eq!((status.timeline, status.postgres_major_version), (Some(1), Some(16)));
    assert_eq!(
        (status.size_bytes, status.stored_bytes, status.from_standby),
        (Some(31457280), Some(4194304), Some(true))
    );
    assert_eq!(status.job_name.as_deref(), Some("orders-before-upgrade-0b6a4f1e"));
}

#[test]
fn a_failed_job_reports_its_reason_and_the_end_of_its_log() {
    let finished: Finished = read("job-failed.yaml");
    let outcome = job_outcome(&finished.job);
    assert!(
        matches!(&outcome, JobOutcome::Failed(reason) if reason.starts_with("BackoffLimitExceeded")),
        "{outcome:?}"
    );
    let status =
        finished_status("orders-before-upgrade-0b6a4f1e", &outcome, termination_message(&[finished.pod]).as_deref());
    assert_eq!(status.phase, Some(BackupPhase::Failed));
    let message = status.message.unwrap();
    assert!(message.contains("BackoffLimitExceeded") && message.contains("was not archived within 600s"), "{message}");
    assert_eq!(status.backup_id, None);
}

#[test]
fn a_succeeded_job_without_a_summary_is_a_failed_backup() {
    let finished: Finished = read("job-succeeded.yaml");
    let status = finished_status("j", &job_outcome(&finished.job), Some("not json"));
    assert_eq!(status.phase, Some(BackupPhase::Failed));
    let long_log = "x".repeat(100_000);
    let status = finished_status("j", &JobOutcome::Failed("DeadlineExceeded".into()), Some(&long_log));
    assert!(status.message.unwrap().len() < 4096, "the message fits the CRD's cap");
}

fn at(text: &str) -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::parse_from_rfc3339(text).unwrap().to_utc()
}

fn scheduled_database() -> DatabaseService {
    let mut database = database();
    database.spec.backup.as_mut().unwrap().schedule = Some("0 1 * * *".into());
    database.metadata.creation_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time("2026-11-01T00:00:00Z".parse().unwrap()));
    database
}

#[test]
fn the_scheduler_creates_one_backup_for_the_latest_missed_cron_time_and_waits_for_it() {
    let database = scheduled_database();
    let now = at("2026-12-01T12:00:00Z");
    // Nothing ever ran (or the operator was down for a month): one run, for the latest cron time.
    let due = next_scheduled_run(&database, &[], now).unwrap();
    assert_eq!(due, at("2026-12-01T01:00:00Z"));
    let created = scheduled_backup(&database, due);
    assert_eq!(created.metadata.name.as_deref(), Some("orders-202612010100"));
    assert_eq!(created.spec.database_service, "orders");
    assert_eq!(created.metadata.annotations.as_ref().unwrap()[SCHEDULED_AT_ANNOTATION], "2026-12-01T01:00:00Z");
    assert_eq!(created.metadata.owner_references.as_ref().unwrap()[0].kind, "DatabaseService");
    // While it is unfinished, nothing more is created, even when the next cron time passes.
    let pending = Arc::new(created.clone());
    assert_eq!(next_scheduled_run(&database, &[pending], at("2026-12-02T01:00:10Z")), None);
    // Finished: nothing is due until the next cron time, then exactly that one.
    let mut done = created;
    done.status = Some(dbservice_operator::api::database_service_backup::DatabaseServiceBackupStatus {
        phase: Some(BackupPhase::Failed),
        ..Default::default()
    });
    let done = [Arc::new(done)];
    assert_eq!(next_scheduled_run(&database, &done, at("2026-12-02T00:59:59Z")), None);
    assert_eq!(next_scheduled_run(&database, &done, at("2026-12-02T01:00:05Z")), Some(at("2026-12-02T01:00:00Z")));
}

#[test]
fn no_schedule_no_run_and_paused_or_deleted_databases_are_skipped() {
    assert_eq!(next_scheduled_run(&database(), &[], at("2026-12-01T12:00:00Z")), None);
    let mut paused = scheduled_database();
    paused.spec.paused = Some(true);
    assert_eq!(next_scheduled_run(&paused, &[], at("2026-12-01T12:00:00Z")), None);
}
