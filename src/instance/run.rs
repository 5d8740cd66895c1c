//! `dbservice-operator instance run`: the postgres container's main process in a pod. It builds
//! the agent's configuration from the pod environment, creates the first data directory when this
//! instance is chosen to bootstrap the database (and only then), and runs the [`Agent`] until
//! SIGTERM, when a primary stops cleanly and hands its Lease over.

use crate::api::recovery::{retry_pause, RecoveryPlan, RecoveryStatus, RECOVERY_PLAN_VARIABLE};
use crate::instance::args::{InstallBinaryArgs, InstanceRunArgs};
use crate::instance::kubernetes::KubeControlPlane;
use crate::instance::postgres::initialized;
use crate::instance::roles::RoleSettings;
use crate::instance::{Agent, ControlPlane, InstanceConfig};
use crate::lease::LeaseTimings;
use anyhow::Context as _;
use std::path::PathBuf;
use std::time::Duration;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;

/// Timeout of every API call of the agent: well inside a renew period, so that a slow API
/// server costs one renewal, never the deadline.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// How long the local server may fail its health queries before it counts as not ready: longer
/// than a stall a failover would not cure (a 2-second I/O stall, a throttled CPU), shorter than
/// the Lease's renew deadline, so a hung primary is still replaced within its RTO.
const UNRESPONSIVE_AFTER: Duration = Duration::from_secs(5);

/// The agent's configuration from the flags (and REPLICATION_PASSWORD from the environment only).
pub fn config(args: &InstanceRunArgs) -> anyhow::Result<InstanceConfig> {
    let lease = LeaseTimings {
        duration: Duration::from_secs(args.lease_seconds),
        renew_deadline: Duration::from_secs(args.renew_deadline_seconds),
        renew_period: Duration::from_secs(args.renew_period_seconds),
    };
    lease.validate().context("--lease-seconds, --renew-deadline-seconds, --renew-period-seconds")?;
    let replication_password = password("REPLICATION_PASSWORD")?;
    Ok(InstanceConfig {
        name: args.pod.clone(),
        pg_bin: args.pg_bin.clone(),
        pgdata: args.pgdata.clone(),
        port: args.port,
        socket_dir: args.socket_dir.clone(),
        listen_addresses: "*".into(),
        superuser: args.superuser.clone(),
        roles: role_settings()?,
        tls: args.tls_directory.clone().map(|directory| crate::instance::tls::TlsFiles { directory }),
        replication_user: args.replication_user.clone(),
        replication_password,
        settings: server_settings(
            args.max_wal_senders.to_string(),
            args.wal_keep_size.clone(),
            std::env::var("DBSERVICE_ARCHIVE_COMMAND").ok(),
            std::env::var("DBSERVICE_ARCHIVE_TIMEOUT_SECONDS").ok(),
        )
        .into_iter()
        .chain(slot_bound(&args.pgdata))
        .collect(),
        standby_restore_command: std::env::var(crate::api::pod::STANDBY_RESTORE_COMMAND_VARIABLE)
            .ok()
            .filter(|command| !command.is_empty()),
        // The container's standard error: kubectl logs shows PostgreSQL and the agent together.
        log_file: PathBuf::from("/proc/self/fd/2"),
        os_user: None,
        health_timeout: Duration::from_secs(1),
        tick: Duration::from_millis(args.tick_milliseconds),
        lease,
        stop_grace: Duration::from_secs(10),
        unresponsive_after: UNRESPONSIVE_AFTER,
        watchdog_binary: Some(
            std::env::current_exe()
                .unwrap_or_else(|_| PathBuf::from(crate::api::pod::AGENT_DIRECTORY).join("dbservice-operator")),
        ),
    })
}

/// A password from the file `NAME_FILE` names (the pods' way: a Secret's key mounted as a file),
/// else from the environment variable `NAME` (tests, older StatefulSets).
pub fn password(name: &str) -> anyhow::Result<String> {
    match std::env::var(format!("{name}_FILE")) {
        Ok(path) => std::fs::read_to_string(&path).with_context(|| format!("{name}_FILE: read {path}")),
        Err(_) => {
            std::env::var(name).with_context(|| format!("environment variable {name} or {name}_FILE must be set"))
        }
    }
}

/// The roles the primary keeps, from the pod's environment (APPLICATION_USER and its password,
/// POSTGRES_DB, POSTGRES_PASSWORD for the superuser, SUPERUSER_NETWORK_ACCESS); None without
/// APPLICATION_USER (an instance of a StatefulSet from before issue 22).
fn role_settings() -> anyhow::Result<Option<RoleSettings>> {
    let Ok(application_user) = std::env::var("APPLICATION_USER") else { return Ok(None) };
    Ok(Some(RoleSettings {
        application_user,
        application_password: password("APPLICATION_PASSWORD")?,
        database: std::env::var("POSTGRES_DB").context("environment variable POSTGRES_DB must be set")?,
        superuser_password: password("POSTGRES_PASSWORD")?,
        superuser_network_access: std::env::var("SUPERUSER_NETWORK_ACCESS").is_ok_and(|value| value == "on"),
    }))
}

/// `max_slot_wal_keep_size` from the size of the data volume (see [`crate::instance::slots`]).
fn slot_bound(pgdata: &std::path::Path) -> Option<(String, String)> {
    let volume = pgdata.parent().unwrap_or(pgdata);
    let bytes = crate::instance::postgres::volume_bytes(volume)?;
    Some(("max_slot_wal_keep_size".into(), crate::instance::slots::max_slot_wal_keep_size(bytes)))
}

/// Server settings the agent writes before every start: replication, and continuous archiving
/// when the StatefulSet gave the pod an archive command (spec.backup, see `backup::pod`).
fn server_settings(
    max_wal_senders: String,
    wal_keep_size: String,
    archive_command: Option<String>,
    archive_timeout_seconds: Option<String>,
) -> Vec<(String, String)> {
    let mut settings = vec![("max_wal_senders".into(), max_wal_senders), ("wal_keep_size".into(), wal_keep_size)];
    if let Some(command) = archive_command.filter(|command| !command.is_empty()) {
        settings.push(("archive_mode".into(), "on".into()));
        settings.push(("archive_command".into(), command));
        settings.push(("archive_timeout".into(), archive_timeout_seconds.unwrap_or_else(|| "300".into())));
    }
    settings
}

/// Creates the first data directory, only when this instance is the target and the Lease has
/// never been held (a database that ever had a primary is never initialized again: a lost
/// volume is cloned from the current primary by the agent instead). Returns once there is data,
/// or once another instance is the primary to clone from.
async fn bootstrap(
    args: &InstanceRunArgs,
    config: &InstanceConfig,
    control_plane: &KubeControlPlane,
    stop: &mut watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let tick = Duration::from_millis(args.tick_milliseconds);
    let recovery_plan = match std::env::var(RECOVERY_PLAN_VARIABLE) {
        Ok(text) => Some(
            serde_json::from_str::<RecoveryPlan>(&text)
                .with_context(|| format!("environment variable {RECOVERY_PLAN_VARIABLE}"))?,
        ),
        Err(_) => None,
    };
    let mut attempt = 0;
    while !initialized(&args.pgdata) && !*stop.borrow() {
        let desired = control_plane.desired().await;
        let lease = control_plane.read_lease().await;
        match (desired, lease) {
            (Ok(desired), Ok((record, _))) => {
                let target = desired.target_primary.as_deref();
                let fresh = record.holder.is_none() && record.timeline.is_none() && record.primary_lsn.is_none();
                if target == Some(args.pod.as_str()) && fresh {
                    if let Some(plan) = &recovery_plan {
                        attempt += 1;
                        if recover(config, plan, attempt, control_plane, stop).await {
                            return Ok(());
                        }
                        continue;
                    }
                    tracing::info!(instance = %args.pod, "bootstrapping the database: initdb");
                    let status = tokio::process::Command::new("/bin/bash")
                        .arg(&args.initialize_script)
                        .arg("initialize")
                        .status()
                        .await
                        .context("run the initialize script")?;
                    anyhow::ensure!(status.success(), "the initialize script failed: {status}");
                    return Ok(());
                }
                if target.is_some_and(|target| target != args.pod && target != crate::api::failover::PENDING) {
                    // The agent clones the current primary.
                    return Ok(());
                }
            }
            (Err(error), _) | (_, Err(error)) => tracing::warn!(instance = %args.pod, %error, "waiting for the API"),
        }
        tokio::select! {
            _ = tokio::time::sleep(tick) => {}
            _ = stop.changed() => {}
        }
    }
    Ok(())
}

/// One recovery attempt with its reports; after a failure, the pause before the next one (the
/// report says why it failed; a restart of the container would only lose that). True once the
/// data directory holds the recovered database.
async fn recover(
    config: &InstanceConfig,
    plan: &RecoveryPlan,
    attempt: u32,
    control_plane: &KubeControlPlane,
    stop: &mut watch::Receiver<bool>,
) -> bool {
    tracing::info!(instance = %config.name, target = %plan.target_description(), attempt, "bootstrapping the database: recovery from a backup");
    let mut report = async |status: &RecoveryStatus| {
        if let Err(error) = control_plane.publish_recovery(status).await {
            tracing::warn!(%error, "recovery progress not published");
        }
    };
    let password = password("POSTGRES_PASSWORD").unwrap_or_default();
    let binary = std::env::current_exe()
        .unwrap_or_else(|_| PathBuf::from(crate::api::pod::AGENT_DIRECTORY).join("dbservice-operator"));
    let restore_args = crate::instance::recovery::restore_args_in_pod(plan, &config.pgdata, &binary);
    match crate::instance::recovery::recover(config, plan, restore_args, &password, attempt, stop, &mut report).await {
        Ok(status) => {
            tracing::info!(instance = %config.name, backup = ?status.backup_id, restore_seconds = ?status.restore_seconds, replay_seconds = ?status.replay_seconds, "recovery completed");
            report(&status).await;
            true
        }
        Err((status, error)) => {
            let pause = retry_pause(attempt);
            tracing::error!(instance = %config.name, %error, ?pause, "recovery failed: trying again after a pause");
            report(&status).await;
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = stop.changed() => {}
            }
            false
        }
    }
}

/// Runs the instance agent until SIGTERM.
pub async fn run(args: InstanceRunArgs) -> anyhow::Result<()> {
    let config = config(&args)?;
    let mut kube_config = kube::Config::infer().await.context("in-cluster Kubernetes configuration")?;
    kube_config.connect_timeout = Some(CALL_TIMEOUT);
    kube_config.read_timeout = Some(CALL_TIMEOUT);
    kube_config.write_timeout = Some(CALL_TIMEOUT);
    let client = kube::Client::try_from(kube_config.clone()).context("Kubernetes client")?;
    kube_config.read_timeout = Some(crate::client::READ_TIMEOUT);
    let watch_client = kube::Client::try_from(kube_config).context("Kubernetes client")?;
    let client_for_queries = client.clone();
    let secrets = crate::instance::SecretReader::Api {
        secrets: Box::new(kube::Api::namespaced(client.clone(), &args.namespace)),
        timeout: CALL_TIMEOUT,
    };
    let control_plane = KubeControlPlane::new(
        client,
        watch_client,
        &args.namespace,
        &args.database,
        &args.pod,
        args.port,
        config.lease.duration,
        CALL_TIMEOUT,
    );
    let (stop_sender, mut stop) = watch::channel(false);
    let mut terminate = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    tokio::spawn(async move {
        tokio::select! {
            _ = terminate.recv() => {}
            _ = interrupt.recv() => {}
        }
        tracing::info!("terminating: stopping PostgreSQL cleanly");
        let _ = stop_sender.send(true);
    });
    let metrics = crate::admission::server::bind(args.metrics_address, "--metrics-address").await?;
    tokio::spawn(crate::admission::server::serve_plain(
        metrics,
        crate::instance::metrics::router(
            config.clone(),
            crate::instance::custom_queries::QueriesSource::from_api(
                control_plane.database_watch(),
                kube::Api::namespaced(client_for_queries, &args.namespace),
            ),
        ),
        stop.clone(),
    ));
    bootstrap(&args, &config, &control_plane, &mut stop).await?;
    tracing::info!(instance = %args.pod, writes_per_second = config.lease.writes_per_second(), "instance agent running");
    Agent::new(config, control_plane).with_secrets(secrets).run(stop).await;
    Ok(())
}

/// Copies the running binary into `directory` as `dbservice-operator` (mode 0755), atomically.
pub fn install_binary(args: &InstallBinaryArgs) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let source = std::env::current_exe().context("locate this binary")?;
    let target = args.directory.join("dbservice-operator");
    let temporary = args.directory.join(".dbservice-operator.tmp");
    std::fs::copy(&source, &temporary).with_context(|| format!("copy to {}", temporary.display()))?;
    std::fs::set_permissions(&temporary, std::fs::Permissions::from_mode(0o755))
        .with_context(|| format!("make {} executable", temporary.display()))?;
    std::fs::rename(&temporary, &target).with_context(|| format!("rename to {}", target.display()))?;
    println!("installed {}", target.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_archive_command_in_the_environment_turns_archiving_on() {
        let plain = server_settings("10".into(), "512MB".into(), None, None);
        assert!(plain.iter().all(|(name, _)| !name.starts_with("archive")), "{plain:?}");
        let command = "/dbservice/bin/dbservice-operator wal-archive %p %f".to_string();
        let archiving = server_settings("10".into(), "512MB".into(), Some(command.clone()), Some("60".into()));
        let value = |wanted: &str| archiving.iter().find(|(name, _)| name == wanted).map(|(_, value)| value.clone());
        assert_eq!(value("archive_mode").as_deref(), Some("on"));
        assert_eq!(value("archive_command"), Some(command));
        assert_eq!(value("archive_timeout").as_deref(), Some("60"));
    }

    #[test]
    fn install_binary_copies_an_executable() {
        use std::os::unix::fs::PermissionsExt;
        let directory = tempfile::tempdir().unwrap();
        install_binary(&InstallBinaryArgs { directory: directory.path().to_path_buf() }).unwrap();
        let installed = directory.path().join("dbservice-operator");
        let metadata = std::fs::metadata(&installed).unwrap();
        assert_eq!(metadata.permissions().mode() & 0o777, 0o755);
        assert_eq!(metadata.len(), std::fs::metadata(std::env::current_exe().unwrap()).unwrap().len());
    }
}
