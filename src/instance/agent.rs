//! The agent's control loop: observe the local server, read what the operator wants, act, and
//! publish a report when something changed.

use crate::api::failover::{ArchivingReport, DiscardedOnRejoin, InstanceReport, Role, PENDING};
use crate::api::storage::VolumeReport;
use crate::instance::archiving::archiving_report;
use crate::instance::configuration::ConfigurationKeeper;
use crate::instance::declared::DeclaredKeeper;
use crate::instance::durability::{self, PreferredKeeper};
use crate::instance::import::ImportKeeper;
use crate::instance::owned_settings::{self, OwnedSettingsKeeper};
use crate::instance::postgres::{
    free_bytes, initialized, is_standby_data, volume_bytes, LocalState, Postgres, PostgresError, Sample,
    DISK_FULL_BYTES,
};
use crate::instance::roles::{write_superuser_rule, RolesKeeper};
use crate::instance::slots::{self, StandbySlot};
use crate::instance::standby::{self, StandbyError};
use crate::instance::tls::CertificateWatch;
use crate::instance::upgrade_keeper::{BeforeStart, UpgradeKeeper};
use crate::instance::watchdog::{FenceFile, Watchdog};
use crate::instance::SecretReader;
use crate::instance::{ControlPlane, ControlPlaneError, Desired, InstanceConfig, SynchronousStandbys, Upstream};
use crate::lease::{acquire_verdict, must_fence, renewal_due, AcquireVerdict, LeaseRecord};
use crate::lsn::Lsn;
use std::time::Instant;
use tokio::sync::watch;

/// One agent step failed (the loop logs it and tries again next tick).
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// Local PostgreSQL.
    #[error(transparent)]
    Postgres(#[from] PostgresError),
    /// Preparing a standby.
    #[error(transparent)]
    Standby(#[from] StandbyError),
    /// The API.
    #[error(transparent)]
    ControlPlane(#[from] ControlPlaneError),
}

/// Result of trying to write this instance into the Lease.
enum LeaseWrite {
    Written,
    HeldByOther,
    Conflict,
}

/// The instance agent of one PostgreSQL server.
pub struct Agent<C> {
    config: InstanceConfig,
    control_plane: C,
    postgres: Postgres,
    /// Last successful write of this instance as lease holder (self-fencing counts from it).
    last_renewal: Option<Instant>,
    /// Lease version last seen, and since when (expiry is judged on this clock only).
    lease_seen: Option<(String, Instant)>,
    /// Role of the data directory.
    role: Option<Role>,
    /// primary_conninfo the running standby was last given.
    upstream_set: Option<String>,
    /// Shutdown checkpoint of the last clean stop as primary.
    shutdown_checkpoint: Option<Lsn>,
    /// Last sample while ready (positions and timeline kept while the server is down).
    last_sample: Option<Sample>,
    fenced_by_hand: bool,
    /// The data volume has less than [`DISK_FULL_BYTES`] free (checked every step).
    disk_full: bool,
    /// The data volume's size and use, as last read (checked every step).
    volume: Option<crate::api::storage::VolumeReport>,
    last_published: Option<InstanceReport>,
    /// Since when a promotion waits for the old primary's last WAL (see [`RELEASED_WAL_WAIT`]).
    waiting_for_released_wal: Option<(Lsn, Instant)>,
    /// WAL archiving health of this primary (kept while the server is down).
    archiving: Option<ArchivingReport>,
    /// The fence watchdog's file: armed with the fence deadline while this server is primary.
    fence_file: FenceFile,
    /// The running fence watchdog.
    watchdog: Option<Watchdog>,
    /// Health queries that failed in a row, and when the first of them failed.
    unanswered: Option<(u32, Instant)>,
    /// When this primary's server was last fenced (by the agent or its watchdog) for a missed
    /// renew deadline: it stays down for a Lease duration from then (see `held_down_after_fence`).
    fenced_at: Option<Instant>,
    /// How the operator last asked to keep `synchronous_standby_names`.
    synchronous_wanted: Option<SynchronousStandbys>,
    /// `preferred` durability on a primary: whether commits should wait for the standbys.
    preferred: PreferredKeeper,
    /// The standbys this primary last wanted to wait for under `preferred` durability (reported;
    /// always containing the ones it waits for).
    waits_for: Option<Vec<String>>,
    /// The value the running server has (written and reloaded, or read at its start).
    synchronous_applied: Option<String>,
    /// The certificate files the server loaded (reloaded when they change).
    certificates: CertificateWatch,
    /// The superuser and the application's role, kept once per start of a primary.
    roles: RolesKeeper,
    /// This standby's replication slot on the primary it follows.
    slot: StandbySlot,
    /// When this server last looked for replication slots to drop.
    slots_checked: Option<Instant>,
    /// `spec.postgresql` in the data directory and the running server.
    configuration: ConfigurationKeeper,
    /// The settings the operator owns, put back after an `ALTER SYSTEM` by someone else.
    owned_settings: OwnedSettingsKeeper,
    /// `spec.roles` and `spec.databases`, kept by a primary.
    declared: DeclaredKeeper,
    /// Where the declared roles' passwords are read.
    secrets: SecretReader,
    /// `spec.bootstrap.import`, done once by a primary.
    import: ImportKeeper,
    /// An in-place major upgrade of this instance's data (see [`UpgradeKeeper`]).
    upgrade: UpgradeKeeper,
    /// This standby is the target of a change of primary, not promoted yet (see `next_tick`).
    handing_over: bool,
    /// The commits this former primary last gave up when it rejoined (reported).
    discarded_on_rejoin: Option<DiscardedOnRejoin>,
    /// The `dbservice.dev/reload-requested-at` value carried out; None until the first desired
    /// state was seen (the value then is covered by this start, which read the files afresh).
    reloaded: Option<Option<String>>,
    /// The switchover target this primary waits for to catch up, and since when.
    catching_up: Option<(String, Instant)>,
}

/// Longest wait of a promotion for the WAL up to the old primary's `releasedAtLsn` (the end of its
/// last commit) while the standby no longer streams. The position never arrives when the stream
/// ended while that primary still committed (its pod's address gone before the stop, say): waiting
/// for it forever would leave the database without a primary. Promoting after this wait loses the
/// commits in that gap (logged), as any asynchronous failover may.
pub const RELEASED_WAL_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Longest wait of a primary stepping down for a standby to stream from it (see
/// `wait_for_a_streaming_standby`): a standby retries its connection every second
/// (`wal_retrieve_retry_interval`), so one that is up connects well within it.
pub const STANDBY_STREAM_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// The agent's tick while this standby waits to be promoted (see `next_tick`): a change of primary
/// is a few steps (the old primary's release, then the promotion), each a tick apart.
pub const HANDOVER_TICK: std::time::Duration = std::time::Duration::from_millis(100);

/// Name of the fence watchdog's file in the socket directory.
pub const FENCE_FILE: &str = "dbservice-fence";

/// Fewest health queries that must fail in a row before the server counts as not ready (with
/// [`crate::instance::InstanceConfig::unresponsive_after`] elapsed since the first).
pub const UNRESPONSIVE_QUERIES: u32 = 3;

/// Equal for publishing purposes: a streaming standby's positions advance all the time and are not
/// republished (they are published when streaming stops, which is when a failover needs them).
fn same_state(left: &InstanceReport, right: &InstanceReport) -> bool {
    let settled = |report: &InstanceReport| {
        let mut report = report.clone();
        if report.wal_receiver && report.postgres_ready {
            report.received_lsn = None;
            report.replay_lsn = None;
        }
        report
    };
    settled(left) == settled(right)
}

impl<C: ControlPlane> Agent<C> {
    /// An agent for `config`, talking to the API through `control_plane`.
    pub fn new(config: InstanceConfig, control_plane: C) -> Self {
        let fence_file = FenceFile::new(config.socket_dir.join(FENCE_FILE));
        Agent {
            postgres: Postgres::new(config.clone()),
            config,
            control_plane,
            last_renewal: None,
            lease_seen: None,
            role: None,
            upstream_set: None,
            shutdown_checkpoint: None,
            last_sample: None,
            fenced_by_hand: false,
            disk_full: false,
            last_published: None,
            waiting_for_released_wal: None,
            archiving: None,
            fence_file,
            watchdog: None,
            unanswered: None,
            fenced_at: None,
            synchronous_wanted: None,
            preferred: PreferredKeeper::default(),
            waits_for: None,
            synchronous_applied: None,
            certificates: CertificateWatch::default(),
            roles: RolesKeeper::default(),
            slot: StandbySlot::default(),
            slots_checked: None,
            configuration: ConfigurationKeeper::default(),
            owned_settings: OwnedSettingsKeeper::default(),
            declared: DeclaredKeeper::default(),
            secrets: SecretReader::default(),
            import: ImportKeeper::default(),
            upgrade: UpgradeKeeper::default(),
            handing_over: false,
            discarded_on_rejoin: None,
            reloaded: None,
            volume: None,
            catching_up: None,
        }
    }

    /// Reads the declared roles' password Secrets through `secrets` (none by default).
    pub fn with_secrets(mut self, secrets: SecretReader) -> Self {
        self.secrets = secrets;
        self
    }

    /// Process id of the postmaster, while it runs.
    pub fn postgres_pid(&self) -> Option<u32> {
        self.postgres.pid()
    }

    /// Steps every tick until `stop` turns true, then stops PostgreSQL cleanly (a primary hands the
    /// Lease over with its shutdown checkpoint, like a switchover).
    pub async fn run(mut self, mut stop: watch::Receiver<bool>) {
        while !*stop.borrow() {
            if let Err(error) = self.step().await {
                tracing::warn!(instance = %self.config.name, %error, "instance step failed");
            }
            tokio::select! {
                _ = tokio::time::sleep(self.next_tick()) => {}
                _ = stop.changed() => {}
                _ = self.control_plane.changed() => {}
            }
        }
        if let Err(error) = self.stop_and_release(false).await {
            tracing::warn!(instance = %self.config.name, %error, "clean stop failed");
        }
        let local = self.postgres.observe().await;
        let _ = self.publish(&local).await;
        self.keep_fence();
        if let Some(watchdog) = self.watchdog.take() {
            watchdog.stop();
        }
    }

    /// The wait before the next step: [`HANDOVER_TICK`] while this standby is the one a change of
    /// primary waits for (it reads the Lease for the old primary's release every step), the
    /// configured tick otherwise.
    fn next_tick(&self) -> std::time::Duration {
        if self.handing_over {
            self.config.tick.min(HANDOVER_TICK)
        } else {
            self.config.tick
        }
    }

    /// One step: observe, act on the operator's wishes, publish on change.
    pub async fn step(&mut self) -> Result<(), AgentError> {
        self.keep_watchdog();
        let result = self.step_once().await;
        self.keep_fence();
        result
    }

    /// Starts the fence watchdog, or again if it ended.
    fn keep_watchdog(&mut self) {
        if self.watchdog.as_mut().is_some_and(Watchdog::running) {
            return;
        }
        match Watchdog::start(self.config.watchdog_binary.as_deref(), self.fence_file.path()) {
            Ok(watchdog) => self.watchdog = Some(watchdog),
            Err(error) => tracing::error!(instance = %self.config.name, %error, "could not start the fence watchdog"),
        }
    }

    /// Arms the fence watchdog with this primary's deadline (its last renewal's send time plus the
    /// renew deadline), or disarms it when this server is not a primary holding the Lease.
    fn keep_fence(&mut self) {
        let armed = match (self.role, self.last_renewal, self.postgres.pid()) {
            (Some(Role::Primary), Some(renewed), Some(postmaster)) => {
                Some((postmaster, renewed + self.config.lease.renew_deadline))
            }
            _ => None,
        };
        let written = match armed {
            Some((postmaster, deadline)) => self.fence_file.arm(postmaster, deadline),
            None => self.fence_file.disarm(),
        };
        if let Err(error) = written {
            tracing::error!(instance = %self.config.name, %error, file = %self.fence_file.path().display(), "could not write the fence deadline");
        }
    }

    async fn step_once(&mut self) -> Result<(), AgentError> {
        // Without the API the target is unknown: a primary keeps its course until its lease
        // deadline, a stopped former primary stays down.
        let desired = self.control_plane.desired().await.unwrap_or_default();
        let local = self.observe().await;
        if self.stalling(&local) {
            // Not yet unresponsive for long: nothing is published or changed; a primary renews
            // nothing either (its server did not answer), so its fence deadline still runs.
            if self.role == Some(Role::Primary) {
                self.hold_lease(None).await;
            }
            return Ok(());
        }
        self.note_disk_space();
        self.note_sample(&local);
        self.keep_server(&local, &desired).await;
        let me = self.config.name.as_str();
        let target_me = desired.target_primary.as_deref() == Some(me);
        let target_other = desired.target_primary.is_some() && !target_me;
        if desired.fenced {
            if self.postgres.is_running() {
                tracing::info!(instance = %me, "fenced by hand: stopping PostgreSQL");
                self.postgres.stop(self.config.stop_grace).await;
            }
            self.fenced_by_hand = true;
            return self.publish(&LocalState::Down).await;
        }
        self.fenced_by_hand = false;
        self.handing_over =
            self.role == Some(Role::Standby) && (target_me || desired.target_primary.as_deref() == Some(PENDING));
        let before = self.role;
        self.act(&local, &desired, target_me, target_other).await?;
        if before == Some(Role::Standby) && self.role == Some(Role::Primary) {
            // Promoted in this step: the operator completes the change once it reads the new
            // timeline, so the report says it now rather than a tick later.
            self.handing_over = false;
            let promoted = self.observe().await;
            return self.publish(&promoted).await;
        }
        if matches!(local, LocalState::Ready(_)) && !self.postgres.is_running() {
            // Stopped in this step (a primary stepping down): its sample is from before.
            return self.publish(&LocalState::Down).await;
        }
        self.publish(&local).await
    }

    /// Notes whether the data volume is (nearly) full, logging each change.
    fn note_disk_space(&mut self) {
        // The volume, not the directory: PGDATA may not exist yet before the first clone.
        let volume = self.config.pgdata.parent().unwrap_or(&self.config.pgdata);
        let free = free_bytes(volume);
        self.volume = free.zip(volume_bytes(volume)).and_then(|(free, size)| VolumeReport::of(size, free));
        if free.is_some_and(|free| free < DISK_FULL_BYTES) != self.disk_full {
            self.disk_full = !self.disk_full;
            tracing::warn!(instance = %self.config.name, free_bytes = ?free, disk_full = self.disk_full, "data volume space");
        }
    }

    /// Remembers what a server that answered said: its sample, its role and its archiving.
    fn note_sample(&mut self, local: &LocalState) {
        if let LocalState::Ready(sample) = local {
            self.last_sample = Some(sample.clone());
            self.role = Some(if sample.in_recovery { Role::Standby } else { Role::Primary });
            self.archiving =
                sample.archiver.as_ref().map(|archiver| archiving_report(self.archiving.as_ref(), archiver));
        }
    }

    /// Keeps the local server as the operator wants it: synchronous standbys, certificates,
    /// configuration and owned settings; on a primary, the roles, the import and the declared
    /// objects; and the replication slots.
    async fn keep_server(&mut self, local: &LocalState, desired: &Desired) {
        if let Some(synchronous) = &desired.synchronous {
            self.synchronous_wanted = Some(synchronous.clone());
        }
        if matches!(local, LocalState::Ready(_)) {
            if let Err(error) = self.keep_synchronous_standbys().await {
                tracing::warn!(instance = %self.config.name, %error, "could not set synchronous_standby_names");
            }
        }
        if matches!(local, LocalState::Ready(_)) {
            self.keep_certificates().await;
        }
        self.configuration.want(desired.configuration.as_ref());
        if matches!(local, LocalState::Ready(_)) {
            self.configuration.keep(&self.config, &mut self.postgres).await;
            self.keep_owned_settings().await;
            self.keep_reload(desired).await;
        }
        self.declared.want(desired.declarations.as_ref());
        self.import.want(desired.import.as_ref());
        if matches!(local, LocalState::Ready(sample) if !sample.in_recovery) {
            self.upgrade.primary_ready(&self.config);
            self.roles.keep(&self.config);
            // Declared roles may be owned by or granted the application's role, and imported
            // objects are owned by it: once it is kept.
            if self.roles.done() || self.config.roles.is_none() {
                self.import.keep(&self.config, &self.secrets);
                if self.import.settled() {
                    self.declared.keep(&self.config, &self.secrets);
                }
            }
        }
        if let LocalState::Ready(sample) = local {
            self.drop_obsolete_slots(!sample.in_recovery, &desired.instances).await;
        }
    }

    /// Carries out what the operator wants, given what the local server is doing.
    async fn act(
        &mut self,
        local: &LocalState,
        desired: &Desired,
        target_me: bool,
        target_other: bool,
    ) -> Result<(), AgentError> {
        let me = self.config.name.clone();
        match local {
            LocalState::Ready(sample) if !sample.in_recovery => {
                self.shutdown_checkpoint = None;
                if !target_other {
                    self.catching_up = None;
                    self.hold_lease(Some(sample)).await;
                } else if desired.switchover && !self.target_caught_up(desired).await {
                    // Writes go on here while the target catches up; looked at every fast tick.
                    self.handing_over = true;
                    self.hold_lease(Some(sample)).await;
                } else {
                    self.catching_up = None;
                    self.stop_and_release(true).await?;
                }
            }
            LocalState::Ready(sample) => {
                if target_me {
                    self.promote_when_allowed(sample, desired.switchover).await?;
                } else if desired.target_primary.as_deref() == Some(PENDING) {
                    // Stop streaming only once the old primary cannot commit any more (lease
                    // released or expired): until then every commit it acknowledges still arrives.
                    // A clean release comes at the shutdown checkpoint, while the old primary's WAL
                    // sender may still be sending: streaming goes on until its position is here.
                    let (record, _, verdict) = self.read_lease().await?;
                    let received = sample.received_lsn.max(sample.replay_lsn).unwrap_or_default();
                    let released_wal_coming =
                        sample.streaming && record.released_at_lsn.is_some_and(|released| received < released);
                    if verdict.may_acquire() && !released_wal_coming {
                        self.follow(None).await?;
                    }
                } else if let Some(upstream) = &desired.upstream {
                    self.follow(Some(upstream)).await?;
                    self.keep_standby_slot(upstream).await;
                }
            }
            LocalState::NotReady(reason) => {
                if self.role == Some(Role::Primary) {
                    if target_other {
                        tracing::warn!(instance = %me, %reason, "unresponsive primary replaced: killing it");
                        self.postgres.kill().await;
                        self.release_lease(None).await?;
                    } else {
                        // No renewal without a healthy server; fences at the deadline.
                        self.hold_lease(None).await;
                    }
                } else if let Some(upstream) = desired.upstream.as_ref().filter(|_| self.postgres.is_running()) {
                    self.follow_offline(upstream)?;
                }
            }
            LocalState::Down => {
                if self.role == Some(Role::Primary) && self.fence_deadline_passed() {
                    // The watchdog killed it at the deadline this agent armed.
                    tracing::warn!(instance = %me, "primary fenced by the watchdog: held down for a failover");
                    self.fenced_at = Some(Instant::now());
                    self.last_renewal = None;
                }
                if self.role == Some(Role::Primary) && target_other {
                    // Stopped (crashed, or killed by the fence watchdog) while another instance
                    // is wanted: nothing of it runs, so the Lease is freed now instead of being
                    // left to expire, which cost a whole Lease duration of the failover.
                    self.release_lease(None).await?;
                }
                self.start_when_allowed(desired).await?
            }
        }
        Ok(())
    }

    /// One health query. A standby that stops streaming reads its timeline from its last
    /// restartpoint, which may predate the timeline it followed: the failover would take it for
    /// one that missed a promotion. Its timeline never goes back while it replays.
    async fn observe(&mut self) -> LocalState {
        let mut local = self.postgres.observe().await;
        if let (LocalState::Ready(sample), Some(last)) = (&mut local, &self.last_sample) {
            if sample.in_recovery && last.in_recovery {
                sample.timeline = sample.timeline.max(last.timeline);
            }
        }
        local
    }

    /// Whether `local` is a failed health query within the grace of a stall: fewer than
    /// [`UNRESPONSIVE_QUERIES`] failures in a row, or less than `unresponsive_after` since the first.
    fn stalling(&mut self, local: &LocalState) -> bool {
        let LocalState::NotReady(reason) = local else {
            self.unanswered = None;
            return false;
        };
        let (count, since) = match self.unanswered {
            Some((count, since)) => (count + 1, since),
            None => (1, Instant::now()),
        };
        self.unanswered = Some((count, since));
        let stalling = count < UNRESPONSIVE_QUERIES || since.elapsed() < self.config.unresponsive_after;
        if stalling {
            tracing::info!(instance = %self.config.name, %reason, failures = count, "local server did not answer");
        }
        stalling
    }

    fn report(&self, local: &LocalState) -> InstanceReport {
        let sample = match local {
            LocalState::Ready(sample) => Some(sample),
            _ => self.last_sample.as_ref(),
        };
        let ready = matches!(local, LocalState::Ready(_));
        let role = self.role.unwrap_or(Role::Standby);
        InstanceReport {
            role,
            timeline: sample.map(|sample| sample.timeline).unwrap_or(0),
            received_lsn: sample.and_then(|sample| sample.received_lsn).filter(|_| role == Role::Standby),
            replay_lsn: sample.and_then(|sample| sample.replay_lsn).filter(|_| role == Role::Standby),
            wal_receiver: ready && sample.is_some_and(|sample| sample.streaming),
            postgres_ready: ready,
            fenced: self.fenced_by_hand,
            disk_full: self.disk_full,
            archiving: self.archiving.clone().filter(|_| role == Role::Primary),
            shutdown_checkpoint_lsn: self.shutdown_checkpoint.filter(|_| !ready),
            parameters: self.configuration.applied_fingerprint(),
            pending_restart: self.configuration.pending_restart(),
            declared: self.declared.status().cloned().filter(|_| role == Role::Primary),
            import: self.import.status().cloned().filter(|_| role == Role::Primary),
            major_upgrade: self.upgrade.report(),
            owned_settings_reverted: self.owned_settings.reverted().cloned(),
            waits_for: self.waits_for.clone().filter(|_| role == Role::Primary),
            discarded_on_rejoin: self.discarded_on_rejoin.clone(),
            reloaded: self.reloaded.clone().flatten(),
            volume: self.volume,
        }
    }

    async fn publish(&mut self, local: &LocalState) -> Result<(), AgentError> {
        let report = self.report(local);
        if self.last_published.as_ref().is_some_and(|published| same_state(published, &report)) {
            return Ok(());
        }
        if let Err(error) = self.control_plane.publish(&report).await {
            // The write may have landed although its answer did not (a connection dropped after
            // the request went out): what the API holds is unknown now, so the next step
            // publishes again even a report equal to the last one known to have landed (seen in
            // CI: a standby's "not streaming" landed unanswered and stayed for good).
            self.last_published = None;
            return Err(error.into());
        }
        tracing::info!(instance = %self.config.name, report = %serde_json::to_string(&report).unwrap_or_default(), "published");
        self.last_published = Some(report);
        Ok(())
    }

    /// Reads the Lease and notes since when its version has been unchanged on this clock.
    async fn read_lease(&mut self) -> Result<(LeaseRecord, String, AcquireVerdict), ControlPlaneError> {
        let (record, version) = self.control_plane.read_lease().await?;
        let now = Instant::now();
        let seen_since = match &self.lease_seen {
            Some((seen, since)) if *seen == version => *since,
            _ => now,
        };
        self.lease_seen = Some((version.clone(), seen_since));
        let verdict = acquire_verdict(&record, &self.config.name, now - seen_since, &self.config.lease);
        Ok((record, version, verdict))
    }

    /// Writes this instance as holder, with its position, if nobody else holds the Lease.
    async fn write_lease(
        &mut self,
        position: Option<Lsn>,
        timeline: Option<u32>,
    ) -> Result<LeaseWrite, ControlPlaneError> {
        let (record, version, verdict) = self.read_lease().await?;
        if !verdict.may_acquire() {
            return Ok(LeaseWrite::HeldByOther);
        }
        let next = LeaseRecord {
            holder: Some(self.config.name.clone()),
            primary_lsn: position.or(record.primary_lsn),
            timeline: timeline.or(record.timeline),
            released_at_lsn: None,
            // Written from this agent's own timings by the control plane.
            duration: None,
        };
        // The fence clock starts when the renewal is sent, not when it returns: others time the
        // Lease from when they see the new version, which is later than this.
        let sent = Instant::now();
        match self.control_plane.write_lease(&version, &next).await? {
            Some(_) => {
                self.last_renewal = Some(sent);
                self.keep_fence();
                Ok(LeaseWrite::Written)
            }
            None => Ok(LeaseWrite::Conflict),
        }
    }

    /// A primary renews when due (only with a healthy server) and fences itself when it could not
    /// renew before the deadline, or learns that someone else holds the Lease.
    async fn hold_lease(&mut self, healthy: Option<&Sample>) {
        let since = self.last_renewal.map(|renewed| renewed.elapsed());
        if let Some(sample) = healthy {
            if since.is_none_or(|since| renewal_due(since, &self.config.lease)) {
                match self.write_lease(sample.current_lsn, Some(sample.timeline)).await {
                    Ok(LeaseWrite::Written) => return,
                    Ok(LeaseWrite::HeldByOther) => return self.fence("another instance holds the primary lease").await,
                    Ok(LeaseWrite::Conflict) => {}
                    Err(error) => tracing::warn!(instance = %self.config.name, %error, "lease renewal failed"),
                }
            }
        }
        let since = self.last_renewal.map(|renewed| renewed.elapsed());
        if since.is_none_or(|since| must_fence(since, &self.config.lease)) {
            self.fence("primary lease not renewed before its deadline").await;
        }
    }

    /// Stops accepting writes at once: an immediate stop, SIGKILL of the process group if that
    /// does not end it. (Setting default_transaction_read_only is no fence: any session can
    /// override it.)
    async fn fence(&mut self, reason: &str) {
        tracing::warn!(instance = %self.config.name, reason, "fencing: stopping PostgreSQL");
        self.postgres.kill().await;
        self.last_renewal = None;
        self.fenced_at = Some(Instant::now());
        self.keep_fence();
    }

    /// Whether the fence deadline of this primary's last renewal has passed.
    fn fence_deadline_passed(&self) -> bool {
        self.last_renewal.is_some_and(|renewed| must_fence(renewed.elapsed(), &self.config.lease))
    }

    /// Whether a fence of this primary is recent enough (within a Lease duration) to keep it from
    /// restarting in place. A hung server killed by its fence is the failure a failover is for:
    /// restarted at once (crash recovery takes a second), the operator would see it down for a
    /// moment or not at all, and the database would keep a primary that hung (seen on the real
    /// node: no failover within 180 s). Held down, it is failed over; with no candidate the failover
    /// is abandoned, and after the hold it restarts as primary.
    fn held_down_after_fence(&self) -> bool {
        self.fenced_at.is_some_and(|fenced| fenced.elapsed() < self.config.lease.duration)
    }

    async fn promote_when_allowed(&mut self, sample: &Sample, switchover: bool) -> Result<(), AgentError> {
        let (record, _, verdict) = self.read_lease().await?;
        if !verdict.may_acquire() {
            return Ok(());
        }
        let received = sample.received_lsn.max(sample.replay_lsn).unwrap_or_default();
        if switchover {
            // A planned change promises every acknowledged commit: only a clean release whose
            // position has arrived allows the promotion. Anything else (an expired Lease, a
            // release without a position after an unclean stop, WAL that does not arrive) waits
            // until the operator gives the old primary its place back.
            let mine = record.holder.as_deref() == Some(self.config.name.as_str());
            let released_and_received =
                record.holder.is_none() && record.released_at_lsn.is_some_and(|released| received >= released);
            let complete = mine || released_and_received;
            if !complete {
                tracing::info!(instance = %self.config.name, %received, released = ?record.released_at_lsn, holder = ?record.holder, "switchover: waiting for the old primary's clean release and its last WAL");
                return Ok(());
            }
        }
        if let Some(released) = record.released_at_lsn.filter(|released| received < *released) {
            // A clean hand-over: promoting before the old primary's last WAL arrived would lose
            // commits. While streaming it keeps arriving; once streaming has stopped, it is given
            // RELEASED_WAL_WAIT (see there) and no more.
            let since = match self.waiting_for_released_wal {
                Some((waited_for, since)) if waited_for == released => since,
                _ => Instant::now(),
            };
            self.waiting_for_released_wal = Some((released, since));
            if sample.streaming || since.elapsed() < RELEASED_WAL_WAIT {
                tracing::info!(instance = %self.config.name, %received, %released, "waiting for the old primary's last WAL");
                return Ok(());
            }
            let gap = released.bytes_ahead_of(received);
            tracing::warn!(instance = %self.config.name, %received, %released, gap_bytes = gap, "the old primary's last WAL did not arrive: promoting without it");
        }
        if !matches!(self.write_lease(sample.received_lsn, Some(sample.timeline)).await?, LeaseWrite::Written) {
            return Ok(());
        }
        tracing::info!(instance = %self.config.name, "holding the primary lease: promoting");
        self.postgres.promote().await?;
        self.role = Some(Role::Primary);
        self.upstream_set = None;
        if let LocalState::Ready(sample) = self.postgres.observe().await {
            let _ = self.write_lease(sample.current_lsn, Some(sample.timeline)).await;
            self.last_sample = Some(sample);
        }
        Ok(())
    }

    async fn follow(&mut self, upstream: Option<&Upstream>) -> Result<(), AgentError> {
        let conninfo = upstream.map(|upstream| standby::conninfo(&self.config, upstream, true)).unwrap_or_default();
        if self.upstream_set.as_deref() != Some(conninfo.as_str()) {
            tracing::info!(instance = %self.config.name, upstream = ?upstream, "following");
            self.postgres.set_upstream(&conninfo).await?;
            self.upstream_set = Some(conninfo);
            self.slot.reset();
        }
        Ok(())
    }

    /// Re-points a standby that takes no connections yet. One that started following a primary
    /// which was lost before the standby reached a consistent state waits for WAL only the new
    /// primary has; without this it would wait forever (its pod never turns ready).
    fn follow_offline(&mut self, upstream: &Upstream) -> Result<(), AgentError> {
        let conninfo = standby::conninfo(&self.config, upstream, true);
        if self.upstream_set.as_deref() != Some(conninfo.as_str()) {
            tracing::info!(instance = %self.config.name, upstream = ?upstream, "following (server not accepting connections yet: configuration file and reload)");
            self.postgres.set_upstream_offline(&conninfo)?;
            self.upstream_set = Some(conninfo);
            self.slot.reset();
        }
        Ok(())
    }

    /// Whether a switchover's target is close enough for this primary to stop
    /// ([`crate::instance::postgres::StandbyLag::caught_up`]). Until then writes go on here: a
    /// switchover over a slow link (or to a standby far behind) stopped the primary at once and
    /// refused writes until the rest of the WAL had crawled over (63 s, throttled link). Past half
    /// the switchover timeout it also stops for a target whose flush lag still fits in half the
    /// time left (one held a second or two behind by a steady flow of writes); a target that cannot
    /// make it is never waited for with writes refused: this primary keeps going and the operator
    /// gives the switchover up at its timeout.
    async fn target_caught_up(&mut self, desired: &Desired) -> bool {
        let Some(target) = desired.target_primary.clone() else { return true };
        let since = match &self.catching_up {
            Some((waited_for, since)) if *waited_for == target => *since,
            _ => Instant::now(),
        };
        self.catching_up = Some((target.clone(), since));
        let lag = match self.postgres.standby_lag(&target).await {
            Ok(lag) => lag,
            Err(error) => {
                tracing::warn!(instance = %self.config.name, %error, "could not read the switchover target's lag: stopping");
                return true;
            }
        };
        if lag.is_some_and(|lag| lag.caught_up()) {
            return true;
        }
        let waited = since.elapsed();
        let left = desired.switchover_timeout.saturating_sub(waited);
        let fits = lag.is_some_and(|lag| lag.behind_by() <= left / 2);
        if waited >= desired.switchover_timeout / 2 && fits {
            tracing::info!(instance = %self.config.name, %target, ?lag, ?waited, "switchover target a little behind: stopping, it gets the rest in time");
            return true;
        }
        if waited < self.config.tick.min(HANDOVER_TICK) {
            tracing::info!(instance = %self.config.name, %target, ?lag, "switchover: writes go on while the target catches up");
        }
        false
    }

    /// A primary that must step down: clean stop, then release the Lease with the end of its last
    /// commit so that the successor waits for it.
    async fn stop_and_release(&mut self, successor_expected: bool) -> Result<(), AgentError> {
        if !self.postgres.is_running() {
            return Ok(());
        }
        let was_primary = self.role == Some(Role::Primary);
        let mut shutdown_began = None;
        if was_primary && successor_expected {
            self.wait_for_a_streaming_standby().await;
        }
        if was_primary {
            self.postgres.checkpoint().await;
            // After the CHECKPOINT: pg_waldump then reads only the WAL of the last moments.
            shutdown_began = self.postgres.insert_lsn().await.ok();
            // The fence watchdog kills at the renew deadline: renewing now gives the shutdown a
            // whole one, whatever the CHECKPOINT above took.
            if let Ok(LeaseWrite::HeldByOther) = self.write_lease(None, None).await {
                self.fence("another instance holds the primary lease").await;
                return Ok(());
            }
        }
        let grace = self.config.stop_grace;
        let writes_over = self.postgres.stop_writes(grace).await;
        if !writes_over || !was_primary {
            self.postgres.finish_stop(grace).await;
        }
        if !was_primary {
            return Ok(());
        }
        // Only pg_control proves a clean stop: a server killed under the stop (by the fence
        // watchdog, say) exits too, and its control file names an old checkpoint that a
        // successor would take for the end of its WAL.
        let control = match writes_over {
            true => standby::shutdown_checkpoint(&self.config).await.ok().filter(|control| control.clean),
            false => None,
        };
        let clean = control.is_some();
        let checkpoint = control.map(|control| control.checkpoint);
        let released = match (control, shutdown_began) {
            (Some(control), Some(began)) => Some(self.end_of_committed_wal(began, &control).await),
            _ => checkpoint,
        };
        tracing::info!(instance = %self.config.name, clean, checkpoint = ?checkpoint, released = ?released, "primary stopped");
        self.shutdown_checkpoint = checkpoint;
        // Released once the shutdown checkpoint is written, not once the server exited: the
        // archiver's last attempts must not hold the successor back (an unreachable object store
        // held it until the fence watchdog killed the server, 24 s); the WAL senders go on sending
        // the last WAL, which the successor waits for.
        let released = self.release_lease(released).await;
        // Said now, not after the exit: the operator takes Service NAME off this server at once.
        if let Err(error) = self.publish(&LocalState::Down).await {
            tracing::warn!(instance = %self.config.name, %error, "could not publish the stop");
        }
        self.postgres.finish_stop(grace).await;
        released
    }

    /// Before a primary steps down for another instance: a clean shutdown sends the last WAL only
    /// to standbys connected at that moment, and a standby that lost its stream (this server was
    /// restarted in place a moment ago, say) would miss it and promote without the last commits.
    /// Waits up to [`STANDBY_STREAM_WAIT`] for one to stream, and never past half the renew
    /// deadline of a renewal made first (the fence watchdog must not kill the server mid-wait);
    /// without that renewal it does not wait.
    async fn wait_for_a_streaming_standby(&mut self) {
        match self.write_lease(None, None).await {
            Ok(LeaseWrite::Written) => {}
            Ok(LeaseWrite::HeldByOther) => return self.fence("another instance holds the primary lease").await,
            Ok(LeaseWrite::Conflict) | Err(_) => return,
        }
        let began = Instant::now();
        let limit = STANDBY_STREAM_WAIT.min(self.config.lease.renew_deadline / 2);
        loop {
            match self.postgres.streaming_standbys().await {
                Ok(streaming) if streaming > 0 => return,
                Ok(_) if began.elapsed() < limit => {
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                }
                Ok(_) => {
                    tracing::warn!(instance = %self.config.name, waited = ?began.elapsed(), "no standby streams: stopping without one");
                    return;
                }
                Err(error) => {
                    tracing::warn!(instance = %self.config.name, %error, "could not count the streaming standbys");
                    return;
                }
            }
        }
    }

    /// The position a successor must have received to hold every commit of this stopped primary:
    /// the end of its last commit record (see [`standby::end_of_committed_wal`]), not the shutdown
    /// checkpoint. A standby may have lost the stream just before the stop (seen on the real node:
    /// 176 bytes short of the shutdown checkpoint, exactly the CHECKPOINT the stop begins with); it
    /// then has every commit and need not wait. Without pg_waldump's answer, the shutdown checkpoint
    /// (stricter).
    async fn end_of_committed_wal(&self, shutdown_began: Lsn, control: &standby::ControlData) -> Lsn {
        match standby::end_of_committed_wal(&self.config, shutdown_began, control).await {
            Ok(end) => end,
            Err(error) => {
                tracing::warn!(instance = %self.config.name, %error, "could not read the last WAL records: releasing at the shutdown checkpoint");
                control.checkpoint
            }
        }
    }

    async fn release_lease(&mut self, checkpoint: Option<Lsn>) -> Result<(), AgentError> {
        self.last_renewal = None;
        let (record, version) = self.control_plane.read_lease().await?;
        if record.holder.as_deref() != Some(self.config.name.as_str()) {
            return Ok(());
        }
        let released = LeaseRecord { holder: None, released_at_lsn: checkpoint, ..record };
        self.control_plane.write_lease(&version, &released).await?;
        Ok(())
    }

    async fn start_when_allowed(&mut self, desired: &Desired) -> Result<(), AgentError> {
        let pgdata = &self.config.pgdata;
        let target_me = desired.target_primary.as_deref() == Some(self.config.name.as_str());
        let named_other = desired.target_primary.as_deref().is_some_and(|target| !target_me && target != PENDING);
        // An upgrade swap interrupted between its two renames leaves no data directory.
        if let Err(error) = crate::instance::major_upgrade::resume(pgdata) {
            tracing::warn!(instance = %self.config.name, %error, "could not finish an interrupted upgrade swap");
            return Ok(());
        }
        if !initialized(pgdata) {
            if let (true, Some(upstream)) = (named_other, &desired.upstream) {
                tracing::info!(instance = %self.config.name, "empty data directory: cloning the primary");
                standby::clone_from(&self.config, upstream).await?;
                return self.start(Role::Standby, Some(upstream));
            }
            return Ok(());
        }
        let standby_data = is_standby_data(pgdata);
        self.role = Some(if standby_data { Role::Standby } else { Role::Primary });
        match self.upgrade.before_start(&self.config, desired.major_upgrade.as_ref(), standby_data).await {
            BeforeStart::Start => {}
            BeforeStart::Hold => return Ok(()),
            BeforeStart::Reclone => {
                let (true, Some(upstream)) = (named_other, &desired.upstream) else { return Ok(()) };
                // A copy of the old major is of no use to a standby of the new one; the
                // primary's previous data directory and the pre-upgrade backup are the way back.
                tracing::info!(instance = %self.config.name, "standby data of an older major: cloning the upgraded primary");
                std::fs::remove_dir_all(pgdata)
                    .map_err(|source| StandbyError::Files { path: pgdata.clone(), source })?;
                standby::clone_from(&self.config, upstream).await?;
                self.upgrade.recloned();
                self.last_sample = None;
                return self.start(Role::Standby, Some(upstream));
            }
        }
        // The instance the operator upgrades is the only possible primary meanwhile (failover
        // is held), and pg_upgrade starts its data on timeline 1 whatever the Lease says.
        let upgrading_me = desired.major_upgrade.as_ref().is_some_and(|instruction| {
            instruction.allowed && !instruction.primary_upgraded && instruction.primary == self.config.name
        });
        match (standby_data, target_me, named_other, &desired.upstream) {
            // A primary restarts in place (crash recovery) only while it can hold the Lease.
            (false, true, _, _) => {
                if self.held_down_after_fence() {
                    return Ok(());
                }
                let (record, _, _) = self.read_lease().await?;
                let local = standby::shutdown_checkpoint(&self.config).await?.timeline;
                if let Some(leased) = record.timeline.filter(|leased| *leased > local && !upgrading_me) {
                    // Another instance was promoted since this data was primary: starting it as
                    // primary would fork the history. The operator's view is stale; wait.
                    tracing::warn!(instance = %self.config.name, local_timeline = local, lease_timeline = leased, "not starting as primary: the Lease names a newer timeline");
                    return Ok(());
                }
                if matches!(self.write_lease(None, None).await?, LeaseWrite::Written) {
                    tracing::info!(instance = %self.config.name, "starting as primary");
                    self.start(Role::Primary, None)?;
                }
            }
            (false, false, true, Some(upstream)) => {
                self.rejoin(upstream).await?;
                self.start(Role::Standby, Some(upstream))?;
            }
            (true, _, _, upstream) => {
                // Standby data: start; the WAL receiver is pointed where the operator says.
                let upstream = if named_other { upstream.as_ref() } else { None };
                if upstream.is_some() {
                    standby::write_standby_config(&self.config, upstream)?;
                }
                self.start(Role::Standby, upstream)?;
                if upstream.is_none() {
                    // Whatever the file says: the next follow() sets it explicitly.
                    self.upstream_set = None;
                }
            }
            // A former primary waits until the new one is known; it never starts as primary on its own.
            _ => {}
        }
        Ok(())
    }

    /// A former primary becomes a standby of `upstream`: pg_rewind (a no-op after a clean
    /// switchover), or a fresh clone when rewinding fails.
    async fn rejoin(&mut self, upstream: &Upstream) -> Result<(), AgentError> {
        tracing::info!(instance = %self.config.name, "former primary: rewinding onto the new primary");
        self.count_what_the_rewind_discards(upstream).await;
        match standby::rewind(&self.config, upstream).await {
            Ok(output) => {
                tracing::info!(instance = %self.config.name, output = %output.trim(), "pg_rewind done");
                standby::write_standby_config(&self.config, Some(upstream))?;
            }
            Err(error) => {
                tracing::warn!(instance = %self.config.name, %error, "pg_rewind failed: cloning afresh");
                let moved = standby::clone_from(&self.config, upstream).await?;
                tracing::warn!(instance = %self.config.name, moved_aside = ?moved, "cloned afresh");
            }
        }
        self.shutdown_checkpoint = None;
        self.role = Some(Role::Standby);
        // Rewound or cloned: the timeline is the new primary's, whatever this one had.
        self.last_sample = None;
        Ok(())
    }

    /// Reads, before the rewind discards it, how much of this former primary's WAL the new primary
    /// never had, and reports it when it holds commits (the operator writes a Warning and a ledger
    /// entry): under asynchronous replication a client may have been told of them.
    async fn count_what_the_rewind_discards(&mut self, upstream: &Upstream) {
        match standby::divergence(&self.config, upstream).await {
            Ok(Some(divergence)) if divergence.commits > 0 => {
                tracing::warn!(instance = %self.config.name, diverged_at = %divergence.diverged_at, commits = divergence.commits, bytes = divergence.bytes, "former primary: commits the new primary lacks are discarded");
                self.discarded_on_rejoin = Some(DiscardedOnRejoin {
                    at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                    diverged_at: divergence.diverged_at.to_string(),
                    timeline: divergence.timeline,
                    commits: divergence.commits,
                    bytes: divergence.bytes,
                });
            }
            Ok(_) => {}
            Err(error) => {
                tracing::warn!(instance = %self.config.name, %error, "could not read what the rewind discards");
            }
        }
    }

    /// Streams through this standby's own replication slot once it exists on `upstream`.
    async fn keep_standby_slot(&mut self, upstream: &Upstream) {
        if !self.slot.created_on(&self.config, upstream) {
            return;
        }
        let slot = slots::slot_name(&self.config.name);
        match self.postgres.set_slot(&slot).await {
            Ok(()) => tracing::info!(instance = %self.config.name, %slot, "streaming through a replication slot"),
            Err(error) => {
                tracing::warn!(instance = %self.config.name, %error, "could not name the replication slot");
                self.slot.reset();
            }
        }
    }

    /// Drops, now and then, the inactive slots of ours this server should not keep (see
    /// [`slots::obsolete_slots`]); a primary that does not know the instances keeps every one.
    async fn drop_obsolete_slots(&mut self, primary: bool, instances: &[String]) {
        let recently = self.slots_checked.is_some_and(|checked| checked.elapsed() < slots::CLEANUP_INTERVAL);
        if recently || (primary && instances.is_empty()) {
            return;
        }
        self.slots_checked = Some(Instant::now());
        let existing = match self.postgres.replication_slots().await {
            Ok(existing) => existing,
            Err(error) => {
                tracing::warn!(instance = %self.config.name, %error, "could not list the replication slots");
                return;
            }
        };
        let keep = slots::wanted_slots(&self.config.name, instances, primary);
        for slot in slots::obsolete_slots(&existing, &keep) {
            match self.postgres.drop_slot(&slot).await {
                Ok(()) => tracing::info!(instance = %self.config.name, %slot, "dropped a replication slot nobody uses"),
                Err(error) => {
                    tracing::warn!(instance = %self.config.name, %slot, %error, "could not drop a replication slot")
                }
            }
        }
    }

    /// Keeps the running server's `synchronous_standby_names` as wanted. Every instance keeps it
    /// (a standby ignores it), so that a promoted standby enforces it from its first commit.
    /// Under `preferred` durability a primary decides whether its commits wait (see
    /// [`crate::instance::durability`]): it stops waiting before it reports so, and waits only
    /// after the operator recorded its offer.
    async fn keep_synchronous_standbys(&mut self) -> Result<(), AgentError> {
        let Some(wanted) = self.synchronous_wanted.clone() else { return Ok(()) };
        let (value, wants) = match wanted {
            SynchronousStandbys::Fixed(names) => (names, None),
            SynchronousStandbys::Preferred { members, count, recorded } => {
                let recorded = durability::recorded_members(&members, &recorded);
                if self.role == Some(Role::Primary) {
                    let seen = self.postgres.standbys_seen(&members).await?;
                    let wanted = self.preferred.decide(&seen, count, Instant::now());
                    let applied = durability::applicable(&wanted, &recorded, count);
                    (durability::names(&applied, count), Some(wanted))
                } else {
                    self.preferred.reset();
                    (durability::names(&durability::applicable(&recorded, &recorded, count), count), None)
                }
            }
        };
        if self.synchronous_applied.as_ref() != Some(&value) {
            standby::set_auto_conf(&self.config, &[("synchronous_standby_names", value.clone())])?;
            self.postgres.reload().await?;
            tracing::info!(instance = %self.config.name, synchronous_standby_names = %value, "synchronous standbys set");
            self.synchronous_applied = Some(value);
        }
        // Only now that the server waits for no one outside it (the applied ones are among them).
        self.waits_for = wants.map(|wanted| wanted.into_iter().collect());
        Ok(())
    }

    /// Puts back, every [`owned_settings::CHECK_INTERVAL`], the owned settings someone changed
    /// with `ALTER SYSTEM` (see [`owned_settings::put_backs`]), and reloads.
    async fn keep_owned_settings(&mut self) {
        if !self.owned_settings.due() {
            return;
        }
        let written = owned_settings::operator_written(&self.config, self.synchronous_applied.as_deref());
        let put_backs = match self.postgres.file_settings().await {
            Ok(rows) => owned_settings::put_backs(&rows, &written),
            Err(error) => {
                return tracing::warn!(instance = %self.config.name, %error, "could not read the owned settings")
            }
        };
        if put_backs.is_empty() {
            return;
        }
        if let Err(error) = self.postgres.put_back(&put_backs).await {
            return tracing::warn!(instance = %self.config.name, %error, "could not put the owned settings back");
        }
        // Names only: a value (archive_command, primary_conninfo) may hold a secret.
        let settings: Vec<String> = put_backs.iter().map(|put_back| put_back.name().to_string()).collect();
        tracing::warn!(instance = %self.config.name, ?settings, "owned settings changed by ALTER SYSTEM: put back");
        self.owned_settings.put_back(settings);
    }

    /// `dbservice.dev/reload-requested-at`: a new value reloads the server (its configuration
    /// files, pg_hba.conf and certificates are read again; nothing restarts).
    async fn keep_reload(&mut self, desired: &Desired) {
        let requested = &desired.reload_requested;
        match &self.reloaded {
            None => self.reloaded = Some(requested.clone()),
            Some(done) if done == requested => {}
            Some(_) if requested.is_none() => self.reloaded = Some(None),
            Some(_) => match self.postgres.reload().await {
                Ok(()) => {
                    tracing::info!(instance = %self.config.name, ?requested, "reload requested: configuration reloaded");
                    self.reloaded = Some(requested.clone());
                }
                // Tried again next step.
                Err(error) => tracing::warn!(instance = %self.config.name, %error, "reload requested: reload failed"),
            },
        }
    }

    /// Reloads the server when the kubelet swapped in a renewed certificate: new connections
    /// get it, open ones keep theirs, nothing restarts.
    async fn keep_certificates(&mut self) {
        let Some(files) = &self.config.tls else { return };
        if !self.certificates.changed(files) {
            return;
        }
        match self.postgres.reload().await {
            Ok(()) => {
                tracing::info!(instance = %self.config.name, "server certificate changed: configuration reloaded")
            }
            Err(error) => {
                // Tried again next step.
                self.certificates = CertificateWatch::default();
                tracing::warn!(instance = %self.config.name, %error, "server certificate changed: reload failed");
            }
        }
    }

    fn start(&mut self, role: Role, upstream: Option<&Upstream>) -> Result<(), AgentError> {
        standby::write_required_settings(&self.config)?;
        if let Some(roles) = &self.config.roles {
            write_superuser_rule(&self.config, roles.superuser_network_access)
                .map_err(|error| StandbyError::Files { path: self.config.pgdata.join("pg_hba.conf"), source: error })?;
        }
        crate::instance::tls::write_transport_rule(&self.config)
            .map_err(|error| StandbyError::Files { path: self.config.pgdata.join("pg_hba.conf"), source: error })?;
        // After the operator's blocks: the user's rules go right below them.
        if let Err(error) = self.configuration.before_start(&self.config) {
            // The server starts with the files it has; the next steps try again and reload.
            tracing::warn!(instance = %self.config.name, %error, "could not write spec.postgresql before the start");
        }
        if let Some(files) = &self.config.tls {
            self.certificates.loaded(files);
        }
        self.roles.restart();
        self.slot.reset();
        // A new role may leave slots to drop (a former primary's, of the standbys it had).
        self.slots_checked = None;
        // A clone or a rewind copied the source's value, which names this instance.
        self.synchronous_applied = None;
        self.preferred.reset();
        let at_start = self.synchronous_wanted.as_ref().map(|wanted| match wanted {
            SynchronousStandbys::Fixed(names) => names.clone(),
            // Waits from its first commit for the standbys the operator counts on (a restart of a
            // primary that waited, or a standby promoted while its primary waited).
            SynchronousStandbys::Preferred { members, count, recorded } => {
                let recorded = durability::recorded_members(members, recorded);
                durability::names(&durability::applicable(&recorded, &recorded, *count), *count)
            }
        });
        if let Some(value) = at_start {
            standby::set_auto_conf(&self.config, &[("synchronous_standby_names", value.clone())])?;
            self.synchronous_applied = Some(value);
        }
        self.postgres.start()?;
        self.fenced_at = None;
        self.role = Some(role);
        self.upstream_set = match role {
            Role::Standby => {
                Some(upstream.map(|upstream| standby::conninfo(&self.config, upstream, true)).unwrap_or_default())
            }
            Role::Primary => None,
        };
        Ok(())
    }
}
