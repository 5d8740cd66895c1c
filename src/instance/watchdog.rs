//! The fence watchdog: kills a primary's PostgreSQL at its Lease's fence deadline, whatever the
//! agent is doing. The agent's own check runs between its steps, and a step can block (a stop, a
//! clone, an API call) or the agent can freeze; the watchdog cannot be held up by any of that.
//!
//! The agent *arms* it after every renewal with the postmaster's pid and the deadline (the send
//! time of the renewal plus the renew deadline), on the machine's monotonic clock, in a small file;
//! it *disarms* it when the server no longer runs as primary. In a pod the watchdog is a separate
//! process (`instance watchdog`), so a frozen or stopped agent still fences in time; in tests that
//! run the agent in-process it is a thread.

use crate::instance::postgres::signal_server;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How often the watchdog reads the deadline: the worst lateness of a fence, far below the
/// `duration - renew_deadline` margin of the Lease (at least 1 s).
pub const POLL: Duration = Duration::from_millis(100);

/// Nanoseconds on CLOCK_MONOTONIC: one clock for every process of the machine, never set back.
pub fn monotonic_nanos() -> u64 {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec we own.
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now);
    }
    (now.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(now.tv_nsec as u64)
}

/// `instant` on [`monotonic_nanos`]'s scale (std's `Instant` is CLOCK_MONOTONIC on Linux, but opaque).
fn nanos_of(instant: Instant) -> u64 {
    let now = Instant::now();
    let nanos = monotonic_nanos();
    match instant.checked_duration_since(now) {
        Some(ahead) => nanos.saturating_add(ahead.as_nanos() as u64),
        None => nanos.saturating_sub(now.duration_since(instant).as_nanos() as u64),
    }
}

/// What the watchdog file says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fence {
    /// Nothing to watch (not a primary).
    Disarmed,
    /// Kill `postmaster` once [`monotonic_nanos`] reaches `deadline`.
    Armed {
        /// Postmaster pid.
        postmaster: u32,
        /// Deadline on the monotonic clock.
        deadline: u64,
    },
}

impl Fence {
    fn text(&self) -> String {
        match self {
            Fence::Disarmed => "disarmed\n".into(),
            Fence::Armed { postmaster, deadline } => format!("armed {postmaster} {deadline}\n"),
        }
    }

    /// Reads the file's text; anything unreadable counts as disarmed (the agent rewrites it).
    pub fn parse(text: &str) -> Fence {
        let mut fields = text.split_whitespace();
        match (
            fields.next(),
            fields.next().and_then(|pid| pid.parse().ok()),
            fields.next().and_then(|at| at.parse().ok()),
        ) {
            (Some("armed"), Some(postmaster), Some(deadline)) => Fence::Armed { postmaster, deadline },
            _ => Fence::Disarmed,
        }
    }
}

/// The agent's side: writes the file when the fence changes (atomically: write, then rename).
#[derive(Debug)]
pub struct FenceFile {
    path: PathBuf,
    written: Option<Fence>,
}

impl FenceFile {
    /// The fence file at `path` (nothing written yet).
    pub fn new(path: PathBuf) -> Self {
        FenceFile { path, written: None }
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Arms the watchdog to kill `postmaster` at `deadline`.
    pub fn arm(&mut self, postmaster: u32, deadline: Instant) -> std::io::Result<()> {
        self.write(Fence::Armed { postmaster, deadline: nanos_of(deadline) })
    }

    /// Disarms it.
    pub fn disarm(&mut self) -> std::io::Result<()> {
        self.write(Fence::Disarmed)
    }

    fn write(&mut self, fence: Fence) -> std::io::Result<()> {
        if self.written == Some(fence) {
            return Ok(());
        }
        let temporary = self.path.with_extension("tmp");
        std::fs::write(&temporary, fence.text())?;
        std::fs::rename(&temporary, &self.path)?;
        self.written = Some(fence);
        Ok(())
    }
}

/// Whether `pid` is a running PostgreSQL server (a recycled pid of something else is never killed).
fn is_postgres(pid: u32) -> bool {
    let Ok(command) = std::fs::read(format!("/proc/{pid}/cmdline")) else { return false };
    let program = command.split(|byte| *byte == 0).next().unwrap_or_default();
    Path::new(std::str::from_utf8(program).unwrap_or_default())
        .file_name()
        .is_some_and(|name| name == "postgres" || name == "postmaster")
}

/// One look at the file: kills the armed postmaster (and its children) if its deadline passed.
/// Returns the pid it killed.
pub fn check(path: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(path).ok()?;
    let Fence::Armed { postmaster, deadline } = Fence::parse(&text) else { return None };
    if monotonic_nanos() < deadline || !is_postgres(postmaster) {
        return None;
    }
    signal_server(postmaster, libc::SIGKILL);
    Some(postmaster)
}

/// Watches `path` every [`POLL`] until `keep_going` says stop, logging each fence.
pub fn watch(path: &Path, keep_going: impl Fn() -> bool) {
    while keep_going() {
        if let Some(killed) = check(path) {
            tracing::warn!(postmaster = killed, file = %path.display(), "fence deadline passed without a renewal: PostgreSQL killed by the watchdog");
        }
        std::thread::sleep(POLL);
    }
}

/// `instance watchdog`: watches `path` until the agent that started it is gone.
pub fn run_process(path: &Path) -> anyhow::Result<()> {
    // SAFETY: getppid has no preconditions.
    let parent = unsafe { libc::getppid() };
    tracing::info!(file = %path.display(), parent, "fence watchdog running");
    // SAFETY: as above.
    watch(path, || unsafe { libc::getppid() } == parent);
    Ok(())
}

/// A running fence watchdog: its own process in a pod, a thread in tests that run agents in-process.
pub enum Watchdog {
    /// `instance watchdog`, a child process.
    Process(std::process::Child),
    /// A thread of this process, and the flag that stops it.
    Thread(std::thread::JoinHandle<()>, std::sync::Arc<std::sync::atomic::AtomicBool>),
}

impl Watchdog {
    /// Starts one on `file`: as `binary instance watchdog`, or as a thread without a binary.
    pub fn start(binary: Option<&std::path::Path>, file: &std::path::Path) -> std::io::Result<Watchdog> {
        match binary {
            Some(binary) => std::process::Command::new(binary)
                .args(["instance", "watchdog", "--fence-file"])
                .arg(file)
                .stdin(std::process::Stdio::null())
                .spawn()
                .map(Watchdog::Process),
            None => {
                let running = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
                let keep_going = running.clone();
                let file = file.to_path_buf();
                let thread = std::thread::Builder::new()
                    .name("fence-watchdog".into())
                    .spawn(move || watch(&file, || keep_going.load(std::sync::atomic::Ordering::Relaxed)))?;
                Ok(Watchdog::Thread(thread, running))
            }
        }
    }

    /// Whether it still runs (a process that ended is reaped).
    pub fn running(&mut self) -> bool {
        match self {
            Watchdog::Process(child) => matches!(child.try_wait(), Ok(None)),
            Watchdog::Thread(thread, _) => !thread.is_finished(),
        }
    }

    /// Stops it.
    pub fn stop(self) {
        match self {
            Watchdog::Process(mut child) => {
                let _ = child.kill();
                let _ = child.wait();
            }
            Watchdog::Thread(thread, running) => {
                running.store(false, std::sync::atomic::Ordering::Relaxed);
                let _ = thread.join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_round_trips_and_garbage_is_disarmed() {
        let armed = Fence::Armed { postmaster: 42, deadline: 1_000 };
        assert_eq!(Fence::parse(&armed.text()), armed);
        assert_eq!(Fence::parse(&Fence::Disarmed.text()), Fence::Disarmed);
        assert_eq!(Fence::parse("armed x 1"), Fence::Disarmed);
        assert_eq!(Fence::parse(""), Fence::Disarmed);
    }

    #[test]
    fn instants_map_onto_the_monotonic_clock() {
        let now = Instant::now();
        let later = now + Duration::from_secs(10);
        let difference = nanos_of(later) as i128 - nanos_of(now) as i128;
        assert!((difference - 10_000_000_000).abs() < 50_000_000, "{difference}");
        assert!(nanos_of(now - Duration::from_millis(1)) < monotonic_nanos());
    }

    #[test]
    fn a_passed_deadline_kills_only_a_postgres_process() {
        let directory = tempfile::tempdir().unwrap();
        let mut file = FenceFile::new(directory.path().join("fence"));
        // A process that is not PostgreSQL is never killed, even past its deadline.
        let mut sleeper = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        file.arm(sleeper.id(), Instant::now() - Duration::from_secs(1)).unwrap();
        assert_eq!(check(file.path()), None);
        assert!(sleeper.try_wait().unwrap().is_none(), "a foreign process was killed");
        // Disarmed: nothing to do.
        file.disarm().unwrap();
        assert_eq!(check(file.path()), None);
        sleeper.kill().unwrap();
        let _ = sleeper.wait();
    }
}
