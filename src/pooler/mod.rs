//! The pooler agent (issue 25): `dbservice-operator pooler run`, beside the two PgBouncers of
//! every pooler pod. It reads its DatabaseService's status and points the read-write PgBouncer at
//! the current primary (the included `rw-databases.ini`, then RELOAD and RECONNECT); it pauses
//! that PgBouncer when the operator asks before a switchover (POST /pause over HTTPS, with the
//! token of Secret NAME-pooler) and resumes it once the switchover has ended ([`pause::step`]);
//! it serves the pools' metrics on /metrics and its readiness on /healthz (plain HTTP); and it
//! has both PgBouncers RELOAD when the kubelet swapped in a renewed certificate. Its passwords
//! and token are files ([`credentials`]), never environment variables.

pub mod admin;
pub mod credentials;
pub mod metrics;
pub mod pause;
mod server;

use crate::admission::limits::ServerLimits;
use crate::admission::tls::ReloadingCertificate;
use crate::api::database_service::DatabaseService;
use crate::api::names::ChildNames;
use crate::api::pod::POSTGRES_PORT;
use crate::api::pooler::{CA_DIRECTORY, READ_ONLY_PORT, READ_WRITE_PORT, RUN_DIRECTORY, TLS_DIRECTORY};
use admin::Pool;
use anyhow::Context;
use credentials::AgentCredentials;
use pause::{Action, Observed, PauseState};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::{mpsc, oneshot};

/// The read-write PgBouncer.
pub const READ_WRITE: Pool = Pool { name: "rw", port: READ_WRITE_PORT as u16 };
/// The read-only PgBouncer.
pub const READ_ONLY: Pool = Pool { name: "ro", port: READ_ONLY_PORT as u16 };
/// How long the agent waits for PAUSE (in-flight transactions finish first); shorter than the
/// operator's wait, so that the operator hears the answer.
const PAUSE_TIMEOUT: Duration = Duration::from_secs(4);
/// How often the status is read: often while paused (the clients wait on it), else once a second.
const PAUSED_INTERVAL: Duration = Duration::from_millis(200);
const RUNNING_INTERVAL: Duration = Duration::from_secs(1);
/// Every call to the apiserver.
const CALL_TIMEOUT: Duration = Duration::from_secs(3);
/// How often the mounted certificate files are compared with what PgBouncer loaded (the kubelet
/// swaps a renewed Secret's files in within a minute or two).
const CERTIFICATE_CHECK_INTERVAL: Duration = Duration::from_secs(10);

/// A fingerprint of the certificate files both PgBouncers read (server certificate, its key and
/// the CA), None while one cannot be read.
fn certificate_fingerprint() -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    for file in
        [format!("{TLS_DIRECTORY}/tls.crt"), format!("{TLS_DIRECTORY}/tls.key"), format!("{CA_DIRECTORY}/ca.crt")]
    {
        std::fs::read(file).ok()?.hash(&mut hasher);
    }
    Some(hasher.finish())
}

/// `pooler` subcommands.
#[derive(Debug, clap::Args)]
pub struct PoolerArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: PoolerCommand,
}

/// Subcommands of `pooler`.
#[derive(Debug, clap::Subcommand)]
pub enum PoolerCommand {
    /// Run the pooler agent (the pooler pod's `pooler-agent` container).
    Run(PoolerRunArgs),
}

/// Flags of `pooler run` (the Deployment sets them through the environment).
#[derive(Clone, Debug, clap::Args)]
pub struct PoolerRunArgs {
    /// The DatabaseService.
    #[arg(long, env = "DATABASE_NAME")]
    pub database: String,
    /// Its namespace.
    #[arg(long, env = "POD_NAMESPACE")]
    pub namespace: String,
    /// File of PgBouncer's admin password (a key of Secret NAME-pooler, mounted).
    #[arg(long, env = "POOLER_ADMIN_PASSWORD_FILE")]
    pub admin_password_file: PathBuf,
    /// File of the pooler role's password (Secret NAME-pooler): the agent logs in through its
    /// PgBouncer once before the pod is ready.
    #[arg(long, env = "POOLER_AUTH_PASSWORD_FILE")]
    pub auth_password_file: PathBuf,
    /// File of the bearer token of POST /pause (Secret NAME-pooler).
    #[arg(long, env = "POOLER_CONTROL_TOKEN_FILE")]
    pub control_token_file: PathBuf,
    /// Address of the plain HTTP server (/healthz, /metrics: nothing secret).
    #[arg(long, default_value = "0.0.0.0:9127")]
    pub listen: std::net::SocketAddr,
    /// Address of the HTTPS server (POST /pause), served with the database's server certificate
    /// of the pod's TLS directory.
    #[arg(long, default_value = "0.0.0.0:9128")]
    pub control_listen: std::net::SocketAddr,
}

/// What the HTTP server and the loop share.
#[derive(Debug, Default)]
pub struct Shared {
    /// The read-write PgBouncer's configuration is written (it can start).
    pub pointed_once: bool,
    /// A login through the read-write PgBouncer reached the primary once: its server logins
    /// (and the auth_query connection every client login needs) work.
    pub server_path_proven: bool,
    /// Pause counters for /metrics.
    pub counters: metrics::PauseCounters,
}

/// A pause the operator asked for, and where the answer goes.
pub type PauseRequest = (String, oneshot::Sender<Result<(), String>>);

struct Agent {
    args: PoolerRunArgs,
    credentials: AgentCredentials,
    /// The control server's certificate (the database's server certificate, reloaded with it).
    control_certificate: Arc<ReloadingCertificate>,
    shared: Arc<Mutex<Shared>>,
    state: PauseState,
    pointed: Option<String>,
    /// The pooled databases (names checked at admission: no quoting needed in the ini file).
    databases: Vec<String>,
    /// What rw-databases.ini holds.
    written: Option<String>,
    reload_pending: bool,
    /// The certificate files' fingerprint PgBouncer runs with, and when they were last read.
    certificates: Option<u64>,
    certificates_checked: Option<Instant>,
}

impl Agent {
    fn headless_host(&self, instance: &str) -> String {
        let headless = ChildNames::headless_service(&self.args.database);
        format!("{instance}.{headless}.{}.svc", self.args.namespace)
    }

    /// Until it succeeded once: a login through the read-write PgBouncer (as the pooler role, to
    /// the first pooled database) and a query on the primary. The pod is ready only then, so a
    /// new pod of a roll gets clients only once its server logins work: a first login that fails
    /// would make PgBouncer refuse the pool's clients for `server_login_retry`.
    async fn prove_server_path(&mut self) {
        if self.shared.lock().expect("not poisoned").server_path_proven || self.pointed.is_none() {
            return;
        }
        let proven = match self.databases.first() {
            Some(database) => {
                match admin::login(READ_WRITE, &self.credentials.auth_password, database, admin::COMMAND_TIMEOUT).await
                {
                    Ok(()) => true,
                    Err(error) => {
                        tracing::info!(%error, "no server login through the read-write pool yet: not ready");
                        false
                    }
                }
            }
            None => true,
        };
        if proven {
            tracing::info!("a login through the read-write pool reached the primary: ready");
            self.shared.lock().expect("not poisoned").server_path_proven = true;
        }
    }

    /// A renewed server certificate (or a new CA) reaches both PgBouncers by a RELOAD: new client
    /// connections get the new certificate, new server connections check against the new CA;
    /// connections already open keep theirs.
    async fn keep_certificates(&mut self) {
        if self.certificates_checked.is_some_and(|checked| checked.elapsed() < CERTIFICATE_CHECK_INTERVAL) {
            return;
        }
        self.certificates_checked = Some(Instant::now());
        match self.control_certificate.reload() {
            Ok(true) => tracing::info!("the control server serves the renewed certificate"),
            Ok(false) => {}
            Err(error) => tracing::warn!(%error, "the control server keeps its certificate"),
        }
        let Some(now) = certificate_fingerprint() else { return };
        let Some(loaded) = self.certificates else {
            // What the PgBouncers started with (they start after the agent's first pointing).
            self.certificates = Some(now);
            return;
        };
        if loaded == now {
            return;
        }
        let mut reloaded = true;
        for pool in [READ_WRITE, READ_ONLY] {
            if let Err(error) = self.admin(pool, "RELOAD", admin::COMMAND_TIMEOUT).await {
                tracing::warn!(%error, "the renewed certificate is not loaded yet; trying again");
                reloaded = false;
            }
        }
        if reloaded {
            tracing::info!("the renewed certificate files are loaded (RELOAD)");
            self.certificates = Some(now);
        }
    }

    async fn admin(&self, pool: Pool, command: &str, timeout: Duration) -> Result<(), admin::AdminCommandError> {
        admin::run(pool, &self.credentials.admin_password, command, timeout).await.map(|_| ())
    }

    /// The read-write [databases] for `instance`: each pooled database by name (PgBouncer keeps
    /// a database made from the `*` entry with the host it was made with, even across a RELOAD),
    /// and `*` for any other.
    fn databases_section(&self, instance: &str) -> String {
        let host = self.headless_host(instance);
        let mut text: String =
            self.databases.iter().map(|database| format!("{database} = host={host} port={POSTGRES_PORT}\n")).collect();
        text.push_str(&format!("* = host={host} port={POSTGRES_PORT}\n"));
        text
    }

    /// Writes the read-write [databases] for `instance`, then has PgBouncer read it and drop its
    /// server connections to the old primary as they are released.
    async fn point(&mut self, instance: String) -> anyhow::Result<()> {
        let path = std::path::Path::new(RUN_DIRECTORY).join("rw-databases.ini");
        let temporary = path.with_extension("ini.tmp");
        let text = self.databases_section(&instance);
        std::fs::write(&temporary, &text).with_context(|| format!("writing {}", temporary.display()))?;
        std::fs::rename(&temporary, &path).with_context(|| format!("renaming to {}", path.display()))?;
        tracing::info!(primary = %instance, "the read-write pool points at the primary");
        self.pointed = Some(instance);
        self.written = Some(text);
        self.shared.lock().expect("not poisoned").pointed_once = true;
        // Also the first time: a restarted agent finds PgBouncer running on the file of before
        // (a PgBouncer not started yet reads the file when it starts; the reload is retried).
        self.reload_pending = true;
        self.reload().await;
        Ok(())
    }

    async fn reload(&mut self) {
        if !self.reload_pending {
            return;
        }
        let reloaded = async {
            self.admin(READ_WRITE, "RELOAD", admin::COMMAND_TIMEOUT).await?;
            self.admin(READ_WRITE, "RECONNECT", admin::COMMAND_TIMEOUT).await
        };
        match reloaded.await {
            Ok(()) => self.reload_pending = false,
            Err(error) => tracing::warn!(%error, "pgbouncer did not reload yet; trying again"),
        }
    }

    async fn pause(&mut self, target: String) -> Result<(), String> {
        if matches!(&self.state, PauseState::Paused { target: paused, .. } if *paused == target) {
            return Ok(());
        }
        let started = Instant::now();
        match self.admin(READ_WRITE, "PAUSE", PAUSE_TIMEOUT).await {
            Ok(()) => {
                tracing::info!(%target, took_ms = started.elapsed().as_millis() as u64, "paused for a switchover");
                self.state = PauseState::Paused { target, since: started, seen_transition: false };
                let mut shared = self.shared.lock().expect("not poisoned");
                shared.counters.paused = true;
                shared.counters.pauses += 1;
                Ok(())
            }
            Err(error) => {
                // A PAUSE that timed out is still pending in PgBouncer: take it back.
                let _ = self.admin(READ_WRITE, "RESUME", admin::COMMAND_TIMEOUT).await;
                tracing::warn!(%error, %target, "could not pause for a switchover");
                Err(error.to_string())
            }
        }
    }

    async fn resume(&mut self, reason: &str, since: Option<Instant>) {
        if let Err(error) = self.admin(READ_WRITE, "RESUME", admin::COMMAND_TIMEOUT).await {
            // "not paused" after a PgBouncer restart is fine; anything else is retried by the
            // operator's next pause or shows in the metrics.
            tracing::warn!(%error, "RESUME");
        }
        let held = since.map_or(0.0, |since| since.elapsed().as_secs_f64());
        tracing::info!(reason, held_seconds = held, "resumed");
        let mut shared = self.shared.lock().expect("not poisoned");
        shared.counters.paused = false;
        shared.counters.last_pause_seconds = held;
    }

    async fn act(&mut self, observed: &Observed) {
        let since = match &self.state {
            PauseState::Paused { since, .. } => Some(*since),
            PauseState::Running => None,
        };
        for action in pause::step(&mut self.state, self.pointed.as_deref(), observed, Instant::now()) {
            match action {
                Action::Point(instance) => {
                    if let Err(error) = self.point(instance).await {
                        tracing::error!(error = format!("{error:#}"), "pointing the read-write pool");
                    }
                }
                Action::Resume(reason) => self.resume(reason, since).await,
            }
        }
        // A database added to or removed from the spec: the same primary, new entries.
        if let Some(instance) = self.pointed.clone() {
            if self.written.as_deref() != Some(self.databases_section(&instance).as_str()) {
                if let Err(error) = self.point(instance).await {
                    tracing::error!(error = format!("{error:#}"), "pointing the read-write pool");
                }
            }
        }
        self.reload().await;
    }
}

async fn observe(
    databases: &kube::Api<DatabaseService>,
    name: &str,
    accepted: &mut Option<crate::api::database_service::DatabaseServiceSpec>,
) -> Option<(Observed, Vec<String>)> {
    let database = match tokio::time::timeout(CALL_TIMEOUT, databases.get(name)).await {
        Ok(Ok(database)) => database,
        Ok(Err(error)) => {
            tracing::warn!(%error, "reading the DatabaseService");
            return None;
        }
        Err(_) => {
            tracing::warn!("reading the DatabaseService: no answer within {CALL_TIMEOUT:?}");
            return None;
        }
    };
    // Pointing, pausing and resuming go on; the pooled databases come from an accepted spec only.
    let (database, refusal) = crate::admission::validation::carried_out_by_agents(database, accepted);
    if let Some(reason) = refusal {
        tracing::warn!(%reason, "not carrying out what validation refuses in the spec");
    }
    let pooled = crate::api::declarations::declarations(&database).pooled_databases;
    let failover = database.status.map(|status| status.failover).unwrap_or_default();
    let observed = Observed {
        current_primary: failover.current_primary,
        target_primary: failover.target_primary,
        transition: failover.transition.is_some(),
    };
    Some((observed, pooled))
}

/// Starts the plain server (/healthz, /metrics) and the HTTPS one (/pause, with the database's
/// server certificate of [`TLS_DIRECTORY`]); the certificate, for the agent to reload.
async fn serve(
    args: &PoolerRunArgs,
    credentials: &AgentCredentials,
    shared: Arc<Mutex<Shared>>,
    requests: mpsc::Sender<PauseRequest>,
) -> anyhow::Result<Arc<ReloadingCertificate>> {
    crate::admission::tls::install_crypto_provider();
    let state = server::ServerState {
        shared,
        requests,
        token: credentials.control_token.clone(),
        admin_password: credentials.admin_password.clone(),
        scrapes: Arc::new(tokio::sync::Semaphore::new(1)),
    };
    let listener =
        tokio::net::TcpListener::bind(args.listen).await.with_context(|| format!("--listen {}", args.listen))?;
    let router = server::router(state.clone());
    tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, router).await {
            tracing::error!(%error, "the pooler agent's HTTP server stopped");
        }
    });
    let tls = std::path::Path::new(TLS_DIRECTORY);
    let certificate = ReloadingCertificate::load(&tls.join("tls.crt"), &tls.join("tls.key"))
        .context("the server certificate of the control server")?;
    let control = crate::admission::server::bind(args.control_listen, "--control-listen").await?;
    let router = server::control_router(state);
    let served = certificate.clone();
    tokio::spawn(async move {
        // Never told to stop (the pod's end ends it); the sender lives as long as the server, as
        // a closed channel would read as a stop.
        let (_stop, never) = tokio::sync::watch::channel(false);
        crate::admission::server::serve_tls(control, router, served, ServerLimits::default(), never).await;
    });
    Ok(certificate)
}

/// Runs the pooler agent until SIGTERM.
pub async fn run(args: PoolerRunArgs) -> anyhow::Result<()> {
    let mut kube_config = kube::Config::infer().await.context("in-cluster Kubernetes configuration")?;
    kube_config.connect_timeout = Some(CALL_TIMEOUT);
    kube_config.read_timeout = Some(CALL_TIMEOUT);
    kube_config.write_timeout = Some(CALL_TIMEOUT);
    let client = kube::Client::try_from(kube_config).context("Kubernetes client")?;
    let databases: kube::Api<DatabaseService> = kube::Api::namespaced(client, &args.namespace);
    let shared = Arc::new(Mutex::new(Shared::default()));
    let (requests, mut pause_requests) = mpsc::channel::<PauseRequest>(4);
    let credentials =
        AgentCredentials::read(&args.admin_password_file, &args.auth_password_file, &args.control_token_file)?;
    let control_certificate = serve(&args, &credentials, shared.clone(), requests).await?;
    let mut terminate = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let name = args.database.clone();
    let mut agent = Agent {
        args,
        credentials,
        control_certificate,
        shared,
        state: PauseState::Running,
        pointed: None,
        databases: Vec::new(),
        written: None,
        reload_pending: false,
        certificates: None,
        certificates_checked: None,
    };
    tracing::info!(database = %name, "pooler agent started");
    let mut accepted = None;
    loop {
        let interval = match agent.state {
            PauseState::Paused { .. } => PAUSED_INTERVAL,
            PauseState::Running => RUNNING_INTERVAL,
        };
        tokio::select! {
            request = pause_requests.recv() => {
                if let Some((target, reply)) = request {
                    let _ = reply.send(agent.pause(target).await);
                }
            }
            _ = tokio::time::sleep(interval) => {}
            _ = terminate.recv() => break,
        }
        if let Some((observed, pooled)) = observe(&databases, &name, &mut accepted).await {
            agent.databases = pooled;
            agent.act(&observed).await;
            agent.prove_server_path().await;
        }
        agent.keep_certificates().await;
    }
    // Clients of a paused pool must not be left waiting by a pod that goes away.
    if let PauseState::Paused { since, .. } = agent.state {
        agent.resume("the agent stops", Some(since)).await;
    }
    Ok(())
}
