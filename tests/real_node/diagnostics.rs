//! What a failed real-node test leaves behind: when a test panics, the state of its namespace (the
//! DatabaseService's status, pods, Leases, the last lines of every PostgreSQL container and of the
//! test's writers, and the operator's lines about it) is printed before the namespace goes, so
//! that a failure seen once in CI can be explained from its output.

use crate::support::operator::RELEASE_NAMESPACE;
use crate::support::{admin_kubeconfig, tool};
use std::cell::RefCell;
use std::process::Command;
use std::sync::Once;

thread_local! {
    /// The namespaces of the test running on this thread (`#[tokio::test]` runs on its own thread).
    static WATCHED: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

static HOOK: Once = Once::new();

/// Prints `namespace`'s state should the test on this thread panic.
pub fn on_panic_describe(namespace: &str) {
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            previous(info);
            let namespaces = WATCHED.with(|watched| watched.borrow().clone());
            for namespace in namespaces {
                describe(&namespace);
            }
        }));
    });
    WATCHED.with(|watched| watched.borrow_mut().push(namespace.to_string()));
}

fn kubectl_text(arguments: &[&str]) -> String {
    let Some(kubeconfig) = admin_kubeconfig() else { return String::new() };
    match Command::new(tool("kubectl")).args(arguments).env("KUBECONFIG", kubeconfig).output() {
        Ok(output) => String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr),
        Err(error) => format!("kubectl: {error}"),
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn describe(namespace: &str) {
    eprintln!("==== [diagnostics] namespace {namespace}");
    let status =
        kubectl_text(&["-n", namespace, "get", "dbs", "-o", "jsonpath={range .items[*]}{.status}{\"\\n\"}{end}"]);
    eprintln!("-- status\n{status}");
    eprintln!("-- pods\n{}", kubectl_text(&["-n", namespace, "get", "pods", "-o", "wide", "--show-labels"]));
    let leases = "jsonpath={range .items[*]}{.metadata.name} {.spec}{\"\\n\"}{end}";
    eprintln!("-- leases\n{}", kubectl_text(&["-n", namespace, "get", "leases", "-o", leases]));
    let pods = kubectl_text(&["-n", namespace, "get", "pods", "-l", "app.kubernetes.io/name=postgresql", "-o", "name"]);
    for pod in pods.lines().filter(|line| line.starts_with("pod/")) {
        let logs = kubectl_text(&["-n", namespace, "logs", pod, "-c", "postgres", "--tail=60"]);
        eprintln!("-- {pod} (last 60 lines)\n{logs}");
    }
    let poolers =
        kubectl_text(&["-n", namespace, "get", "pods", "-l", "app.kubernetes.io/component=pooler", "-o", "name"]);
    for pod in poolers.lines().filter(|line| line.starts_with("pod/")) {
        for container in ["pooler-agent", "pgbouncer-rw", "pgbouncer-ro"] {
            let logs = kubectl_text(&["-n", namespace, "logs", pod, "-c", container, "--tail=25"]);
            eprintln!("-- {pod} {container} (last 25 lines)\n{logs}");
        }
    }
    // The checkers' last attempts tell a client that hangs from a database that does not answer.
    for writer in ["writer", "pinned-writer"] {
        let logs = kubectl_text(&["-n", namespace, "logs", writer, "--tail=15"]);
        eprintln!("-- pod/{writer} (last 15 lines, now {:.1})\n{logs}", crate::failover::epoch_now());
    }
    let operator = kubectl_text(&[
        "-n",
        RELEASE_NAMESPACE,
        "logs",
        "-l",
        "app.kubernetes.io/name=dbservice-operator",
        "--tail=2000",
        "--prefix",
    ]);
    let about: Vec<&str> =
        operator.lines().filter(|line| line.contains(namespace) || line.contains("leader")).collect();
    eprintln!("-- operator lines about it (last 60)\n{}", tail(&about.join("\n"), 60));
    eprintln!("==== [diagnostics] end of {namespace}");
}
