//! The `kubectl dbservice` verbs that act (run by people, as the plugin binary `kubectl-dbservice`
//! or as `dbservice-operator VERB`): each writes through the API what the documented annotation
//! or object does, so the operator carries it out and records it in the ledger as for any writer.

pub mod actions;
pub mod output;
pub mod report;
pub mod shell;

use crate::api::database_service::{DatabaseService, Phase};
use crate::api::database_service_backup::{BackupPhase, BackupTarget, DatabaseServiceBackup};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use std::time::Duration;

/// A verb failed: what was missing or refused, in words.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// No DatabaseService of that name.
    #[error("no DatabaseService {name:?} in namespace {namespace:?}")]
    NotFound { name: String, namespace: String },
    /// The apiserver refused (not allowed, invalid) or could not be reached.
    #[error("{what}: {source}")]
    Api { what: String, source: kube::Error },
    /// The verb does not apply to this database.
    #[error(transparent)]
    Verb(#[from] actions::VerbError),
    /// `backup --wait` saw the backup fail.
    #[error("backup {name} failed: {message}")]
    BackupFailed { name: String, message: String },
    /// `backup --wait` gave up.
    #[error("backup {name} not done after {seconds} s (phase {phase}); it goes on: kubectl get dbsbackup {name}")]
    BackupTimedOut { name: String, seconds: u64, phase: String },
    /// `hibernate --wait` or `wake --wait` did not see the phase in time.
    #[error("{name} did not reach phase {goal} within {seconds} s; see kubectl dbservice status {name}")]
    PhaseTimedOut { name: String, seconds: u64, goal: Phase },
    /// `restart --wait` or `reload --wait` did not see it carried out in time.
    #[error("the {verb} of {name} was not done within {seconds} s; see kubectl dbservice status {name}")]
    RequestTimedOut { name: String, verb: &'static str, seconds: u64 },
    /// `psql` has no instance to open.
    #[error(transparent)]
    Psql(#[from] shell::PsqlError),
    /// `report` failed.
    #[error(transparent)]
    Report(#[from] report::ReportError),
}

fn api_error(what: impl Into<String>) -> impl FnOnce(kube::Error) -> PluginError {
    let what = what.into();
    move |source| match &source {
        kube::Error::Api(status) if status.code == 403 => {
            PluginError::Api { what: format!("{what}: not allowed"), source }
        }
        _ => PluginError::Api { what, source },
    }
}

async fn database(client: &Client, namespace: &str, name: &str) -> Result<DatabaseService, PluginError> {
    let databases: Api<DatabaseService> = Api::namespaced(client.clone(), namespace);
    databases
        .get_opt(name)
        .await
        .map_err(api_error(format!("cannot read DatabaseService {namespace}/{name}")))?
        .ok_or_else(|| PluginError::NotFound { name: name.into(), namespace: namespace.into() })
}

async fn patch(client: &Client, database: &DatabaseService, patch: serde_json::Value) -> Result<(), PluginError> {
    let namespace = database.metadata.namespace.clone().unwrap_or_default();
    let name = database.metadata.name.clone().unwrap_or_default();
    let databases: Api<DatabaseService> = Api::namespaced(client.clone(), &namespace);
    databases
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(api_error(format!("cannot change DatabaseService {namespace}/{name}")))?;
    Ok(())
}

/// `switchover NAME INSTANCE` (also `promote`): asks for a planned switchover to `instance`.
pub async fn switchover(client: Client, namespace: &str, name: &str, instance: &str) -> Result<String, PluginError> {
    let database = database(&client, namespace, name).await?;
    let body = actions::switchover_patch(&database, instance)?;
    patch(&client, &database, body.clone()).await?;
    let target =
        body["metadata"]["annotations"][crate::api::failover::SWITCHOVER_ANNOTATION].as_str().unwrap_or(instance);
    Ok(format!("switchover of {namespace}/{name} to {target} requested; follow it with: kubectl dbservice status {name} -n {namespace}"))
}

/// `fence NAME INSTANCE` / `unfence NAME INSTANCE`: keeps an instance's PostgreSQL stopped, or
/// lets it run again.
pub async fn fence(
    client: Client,
    namespace: &str,
    name: &str,
    instance: &str,
    fenced: bool,
) -> Result<String, PluginError> {
    let database = database(&client, namespace, name).await?;
    patch(&client, &database, actions::fence_patch(&database, instance, fenced)?).await?;
    let pod = actions::instance_of(&database, instance)?;
    Ok(format!("{pod} {}", if fenced { "fenced: its PostgreSQL is kept stopped" } else { "unfenced" }))
}

/// `hibernate NAME` (`hibernated`) or `wake NAME`: sets `spec.hibernated`; with `wait`, follows
/// the phase until it is Hibernated (or, waking, Running).
pub async fn hibernate(
    client: Client,
    namespace: &str,
    name: &str,
    hibernated: bool,
    wait: Option<Duration>,
) -> Result<String, PluginError> {
    let database = database(&client, namespace, name).await?;
    patch(&client, &database, actions::hibernation_patch(hibernated)).await?;
    let (verb, goal) = if hibernated { ("hibernation", Phase::Hibernated) } else { ("wake", Phase::Running) };
    let Some(timeout) = wait else {
        return Ok(format!(
            "{verb} of {namespace}/{name} requested; follow it with: kubectl dbservice status {name} -n {namespace}"
        ));
    };
    let databases: Api<DatabaseService> = Api::namespaced(client, namespace);
    let started = std::time::Instant::now();
    let mut last = None;
    loop {
        let current = databases.get(name).await.map_err(api_error(format!("cannot read {namespace}/{name}")))?;
        let phase = current.status.and_then(|status| status.phase);
        if phase != last {
            let shown = phase.map_or("-".to_string(), |phase| phase.to_string());
            eprintln!("{:>5.1} s  {name}: {shown}", started.elapsed().as_secs_f64());
            last = phase;
        }
        // A wake goes through the phases of starting pods: only the goal after the change counts.
        if phase == Some(goal) && current.spec.is_hibernated() == hibernated {
            return Ok(format!("{namespace}/{name} is {goal} after {:.1} s", started.elapsed().as_secs_f64()));
        }
        if started.elapsed() >= timeout {
            return Err(PluginError::PhaseTimedOut { name: name.into(), seconds: timeout.as_secs(), goal });
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// What `restart` and `reload` ask for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request {
    /// A rolling restart.
    Restart,
    /// A reload of every instance's configuration.
    Reload,
}

/// `restart NAME` or `reload NAME`: writes the request's annotation with the time; with `wait`,
/// follows it until the status says it was carried out (the rolling restart back to Running,
/// every instance reloaded).
pub async fn request(
    client: Client,
    namespace: &str,
    name: &str,
    request: Request,
    wait: Option<Duration>,
) -> Result<String, PluginError> {
    use crate::api::failover::{RELOAD_ANNOTATION, RESTART_ANNOTATION};
    let database = database(&client, namespace, name).await?;
    let (key, verb) = match request {
        Request::Restart => (RESTART_ANNOTATION, "rolling restart"),
        Request::Reload => (RELOAD_ANNOTATION, "reload"),
    };
    let value = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    patch(&client, &database, actions::request_patch(&database, key, &value)?).await?;
    let Some(timeout) = wait else {
        return Ok(format!(
            "{verb} of {namespace}/{name} requested; follow it with: kubectl dbservice status {name} -n {namespace}"
        ));
    };
    let databases: Api<DatabaseService> = Api::namespaced(client, namespace);
    let started = std::time::Instant::now();
    loop {
        let current = databases.get(name).await.map_err(api_error(format!("cannot read {namespace}/{name}")))?;
        let status = current.status.unwrap_or_default();
        let done = match request {
            Request::Restart => {
                status.restart_requested.as_ref() == Some(&value) && status.phase == Some(Phase::Running)
            }
            Request::Reload => status.reloaded.as_ref() == Some(&value),
        };
        if done {
            return Ok(format!("{verb} of {namespace}/{name} done in {:.1} s", started.elapsed().as_secs_f64()));
        }
        if started.elapsed() >= timeout {
            return Err(PluginError::RequestTimedOut { name: name.into(), verb, seconds: timeout.as_secs() });
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// `backup NAME`: creates a DatabaseServiceBackup; with `wait`, follows it to its end.
pub async fn backup(
    client: Client,
    namespace: &str,
    name: &str,
    backup_name: Option<&str>,
    target: Option<BackupTarget>,
    wait: Option<Duration>,
) -> Result<String, PluginError> {
    let database = database(&client, namespace, name).await?;
    let object = actions::backup_object(&database, backup_name, target, chrono::Utc::now())?;
    let backups: Api<DatabaseServiceBackup> = Api::namespaced(client, namespace);
    let created = backups
        .create(&PostParams::default(), &object)
        .await
        .map_err(api_error(format!("cannot create DatabaseServiceBackup in {namespace}")))?;
    let backup_name = created.metadata.name.clone().unwrap_or_default();
    let Some(timeout) = wait else {
        return Ok(format!("DatabaseServiceBackup {namespace}/{backup_name} created; follow it with: kubectl get dbsbackup {backup_name} -n {namespace} -w"));
    };
    wait_for_backup(&backups, &backup_name, timeout).await
}

/// Polls the backup every second, printing a line when its phase changes, until it ends.
async fn wait_for_backup(
    backups: &Api<DatabaseServiceBackup>,
    name: &str,
    timeout: Duration,
) -> Result<String, PluginError> {
    let started = std::time::Instant::now();
    let mut last = String::new();
    loop {
        let status = backups.get(name).await.map_err(api_error(format!("cannot read backup {name}")))?.status;
        let phase = status
            .as_ref()
            .and_then(|status| status.phase)
            .map(|phase| format!("{phase:?}"))
            .unwrap_or("Pending".into());
        if phase != last {
            eprintln!("{:>5.1} s  backup {name}: {phase}", started.elapsed().as_secs_f64());
            last = phase.clone();
        }
        match status.as_ref().and_then(|status| status.phase) {
            Some(BackupPhase::Completed) => {
                let id = status.and_then(|status| status.backup_id).unwrap_or_default();
                return Ok(format!("backup {name} completed in {:.1} s: {id}", started.elapsed().as_secs_f64()));
            }
            Some(BackupPhase::Failed) => {
                let message = status.and_then(|status| status.message).unwrap_or_default();
                return Err(PluginError::BackupFailed { name: name.into(), message });
            }
            _ if started.elapsed() >= timeout => {
                return Err(PluginError::BackupTimedOut { name: name.into(), seconds: timeout.as_secs(), phase });
            }
            _ => tokio::time::sleep(Duration::from_secs(1)).await,
        }
    }
}

/// kubectl's arguments for `psql NAME` (see [`shell::psql_arguments`]).
pub async fn psql(
    client: Client,
    namespace: &str,
    name: &str,
    which: &shell::PsqlInstance,
    superuser: bool,
    interactive: bool,
    extra: &[String],
) -> Result<Vec<String>, PluginError> {
    let database = database(&client, namespace, name).await?;
    let pod = shell::psql_pod(&database, which)?;
    Ok(shell::psql_arguments(&database, &pod, superuser, interactive, extra))
}

/// kubectl's arguments for `logs NAME` (see [`shell::logs_arguments`]).
pub async fn logs(
    client: Client,
    namespace: &str,
    name: &str,
    follow: bool,
    tail: Option<i64>,
) -> Result<Vec<String>, PluginError> {
    Ok(shell::logs_arguments(&database(&client, namespace, name).await?, follow, tail))
}
