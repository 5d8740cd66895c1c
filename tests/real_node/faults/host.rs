//! The real node's processes, seen from the host (the tests run as root on the node's machine):
//! a pod's agent, watchdog and PostgreSQL by their environment (`POD_NAMESPACE`, `POD_NAME`), signals
//! to them, and commands in a pod's network namespace (iptables, tc).

use std::process::Command;

/// One process of the host.
#[derive(Clone, Debug)]
pub struct HostProcess {
    /// Host pid.
    pub pid: u32,
    /// Its arguments.
    pub arguments: Vec<String>,
}

fn split_nul(bytes: &[u8]) -> Vec<String> {
    bytes
        .split(|byte| *byte == 0)
        .filter(|part| !part.is_empty())
        .map(|part| String::from_utf8_lossy(part).into())
        .collect()
}

/// Every host process of instance `pod` in `namespace` (the agent, its watchdog, PostgreSQL).
pub fn processes_of(namespace: &str, pod: &str) -> Vec<HostProcess> {
    let wanted = [format!("POD_NAMESPACE={namespace}"), format!("POD_NAME={pod}")];
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<u32>().ok()) else { continue };
        let Ok(environment) = std::fs::read(entry.path().join("environ")) else { continue };
        let environment = split_nul(&environment);
        if !wanted.iter().all(|variable| environment.contains(variable)) {
            continue;
        }
        let arguments = std::fs::read(entry.path().join("cmdline")).map(|bytes| split_nul(&bytes)).unwrap_or_default();
        found.push(HostProcess { pid, arguments });
    }
    found
}

/// The instance agent (`instance run`) of `pod`.
pub fn agent(namespace: &str, pod: &str) -> Option<HostProcess> {
    processes_of(namespace, pod)
        .into_iter()
        .find(|process| process.arguments.windows(2).any(|pair| pair[0] == "instance" && pair[1] == "run"))
}

/// The postmaster of `pod`: the agent's own child started with `-D`. Another `postgres -D` of the
/// pod (a tool's server, one left from an earlier start) is not the one serving.
pub fn postmaster(namespace: &str, pod: &str) -> Option<HostProcess> {
    let processes = processes_of(namespace, pod);
    let agent = processes
        .iter()
        .find(|process| process.arguments.windows(2).any(|pair| pair[0] == "instance" && pair[1] == "run"))?
        .pid;
    let mut servers: Vec<HostProcess> = processes
        .into_iter()
        .filter(|process| {
            process.arguments.first().is_some_and(|program| program.ends_with("/postgres"))
                && process.arguments.get(1).is_some_and(|flag| flag == "-D")
        })
        .collect();
    let all = format!("{servers:?}");
    servers.retain(|process| parent(process.pid) == Some(agent));
    assert!(servers.len() <= 1, "{namespace}/{pod}: more than one postmaster of agent {agent}: {all}");
    servers.pop()
}

/// The parent of `pid` (from /proc/PID/stat).
pub fn parent(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()
}

/// The state letter of `pid` (`T` when stopped), from /proc/PID/stat.
pub fn state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.split_whitespace().next()?.chars().next()
}

/// Whether `pid` still runs (a zombie serves nothing: it counts as gone).
pub fn running(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next());
    state.is_some_and(|state| state != "Z" && state != "X")
}

/// Sends `signal` to `pid`.
pub fn signal(pid: u32, signal: i32) {
    // SAFETY: kill(2) only sends a signal.
    unsafe {
        libc::kill(pid as i32, signal);
    }
}

/// Runs `command` in the network namespace of `pid` and asserts it succeeds.
pub fn in_network_of(pid: u32, command: &[&str]) {
    let output = Command::new("nsenter")
        .args(["-t", &pid.to_string(), "-n", "--"])
        .args(command)
        .output()
        .expect("nsenter runs");
    assert!(
        output.status.success(),
        "{command:?} in the network namespace of {pid}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}
