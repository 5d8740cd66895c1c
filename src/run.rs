//! Wiring of the subcommands: the admission server alone, or everything (`run`).

use crate::admission::certificates::ManagedCertificates;
use crate::admission::limits::{RequestLimits, ServerLimits};
use crate::admission::server::{bind, serve_plain, serve_tls};
use crate::admission::tls::{install_crypto_provider, ReloadingCertificate};
use crate::admission::webhook::{admission_router, probe_router, AdmissionState, Readiness};
use crate::cli::{CertsArgs, LedgerArgs, RunArgs, WebhookArgs};
use crate::metrics::Metrics;
use crate::operator::context::Context;
use crate::operator::database::settings::ControllerSettings;
use crate::operator::leader::LeaderElection;
use crate::operator::wiring::{recorder, run_while_leader};
use anyhow::Context as _;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How often certificate files are checked for changes.
const CERTIFICATE_POLL: Duration = Duration::from_secs(2);

/// A channel that turns true on SIGTERM or SIGINT.
pub fn shutdown_signal() -> watch::Receiver<bool> {
    let (sender, receiver) = watch::channel(false);
    tokio::spawn(async move {
        let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("can install a SIGTERM handler");
        tokio::select! {
            _ = terminate.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        tracing::info!("shutdown requested");
        let _ = sender.send(true);
    });
    receiver
}

/// Starts the HTTPS admission server and the probe server; returns their tasks.
async fn start_servers(
    args: &WebhookArgs,
    client: Option<kube::Client>,
    metrics: Arc<Metrics>,
    readiness: Readiness,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<Vec<tokio::task::JoinHandle<()>>> {
    install_crypto_provider();
    let certificate = ReloadingCertificate::load(&args.tls_cert, &args.tls_key)
        .map_err(|error| anyhow::anyhow!("--tls-cert/--tls-key: {error}"))?;
    let mut state = AdmissionState::new(&args.min_storage_size, metrics.clone())
        .map_err(|error| anyhow::anyhow!("--min-storage-size: {error}"))?
        .with_limits(RequestLimits::new(args.max_concurrent_requests))
        .with_allowed_image_prefixes(args.allowed_image_prefixes.clone())
        .with_import_with_source_roles(args.allow_import_with_source_roles);
    if let Some(client) = client {
        state =
            state.with_secret_access(Arc::new(crate::admission::secret_access::KubeSecretAccessReviewer::new(client)));
    }
    let limits = ServerLimits { max_connections: args.max_connections, ..ServerLimits::default() };
    let webhook_listener = bind(args.listen, "--listen").await?;
    let probe_listener = bind(args.probe_listen, "--probe-listen").await?;
    tracing::info!(listen = %args.listen, probe_listen = %args.probe_listen, "admission server listening");
    let watch_task = tokio::spawn(certificate.clone().watch(CERTIFICATE_POLL, metrics.clone()));
    let tls_task =
        tokio::spawn(serve_tls(webhook_listener, admission_router(state), certificate, limits, shutdown.clone()));
    let probe_task = tokio::spawn(serve_plain(probe_listener, probe_router(metrics, readiness.clone()), shutdown));
    readiness.set(true);
    Ok(vec![tls_task, probe_task, watch_task])
}

/// `dbservice-operator webhook`: the admission server alone.
pub async fn webhook(args: WebhookArgs) -> anyhow::Result<()> {
    let metrics = Arc::new(Metrics::new());
    let readiness = Readiness::default();
    let mut shutdown = shutdown_signal();
    let tasks = start_servers(&args, None, metrics, readiness.clone(), shutdown.clone()).await?;
    let _ = shutdown.wait_for(|stop| *stop).await;
    readiness.set(false);
    for task in tasks.into_iter().take(2) {
        let _ = task.await;
    }
    Ok(())
}

/// `dbservice-operator run`: admission server, leader election and controller.
pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    install_crypto_provider();
    let metrics = Arc::new(Metrics::new());
    let config = kube_config().await?;
    // Every replica manages certificates; only the leader's controller writes (gated client). Both
    // clients count every request by verb and resource (dbservice_api_requests_total).
    let client = crate::client::client(&config, None, &metrics)?;
    let readiness = Readiness::default();
    let mut shutdown = shutdown_signal();
    if args.manage_certificates {
        manage_webhook_certificates(&args, &client).await?;
    }
    let servers =
        start_servers(&args.webhook, Some(client.clone()), metrics.clone(), readiness.clone(), shutdown.clone())
            .await?;
    let election = LeaderElection {
        namespace: args.namespace.clone(),
        lease_name: args.lease_name.clone(),
        identity: args.identity.clone(),
        lease_duration: Duration::from_secs(args.lease_duration_seconds),
    };
    let (leader, election_task) = election.spawn(&config, metrics.clone(), shutdown.clone())?;
    let client = crate::client::client(&config, Some(leader.clone()), &metrics)?;
    let context = Arc::new(Context {
        client: client.clone(),
        recorder: recorder(client.clone(), &args.identity),
        metrics: metrics.clone(),
        settings: controller_settings(&args),
        failover_timers: Default::default(),
        checked_secrets: Default::default(),
    });
    let controller_task = tokio::spawn(run_while_leader(client, context, leader, shutdown.clone()));
    let _ = shutdown.wait_for(|stop| *stop).await;
    let stopping = tokio::time::Instant::now();
    let deadline = stopping + SHUTDOWN_DEADLINE;
    readiness.set(false);
    // Leadership ends first (the client refuses every write from then on), then the Lease is
    // released so that a successor takes over at once.
    if tokio::time::timeout_at(deadline, election_task).await.is_err() {
        tracing::warn!("the leader election did not stop in time");
    }
    let mut tasks = vec![("controllers", controller_task)];
    tasks.extend(["admission server", "probe server"].into_iter().zip(servers));
    for (name, mut task) in tasks {
        if tokio::time::timeout_at(deadline, &mut task).await.is_err() {
            tracing::warn!(task = name, "still running at the shutdown deadline; stopped it");
            task.abort();
        }
    }
    tracing::info!(seconds = stopping.elapsed().as_secs_f64(), "stopped");
    Ok(())
}

/// Prepares the webhook's certificate files and keeps them (and the webhook configurations'
/// CA bundles) current in the background.
async fn manage_webhook_certificates(args: &RunArgs, client: &kube::Client) -> anyhow::Result<()> {
    let managed = ManagedCertificates {
        namespace: args.namespace.clone(),
        secret_name: args.certificate_secret.clone(),
        service_name: args.webhook_service.clone(),
        validating_webhook: args.validating_webhook_configuration.clone(),
        mutating_webhook: args.mutating_webhook_configuration.clone(),
        certificate_path: args.webhook.tls_cert.clone(),
        key_path: args.webhook.tls_key.clone(),
    };
    // The first pass must succeed: without files there is nothing to serve.
    let mut attempt = 0;
    while let Err(error) = managed.reconcile(client).await {
        attempt += 1;
        if attempt >= 30 {
            return Err(anyhow::anyhow!("managing webhook certificates: {error}"));
        }
        tracing::warn!(%error, "cannot prepare webhook certificates yet; retrying");
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    tokio::spawn(managed.run(client.clone(), Duration::from_secs(args.certificate_check_seconds)));
    Ok(())
}

/// The controller's tunables from the command line.
fn controller_settings(args: &RunArgs) -> ControllerSettings {
    ControllerSettings {
        min_storage_size: args.webhook.min_storage_size.clone(),
        allowed_image_prefixes: args.webhook.allowed_image_prefixes.clone(),
        allow_import_with_source_roles: args.webhook.allow_import_with_source_roles,
        progress_deadline: Duration::from_secs(args.progress_deadline_seconds),
        unhealthy_threshold: Duration::from_secs(args.unhealthy_threshold_seconds),
        restart_backoff: Duration::from_secs(args.restart_backoff_seconds),
        restart_backoff_cap: Duration::from_secs(args.restart_backoff_cap_seconds),
        restore_probe: Duration::from_secs(args.restore_probe_seconds),
        concurrency: args.concurrency,
        watch_namespace: Some(args.watch_namespace.clone()).filter(|namespace| !namespace.is_empty()),
        selector: Some(args.selector.clone()).filter(|selector| !selector.is_empty()),
        instance_image: Some(args.instance_image.clone()).filter(|image| !image.is_empty()),
        database_network_policy: args.database_network_policies.then(|| args.database_client_selector.clone()),
        pooler_image: args.pooler_image.clone(),
    }
}

/// Longest time from SIGTERM to exit, whatever the number of databases: below the chart's
/// terminationGracePeriodSeconds (30) minus its preStop pause (5), so that no rollout or drain
/// ends in SIGKILL. Everything still running then is stopped (no write: leadership ended first).
const SHUTDOWN_DEADLINE: Duration = Duration::from_secs(15);

/// The Kubernetes configuration from KUBECONFIG or the in-cluster environment.
async fn kube_config() -> anyhow::Result<kube::Config> {
    kube::Config::infer().await.context("cannot build a Kubernetes client (KUBECONFIG or in-cluster config)")
}

/// `dbservice-operator certs`.
pub fn certs(args: CertsArgs) -> anyhow::Result<()> {
    let bundle = crate::certificates::generate_bundle(&args.dns, &args.ip)?;
    crate::certificates::write_bundle(&bundle, &args.out)?;
    println!(
        "wrote {0}/ca.crt, {0}/tls.crt and {0}/tls.key (DNS {1:?}, IP {2:?})",
        args.out.display(),
        args.dns,
        args.ip
    );
    Ok(())
}

/// `dbservice-operator backups NAME -n NAMESPACE`.
pub async fn backups(args: LedgerArgs) -> anyhow::Result<()> {
    let client = people_client().await?;
    let namespace = namespace_of(&args.namespace, &client);
    let render = args
        .output
        .map(|format| move |document: &serde_json::Value| crate::plugin::output::render_document(document, format));
    let as_data = render.as_ref().map(|render| render as &dyn Fn(&serde_json::Value) -> String);
    Ok(crate::store::inventory::print_backups(client, &namespace, &args.name, as_data).await?)
}

/// The namespace a person named, else the kubeconfig context's (in a pod its own), else
/// `default`: what kubectl would use.
fn namespace_of(given: &Option<String>, client: &kube::Client) -> String {
    given.clone().unwrap_or_else(|| client.default_namespace().to_string())
}

/// A client for the commands people run (status, ledger, backups and the plugin's verbs), from
/// the kubeconfig or the pod's account.
async fn people_client() -> anyhow::Result<kube::Client> {
    install_crypto_provider();
    Ok(crate::client::client(&kube_config().await?, None, &Arc::new(Metrics::new()))?)
}

/// `switchover NAME INSTANCE` (alias `promote`).
pub async fn switchover(args: crate::cli::InstanceVerbArgs) -> anyhow::Result<()> {
    let client = people_client().await?;
    let namespace = namespace_of(&args.namespace, &client);
    let done = crate::plugin::switchover(client, &namespace, &args.name, &args.instance).await?;
    println!("{done}");
    Ok(())
}

/// `fence NAME INSTANCE` / `unfence NAME INSTANCE`.
pub async fn fence(args: crate::cli::InstanceVerbArgs, fenced: bool) -> anyhow::Result<()> {
    let client = people_client().await?;
    let namespace = namespace_of(&args.namespace, &client);
    println!("{}", crate::plugin::fence(client, &namespace, &args.name, &args.instance, fenced).await?);
    Ok(())
}

/// `hibernate NAME [--wait]` (`hibernated`) or `wake NAME [--wait]`.
pub async fn hibernate(args: crate::cli::WaitVerbArgs, hibernated: bool) -> anyhow::Result<()> {
    let wait = args.wait.then(|| std::time::Duration::from_secs(args.wait_seconds));
    let client = people_client().await?;
    let namespace = namespace_of(&args.namespace, &client);
    println!("{}", crate::plugin::hibernate(client, &namespace, &args.name, hibernated, wait).await?);
    Ok(())
}

/// `restart NAME [--wait]` or `reload NAME [--wait]`.
pub async fn request(args: crate::cli::WaitVerbArgs, request: crate::plugin::Request) -> anyhow::Result<()> {
    let wait = args.wait.then(|| std::time::Duration::from_secs(args.wait_seconds));
    let client = people_client().await?;
    let namespace = namespace_of(&args.namespace, &client);
    println!("{}", crate::plugin::request(client, &namespace, &args.name, request, wait).await?);
    Ok(())
}

/// `backup-now NAME [--wait]`.
pub async fn backup_now(args: crate::cli::BackupNowArgs) -> anyhow::Result<()> {
    use crate::api::database_service_backup::BackupTarget;
    let target = args.from_primary.then_some(BackupTarget::Primary);
    let wait = args.wait.then(|| std::time::Duration::from_secs(args.wait_seconds));
    let client = people_client().await?;
    let namespace = namespace_of(&args.namespace, &client);
    let done = crate::plugin::backup(client, &namespace, &args.name, args.backup_name.as_deref(), target, wait).await?;
    println!("{done}");
    Ok(())
}

/// `report NAME [-o FILE]`.
pub async fn report(args: crate::cli::ReportArgs) -> anyhow::Result<()> {
    let client = people_client().await?;
    let namespace = namespace_of(&args.namespace, &client);
    let bundle = crate::plugin::report::report(client, &namespace, &args.name).await?;
    match &args.output {
        Some(path) => {
            std::fs::write(path, &bundle).with_context(|| format!("cannot write {}", path.display()))?;
            eprintln!("wrote {} ({} bytes; Secrets' values redacted)", path.display(), bundle.len());
        }
        None => print!("{bundle}"),
    }
    Ok(())
}

/// Runs kubectl (`DBSERVICE_KUBECTL`, or `kubectl` on PATH, where a kubectl plugin always finds
/// it) with `arguments` on this terminal, and exits with its status.
fn hand_over_to_kubectl(arguments: &[String]) -> anyhow::Result<()> {
    let kubectl = std::env::var("DBSERVICE_KUBECTL").unwrap_or_else(|_| "kubectl".into());
    let status = std::process::Command::new(&kubectl)
        .args(arguments)
        .status()
        .with_context(|| format!("cannot run {kubectl} (it must be on PATH)"))?;
    std::process::exit(status.code().unwrap_or(1));
}

/// `psql NAME [--standby | --instance N] [--superuser] [-- PSQL ARGUMENTS]`.
pub async fn psql(args: crate::cli::PsqlArgs) -> anyhow::Result<()> {
    use crate::plugin::shell::PsqlInstance;
    use std::io::IsTerminal;
    let which = match (&args.instance, args.standby) {
        (Some(instance), _) => PsqlInstance::Named(instance.clone()),
        (None, true) => PsqlInstance::Standby,
        (None, false) => PsqlInstance::Primary,
    };
    let interactive = std::io::stdin().is_terminal();
    let client = people_client().await?;
    let namespace = namespace_of(&args.namespace, &client);
    let arguments =
        crate::plugin::psql(client, &namespace, &args.name, &which, args.superuser, interactive, &args.psql).await?;
    hand_over_to_kubectl(&arguments)
}

/// `logs NAME [-f] [--tail N]`.
pub async fn logs(args: crate::cli::LogsArgs) -> anyhow::Result<()> {
    let client = people_client().await?;
    let namespace = namespace_of(&args.namespace, &client);
    let arguments = crate::plugin::logs(client, &namespace, &args.name, args.follow, args.tail).await?;
    hand_over_to_kubectl(&arguments)
}

/// `completion SHELL`: the script completes the verbs for `dbservice-operator` and for
/// `kubectl-dbservice` (kubectl's own completion of plugins calls the latter).
pub fn completion(args: crate::cli::CompletionArgs) {
    use clap::CommandFactory;
    let mut command = crate::cli::Cli::command();
    for name in ["dbservice-operator", "kubectl-dbservice"] {
        clap_complete::generate(args.shell, &mut command, name, &mut std::io::stdout());
    }
}

/// `dbservice-operator status NAME -n NAMESPACE`.
pub async fn status(args: crate::cli::StatusArgs) -> anyhow::Result<()> {
    use crate::operator::status_view::{read, render};
    let client = people_client().await?;
    let namespace = namespace_of(&args.namespace, &client);
    loop {
        let view = read(client.clone(), &namespace, &args.name).await?;
        match args.output {
            Some(format) => print!("{}", crate::plugin::output::render(&view, format)),
            // Clear the screen and home the cursor before each redraw.
            None if args.watch => print!("\x1b[2J\x1b[H{}", render(&view)),
            None => print!("{}", render(&view)),
        }
        if !args.watch {
            return Ok(());
        }
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    }
}

/// `dbservice-operator ledger NAME -n NAMESPACE`.
pub async fn ledger(args: LedgerArgs) -> anyhow::Result<()> {
    use crate::api::database_service::DatabaseService;
    use crate::api::names::ChildNames;
    use crate::operator::ledger::{parse, render_table, LEDGER_KEY};
    use k8s_openapi::api::core::v1::ConfigMap;
    let client = people_client().await?;
    let namespace = namespace_of(&args.namespace, &client);
    let config_maps: kube::Api<ConfigMap> = kube::Api::namespaced(client.clone(), &namespace);
    let databases: kube::Api<DatabaseService> = kube::Api::namespaced(client, &namespace);
    let database = databases.get_opt(&args.name).await?;
    let ledger = config_maps.get_opt(&ChildNames::ledger(&args.name)).await?;
    if database.is_none() && ledger.is_none() {
        anyhow::bail!("no DatabaseService {:?} and no ledger in namespace {:?}", args.name, namespace);
    }
    if let Some(format) = args.output {
        let entries = ledger
            .as_ref()
            .and_then(|config_map| config_map.data.as_ref())
            .and_then(|data| data.get(LEDGER_KEY))
            .map(|text| parse(text))
            .unwrap_or_default();
        let document = serde_json::json!({"name": args.name, "namespace": namespace, "entries": entries});
        print!("{}", crate::plugin::output::render_document(&document, format));
        return Ok(());
    }
    match &database {
        Some(database) => {
            let status = database.status.clone().unwrap_or_default();
            println!("DatabaseService {namespace}/{}", args.name);
            println!(
                "  phase: {}   ready: {}/{}   version: {} (spec {})   last stable: {}",
                status.phase.map(|phase| phase.to_string()).unwrap_or_else(|| "-".into()),
                status.ready_replicas,
                database.spec.replicas_or_default(),
                status.current_version.as_deref().unwrap_or("-"),
                database.spec.version,
                status.last_stable_version.as_deref().unwrap_or("-"),
            );
            for condition in &status.conditions {
                println!(
                    "  {:<17} {:<5} {:<26} {}",
                    condition.type_, condition.status, condition.reason, condition.message
                );
            }
        }
        None => println!("DatabaseService {namespace}/{} no longer exists; its ledger was retained", args.name),
    }
    let entries = ledger
        .and_then(|config_map| config_map.data)
        .and_then(|data| data.get(LEDGER_KEY).cloned())
        .map(|text| parse(&text))
        .unwrap_or_default();
    println!();
    print!("{}", render_table(&entries));
    Ok(())
}
