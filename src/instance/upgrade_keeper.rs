//! The agent's part in an in-place major upgrade (issue 24): data of an older major than this
//! pod's binaries is upgraded by `pg_upgrade` on the primary, re-cloned on a standby, and the
//! way back is taken by an agent of the older major. The data directory steps themselves are
//! [`crate::instance::major_upgrade`]; this module decides when to run them, from what the
//! operator allows ([`UpgradeInstruction`]) and what the data and the binaries are.

use crate::api::major_upgrade::{InstanceUpgradeReport, InstanceUpgradeState, UpgradeStep, PREVIOUS_BINDIR_VARIABLE};
use crate::instance::major_upgrade::{self, UpgradeMethod, UpgradeTarget};
use crate::instance::InstanceConfig;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

/// Longest `vacuumdb --analyze-in-stages` run.
const ANALYZE_TIMEOUT: Duration = Duration::from_secs(6 * 3600);

/// What the operator allows this instance, from `status.majorUpgrade`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UpgradeInstruction {
    /// The instance whose data `pg_upgrade` upgrades (the primary when the upgrade began).
    pub primary: String,
    /// The primary's pod may run pg_upgrade now (the backup, if any, is done).
    pub allowed: bool,
    /// The primary runs the new major: standbys of an older major clone it again.
    pub primary_upgraded: bool,
}

/// The instruction of an upgrade in progress, None once it completed or was rolled back.
pub fn instruction(status: &crate::api::major_upgrade::MajorUpgradeStatus) -> Option<UpgradeInstruction> {
    use crate::api::major_upgrade::MajorUpgradePhase;
    let (allowed, primary_upgraded) = match status.phase {
        MajorUpgradePhase::BackingUp => (false, false),
        MajorUpgradePhase::Upgrading => (true, false),
        MajorUpgradePhase::Recloning => (true, true),
        // A standby of the old major that comes back later (a volume restored, say) is cloned.
        MajorUpgradePhase::Completed => (false, true),
        MajorUpgradePhase::RollingBack | MajorUpgradePhase::RolledBack => return None,
    };
    Some(UpgradeInstruction { primary: status.primary.clone(), allowed, primary_upgraded })
}

/// What [`UpgradeKeeper::before_start`] decided.
#[derive(Debug, PartialEq, Eq)]
pub enum BeforeStart {
    /// The data and the binaries are of one major (or were made so): start as usual.
    Start,
    /// Do not start the server this step.
    Hold,
    /// Standby data of an older major: clone the upgraded primary afresh (the old copy is removed).
    Reclone,
}

/// File in an upgraded data directory holding the upgrade's report (JSON): an agent that
/// restarts after the upgrade still tells the operator what happened.
pub const REPORT_FILE: &str = "dbservice-major-upgrade.json";

/// Keeps the upgrade state of one instance.
#[derive(Default)]
pub struct UpgradeKeeper {
    /// Major of this pod's `postgres`, read once.
    binaries_major: Option<u32>,
    /// What the next report says.
    report: Option<InstanceUpgradeReport>,
    /// pg_upgrade ran in this agent's life (its statistics rebuild is due).
    upgraded_here: bool,
    /// The first ready primary was seen (the commit and the rebuild are done once).
    settled: bool,
    /// The statistics rebuild running after the upgrade, with its progress.
    analyze: Option<tokio::sync::watch::Receiver<String>>,
}

impl UpgradeKeeper {
    /// The report's `majorUpgrade`.
    pub fn report(&self) -> Option<InstanceUpgradeReport> {
        let mut report = self.report.clone()?;
        if let Some(progress) = &self.analyze {
            report.analyze = Some(progress.borrow().clone());
        }
        Some(report)
    }

    async fn binaries_major(&mut self, config: &InstanceConfig) -> Option<u32> {
        if self.binaries_major.is_none() {
            match major_upgrade::binaries_major(config.os_user, &config.pg_bin).await {
                Ok(major) => self.binaries_major = Some(major),
                Err(error) => tracing::warn!(instance = %config.name, %error, "could not read the server's major"),
            }
        }
        self.binaries_major
    }

    /// Before a server starts on initialized data: finishes an interrupted swap, takes the way
    /// back when the data is of a newer major than the binaries (a rolled-back upgrade), and
    /// upgrades or re-clones data of an older major when the operator allows it.
    pub async fn before_start(
        &mut self,
        config: &InstanceConfig,
        instruction: Option<&UpgradeInstruction>,
        standby_data: bool,
    ) -> BeforeStart {
        let pgdata = &config.pgdata;
        if let Err(error) = major_upgrade::resume(pgdata) {
            tracing::warn!(instance = %config.name, %error, "could not finish an interrupted upgrade swap");
            return BeforeStart::Hold;
        }
        let (Some(data), Some(binaries)) = (major_upgrade::data_major(pgdata), self.binaries_major(config).await)
        else {
            return BeforeStart::Start;
        };
        if data > binaries {
            return self.way_back(config, data, binaries);
        }
        if data == binaries {
            if self.report.is_none() && !standby_data {
                // Upgraded by an earlier agent of this pod: what it did.
                let text = std::fs::read_to_string(pgdata.join(REPORT_FILE)).unwrap_or_default();
                self.report = serde_json::from_str(&text).ok();
            }
            return BeforeStart::Start;
        }
        let waiting = |message: &str| InstanceUpgradeReport {
            state: InstanceUpgradeState::Waiting,
            from_major: data,
            to_major: binaries,
            steps: Vec::new(),
            message: Some(message.to_string()),
            analyze: None,
        };
        let Some(instruction) = instruction else {
            self.report = Some(waiting("data of an older major and no upgrade in progress"));
            return BeforeStart::Hold;
        };
        if standby_data {
            if instruction.primary_upgraded {
                return BeforeStart::Reclone;
            }
            self.report = Some(waiting("waiting for the primary's upgrade"));
            return BeforeStart::Hold;
        }
        if !instruction.allowed || instruction.primary != config.name {
            self.report = Some(waiting("waiting for the operator"));
            return BeforeStart::Hold;
        }
        if self.report.as_ref().is_some_and(|report| report.state == InstanceUpgradeState::Failed) {
            // Failed once: the operator rolls back; trying again would only repeat the failure.
            return BeforeStart::Hold;
        }
        self.upgrade(config, data, binaries).await
    }

    fn way_back(&mut self, config: &InstanceConfig, data: u32, binaries: u32) -> BeforeStart {
        match major_upgrade::swap_back(&config.pgdata) {
            Ok(true) => {
                tracing::warn!(instance = %config.name, data_major = data, binaries_major = binaries, "upgrade rolled back: the previous data directory is back");
                self.report = None;
                BeforeStart::Start
            }
            Ok(false) => {
                tracing::error!(instance = %config.name, data_major = data, binaries_major = binaries, "data of a newer major than this image, and no way back: not starting");
                BeforeStart::Hold
            }
            Err(error) => {
                tracing::error!(instance = %config.name, %error, "could not swap the previous data directory back");
                BeforeStart::Hold
            }
        }
    }

    async fn upgrade(&mut self, config: &InstanceConfig, data: u32, binaries: u32) -> BeforeStart {
        let Some(previous_bin) = std::env::var_os(PREVIOUS_BINDIR_VARIABLE).map(PathBuf::from) else {
            self.fail(
                config,
                data,
                binaries,
                format!("{PREVIOUS_BINDIR_VARIABLE} is not set: the previous major's binaries are missing"),
            );
            return BeforeStart::Hold;
        };
        let method = match std::env::var(crate::api::major_upgrade::UPGRADE_METHOD_VARIABLE).as_deref() {
            Ok("link") => UpgradeMethod::Link,
            _ => UpgradeMethod::Copy,
        };
        let own_initdb_arguments = initdb_arguments_from_environment();
        tracing::info!(instance = %config.name, from = data, to = binaries, ?method, "upgrading the data directory with pg_upgrade");
        let target = UpgradeTarget {
            pgdata: &config.pgdata,
            bin: &config.pg_bin,
            previous_bin: &previous_bin,
            superuser: &config.superuser,
            os_user: config.os_user,
        };
        match major_upgrade::upgrade(target, &own_initdb_arguments, method).await {
            Ok(outcome) => {
                tracing::info!(instance = %config.name, steps = ?outcome.steps, "pg_upgrade done: starting the new major");
                if method == UpgradeMethod::Link {
                    // The old cluster shares the new one's files: no way back once it starts.
                    if let Err(error) = major_upgrade::commit(&config.pgdata) {
                        tracing::warn!(instance = %config.name, %error, "could not end the way back of a link-mode upgrade");
                    }
                }
                let report = InstanceUpgradeReport {
                    state: InstanceUpgradeState::Upgraded,
                    from_major: outcome.from_major,
                    to_major: outcome.to_major,
                    steps: outcome
                        .steps
                        .iter()
                        .map(|(name, seconds)| UpgradeStep {
                            name: name.to_string(),
                            milliseconds: (seconds * 1000.0).round() as u64,
                        })
                        .collect(),
                    message: None,
                    analyze: None,
                };
                let file = config.pgdata.join(REPORT_FILE);
                if let Err(error) = std::fs::write(&file, serde_json::to_vec(&report).unwrap_or_default()) {
                    tracing::warn!(instance = %config.name, %error, "could not keep the upgrade's report");
                }
                self.report = Some(report);
                self.upgraded_here = true;
                BeforeStart::Start
            }
            Err(error) => {
                self.fail(config, data, binaries, error.to_string());
                BeforeStart::Hold
            }
        }
    }

    fn fail(&mut self, config: &InstanceConfig, data: u32, binaries: u32, message: String) {
        tracing::error!(instance = %config.name, %message, "major upgrade failed: the old data directory is as it was");
        self.report = Some(InstanceUpgradeReport {
            state: InstanceUpgradeState::Failed,
            from_major: data,
            to_major: binaries,
            steps: Vec::new(),
            message: Some(message),
            analyze: None,
        });
    }

    /// The new major's server answers as primary: the upgrade is committed (the previous data
    /// directory goes; from now on the way back is the pre-upgrade backup) and the planner's
    /// statistics, which pg_upgrade does not carry over, are rebuilt in the background.
    pub fn primary_ready(&mut self, config: &InstanceConfig) {
        if self.settled {
            return;
        }
        let mut committed_now = false;
        if major_upgrade::uncommitted(&config.pgdata) {
            if let Err(error) = major_upgrade::commit(&config.pgdata) {
                // Tried again next step.
                tracing::warn!(instance = %config.name, %error, "could not commit the major upgrade");
                return;
            }
            tracing::info!(instance = %config.name, "major upgrade committed: the previous data directory is removed");
            committed_now = true;
        }
        self.settled = true;
        if committed_now || self.upgraded_here {
            self.analyze = Some(analyze_in_stages(config));
        }
    }

    /// A standby was cloned from the upgraded primary: nothing left to report.
    pub fn recloned(&mut self) {
        self.report = None;
    }
}

/// The database's own initdb arguments, as the entrypoint gets them (`POSTGRES_INITDB_ARGS`).
fn initdb_arguments_from_environment() -> Vec<String> {
    std::env::var("POSTGRES_INITDB_ARGS")
        .map(|arguments| arguments.split_whitespace().map(String::from).collect())
        .unwrap_or_default()
}

/// Runs `vacuumdb --all --analyze-in-stages` over the local socket as the superuser; its progress
/// ("stage N of 3", then "done" or "failed: ...") in the returned channel.
fn analyze_in_stages(config: &InstanceConfig) -> tokio::sync::watch::Receiver<String> {
    let (sender, receiver) = tokio::sync::watch::channel("starting".to_string());
    // No PGOPTIONS: vacuumdb pins an empty search_path on connect (since PostgreSQL 10.3), and
    // its ANALYZE runs for hours on a big database, past any statement_timeout we would set.
    let mut command = tokio::process::Command::new(config.pg_bin.join("vacuumdb"));
    command
        .args(["--all", "--analyze-in-stages", "--host"])
        .arg(&config.socket_dir)
        .args(["--port", &config.port.to_string(), "--username", &config.superuser])
        .env("PGSSLMODE", "disable")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if let Some((uid, gid)) = config.os_user {
        command.uid(uid).gid(gid);
    }
    let name = config.name.clone();
    tokio::spawn(async move {
        use tokio::io::AsyncBufReadExt;
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(error) => {
                sender.send_replace(format!("failed: {error}"));
                return;
            }
        };
        // vacuumdb says each stage on stdout ("Generating minimal optimizer statistics (1 target)").
        let stdout = child.stdout.take();
        let progress = async {
            let Some(stdout) = stdout else { return };
            let mut lines = tokio::io::BufReader::new(stdout).lines();
            let mut stage = 0usize;
            let mut last_message = String::new();
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(message) = line.rsplit(": ").next().filter(|message| message.starts_with("Generating")) {
                    if message != last_message {
                        last_message = message.to_string();
                        stage += 1;
                        sender.send_replace(format!("stage {} of 3", stage.min(3)));
                    }
                }
            }
        };
        let finished = tokio::time::timeout(ANALYZE_TIMEOUT, async {
            progress.await;
            child.wait_with_output().await
        })
        .await;
        let outcome = match finished {
            Ok(Ok(output)) if output.status.success() => "done".to_string(),
            Ok(Ok(output)) => format!("failed: {}", String::from_utf8_lossy(&output.stderr).trim()),
            Ok(Err(error)) => format!("failed: {error}"),
            Err(_) => format!("failed: no result within {ANALYZE_TIMEOUT:?}"),
        };
        tracing::info!(instance = %name, %outcome, "vacuumdb --analyze-in-stages");
        sender.send_replace(outcome.chars().take(60).collect());
    });
    receiver
}
