//! Harness for the failover tests on loopback: real PostgreSQL servers run by real instance
//! agents; the API server is replaced by an in-memory world (pods, reports, the primary Lease,
//! the failover status) and the operator by a loop calling the real `failover::decide`.

#![allow(dead_code)]

use chrono::Utc;
use dbservice_operator::api::failover::{
    FailoverSettings, FailoverStatus, InstanceObservation, InstanceReport, PodState, TransitionKind,
};
use dbservice_operator::api::synchronous::synchronous_standby_names;
use dbservice_operator::instance::{
    Agent, ControlPlane, ControlPlaneError, Desired, InstanceConfig, SynchronousStandbys, Upstream,
};
use dbservice_operator::lease::{LeaseRecord, LeaseTimings};
use dbservice_operator::operator::database::failover::{decide, Action, Observed};
use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub const SUPERUSER: &str = "dbadmin";
/// Quotes and a backslash exercise the conninfo and configuration-file quoting.
pub const PASSWORD: &str = r"s3cret 'pa\ss'";

fn is_ci() -> bool {
    std::env::var("CI").is_ok_and(|value| value == "true")
}

fn has_binaries(dir: &Path) -> bool {
    ["postgres", "initdb", "pg_rewind", "pg_basebackup", "pg_controldata"].iter().all(|tool| dir.join(tool).is_file())
}

fn search_pg_bin() -> Option<PathBuf> {
    if let Ok(dir) = std::env::var("DBSERVICE_TEST_PG_BIN") {
        return Some(PathBuf::from(dir)).filter(|dir| has_binaries(dir));
    }
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_string_lossy().parse().ok()?;
            Some((version, entry.path().join("bin"))).filter(|(_, bin)| has_binaries(bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, bin)| bin)
}

/// PostgreSQL's binaries; under CI=true they are installed with apt when missing, and their
/// absence fails the test instead of skipping it.
pub fn pg_bin() -> Option<PathBuf> {
    if let Some(bin) = search_pg_bin() {
        return Some(bin);
    }
    if is_ci() && Path::new("/usr/bin/apt-get").exists() {
        let install = || {
            Command::new("apt-get")
                .args(["install", "-y", "--no-install-recommends", "postgresql"])
                .env("DEBIAN_FRONTEND", "noninteractive")
                .stdin(Stdio::null())
                .status()
                .is_ok_and(|status| status.success())
        };
        if !install() {
            let _ = Command::new("apt-get").arg("update").stdin(Stdio::null()).status();
            install();
        }
    }
    match search_pg_bin() {
        Some(bin) => Some(bin),
        None if is_ci() => panic!("CI=true but no PostgreSQL binaries (apt-get install -y postgresql)"),
        None => {
            eprintln!("SKIPPED: no PostgreSQL binaries (apt-get install -y postgresql, or set DBSERVICE_TEST_PG_BIN)");
            None
        }
    }
}

/// uid/gid of the `postgres` user when running as root (PostgreSQL refuses root).
fn os_user() -> Option<(u32, u32)> {
    if std::fs::metadata("/proc/self").map(|meta| meta.uid()).unwrap_or(0) != 0 {
        return None;
    }
    let passwd = std::fs::read_to_string("/etc/passwd").expect("read /etc/passwd");
    passwd.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        (fields.len() > 3 && fields[0] == "postgres").then(|| (fields[2].parse().unwrap(), fields[3].parse().unwrap()))
    })
}

fn chown_tree(path: &Path, owner: Option<(u32, u32)>) {
    let Some((uid, gid)) = owner else { return };
    std::os::unix::fs::chown(path, Some(uid), Some(gid)).unwrap();
    if path.is_dir() {
        for entry in std::fs::read_dir(path).unwrap().flatten() {
            chown_tree(&entry.path(), Some((uid, gid)));
        }
    }
}

/// What the API server would hold.
#[derive(Default)]
pub struct World {
    pub status: FailoverStatus,
    pub reports: BTreeMap<String, InstanceReport>,
    pub lease: LeaseRecord,
    pub lease_version: u64,
    pub ports: BTreeMap<String, u16>,
    pub pgdata: BTreeMap<String, PathBuf>,
    /// Instances cut off from the API.
    pub partitioned: BTreeSet<String>,
    /// Instances whose reports are stored but whose publish calls then fail, as when the answer
    /// of a write that landed is lost.
    pub answers_lost: BTreeSet<String>,
    /// Instances whose API calls hang (until removed): their agent's step blocks.
    pub hung: BTreeSet<String>,
    /// The operator makes no pass (its status is whatever a test wrote).
    pub operator_paused: bool,
    /// Pods deleted (their processes are dead).
    pub gone: BTreeSet<String>,
    /// Pods being deleted: their agent was told to stop; a pod with a deletion timestamp is not
    /// ready for the operator (as `PodHealth::terminating`).
    pub terminating: BTreeSet<String>,
    pub switchover_to: Option<String>,
    /// spec.failover.synchronousStandbys.
    pub synchronous_standbys: u32,
    /// spec.failover.switchoverTimeoutSeconds, as the agents see it.
    pub switchover_timeout: Duration,
    /// Every distinct operator action, with when it was decided.
    pub actions: Vec<(Instant, Action)>,
    pub lease_writes: u64,
    /// Every Lease record written, in order.
    pub lease_history: Vec<LeaseRecord>,
    /// Reports published by the agents (each one a pod write in Kubernetes).
    pub publishes: u64,
    /// spec.postgresql as the agents see it (None: unknown, their configuration stays).
    pub configuration: Option<dbservice_operator::instance::ServerConfiguration>,
    /// spec.roles and spec.databases as the agents see them.
    pub declarations: Option<dbservice_operator::api::roles::Declarations>,
    /// spec.bootstrap.import as the agents see it.
    pub import: Option<dbservice_operator::api::import::ImportSpec>,
    /// The Secrets the agents may read (the declared roles' passwords).
    pub secrets: dbservice_operator::instance::SecretReader,
    /// The `dbservice.dev/reload-requested-at` annotation as the agents see it.
    pub reload_requested: Option<String>,
}

pub type SharedWorld = Arc<Mutex<World>>;

/// One agent's API access.
pub struct MemoryControlPlane {
    world: SharedWorld,
    name: String,
}

impl MemoryControlPlane {
    /// Waits while this instance's calls hang.
    async fn hang_while_hung(&self) {
        while self.world.lock().unwrap().hung.contains(&self.name) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn reachable(&self) -> Result<std::sync::MutexGuard<'_, World>, ControlPlaneError> {
        let world = self.world.lock().unwrap();
        if world.partitioned.contains(&self.name) {
            return Err(ControlPlaneError("partitioned from the API server".into()));
        }
        Ok(world)
    }
}

impl ControlPlane for MemoryControlPlane {
    async fn desired(&self) -> Result<Desired, ControlPlaneError> {
        self.hang_while_hung().await;
        let world = self.reachable()?;
        let status = &world.status;
        let settled = status.current_primary.is_some() && status.current_primary == status.target_primary;
        let upstream = status
            .current_primary
            .as_ref()
            .filter(|current| settled && **current != self.name)
            .map(|current| Upstream { host: "127.0.0.1".into(), port: world.ports[current] });
        let instances: Vec<String> = world.ports.keys().cloned().collect();
        let synchronous = synchronous_standby_names(&instances, world.synchronous_standbys, &self.name);
        Ok(Desired {
            target_primary: status.target_primary.clone(),
            upstream,
            fenced: false,
            switchover: status
                .transition
                .as_ref()
                .is_some_and(|transition| transition.kind == TransitionKind::Switchover),
            switchover_timeout: world.switchover_timeout,
            synchronous: Some(SynchronousStandbys::Fixed(synchronous)),
            instances,
            configuration: world.configuration.clone(),
            declarations: world.declarations.clone(),
            import: world.import.clone(),
            major_upgrade: None,
            reload_requested: world.reload_requested.clone(),
        })
    }

    async fn publish(&self, report: &InstanceReport) -> Result<(), ControlPlaneError> {
        self.hang_while_hung().await;
        let mut world = self.reachable()?;
        world.reports.insert(self.name.clone(), report.clone());
        world.publishes += 1;
        if world.answers_lost.contains(&self.name) {
            return Err(ControlPlaneError("the answer was lost".into()));
        }
        Ok(())
    }

    async fn read_lease(&self) -> Result<(LeaseRecord, String), ControlPlaneError> {
        self.hang_while_hung().await;
        let world = self.reachable()?;
        Ok((world.lease.clone(), world.lease_version.to_string()))
    }

    async fn write_lease(&self, version: &str, record: &LeaseRecord) -> Result<Option<String>, ControlPlaneError> {
        self.hang_while_hung().await;
        let mut world = self.reachable()?;
        if world.lease_version.to_string() != version {
            return Ok(None);
        }
        world.lease = record.clone();
        world.lease_version += 1;
        world.lease_writes += 1;
        world.lease_history.push(record.clone());
        Ok(Some(world.lease_version.to_string()))
    }
}

/// Pid in postmaster.pid.
pub fn postmaster_pid(pgdata: &Path) -> Option<i32> {
    std::fs::read_to_string(pgdata.join("postmaster.pid")).ok()?.lines().next()?.trim().parse().ok()
}

/// The postmaster of `pgdata` runs (what a kubelet readiness probe needs at the least). A zombie
/// (killed, not yet reaped by a stuck agent) serves nothing and counts as dead.
pub fn postmaster_alive(pgdata: &Path) -> bool {
    postmaster_pid(pgdata).is_some_and(|pid| {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // pid (comm) state ...: the state follows the last ')'.
        let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next());
        state.is_some_and(|state| state != "Z" && state != "X")
    })
}

/// Sends `signal` to the postmaster of `pgdata` and all its children (SIGSTOP: the whole server hangs).
pub fn signal_postgres(pgdata: &Path, signal: i32) {
    let pid = postmaster_pid(pgdata).expect("postmaster.pid");
    dbservice_operator::instance::postgres::signal_server(pid as u32, signal);
}

/// One operator pass over the world, like a reconcile triggered by a watch event.
pub fn operator_pass(world: &mut World, settings: &FailoverSettings) -> Action {
    let instances = world
        .ports
        .keys()
        .map(|name| {
            let gone = world.gone.contains(name);
            let report = if gone { None } else { world.reports.get(name).cloned() };
            let ready =
                report.as_ref().is_some_and(|report| report.postgres_ready) && postmaster_alive(&world.pgdata[name]);
            let pod = if gone {
                PodState::Gone
            } else if ready && !world.terminating.contains(name) {
                PodState::Ready
            } else {
                PodState::NotReady
            };
            InstanceObservation { name: name.clone(), pod, report, fenced_by_hand: false }
        })
        .collect();
    let observed = Observed {
        instances,
        lease: Some(world.lease.clone()),
        lease_lapsed: false,
        switchover_to: world.switchover_to.clone(),
        held_by_major_upgrade: false,
        held_by_wake: false,
    };
    let decision = decide(&world.status, &observed, settings, Utc::now());
    world.status = decision.status;
    match &decision.action {
        // The pod is gone, so its processes are: the operator may release its lease at once.
        Action::FailoverStarted { old_primary, release_lease: true }
            if world.lease.holder.as_ref() == Some(old_primary) =>
        {
            world.lease.holder = None;
            world.lease_version += 1;
        }
        Action::PrimaryChanged { .. } | Action::SwitchoverRejected { .. } => world.switchover_to = None,
        _ => {}
    }
    if world.actions.last().is_none_or(|(_, last)| *last != decision.action) {
        eprintln!("operator: {:?}", decision.action);
        world.actions.push((Instant::now(), decision.action.clone()));
    }
    decision.action
}

/// Acknowledged commits: (id, when, port of the server that acknowledged it).
pub type Acks = Arc<Mutex<Vec<(i64, Instant, u16)>>>;

pub fn conninfo(port: u16) -> String {
    format!(
        "host=127.0.0.1 port={port} user={SUPERUSER} password='{}' dbname=postgres connect_timeout=2",
        PASSWORD.replace('\\', "\\\\").replace('\'', "\\'")
    )
}

/// A client over TCP with a password, as an application connects; the server's message when refused.
pub async fn login(port: u16, user: &str, password: &str, database: &str) -> Result<tokio_postgres::Client, String> {
    let mut config = tokio_postgres::Config::new();
    config
        .host("127.0.0.1")
        .port(port)
        .user(user)
        .password(password)
        .dbname(database)
        .connect_timeout(Duration::from_secs(5));
    let (client, connection) = config
        .connect(tokio_postgres::NoTls)
        .await
        .map_err(|error| error.as_db_error().map(|db| db.message().to_string()).unwrap_or_else(|| error.to_string()))?;
    tokio::spawn(connection);
    Ok(client)
}

/// Runs one statement over TCP with password authentication.
pub async fn query(port: u16, sql: &str) -> Result<Vec<tokio_postgres::Row>, String> {
    let (client, connection) =
        tokio_postgres::connect(&conninfo(port), tokio_postgres::NoTls).await.map_err(|error| error.to_string())?;
    tokio::spawn(connection);
    tokio::time::timeout(Duration::from_secs(5), client.query(sql, &[]))
        .await
        .map_err(|_| "query timed out".to_string())?
        .map_err(|error| error.to_string())
}

/// A cluster of agents on loopback.
pub struct Cluster {
    pub world: SharedWorld,
    pub pg_bin: PathBuf,
    pub timings: LeaseTimings,
    configs: BTreeMap<String, InstanceConfig>,
    agents: BTreeMap<String, (watch::Sender<bool>, JoinHandle<()>)>,
    operator: Option<(watch::Sender<bool>, JoinHandle<()>)>,
    writer: Option<(watch::Sender<bool>, JoinHandle<()>)>,
    pub acks: Acks,
    _dir: tempfile::TempDir,
    /// Released last, once the servers are gone.
    _slot: ClusterSlot,
}

/// At most this many loopback clusters run at once in one test binary. Each is two or three
/// PostgreSQL servers with 200 ms agents and a 3 s renew deadline; 16 of them on 2 cores (CI)
/// starve each other into missed deadlines that are no fault of the code under test (seen twice:
/// a stall test failed over, a hung primary was not yet restarted).
const CONCURRENT_CLUSTERS: usize = 4;

static RUNNING_CLUSTERS: (std::sync::Mutex<usize>, std::sync::Condvar) =
    (std::sync::Mutex::new(0), std::sync::Condvar::new());

/// One of the [`CONCURRENT_CLUSTERS`] places; given back when dropped (a failed test too).
struct ClusterSlot;

impl ClusterSlot {
    async fn acquire() -> Self {
        tokio::task::spawn_blocking(|| {
            let (running, freed) = &RUNNING_CLUSTERS;
            let mut count = running.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            while *count >= CONCURRENT_CLUSTERS {
                count = freed.wait(count).unwrap_or_else(|poisoned| poisoned.into_inner());
            }
            *count += 1;
        })
        .await
        .expect("waiting for a cluster slot");
        ClusterSlot
    }
}

impl Drop for ClusterSlot {
    fn drop(&mut self) {
        let (running, freed) = &RUNNING_CLUSTERS;
        *running.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) -= 1;
        freed.notify_one();
    }
}

impl Cluster {
    /// `instances` names, the first initialized as primary; agents started; waits until the others stream.
    pub async fn start(pg_bin: PathBuf, names: &[&str]) -> Cluster {
        Self::start_with(pg_bin, names, FailoverSettings::default()).await
    }

    /// Like [`Cluster::start`], with the operator's failover settings.
    pub async fn start_with(pg_bin: PathBuf, names: &[&str], settings: FailoverSettings) -> Cluster {
        Self::start_with_server_settings(pg_bin, names, settings, &[]).await
    }

    /// Like [`Cluster::start_with`], with extra PostgreSQL settings (name, value) on every instance.
    pub async fn start_with_server_settings(
        pg_bin: PathBuf,
        names: &[&str],
        settings: FailoverSettings,
        server_settings: &[(&str, &str)],
    ) -> Cluster {
        Self::start_with_agents(pg_bin, names, settings, server_settings, |_| {}).await
    }

    /// Like [`Cluster::start_with_server_settings`], with every agent's configuration changed by
    /// `adjust` before it starts.
    pub async fn start_with_agents(
        pg_bin: PathBuf,
        names: &[&str],
        settings: FailoverSettings,
        server_settings: &[(&str, &str)],
        adjust: impl Fn(&mut InstanceConfig),
    ) -> Cluster {
        let slot = ClusterSlot::acquire().await;
        // The agents' logs go to the test output (shown for failing tests, or with --nocapture).
        let _ = tracing_subscriber::fmt().with_test_writer().with_env_filter("dbservice_operator=info").try_init();
        let owner = os_user();
        let dir = tempfile::Builder::new().prefix("dbservice-failover-").tempdir_in("/tmp").unwrap();
        let timings = LeaseTimings {
            duration: Duration::from_secs(4),
            renew_deadline: Duration::from_secs(3),
            renew_period: Duration::from_secs(1),
        };
        timings.validate().unwrap();
        let mut world = World {
            synchronous_standbys: settings.synchronous_standbys,
            switchover_timeout: settings.switchover_timeout,
            ..Default::default()
        };
        let mut configs = BTreeMap::new();
        for name in names {
            let base = dir.path().join(name);
            std::fs::create_dir_all(base.join("data")).unwrap();
            std::fs::create_dir_all(base.join("run")).unwrap();
            let port = crate::ports::unused_port();
            let mut config = InstanceConfig {
                name: name.to_string(),
                pg_bin: pg_bin.clone(),
                pgdata: base.join("data/pgdata"),
                port,
                socket_dir: base.join("run"),
                listen_addresses: "127.0.0.1".into(),
                superuser: SUPERUSER.into(),
                roles: None,
                replication_user: SUPERUSER.into(),
                replication_password: PASSWORD.into(),
                // As the pod scripts set it: keeps the WAL pg_rewind reads back to the last common checkpoint.
                settings: [("shared_buffers", "16MB"), ("wal_keep_size", "256MB")]
                    .iter()
                    .chain(server_settings)
                    .map(|(name, value)| (name.to_string(), value.to_string()))
                    .collect(),
                standby_restore_command: None,
                log_file: base.join("postgres.log"),
                os_user: owner,
                health_timeout: Duration::from_secs(1),
                tick: Duration::from_millis(200),
                lease: timings,
                stop_grace: Duration::from_secs(5),
                unresponsive_after: Duration::from_secs(2),
                watchdog_binary: None,
                tls: None,
            };
            adjust(&mut config);
            world.ports.insert(name.to_string(), port);
            world.pgdata.insert(name.to_string(), config.pgdata.clone());
            configs.insert(name.to_string(), config);
        }
        chown_tree(dir.path(), owner);
        // The first instance's bootstrap (done by the pod scripts in production).
        let primary = &configs[names[0]];
        let password_file = dir.path().join("pwfile");
        std::fs::write(&password_file, format!("{PASSWORD}\n")).unwrap();
        chown_tree(&password_file, owner);
        let mut initdb = Command::new(pg_bin.join("initdb"));
        initdb
            .arg("-D")
            .arg(&primary.pgdata)
            .args(["-U", SUPERUSER, "--auth-local=trust", "--auth-host=scram-sha-256"])
            .arg(format!("--pwfile={}", password_file.display()))
            .stdout(Stdio::null());
        if let Some((uid, gid)) = owner {
            use std::os::unix::process::CommandExt;
            initdb.uid(uid).gid(gid);
        }
        assert!(initdb.status().unwrap().success(), "initdb failed");
        world.status = FailoverStatus {
            current_primary: Some(names[0].to_string()),
            target_primary: Some(names[0].to_string()),
            timeline: Some(1),
            ..Default::default()
        };
        let mut cluster = Cluster {
            world: Arc::new(Mutex::new(world)),
            pg_bin,
            timings,
            configs,
            agents: BTreeMap::new(),
            operator: None,
            writer: None,
            acks: Arc::default(),
            _dir: dir,
            _slot: slot,
        };
        for name in names {
            cluster.start_agent(name);
        }
        let port = cluster.port(names[0]);
        cluster
            .wait_for("the primary to accept writes", Duration::from_secs(60), async || {
                let Ok((client, connection)) = tokio_postgres::connect(&conninfo(port), tokio_postgres::NoTls).await
                else {
                    return false;
                };
                tokio::spawn(connection);
                let create = client.batch_execute("CREATE TABLE IF NOT EXISTS acked_writes (id bigint PRIMARY KEY)");
                match tokio::time::timeout(Duration::from_secs(5), create).await {
                    Ok(Ok(())) => true,
                    // A writable server that took the superuser away from the test's role (the
                    // roles tests' agent migrates it, racing this check): it runs no writer.
                    Ok(Err(error)) => error.code() == Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE),
                    Err(_) => false,
                }
            })
            .await;
        for name in &names[1..] {
            cluster.wait_streaming(name).await;
        }
        // Bootstrap is not a failover: the operator's failover loop starts once the database has
        // been healthy, as the controller will gate it.
        cluster.start_operator(settings);
        cluster
    }

    /// The agent configuration of instance `name`.
    pub fn config(&self, name: &str) -> InstanceConfig {
        self.configs[name].clone()
    }

    pub fn port(&self, name: &str) -> u16 {
        self.configs[name].port
    }

    pub fn socket_dir(&self, name: &str) -> PathBuf {
        self.configs[name].socket_dir.clone()
    }

    pub fn pgdata(&self, name: &str) -> PathBuf {
        self.configs[name].pgdata.clone()
    }

    pub fn start_agent(&mut self, name: &str) {
        let control_plane = MemoryControlPlane { world: self.world.clone(), name: name.to_string() };
        let secrets = self.world.lock().unwrap().secrets.clone();
        let agent = Agent::new(self.configs[name].clone(), control_plane).with_secrets(secrets);
        let (stop, stopped) = watch::channel(false);
        self.agents.insert(name.to_string(), (stop, tokio::spawn(agent.run(stopped))));
    }

    /// The pod vanishes at once: agent and PostgreSQL killed (SIGKILL), the pod object removed.
    pub fn kill_pod(&mut self, name: &str) {
        if let Some((_, task)) = self.agents.remove(name) {
            task.abort();
        }
        signal_postgres(&self.pgdata(name), libc::SIGKILL);
        let mut world = self.world.lock().unwrap();
        world.gone.insert(name.to_string());
        world.reports.remove(name);
    }

    /// The pod is deleted the way a kubelet deletes it: its agent is told to stop (SIGTERM) and
    /// stops PostgreSQL cleanly, handing the Lease over; the pod object goes once it has exited.
    pub async fn delete_pod(&mut self, name: &str) {
        self.terminate_pod(name);
        if let Some((_, task)) = self.agents.remove(name) {
            let _ = tokio::time::timeout(Duration::from_secs(30), task).await;
        }
        let mut world = self.world.lock().unwrap();
        world.terminating.remove(name);
        world.gone.insert(name.to_string());
        world.reports.remove(name);
    }

    /// The first half of [`Self::delete_pod`]: the pod has its deletion timestamp and its agent was
    /// told to stop, which it is still doing; `delete_pod` waits for the rest.
    pub fn terminate_pod(&mut self, name: &str) {
        self.world.lock().unwrap().terminating.insert(name.to_string());
        if let Some((stop, _)) = self.agents.get(name) {
            let _ = stop.send(true);
        }
    }

    /// The pod comes back (a new agent on the same volume).
    pub fn recreate_pod(&mut self, name: &str) {
        self.world.lock().unwrap().gone.remove(name);
        self.start_agent(name);
    }

    fn start_operator(&mut self, settings: FailoverSettings) {
        let world = self.world.clone();
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            while !*stopped.borrow() {
                {
                    let mut world = world.lock().unwrap();
                    if !world.operator_paused {
                        operator_pass(&mut world, &settings);
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        self.operator = Some((stop, task));
    }

    /// A client that inserts one row per transaction into whatever Service `<name>` points at
    /// (the current primary while no change is in progress) and logs every acknowledged commit.
    pub fn start_writer(&mut self) {
        let (world, acks) = (self.world.clone(), self.acks.clone());
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            let mut next_id = 1i64;
            let mut client: Option<(u16, tokio_postgres::Client)> = None;
            while !*stopped.borrow() {
                // Service NAME as the operator labels it: the settled primary, and during a
                // switchover the old one until the target's promotion is seen.
                let port = {
                    let world = world.lock().unwrap();
                    let status = &world.status;
                    let switching_over = status
                        .transition
                        .as_ref()
                        .is_some_and(|transition| transition.kind == TransitionKind::Switchover);
                    status
                        .current_primary
                        .as_ref()
                        .filter(|current| switching_over || status.target_primary.as_ref() == Some(*current))
                        .map(|current| world.ports[current])
                };
                let Some(port) = port else {
                    client = None;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                };
                if client.as_ref().is_none_or(|(connected, client)| *connected != port || client.is_closed()) {
                    client = match tokio_postgres::connect(&conninfo(port), tokio_postgres::NoTls).await {
                        Ok((new, connection)) => {
                            tokio::spawn(connection);
                            Some((port, new))
                        }
                        Err(_) => {
                            tokio::time::sleep(Duration::from_millis(20)).await;
                            continue;
                        }
                    };
                }
                let (_, connected) = client.as_ref().expect("connected");
                let id = next_id;
                next_id += 1;
                let parameters: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&id];
                let insert = connected.execute("INSERT INTO acked_writes (id) VALUES ($1)", &parameters);
                match tokio::time::timeout(Duration::from_secs(1), insert).await {
                    Ok(Ok(_)) => acks.lock().unwrap().push((id, Instant::now(), port)),
                    _ => {
                        client = None;
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            }
        });
        self.writer = Some((stop, task));
    }

    /// Stops the writer; returns the acknowledged ids.
    pub async fn stop_writer(&mut self) -> Vec<i64> {
        if let Some((stop, task)) = self.writer.take() {
            let _ = stop.send(true);
            let _ = task.await;
        }
        self.acks.lock().unwrap().iter().map(|(id, _, _)| *id).collect()
    }

    /// First acknowledged commit after `since` on `port`.
    pub fn first_ack_after(&self, since: Instant, port: u16) -> Option<Instant> {
        self.acks.lock().unwrap().iter().find(|(_, at, on)| *at > since && *on == port).map(|(_, at, _)| *at)
    }

    pub async fn wait_for(&self, what: &str, limit: Duration, mut check: impl AsyncFnMut() -> bool) {
        let deadline = Instant::now() + limit;
        while !check().await {
            if Instant::now() > deadline {
                panic!("timed out after {limit:?} waiting for {what}\n{}", self.diagnostics());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub async fn wait_streaming(&self, name: &str) {
        let world = self.world.clone();
        let name = name.to_string();
        self.wait_for(&format!("{name} to stream"), Duration::from_secs(90), async || {
            world.lock().unwrap().reports.get(&name).is_some_and(|report| report.wal_receiver && report.postgres_ready)
        })
        .await;
    }

    pub async fn wait_primary(&self, name: &str, limit: Duration) {
        let world = self.world.clone();
        self.wait_for(&format!("{name} to become the current primary"), limit, async || {
            let world = world.lock().unwrap();
            world.status.current_primary.as_deref() == Some(name)
                && world.status.target_primary.as_deref() == Some(name)
        })
        .await;
    }

    /// Ids present in acked_writes on `port`.
    pub async fn stored_ids(&self, port: u16) -> BTreeSet<i64> {
        let rows = query(port, "SELECT id FROM acked_writes").await.expect("read acked_writes");
        rows.iter().map(|row| row.get::<_, i64>(0)).collect()
    }

    pub async fn scalar(&self, port: u16, sql: &str) -> String {
        let rows = query(port, sql).await.unwrap_or_else(|error| panic!("{sql}: {error}\n{}", self.diagnostics()));
        rows[0].get::<_, String>(0)
    }

    /// A row written on the new primary reaches `name`: it follows it.
    pub async fn assert_follows(&self, name: &str, primary: &str) {
        self.wait_streaming(name).await;
        let marker = format!("marker-{}", rand_suffix());
        query(self.port(primary), "CREATE TABLE IF NOT EXISTS markers (note text)").await.unwrap();
        query(self.port(primary), &format!("INSERT INTO markers VALUES ('{marker}')")).await.unwrap();
        let port = self.port(name);
        self.wait_for(&format!("{name} to replay a row written on {primary}"), Duration::from_secs(60), async || {
            query(port, &format!("SELECT 1 FROM markers WHERE note = '{marker}'"))
                .await
                .is_ok_and(|rows| rows.len() == 1)
        })
        .await;
        assert_eq!(self.scalar(port, "SELECT pg_is_in_recovery()::text").await, "true");
    }

    /// Data directories moved aside by a fresh clone (a rewind moves nothing).
    pub fn replaced_directories(&self, name: &str) -> Vec<PathBuf> {
        let pgdata = self.pgdata(name);
        let prefix = format!("{}.replaced-", pgdata.file_name().unwrap().to_string_lossy());
        std::fs::read_dir(pgdata.parent().unwrap())
            .unwrap()
            .flatten()
            .filter(|entry| entry.file_name().to_string_lossy().starts_with(&prefix))
            .map(|entry| entry.path())
            .collect()
    }

    pub fn diagnostics(&self) -> String {
        let world = self.world.lock().unwrap();
        let mut out = format!("status: {:?}\nlease: {:?}\nreports: {:#?}\n", world.status, world.lease, world.reports);
        for config in self.configs.values() {
            let log = std::fs::read_to_string(&config.log_file).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(25).collect();
            out.push_str(&format!("--- {} log (last lines) ---\n", config.name));
            for line in tail.iter().rev() {
                out.push_str(line);
                out.push('\n');
            }
        }
        out
    }

    /// Stops everything (agents cleanly, then any server left).
    pub async fn shutdown(mut self) {
        let _ = self.stop_writer().await;
        if let Some((stop, task)) = self.operator.take() {
            let _ = stop.send(true);
            let _ = task.await;
        }
        for (_, (stop, task)) in std::mem::take(&mut self.agents) {
            let _ = stop.send(true);
            let _ = tokio::time::timeout(Duration::from_secs(20), task).await;
        }
    }
}

fn rand_suffix() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Whatever happened (a failed assertion included), no server outlives the test.
        for (_, task) in self.agents.values() {
            task.abort();
        }
        for config in self.configs.values() {
            if postmaster_alive(&config.pgdata) {
                signal_postgres(&config.pgdata, libc::SIGKILL);
            }
        }
    }
}
