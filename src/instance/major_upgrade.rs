//! In-place major upgrade of a stopped data directory with `pg_upgrade` (issue 24), the step the
//! agent runs before it starts a server of a newer major on older data. The previous major's
//! binaries come from the previous image (copied into the pod); the new ones are the agent's own.
//!
//! The way back is built into the directories: the new cluster is made beside the old one
//! (`pgdata.next`), in copy mode the old one is never written, and only a complete new cluster
//! replaces it, by two renames, with a marker file:
//! - a failure before the swap removes `pgdata.next`: the old directory is as it was;
//! - after the swap the old directory waits as `pgdata.previous`; an agent of the previous major
//!   (after a rollback) swaps back with [`swap_back`] while the marker is there;
//! - [`commit`] (the new server accepted writes) removes marker and previous directory: from then
//!   on the way back is recovery from the pre-upgrade backup.
//!
//! Link mode (`pg_upgrade --link`) needs no second copy of the data, but the old cluster shares
//! its files with the new one: the way back ends when the new server first starts, so the marker
//! is removed before that start ([`UpgradeMethod::Link`]).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::process::Command;

/// Marker in the new data directory between the swap and [`commit`].
pub const MARKER_FILE: &str = "dbservice-major-upgrade";
/// Longest `pg_upgrade` run (copying a large database takes its time).
const UPGRADE_TIMEOUT: Duration = Duration::from_secs(6 * 3600);
/// Longest run of the other tools (initdb, pg_controldata, a start and stop).
const TOOL_TIMEOUT: Duration = Duration::from_secs(300);
/// Longest reason kept from pg_upgrade's output (it goes into a condition and an Event).
const MAX_REASON_CHARACTERS: usize = 600;
/// The servers started during an upgrade archive nothing: the pod's archive settings already
/// name the new system's archive, which the old system's WAL must not claim (see `store::owner`).
const NO_ARCHIVING: &str = "-c archive_mode=off";
/// Ports of the servers pg_upgrade starts (unix socket only, in the work directory).
const OLD_PORT: &str = "50432";
const NEW_PORT: &str = "50433";

/// A failed step of an upgrade; the message names the step and carries the tool's own words.
#[derive(Debug, thiserror::Error)]
pub enum MajorUpgradeError {
    /// A tool could not run, failed or took too long.
    #[error("{step}: {detail}")]
    Step {
        /// What was being done.
        step: &'static str,
        /// The tool's message.
        detail: String,
    },
    /// `pg_upgrade --check` refused the old cluster.
    #[error("pg_upgrade --check refused the upgrade: {0}")]
    Refused(String),
    /// The data volume has no room for the new cluster.
    #[error(
        "not enough free space on the data volume for a {method} upgrade: it needs about {needed_megabytes} MiB, \
         {free_megabytes} MiB are free; grow spec.storageSize{hint}"
    )]
    NoSpace {
        /// `copy` or `link`.
        method: &'static str,
        /// What the new cluster needs.
        needed_megabytes: u64,
        /// What the volume has.
        free_megabytes: u64,
        /// Another way out, if any.
        hint: &'static str,
    },
    /// A directory could not be read, written or renamed.
    #[error("{what} {path}: {source}")]
    Files {
        /// What was done.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

/// How pg_upgrade moves the data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UpgradeMethod {
    /// Copies every file: twice the space, the old cluster untouched until [`commit`].
    Copy,
    /// Hard links: little space and time; no way back once the new server started.
    Link,
}

/// Room kept free beyond the new cluster's relation files: initdb's cluster (its catalogs and
/// first WAL segments) and the WAL the new server writes before its first checkpoint.
const NEW_CLUSTER_ROOM: u64 = 96 * 1024 * 1024;

/// Bytes the new cluster needs on the data volume: in copy mode a second copy of every relation
/// file (everything but the WAL, which pg_upgrade does not carry), in link mode only hard links.
pub fn space_needed(method: UpgradeMethod, relation_bytes: u64) -> u64 {
    match method {
        UpgradeMethod::Copy => relation_bytes.saturating_add(NEW_CLUSTER_ROOM),
        UpgradeMethod::Link => NEW_CLUSTER_ROOM,
    }
}

/// Refuses an upgrade the data volume has no room for, before anything is written: pg_upgrade
/// would fill the volume half way through, and a full volume also stops the old server.
fn check_space(method: UpgradeMethod, relation_bytes: u64, free_bytes: u64) -> Result<(), MajorUpgradeError> {
    let needed = space_needed(method, relation_bytes);
    if free_bytes >= needed {
        return Ok(());
    }
    let megabytes = |bytes: u64| bytes.div_ceil(1024 * 1024);
    Err(MajorUpgradeError::NoSpace {
        method: if method == UpgradeMethod::Link { "link" } else { "copy" },
        needed_megabytes: megabytes(needed),
        free_megabytes: free_bytes / (1024 * 1024),
        hint: if method == UpgradeMethod::Copy { ", or use spec.upgradeMethod: link" } else { "" },
    })
}

/// Bytes of the files under `directory` except its WAL (`pg_wal`), without following links.
fn relation_bytes(directory: &Path) -> Result<u64, MajorUpgradeError> {
    let mut total = 0u64;
    let mut pending = vec![directory.to_path_buf()];
    while let Some(current) = pending.pop() {
        for entry in std::fs::read_dir(&current).map_err(files("reading", &current))? {
            let entry = entry.map_err(files("reading", &current))?;
            let kind = entry.file_type().map_err(files("reading", &entry.path()))?;
            if kind.is_dir() {
                if current != directory || entry.file_name() != "pg_wal" {
                    pending.push(entry.path());
                }
            } else if kind.is_file() {
                total = total.saturating_add(entry.metadata().map(|metadata| metadata.len()).unwrap_or_default());
            }
        }
    }
    Ok(total)
}

/// The cluster to upgrade and the binaries of both majors.
#[derive(Clone, Copy, Debug)]
pub struct UpgradeTarget<'a> {
    /// The stopped data directory (of the previous major).
    pub pgdata: &'a Path,
    /// The new major's binaries.
    pub bin: &'a Path,
    /// The previous major's binaries.
    pub previous_bin: &'a Path,
    /// The bootstrap superuser of both clusters.
    pub superuser: &'a str,
    /// uid and gid to run the tools as when the agent runs as root (tests).
    pub os_user: Option<(u32, u32)>,
}

/// The three data directories of an upgrade.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UpgradePaths {
    /// The data directory the server runs on.
    pub data: PathBuf,
    /// The new cluster while it is made.
    pub next: PathBuf,
    /// The old cluster after the swap.
    pub previous: PathBuf,
}

impl UpgradePaths {
    /// The directories beside `pgdata`.
    pub fn of(pgdata: &Path) -> UpgradePaths {
        let with_suffix = |suffix: &str| {
            let mut name = pgdata.file_name().unwrap_or_default().to_os_string();
            name.push(suffix);
            pgdata.with_file_name(name)
        };
        UpgradePaths { data: pgdata.to_path_buf(), next: with_suffix(".next"), previous: with_suffix(".previous") }
    }
}

/// What one upgrade did and how long each step took (seconds), for the status and the ledger.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct UpgradeOutcome {
    /// Major of the old cluster.
    pub from_major: u32,
    /// Major of the new one.
    pub to_major: u32,
    /// (step, seconds) in order.
    pub steps: Vec<(&'static str, f64)>,
}

/// The major of the data in `pgdata` (its PG_VERSION), None when there is none.
pub fn data_major(pgdata: &Path) -> Option<u32> {
    std::fs::read_to_string(pgdata.join("PG_VERSION")).ok()?.trim().parse().ok()
}

/// The major of the `postgres` in `bin`.
pub async fn binaries_major(os_user: Option<(u32, u32)>, bin: &Path) -> Result<u32, MajorUpgradeError> {
    let output = run(os_user, bin, "postgres", &["--version".into()], TOOL_TIMEOUT, None).await?;
    parse_version_major(&output).ok_or_else(|| step_error("reading the server version", output))
}

/// The major of `postgres --version` output ("postgres (PostgreSQL) 17.2 (Debian ...)").
fn parse_version_major(output: &str) -> Option<u32> {
    let rest = output.split("(PostgreSQL)").nth(1)?.trim();
    rest.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

/// The initdb arguments the new cluster needs to match the old one's control data (checksums,
/// WAL segment size), after the database's own initdb arguments.
fn initdb_arguments(control: &str, own: &[String], superuser: &str, new_major: u32) -> Vec<String> {
    let field = |name: &str| {
        control.lines().find_map(|line| line.strip_prefix(name).map(|rest| rest.trim_start_matches(':').trim()))
    };
    let mut arguments: Vec<String> = own
        .iter()
        .filter(|argument| !argument.contains("checksums") && !argument.starts_with("--wal-segsize"))
        .cloned()
        .collect();
    arguments.push(format!("--username={superuser}"));
    arguments.extend(["--auth-local=trust".into(), "--auth-host=scram-sha-256".into()]);
    // Checksums must match; 18's initdb turns them on unless told otherwise (and only 18 has
    // --no-data-checksums).
    let checksums = field("Data page checksum version").is_some_and(|version| version != "0");
    if checksums {
        arguments.push("--data-checksums".into());
    } else if new_major >= 18 {
        arguments.push("--no-data-checksums".into());
    }
    if let Some(bytes) = field("Bytes per WAL segment").and_then(|bytes| bytes.parse::<u64>().ok()) {
        arguments.push(format!("--wal-segsize={}", bytes / (1024 * 1024)));
    }
    arguments
}

/// The problem reports pg_upgrade names in its output (such as `loadable_libraries.txt`: which
/// library is missing, in which database), their first lines each; read before the new cluster
/// that holds them is removed.
fn problem_reports(output: &str) -> Vec<String> {
    output
        .lines()
        .map(str::trim)
        .filter(|line| line.starts_with('/') && line.ends_with(".txt"))
        .filter_map(|path| std::fs::read_to_string(path).ok())
        .map(|text| text.lines().map(str::trim).filter(|line| !line.is_empty()).take(10).collect::<Vec<_>>().join("; "))
        .filter(|text| !text.is_empty())
        .collect()
}

/// `text` without pg_upgrade's sentences "A list of ... is in the file:" (wrapped across lines in
/// its output): the file goes with the discarded new cluster; its contents follow instead.
fn without_file_pointers(text: &str) -> String {
    let mut text = text.to_string();
    while let Some(start) = text.find("A list of ") {
        let Some(length) = text[start..].find("in the file:") else { break };
        text.replace_range(start..start + length + "in the file:".len(), "");
    }
    text.trim().to_string()
}

/// pg_upgrade's reason from its output: the failed check and its explanation (without the
/// report file's path, which goes with the discarded new cluster), or its last lines; then what
/// the report files said (`reports`).
fn refusal(output: &str, reports: &[String]) -> String {
    let lines: Vec<&str> = output.lines().map(str::trim).collect();
    let failed = lines.iter().position(|line| line.ends_with("fatal") || line.contains("failed check:"));
    let explained = failed.map(|failed| {
        let check = lines[failed].split_once("failed check:").map(|(_, check)| check.trim().to_string());
        let explanation = lines[failed + 1..]
            .iter()
            .take_while(|line| !line.starts_with("Failure, exiting"))
            .filter(|line| !line.is_empty() && !line.starts_with('/') && !line.starts_with("A list of "))
            .filter(|line| !line.ends_with("checks failed:"))
            .copied();
        check.into_iter().chain(explanation.map(String::from)).collect::<Vec<_>>().join(" ")
    });
    let text = match explained.filter(|text| !text.is_empty()) {
        Some(text) => text,
        None => {
            let mut last: Vec<&str> = lines.iter().rev().filter(|line| !line.is_empty()).take(3).copied().collect();
            last.reverse();
            last.join(" ")
        }
    };
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let text = without_file_pointers(&text);
    let text = std::iter::once(text).chain(reports.iter().cloned()).collect::<Vec<_>>().join(" ");
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match text.char_indices().nth(MAX_REASON_CHARACTERS) {
        Some((end, _)) => format!("{}...", &text[..end]),
        None => text,
    }
}

/// Upgrades the stopped cluster of `target` to the major of its new binaries, and swaps the new
/// cluster in (`own_initdb_arguments`: the database's `spec.bootstrap.initdb`). The old cluster is
/// left as it was on every error.
pub async fn upgrade(
    target: UpgradeTarget<'_>,
    own_initdb_arguments: &[String],
    method: UpgradeMethod,
) -> Result<UpgradeOutcome, MajorUpgradeError> {
    let UpgradeTarget { pgdata, bin, previous_bin, os_user, .. } = target;
    let paths = UpgradePaths::of(pgdata);
    let mut outcome = UpgradeOutcome {
        from_major: data_major(&paths.data).unwrap_or_default(),
        to_major: binaries_major(os_user, bin).await?,
        steps: Vec::new(),
    };
    let work = paths.data.with_file_name("pg_upgrade.work");
    for stale in [&paths.next, &work] {
        remove_if_present(stale)?;
    }
    create_directory(os_user, &work)?;
    let data = paths.data.display().to_string();

    stop_cleanly(&target, &data, &work, &mut outcome).await?;
    let control =
        run(os_user, previous_bin, "pg_controldata", &["-D".into(), data.clone()], TOOL_TIMEOUT, None).await?;
    if let Some(free) = crate::instance::postgres::free_bytes(&paths.data) {
        if let Err(error) = check_space(method, relation_bytes(&paths.data)?, free) {
            remove_if_present(&work)?;
            return Err(error);
        }
    }

    let started = Instant::now();
    let mut initdb = vec!["-D".to_string(), paths.next.display().to_string()];
    initdb.extend(initdb_arguments(&control, own_initdb_arguments, target.superuser, outcome.to_major));
    let made = run(os_user, bin, "initdb", &initdb, TOOL_TIMEOUT, Some(&work)).await;
    if let Err(error) = made {
        remove_if_present(&paths.next)?;
        return Err(error);
    }
    outcome.steps.push(("initdb", started.elapsed().as_secs_f64()));

    run_pg_upgrade(&target, &paths, &work, method, &mut outcome).await?;
    swap_in(os_user, &paths, method, &outcome)?;
    remove_if_present(&work)?;
    Ok(outcome)
}

/// pg_upgrade wants a clean shutdown: when the old cluster was not shut down cleanly, the
/// previous major runs its crash recovery, then stops cleanly.
async fn stop_cleanly(
    target: &UpgradeTarget<'_>,
    data: &str,
    work: &Path,
    outcome: &mut UpgradeOutcome,
) -> Result<(), MajorUpgradeError> {
    let UpgradeTarget { previous_bin, os_user, .. } = *target;
    let started = Instant::now();
    let control =
        run(os_user, previous_bin, "pg_controldata", &["-D".into(), data.to_string()], TOOL_TIMEOUT, None).await?;
    if control.lines().any(|line| line.starts_with("Database cluster state") && line.ends_with("shut down")) {
        return Ok(());
    }
    let socket =
        format!("-c listen_addresses='' -c unix_socket_directories={} -p {OLD_PORT} {NO_ARCHIVING}", work.display());
    let start = ["-D".into(), data.to_string(), "-w".into(), "-o".into(), socket, "start".into()];
    let stop = ["-D".into(), data.to_string(), "-w".into(), "-m".into(), "fast".into(), "stop".into()];
    run(os_user, previous_bin, "pg_ctl", &start, TOOL_TIMEOUT, Some(work)).await?;
    run(os_user, previous_bin, "pg_ctl", &stop, TOOL_TIMEOUT, Some(work)).await?;
    outcome.steps.push(("clean stop by the previous major", started.elapsed().as_secs_f64()));
    Ok(())
}

/// `pg_upgrade --check`, then `pg_upgrade` into the new cluster made beside the old one; on a
/// failure the new cluster goes (and link mode's change to the old one is undone), with
/// pg_upgrade's reason.
async fn run_pg_upgrade(
    target: &UpgradeTarget<'_>,
    paths: &UpgradePaths,
    work: &Path,
    method: UpgradeMethod,
    outcome: &mut UpgradeOutcome,
) -> Result<(), MajorUpgradeError> {
    let UpgradeTarget { bin, previous_bin, superuser, os_user, .. } = *target;
    let mut arguments = vec![
        format!("--old-bindir={}", previous_bin.display()),
        format!("--new-bindir={}", bin.display()),
        format!("--old-datadir={}", paths.data.display()),
        format!("--new-datadir={}", paths.next.display()),
        format!("--username={superuser}"),
        format!("--socketdir={}", work.display()),
        format!("--old-port={OLD_PORT}"),
        format!("--new-port={NEW_PORT}"),
        format!("--old-options={NO_ARCHIVING}"),
        format!("--new-options={NO_ARCHIVING}"),
    ];
    // Copy is pg_upgrade's default (its --copy flag only exists from 16 on).
    if method == UpgradeMethod::Link {
        arguments.push("--link".into());
    }
    let started = Instant::now();
    let mut check = arguments.clone();
    check.push("--check".into());
    if let Err(error) = run(os_user, bin, "pg_upgrade", &check, UPGRADE_TIMEOUT, Some(work)).await {
        let error = match error {
            MajorUpgradeError::Step { detail, .. } => {
                MajorUpgradeError::Refused(refusal(&detail, &problem_reports(&detail)))
            }
            other => other,
        };
        remove_if_present(&paths.next)?;
        return Err(error);
    }
    outcome.steps.push(("pg_upgrade --check", started.elapsed().as_secs_f64()));
    let started = Instant::now();
    if let Err(error) = run(os_user, bin, "pg_upgrade", &arguments, UPGRADE_TIMEOUT, Some(work)).await {
        let error = match error {
            MajorUpgradeError::Step { step, detail } => {
                MajorUpgradeError::Step { step, detail: refusal(&detail, &problem_reports(&detail)) }
            }
            other => other,
        };
        remove_if_present(&paths.next)?;
        if method == UpgradeMethod::Link {
            undo_link_mode(&paths.data)?;
        }
        return Err(error);
    }
    outcome.steps.push(("pg_upgrade", started.elapsed().as_secs_f64()));
    Ok(())
}

/// Swaps the complete new cluster in: the configuration files and the marker go into it, the old
/// cluster waits as `pgdata.previous` (see [`swap_back`] and [`commit`]).
fn swap_in(
    os_user: Option<(u32, u32)>,
    paths: &UpgradePaths,
    method: UpgradeMethod,
    outcome: &UpgradeOutcome,
) -> Result<(), MajorUpgradeError> {
    // The operator's and the user's configuration files come along (pg_upgrade moves only data).
    for entry in std::fs::read_dir(&paths.data).map_err(files("reading", &paths.data))? {
        let entry = entry.map_err(files("reading", &paths.data))?;
        let name = entry.file_name();
        if name.to_string_lossy().ends_with(".conf") && entry.file_type().is_ok_and(|kind| kind.is_file()) {
            let target = paths.next.join(&name);
            std::fs::copy(entry.path(), &target).map_err(files("copying into", &target))?;
            chown(os_user, &target);
        }
    }
    let marker = paths.next.join(MARKER_FILE);
    let text = format!("{} {}\n", outcome.from_major, if method == UpgradeMethod::Link { "link" } else { "copy" });
    std::fs::write(&marker, text).map_err(files("writing", &marker))?;
    chown(os_user, &marker);
    remove_if_present(&paths.previous)?;
    std::fs::rename(&paths.data, &paths.previous).map_err(files("moving aside", &paths.data))?;
    std::fs::rename(&paths.next, &paths.data).map_err(files("moving in", &paths.next))?;
    sync_directory(&paths.data);
    Ok(())
}

/// Puts back what link mode did to the old cluster when pg_upgrade failed: it renames
/// `global/pg_control` to `pg_control.old` so that the old cluster is not started by mistake.
fn undo_link_mode(data: &Path) -> Result<(), MajorUpgradeError> {
    let (old, control) = (data.join("global/pg_control.old"), data.join("global/pg_control"));
    if old.exists() && !control.exists() {
        std::fs::rename(&old, &control).map_err(files("restoring", &control))?;
    }
    Ok(())
}

/// Finishes what an interrupted agent left (called before anything reads the data directory): a
/// swap half done is completed, a new cluster never swapped in is removed.
pub fn resume(pgdata: &Path) -> Result<(), MajorUpgradeError> {
    let paths = UpgradePaths::of(pgdata);
    if !paths.next.exists() {
        return Ok(());
    }
    if !paths.data.exists() && paths.previous.exists() && paths.next.join(MARKER_FILE).exists() {
        std::fs::rename(&paths.next, &paths.data).map_err(files("moving in", &paths.next))?;
        return Ok(());
    }
    remove_if_present(&paths.next)
}

/// Whether the data directory is an upgrade not committed yet (the way back still open).
pub fn uncommitted(pgdata: &Path) -> bool {
    pgdata.join(MARKER_FILE).exists() && UpgradePaths::of(pgdata).previous.exists()
}

/// The way back, for an agent of the previous major: when the data directory is an upgraded
/// cluster whose upgrade is not committed, the previous cluster comes back (the new one, which
/// never accepted writes, is removed). True when it swapped back.
pub fn swap_back(pgdata: &Path) -> Result<bool, MajorUpgradeError> {
    if !uncommitted(pgdata) {
        return Ok(false);
    }
    let paths = UpgradePaths::of(pgdata);
    remove_if_present(&paths.next)?;
    std::fs::rename(&paths.data, &paths.next).map_err(files("moving aside", &paths.data))?;
    std::fs::rename(&paths.previous, &paths.data).map_err(files("moving back", &paths.previous))?;
    undo_link_mode(&paths.data)?;
    remove_if_present(&paths.next)?;
    sync_directory(&paths.data);
    Ok(true)
}

/// Ends the way back: the marker and the previous cluster go (the new server accepted writes).
pub fn commit(pgdata: &Path) -> Result<(), MajorUpgradeError> {
    let marker = pgdata.join(MARKER_FILE);
    if marker.exists() {
        std::fs::remove_file(&marker).map_err(files("removing", &marker))?;
    }
    remove_if_present(&UpgradePaths::of(pgdata).previous)
}

fn remove_if_present(path: &Path) -> Result<(), MajorUpgradeError> {
    match std::fs::remove_dir_all(path) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => Err(files("removing", path)(error)),
        _ => Ok(()),
    }
}

fn create_directory(os_user: Option<(u32, u32)>, path: &Path) -> Result<(), MajorUpgradeError> {
    std::fs::create_dir_all(path).map_err(files("creating", path))?;
    chown(os_user, path);
    Ok(())
}

fn chown(os_user: Option<(u32, u32)>, path: &Path) {
    if let Some((uid, gid)) = os_user {
        let _ = std::os::unix::fs::chown(path, Some(uid), Some(gid));
    }
}

/// Makes the renames durable (best effort: a crash before it is handled by [`resume`]).
fn sync_directory(path: &Path) {
    if let Some(parent) = path.parent() {
        if let Ok(directory) = std::fs::File::open(parent) {
            let _ = directory.sync_all();
        }
    }
}

fn files(what: &'static str, path: &Path) -> impl Fn(std::io::Error) -> MajorUpgradeError {
    let path = path.to_path_buf();
    move |source| MajorUpgradeError::Files { what, path: path.clone(), source }
}

fn step_error(step: &'static str, detail: String) -> MajorUpgradeError {
    MajorUpgradeError::Step { step, detail }
}

/// Runs `tool` of `bin` as the server's user (in `directory`); its stdout, or its output as the
/// error when it fails.
async fn run(
    os_user: Option<(u32, u32)>,
    bin: &Path,
    tool: &'static str,
    arguments: &[String],
    limit: Duration,
    directory: Option<&Path>,
) -> Result<String, MajorUpgradeError> {
    // No PGOPTIONS: pg_upgrade pins an empty search_path on every connection it makes (and runs
    // pg_dump, which does too); initdb and pg_controldata connect to nothing.
    let mut command = Command::new(bin.join(tool));
    command.args(arguments).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
    if let Some(directory) = directory {
        command.current_dir(directory);
    }
    if let Some((uid, gid)) = os_user {
        command.uid(uid).gid(gid);
    }
    let output = tokio::time::timeout(limit, command.output())
        .await
        .map_err(|_| step_error(tool, format!("no result within {limit:?}")))?
        .map_err(|error| step_error(tool, error.to_string()))?;
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    if output.status.success() {
        return Ok(stdout);
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    Err(step_error(tool, format!("{}\n{stdout}\n{stderr}", output.status)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_directories_sit_beside_the_data_directory() {
        let paths = UpgradePaths::of(Path::new("/var/lib/postgresql/data/pgdata"));
        assert_eq!(paths.next, Path::new("/var/lib/postgresql/data/pgdata.next"));
        assert_eq!(paths.previous, Path::new("/var/lib/postgresql/data/pgdata.previous"));
    }

    #[test]
    fn the_version_major_is_read_from_any_build() {
        assert_eq!(parse_version_major("postgres (PostgreSQL) 17.2 (Debian 17.2-1.pgdg120+1)\n"), Some(17));
        assert_eq!(parse_version_major("postgres (PostgreSQL) 18.6\n"), Some(18));
        assert_eq!(parse_version_major("postgres (PostgreSQL) 15beta1\n"), Some(15));
        assert_eq!(parse_version_major("nonsense"), None);
    }

    #[test]
    fn the_new_cluster_matches_the_old_checksums_and_segment_size() {
        let control = "Database cluster state:               shut down\nBytes per WAL segment:                33554432\nData page checksum version:           0\n";
        let own = vec!["--locale=C.UTF-8".to_string(), "--data-checksums".to_string(), "--wal-segsize=16".to_string()];
        let arguments = initdb_arguments(control, &own, "postgres", 18);
        assert_eq!(
            arguments,
            [
                "--locale=C.UTF-8",
                "--username=postgres",
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "--no-data-checksums",
                "--wal-segsize=32"
            ]
        );
        let checksummed = "Data page checksum version:           1\n";
        assert!(initdb_arguments(checksummed, &[], "postgres", 17).contains(&"--data-checksums".to_string()));
        let before_18 = initdb_arguments(control, &own, "postgres", 17);
        assert!(!before_18.iter().any(|argument| argument.contains("checksums")), "{before_18:?}");
    }

    #[test]
    fn copy_mode_needs_room_for_a_second_copy_and_link_mode_only_for_a_new_cluster() {
        let gib = 1024 * 1024 * 1024;
        assert!(check_space(UpgradeMethod::Copy, gib, 2 * gib).is_ok());
        let refused = check_space(UpgradeMethod::Copy, gib, gib).unwrap_err().to_string();
        assert_eq!(
            refused,
            "not enough free space on the data volume for a copy upgrade: it needs about 1120 MiB, 1024 MiB are free; \
             grow spec.storageSize, or use spec.upgradeMethod: link"
        );
        assert!(check_space(UpgradeMethod::Link, gib, 200 * 1024 * 1024).is_ok());
        let refused = check_space(UpgradeMethod::Link, gib, 10 * 1024 * 1024).unwrap_err().to_string();
        assert!(refused.ends_with("grow spec.storageSize"), "{refused}");
    }

    #[test]
    fn the_relation_bytes_leave_out_the_wal() {
        let directory = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(directory.path().join("base/1")).unwrap();
        std::fs::create_dir_all(directory.path().join("pg_wal")).unwrap();
        std::fs::write(directory.path().join("base/1/1259"), vec![0u8; 8192]).unwrap();
        std::fs::write(directory.path().join("PG_VERSION"), "15\n").unwrap();
        std::fs::write(directory.path().join("pg_wal/000000010000000000000001"), vec![0u8; 65536]).unwrap();
        assert_eq!(relation_bytes(directory.path()).unwrap(), 8192 + 3);
    }

    #[test]
    fn the_refusal_is_the_failed_checks_explanation() {
        // pg_upgrade 16's layout.
        let output = "Checking for reg* data types in user tables                   fatal\n\n\
            Your installation contains one of the reg* data types in user tables.\n\
            These data types reference system OIDs.\n\
            A list of the problem columns is in the file:\n    /data/pgdata.next/tables_using_reg.txt\n\nFailure, exiting\n";
        assert_eq!(
            refusal(output, &[]),
            "Your installation contains one of the reg* data types in user tables. These data types reference system OIDs."
        );
        // pg_upgrade 17's.
        let output = "Checking data type usage                                      failed check: Checking for reg* data types in user tables\n\n\
            Data type checks failed: \nYour installation contains one of the reg* data types in user tables.\n\n\
            A list of the problem columns is in the file:\n    /tmp/b/tables_using_reg.txt\n\nFailure, exiting";
        assert_eq!(
            refusal(output, &[]),
            "Checking for reg* data types in user tables Your installation contains one of the reg* data types in user tables."
        );
        assert_eq!(refusal("exit status: 1\nsomething broke\n", &[]), "exit status: 1 something broke");
        assert!(refusal(&"word ".repeat(500), &[]).ends_with("..."));
    }

    #[test]
    fn a_missing_library_is_named_from_pg_upgrades_report_file() {
        let directory = tempfile::tempdir().unwrap();
        let report = directory.path().join("loadable_libraries.txt");
        std::fs::write(
            &report,
            "could not load library \"$libdir/adminpack\": ERROR:  could not access file \"$libdir/adminpack\": No such file or directory\nIn database: app\n\n",
        )
        .unwrap();
        // pg_upgrade 17's layout.
        let output = format!(
            "Checking for presence of required libraries                   fatal\n\n\
             Your installation references loadable libraries that are missing from the\n\
             new installation.  You can add these libraries to the new installation,\n\
             or remove the functions using them from the old installation.  A list of\n\
             problem libraries is in the file:\n    {}\n\nFailure, exiting\n",
            report.display()
        );
        let reports = problem_reports(&output);
        assert_eq!(
            refusal(&output, &reports),
            "Your installation references loadable libraries that are missing from the new installation. You can \
             add these libraries to the new installation, or remove the functions using them from the old \
             installation. could not load library \"$libdir/adminpack\": ERROR: could not access file \"$libdir/adminpack\": \
             No such file or directory; In database: app"
        );
        assert!(problem_reports("    /nowhere/loadable_libraries.txt\n").is_empty());
    }

    #[test]
    fn an_interrupted_swap_is_finished_and_an_unfinished_cluster_removed() {
        let root = tempfile::tempdir().unwrap();
        let pgdata = root.path().join("pgdata");
        let paths = UpgradePaths::of(&pgdata);
        // Interrupted between the two renames: the new cluster moves in.
        std::fs::create_dir_all(&paths.previous).unwrap();
        std::fs::create_dir_all(&paths.next).unwrap();
        std::fs::write(paths.next.join(MARKER_FILE), "15 copy\n").unwrap();
        resume(&pgdata).unwrap();
        assert!(pgdata.join(MARKER_FILE).exists() && !paths.next.exists());
        assert!(uncommitted(&pgdata));
        // Interrupted before the swap: the half-made cluster goes, the data stays.
        std::fs::create_dir_all(&paths.next).unwrap();
        resume(&pgdata).unwrap();
        assert!(!paths.next.exists() && pgdata.exists());
    }

    #[test]
    fn the_way_back_swaps_until_the_commit_and_never_after() {
        let root = tempfile::tempdir().unwrap();
        let pgdata = root.path().join("pgdata");
        let paths = UpgradePaths::of(&pgdata);
        std::fs::create_dir_all(&paths.previous).unwrap();
        std::fs::write(paths.previous.join("PG_VERSION"), "15\n").unwrap();
        std::fs::create_dir_all(&pgdata).unwrap();
        std::fs::write(pgdata.join("PG_VERSION"), "17\n").unwrap();
        std::fs::write(pgdata.join(MARKER_FILE), "15 copy\n").unwrap();
        assert!(swap_back(&pgdata).unwrap());
        assert_eq!(data_major(&pgdata), Some(15));
        assert!(!paths.previous.exists() && !paths.next.exists());
        assert!(!swap_back(&pgdata).unwrap(), "nothing to swap back to any more");

        std::fs::rename(&pgdata, &paths.previous).unwrap();
        std::fs::create_dir_all(&pgdata).unwrap();
        std::fs::write(pgdata.join("PG_VERSION"), "17\n").unwrap();
        std::fs::write(pgdata.join(MARKER_FILE), "15 copy\n").unwrap();
        commit(&pgdata).unwrap();
        assert!(!uncommitted(&pgdata) && !paths.previous.exists());
        assert!(!swap_back(&pgdata).unwrap(), "a committed upgrade has no way back");
        assert_eq!(data_major(&pgdata), Some(17));
    }
}
