//! Command line: every flag has an environment variable and a default.

use crate::instance::args::{InstallBinaryArgs, InstanceArgs};
use clap::{Args, Parser, Subcommand, ValueEnum};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

/// Kubernetes operator for PostgreSQL: admission webhooks and a self-healing controller.
#[derive(Debug, Parser)]
#[command(name = "dbservice-operator", version, about, long_about = None)]
pub struct Cli {
    /// What to do; `run` when omitted.
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// Subcommands.
// Parsed once at start-up: the size difference between variants does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Webhook server, controller and leader election (the container's default).
    Run(RunArgs),
    /// The admission server alone, with no cluster connection (local use, benchmarks, tests).
    Webhook(WebhookArgs),
    /// Print the CustomResourceDefinition generated from the Rust types.
    Crd(CrdArgs),
    /// Write a CA and a serving certificate signed by it: ca.crt, tls.crt, tls.key.
    Certs(CertsArgs),
    /// Print the history of a DatabaseService and its current status.
    Ledger(LedgerArgs),
    /// One screen on a DatabaseService: instances, primary, lag, timeline, archiving, backups,
    /// certificates, roles and the recent ledger (`kubectl dbservice status NAME` when installed
    /// as `kubectl-dbservice`).
    Status(StatusArgs),
    /// Pooler agent commands, run inside a pooler (PgBouncer) pod.
    Pooler(crate::pooler::PoolerArgs),
    /// Instance agent commands, run inside a PostgreSQL pod.
    Instance(InstanceArgs),
    /// PostgreSQL's archive_command: `wal-archive %p %f` uploads one WAL file to the object store.
    WalArchive(crate::store::config::WalArchiveArgs),
    /// PostgreSQL's restore_command: `wal-restore %f %p` downloads one WAL file from the object store.
    WalRestore(crate::store::config::WalRestoreArgs),
    /// Take one base backup: pg_basebackup streamed, compressed, to the object store.
    Backup(crate::store::config::BaseBackupArgs),
    /// Fill an empty data directory from a base backup, set up to recover to a target.
    Restore(crate::store::config::RestoreArgs),
    /// List the base backups in the object store and the recoverable window (JSON).
    BackupList(crate::store::config::ListBackupsArgs),
    /// Delete base backups and WAL outside a retention window, nothing a kept backup needs.
    BackupPrune(crate::store::config::PruneBackupsArgs),
    /// List a DatabaseService's base backups and recoverable window (reads its spec.backup store).
    Backups(LedgerArgs),
    /// Ask for a planned switchover to an instance (`kubectl dbservice switchover NAME 1`): writes
    /// the `dbservice.dev/switchover-to` annotation.
    #[command(alias = "promote")]
    Switchover(InstanceVerbArgs),
    /// Keep an instance's PostgreSQL stopped (the `dbservice.dev/fenced-instances` annotation).
    Fence(InstanceVerbArgs),
    /// Let a fenced instance run again.
    Unfence(InstanceVerbArgs),
    /// Hibernate: stop every instance and the pooler, keeping the data, Secrets and Services
    /// (sets `spec.hibernated`; with --wait, follows it to phase Hibernated).
    Hibernate(WaitVerbArgs),
    /// Wake a hibernated database on its volumes with its primary (with --wait, to phase Running).
    Wake(WaitVerbArgs),
    /// A rolling restart: standbys first, one at a time, then a switchover, then the former
    /// primary (the `dbservice.dev/restart-requested-at` annotation).
    Restart(WaitVerbArgs),
    /// Every instance reads its configuration files and certificates again, nothing restarts
    /// (the `dbservice.dev/reload-requested-at` annotation).
    Reload(WaitVerbArgs),
    /// Take a base backup now: creates a DatabaseServiceBackup (with --wait, follows it).
    #[command(name = "backup-now")]
    BackupNow(BackupNowArgs),
    /// A support bundle of a DatabaseService: its object, Events, ledger, child objects, Secrets'
    /// names and keys (values redacted), the instances' and the operator's logs.
    Report(ReportArgs),
    /// psql into the primary (or `--standby`, or `--instance N`) through `kubectl exec`, as the
    /// application's user or, with `--superuser`, as postgres; arguments after `--` go to psql.
    Psql(PsqlArgs),
    /// Every instance's log (PostgreSQL's and the agent's), each line prefixed with its pod.
    Logs(LogsArgs),
    /// Print a shell completion script (bash, zsh, fish, powershell, elvish).
    Completion(CompletionArgs),
    /// Copy this binary into DIRECTORY (an init container brings it into PostgreSQL pods this
    /// way: the operator image has no shell to copy with).
    InstallBinary(InstallBinaryArgs),
}

/// Log output format.
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

fn quantity(value: &str) -> Result<String, String> {
    crate::quantity::parse_bytes(value).map(|_| value.to_string()).map_err(|error| error.to_string())
}

/// Flags of the admission server.
#[derive(Debug, Args, Clone)]
pub struct WebhookArgs {
    /// Address of the HTTPS admission server (/validate, /mutate).
    #[arg(long, env = "DBSERVICE_LISTEN", default_value = "0.0.0.0:9443")]
    pub listen: SocketAddr,
    /// Address of the plain-HTTP server for /healthz, /readyz and /metrics.
    #[arg(long, env = "DBSERVICE_PROBE_LISTEN", default_value = "0.0.0.0:8080")]
    pub probe_listen: SocketAddr,
    /// PEM serving certificate (reloaded when it changes on disk).
    #[arg(long, env = "DBSERVICE_TLS_CERT", default_value = "/var/run/dbservice-operator/tls/tls.crt")]
    pub tls_cert: PathBuf,
    /// PEM private key of the serving certificate.
    #[arg(long, env = "DBSERVICE_TLS_KEY", default_value = "/var/run/dbservice-operator/tls/tls.key")]
    pub tls_key: PathBuf,
    /// Smallest spec.storageSize accepted (a Kubernetes quantity).
    #[arg(long, env = "DBSERVICE_MIN_STORAGE_SIZE", default_value = "1Gi", value_parser = quantity)]
    pub min_storage_size: String,
    /// Image prefixes (a registry, `registry/`, or `registry/path/`) that spec.image and
    /// spec.pooler.image must start with, comma-separated; empty allows any image. Enforced at
    /// admission and again by the controller.
    #[arg(long, env = "DBSERVICE_ALLOWED_IMAGE_PREFIXES", value_delimiter = ',', num_args = 0..)]
    pub allowed_image_prefixes: Vec<String>,
    /// Allow spec.bootstrap.import.roles: true, whose restore runs as the superuser (whoever
    /// controls the import's source then controls code run as the superuser).
    #[arg(long, env = "DBSERVICE_ALLOW_IMPORT_WITH_SOURCE_ROLES", default_value_t = false, action = clap::ArgAction::Set)]
    pub allow_import_with_source_roles: bool,
    /// Connections open at once to the admission port; more clients wait in the listen backlog.
    #[arg(long, env = "DBSERVICE_MAX_CONNECTIONS", default_value_t = crate::admission::limits::DEFAULT_MAX_CONNECTIONS, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=65536))]
    pub max_connections: usize,
    /// Admission requests parsed and decided at once; others wait (within the request timeout).
    #[arg(long, env = "DBSERVICE_MAX_CONCURRENT_REQUESTS", default_value_t = crate::admission::limits::DEFAULT_MAX_CONCURRENT_REQUESTS, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1024))]
    pub max_concurrent_requests: usize,
    /// Log format.
    #[arg(long, env = "DBSERVICE_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
}

/// Flags of `run`: the admission server's plus the controller's.
#[derive(Debug, Args, Clone)]
pub struct RunArgs {
    /// Admission server flags.
    #[command(flatten)]
    pub webhook: WebhookArgs,
    /// The operator's own namespace (leader Lease, certificate Secret).
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub namespace: String,
    /// This replica's identity in the Lease; the pod name in-cluster, the hostname otherwise.
    #[arg(long, env = "POD_NAME", default_value_t = default_identity())]
    pub identity: String,
    /// Name of the leader election Lease.
    #[arg(long, env = "DBSERVICE_LEASE_NAME", default_value = "dbservice-operator-leader")]
    pub lease_name: String,
    /// Lease duration in seconds: a dead leader is replaced after at most this long.
    #[arg(long, env = "DBSERVICE_LEASE_DURATION_SECONDS", default_value_t = 15, value_parser = clap::value_parser!(u64).range(3..=300))]
    pub lease_duration_seconds: u64,
    /// Seconds a version change may stay unhealthy before it is rolled back.
    #[arg(long, env = "DBSERVICE_PROGRESS_DEADLINE_SECONDS", default_value_t = 300)]
    pub progress_deadline_seconds: u64,
    /// Seconds a pod may stay not ready (or a standby unschedulable) before the operator acts.
    #[arg(long, env = "DBSERVICE_UNHEALTHY_THRESHOLD_SECONDS", default_value_t = 60)]
    pub unhealthy_threshold_seconds: u64,
    /// First restart backoff in seconds; doubles with each restart of the same episode.
    #[arg(long, env = "DBSERVICE_RESTART_BACKOFF_SECONDS", default_value_t = 30)]
    pub restart_backoff_seconds: u64,
    /// Longest restart backoff in seconds.
    #[arg(long, env = "DBSERVICE_RESTART_BACKOFF_CAP_SECONDS", default_value_t = 1800)]
    pub restart_backoff_cap_seconds: u64,
    /// Seconds to stay degraded before trying all instances again.
    #[arg(long, env = "DBSERVICE_RESTORE_PROBE_SECONDS", default_value_t = 300)]
    pub restore_probe_seconds: u64,
    /// Reconcile only DatabaseServices in this namespace (all namespaces when empty).
    #[arg(long, env = "DBSERVICE_WATCH_NAMESPACE", default_value = "")]
    pub watch_namespace: String,
    /// Reconcile only DatabaseServices matching this label selector (all when empty); lets
    /// several operator installations share a cluster, e.g. a canary.
    #[arg(long, env = "DBSERVICE_SELECTOR", default_value = "")]
    pub selector: String,
    /// The operator's own image (the chart sets it): an init container copies the binary from it
    /// into each PostgreSQL pod, for the instance agent (failover) and for WAL archiving. Empty: no
    /// agent (the primary is fixed to pod 0) and no archiving.
    #[arg(long, env = "DBSERVICE_INSTANCE_IMAGE", default_value = "")]
    pub instance_image: String,
    /// PgBouncer's image for `spec.pooler` when the DatabaseService names none: `pgbouncer` on its
    /// PATH and `/bin/sh`.
    #[arg(long, env = "DBSERVICE_POOLER_IMAGE", default_value = crate::api::pooler::DEFAULT_POOLER_IMAGE)]
    pub pooler_image: String,
    /// Give each database's pods a NetworkPolicy: PostgreSQL's port open to the database's own
    /// pods and to the pods of its namespace that --database-client-selector selects, nothing else.
    #[arg(long, env = "DBSERVICE_DATABASE_NETWORK_POLICIES")]
    pub database_network_policies: bool,
    /// Labels (`key=value,...`) of the pods that may connect when NetworkPolicies are on; empty:
    /// every pod of the database's namespace.
    #[arg(long, env = "DBSERVICE_DATABASE_CLIENT_SELECTOR", default_value = "", value_parser = parse_labels)]
    pub database_client_selector: std::collections::BTreeMap<String, String>,
    /// DatabaseServices reconciled at once. 16: a pass is a few sequential writes waiting on the
    /// apiserver, so with 4 the operator sat idle while 400 of 1000 new DatabaseServices waited for
    /// their first pass (benches/README.md, scale).
    #[arg(long, env = "DBSERVICE_CONCURRENCY", default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub concurrency: u16,
    /// Manage the webhook certificates in-cluster (Secret, caBundle, renewal).
    #[arg(long, env = "DBSERVICE_MANAGE_CERTIFICATES", default_value_t = false)]
    pub manage_certificates: bool,
    /// Seconds between checks that the live caBundle trusts the served certificate (and renewals).
    #[arg(long, env = "DBSERVICE_CERTIFICATE_CHECK_SECONDS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    pub certificate_check_seconds: u64,
    /// Secret holding the managed certificates.
    #[arg(long, env = "DBSERVICE_CERTIFICATE_SECRET", default_value = "dbservice-operator-webhook-tls")]
    pub certificate_secret: String,
    /// Service in front of the webhook (its DNS names go into the certificate).
    #[arg(long, env = "DBSERVICE_WEBHOOK_SERVICE", default_value = "dbservice-operator-webhook")]
    pub webhook_service: String,
    /// ValidatingWebhookConfiguration whose caBundle the operator keeps.
    #[arg(long, env = "DBSERVICE_VALIDATING_WEBHOOK", default_value = "dbservice-operator")]
    pub validating_webhook_configuration: String,
    /// MutatingWebhookConfiguration whose caBundle the operator keeps.
    #[arg(long, env = "DBSERVICE_MUTATING_WEBHOOK", default_value = "dbservice-operator")]
    pub mutating_webhook_configuration: String,
}

fn default_identity() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| format!("dbservice-operator-{}", std::process::id()))
}

/// Flags of `crd`.
#[derive(Debug, Args, Clone)]
pub struct CrdArgs {
    /// Print only the CRD's .spec (what the Helm chart embeds).
    #[arg(long, env = "DBSERVICE_CRD_SPEC_ONLY", default_value_t = false)]
    pub spec_only: bool,
    /// Print the manual's API reference (Markdown) rendered from the CRD instead.
    #[arg(long, default_value_t = false, conflicts_with = "spec_only")]
    pub reference: bool,
    /// Which CRD: the DatabaseService's or the DatabaseServiceBackup's.
    #[arg(long, env = "DBSERVICE_CRD_KIND", value_enum, default_value = "database-service")]
    pub kind: CrdKind,
}

/// The CRDs the operator defines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CrdKind {
    /// DatabaseService.
    DatabaseService,
    /// DatabaseServiceBackup.
    Backup,
}

/// Flags of `certs`.
#[derive(Debug, Args, Clone)]
pub struct CertsArgs {
    /// Directory to write ca.crt, tls.crt and tls.key into.
    #[arg(long, env = "DBSERVICE_CERTS_OUT", default_value = "certs")]
    pub out: PathBuf,
    /// DNS names of the serving certificate (repeatable).
    #[arg(long = "dns", env = "DBSERVICE_CERTS_DNS", value_delimiter = ',', default_values_t = ["localhost".to_string()])]
    pub dns: Vec<String>,
    /// IP addresses of the serving certificate (repeatable).
    #[arg(long = "ip", env = "DBSERVICE_CERTS_IP", value_delimiter = ',', default_values_t = ["127.0.0.1".parse::<IpAddr>().expect("valid")])]
    pub ip: Vec<IpAddr>,
}

/// Flags of `ledger` and `backups`.
#[derive(Debug, Args, Clone)]
pub struct LedgerArgs {
    /// DatabaseService name.
    pub name: String,
    /// Namespace of the DatabaseService (default: the kubeconfig context's, in a pod its own,
    /// else `default`).
    #[arg(short, long, env = "DBSERVICE_NAMESPACE")]
    pub namespace: Option<String>,
    /// Print the entries (or backups) as data (json or yaml) instead of a table.
    #[arg(short, long, value_enum)]
    pub output: Option<crate::plugin::output::OutputFormat>,
}

/// Arguments of the verbs that name one instance of a DatabaseService.
#[derive(Debug, Args, Clone)]
pub struct InstanceVerbArgs {
    /// DatabaseService name.
    pub name: String,
    /// The instance: its pod's name (`NAME-1`) or its ordinal (`1`).
    pub instance: String,
    /// Namespace of the DatabaseService (default: the kubeconfig context's, in a pod its own,
    /// else `default`).
    #[arg(short, long, env = "DBSERVICE_NAMESPACE")]
    pub namespace: Option<String>,
}

/// Arguments of the verbs that change a database and may follow the change to its end:
/// `hibernate`, `wake`, `restart` and `reload`.
#[derive(Debug, Args, Clone)]
pub struct WaitVerbArgs {
    /// DatabaseService name.
    pub name: String,
    /// Namespace of the DatabaseService (default: the kubeconfig context's, in a pod its own,
    /// else `default`).
    #[arg(short, long, env = "DBSERVICE_NAMESPACE")]
    pub namespace: Option<String>,
    /// Follow the change to its end (Hibernated, Running, the rolling restart done, every
    /// instance reloaded).
    #[arg(long, default_value_t = false)]
    pub wait: bool,
    /// How long --wait follows it.
    #[arg(long, default_value_t = 600)]
    pub wait_seconds: u64,
}

/// Arguments of `backup-now`.
#[derive(Debug, Args, Clone)]
pub struct BackupNowArgs {
    /// DatabaseService name (it needs `spec.backup`).
    pub name: String,
    /// Namespace of the DatabaseService (default: the kubeconfig context's, in a pod its own,
    /// else `default`).
    #[arg(short, long, env = "DBSERVICE_NAMESPACE")]
    pub namespace: Option<String>,
    /// The DatabaseServiceBackup's name (default: NAME-YYYYMMDDHHMMSS).
    #[arg(long)]
    pub backup_name: Option<String>,
    /// Copy the primary instead of a standby.
    #[arg(long, default_value_t = false)]
    pub from_primary: bool,
    /// Follow the backup to its end, printing each phase; fail if it fails.
    #[arg(long, default_value_t = false)]
    pub wait: bool,
    /// How long --wait follows it.
    #[arg(long, default_value_t = 3600)]
    pub wait_seconds: u64,
}

/// Arguments of `report`.
#[derive(Debug, Args, Clone)]
pub struct ReportArgs {
    /// DatabaseService name.
    pub name: String,
    /// Namespace of the DatabaseService (default: the kubeconfig context's, in a pod its own,
    /// else `default`).
    #[arg(short, long, env = "DBSERVICE_NAMESPACE")]
    pub namespace: Option<String>,
    /// Write the bundle to this file instead of standard output.
    #[arg(short, long)]
    pub output: Option<std::path::PathBuf>,
}

/// Arguments of `status`.
#[derive(Debug, Args, Clone)]
pub struct StatusArgs {
    /// DatabaseService name.
    pub name: String,
    /// Namespace of the DatabaseService (default: the kubeconfig context's, in a pod its own,
    /// else `default`).
    #[arg(short, long, env = "DBSERVICE_NAMESPACE")]
    pub namespace: Option<String>,
    /// Print the view as data (json or yaml) instead of the screen for people.
    #[arg(short, long, value_enum)]
    pub output: Option<crate::plugin::output::OutputFormat>,
    /// Redraw the screen every 2 seconds until interrupted.
    #[arg(short, long, default_value_t = false, conflicts_with = "output")]
    pub watch: bool,
}

/// Arguments of `psql`.
#[derive(Debug, Args, Clone)]
pub struct PsqlArgs {
    /// DatabaseService name.
    pub name: String,
    /// Namespace of the DatabaseService (default: the kubeconfig context's, in a pod its own,
    /// else `default`).
    #[arg(short, long, env = "DBSERVICE_NAMESPACE")]
    pub namespace: Option<String>,
    /// A ready standby instead of the primary.
    #[arg(long, default_value_t = false, conflicts_with = "instance")]
    pub standby: bool,
    /// This instance (pod name or ordinal) instead of the primary.
    #[arg(long)]
    pub instance: Option<String>,
    /// As the superuser postgres (over the pod's local socket; needs `pods/exec`).
    #[arg(long, default_value_t = false)]
    pub superuser: bool,
    /// Arguments for psql (after `--`), e.g. `-- -c 'select 1'`.
    #[arg(last = true)]
    pub psql: Vec<String>,
}

/// Arguments of `logs`.
#[derive(Debug, Args, Clone)]
pub struct LogsArgs {
    /// DatabaseService name.
    pub name: String,
    /// Namespace of the DatabaseService (default: the kubeconfig context's, in a pod its own,
    /// else `default`).
    #[arg(short, long, env = "DBSERVICE_NAMESPACE")]
    pub namespace: Option<String>,
    /// Keep following the logs.
    #[arg(short, long, default_value_t = false)]
    pub follow: bool,
    /// Lines of each instance's log to start with (all when absent).
    #[arg(long)]
    pub tail: Option<i64>,
}

/// Arguments of `completion`.
#[derive(Debug, Args, Clone)]
pub struct CompletionArgs {
    /// The shell.
    pub shell: clap_complete::Shell,
}

impl Cli {
    /// Parses the command line; a bad flag prints one line naming it and exits with status 2.
    pub fn parse_or_exit() -> Self {
        match Self::try_parse() {
            Ok(cli) => cli,
            Err(error) => {
                use clap::error::ErrorKind;
                if matches!(
                    error.kind(),
                    ErrorKind::DisplayHelp
                        | ErrorKind::DisplayVersion
                        | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
                ) {
                    error.exit();
                }
                let rendered = error.to_string();
                let first = rendered.lines().find(|line| !line.trim().is_empty()).unwrap_or("error: invalid arguments");
                eprintln!("{first} (see --help)");
                std::process::exit(2);
            }
        }
    }
}

/// `key=value,...` as labels: each key and value a label name and value (empty text: none).
pub fn parse_labels(text: &str) -> Result<std::collections::BTreeMap<String, String>, String> {
    let valid = |part: &str, max: usize| {
        part.len() <= max
            && part.bytes().all(|byte| byte.is_ascii_alphanumeric() || b"-_./".contains(&byte))
            && part.bytes().next().is_none_or(|byte| byte.is_ascii_alphanumeric())
    };
    text.split(',')
        .filter(|pair| !pair.trim().is_empty())
        .map(|pair| match pair.trim().split_once('=') {
            Some((key, value)) if !key.is_empty() && valid(key, 317) && valid(value, 63) => {
                Ok((key.to_string(), value.to_string()))
            }
            _ => Err(format!("{pair:?} is not key=value with a label name and value")),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::parse_labels;

    #[test]
    fn client_selectors_are_labels_and_bad_ones_are_named() {
        assert!(parse_labels("").unwrap().is_empty());
        let labels = parse_labels("app.kubernetes.io/part-of=shop, tier=api").unwrap();
        assert_eq!(labels["app.kubernetes.io/part-of"], "shop");
        assert_eq!(labels["tier"], "api");
        assert!(parse_labels("tier").unwrap_err().contains("\"tier\" is not key=value"));
        assert!(parse_labels("tier=a b").is_err());
    }
}
