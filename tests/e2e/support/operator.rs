//! The operator under test as a local process, and the shared environment every test uses:
//! the chart installed in URL mode pointing at that process, which runs with a token of the
//! chart's ServiceAccount (so a missing RBAC rule fails a test, not a user's cluster).

use super::{admin_kubeconfig, kubectl, repository, tool};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Namespace and release of the chart installed for the suite.
pub const RELEASE_NAMESPACE: &str = "dbservice-system";
/// Helm release name (the chart's defaults match it).
pub const RELEASE: &str = "dbservice-operator";
/// The chart's ServiceAccount.
pub const SERVICE_ACCOUNT: &str = "dbservice-operator";
/// The Lease the chart's Role allows.
pub const CHART_LEASE: &str = "dbservice-operator-leader";
/// Label that keeps a DatabaseService away from the shared operator (tests that run their own).
pub const ISOLATION_LABEL: &str = "dbservice.dev/e2e-isolated";

/// A free TCP port on 127.0.0.1.
pub fn free_port() -> u16 {
    crate::ports::unused_port()
}

/// Directory for logs of processes started by the suite.
pub fn log_directory() -> PathBuf {
    let directory = repository().join("target/e2e-logs");
    std::fs::create_dir_all(&directory).unwrap();
    directory
}

/// A plain HTTP GET on 127.0.0.1:port; returns (status, body).
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_secs(2)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(stream, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let status = response.split_whitespace().nth(1)?.parse().ok()?;
    let body = response.split_once("\r\n\r\n").map(|(_, body)| body.to_string()).unwrap_or_default();
    Some((status, body))
}

/// Sum of a metric's samples whose line contains every one of `filters`.
pub fn metric_sum(metrics: &str, name: &str, filters: &[&str]) -> f64 {
    metrics
        .lines()
        // The exact sample name: `dbservice_leader` must not also count `dbservice_leadership_changes_total`.
        .filter(|line| {
            !line.starts_with('#') && line.strip_prefix(name).is_some_and(|rest| rest.starts_with([' ', '{']))
        })
        .filter(|line| filters.iter().all(|filter| line.contains(filter)))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Settings of one operator process.
#[derive(Clone, Debug)]
pub struct OperatorOptions {
    /// Lease identity.
    pub identity: String,
    /// Namespace of the Lease.
    pub lease_namespace: String,
    /// Lease duration in seconds.
    pub lease_duration_seconds: u64,
    /// Only this namespace (empty: all).
    pub watch_namespace: String,
    /// DatabaseService label selector.
    pub selector: String,
    /// Lease name (the chart's Role only allows its own).
    pub lease_name: String,
    /// More flags.
    pub extra_arguments: Vec<String>,
}

/// Starts an operator of its own for `namespace` (its Lease there, only DatabaseServices labelled
/// with the isolation label), named after `purpose`, with `extra_arguments`.
pub fn isolated_operator(namespace: &str, purpose: &str, extra_arguments: Vec<String>) -> OperatorProcess {
    crate::support::leader::grant_lease_rights(namespace);
    let work = log_directory().join(format!("{purpose}-{}", std::process::id()));
    let options = OperatorOptions {
        identity: format!("{purpose}-{}", std::process::id()),
        lease_namespace: namespace.into(),
        lease_duration_seconds: 15,
        watch_namespace: namespace.into(),
        selector: format!("{ISOLATION_LABEL}={namespace}"),
        lease_name: CHART_LEASE.into(),
        extra_arguments,
    };
    OperatorProcess::start(&options, &service_account_kubeconfig(&work), &shared().certificates, free_port())
}

/// A running operator process.
pub struct OperatorProcess {
    child: Child,
    /// Plain-HTTP probe and metrics port.
    pub probe_port: u16,
    /// Log file.
    pub log: PathBuf,
}

impl OperatorProcess {
    /// Starts `dbservice-operator run` with the given kubeconfig and certificates.
    pub fn start(options: &OperatorOptions, kubeconfig: &Path, certificates: &Path, webhook_port: u16) -> Self {
        Self::start_with_certificate_paths(options, kubeconfig, certificates, webhook_port)
    }

    /// Like [`Self::start`]; `certificates` may be empty when the operator manages them.
    pub fn start_with_certificate_paths(
        options: &OperatorOptions,
        kubeconfig: &Path,
        certificates: &Path,
        webhook_port: u16,
    ) -> Self {
        let probe_port = free_port();
        let log = log_directory().join(format!("operator-{}.log", options.identity));
        let log_file = std::fs::File::create(&log).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_dbservice-operator"))
            .arg("run")
            .args(["--listen", &format!("127.0.0.1:{webhook_port}")])
            .args(["--probe-listen", &format!("127.0.0.1:{probe_port}")])
            .args(["--tls-cert", certificates.join("tls.crt").to_str().unwrap()])
            .args(["--tls-key", certificates.join("tls.key").to_str().unwrap()])
            .args([
                "--namespace",
                &options.lease_namespace,
                "--identity",
                &options.identity,
                "--lease-name",
                &options.lease_name,
            ])
            .args(["--lease-duration-seconds", &options.lease_duration_seconds.to_string()])
            .args(["--watch-namespace", &options.watch_namespace, "--selector", &options.selector])
            // Fast self-healing so the suite runs in minutes, not hours.
            .args(["--progress-deadline-seconds", "25", "--unhealthy-threshold-seconds", "5"])
            .args([
                "--restart-backoff-seconds",
                "10",
                "--restart-backoff-cap-seconds",
                "80",
                "--restore-probe-seconds",
                "15",
            ])
            // As the chart runs it: every PostgreSQL pod gets the instance agent (kwok pods run
            // nothing, so no agent reports and the primary stays pod 0), and the operator creates
            // the agents' ServiceAccount, Role, RoleBinding and Lease under the chart's RBAC.
            .args(["--instance-image", "localhost/dbservice-operator:kwok"])
            .args(&options.extra_arguments)
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", "info,dbservice_operator=debug,kube_runtime=warn")
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .expect("the operator binary starts");
        let process = Self { child, probe_port, log };
        process.orphan_guard();
        let deadline = Instant::now() + Duration::from_secs(60);
        while http_get(probe_port, "/readyz").map(|(status, _)| status) != Some(200) {
            assert!(
                Instant::now() < deadline,
                "operator {} not ready in 60 s; log:\n{}",
                options.identity,
                process.log_tail()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        process
    }

    /// Kills the operator when the test binary exits (statics are never dropped).
    fn orphan_guard(&self) {
        let script = format!(
            "while kill -0 {} 2>/dev/null; do sleep 1; done; kill -9 {} 2>/dev/null",
            std::process::id(),
            self.child.id()
        );
        let _ = Command::new("sh")
            .args(["-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
    }

    /// The last lines of the log, for failure messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// The metrics text, if the process answers.
    pub fn metrics(&self) -> Option<String> {
        http_get(self.probe_port, "/metrics").map(|(_, body)| body)
    }

    /// Whether this process says it holds the Lease.
    pub fn is_leader(&self) -> bool {
        self.metrics().is_some_and(|metrics| metric_sum(&metrics, "dbservice_leader", &[]) >= 1.0)
    }

    /// Peak resident memory of the process in KiB (VmHWM), for the record.
    pub fn peak_memory_kib(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).ok()?;
        let line = status.lines().find(|line| line.starts_with("VmHWM:"))?;
        line.split_whitespace().nth(1)?.parse().ok()
    }

    /// Writes the controller made, by its own count.
    pub fn writes(&self) -> f64 {
        self.metrics().map(|metrics| metric_sum(&metrics, "dbservice_controller_writes_total", &[])).unwrap_or(0.0)
    }

    /// Sends SIGTERM and measures how long the process takes to exit; after `limit` it is killed
    /// and the error carries the log's tail.
    pub fn terminate_timed(&mut self, limit: Duration) -> Result<Duration, String> {
        let sent = Instant::now();
        let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        while self.child.try_wait().ok().flatten().is_none() {
            if sent.elapsed() > limit {
                let _ = self.child.kill();
                return Err(format!("still running {limit:?} after SIGTERM; log:\n{}", self.log_tail()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(sent.elapsed())
    }

    /// Sends a signal by name and waits for the process to exit.
    pub fn signal(&mut self, signal: &str) {
        let _ = Command::new("kill").args([&format!("-{signal}"), &self.child.id().to_string()]).status();
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.child.try_wait().ok().flatten().is_none() {
            assert!(Instant::now() < deadline, "operator did not exit after SIG{signal}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for OperatorProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What every test shares: the chart in URL mode and one operator process.
pub struct SharedEnvironment {
    /// The operator serving the registered webhooks and reconciling non-isolated objects.
    pub operator: OperatorProcess,
    /// ca.crt, tls.crt, tls.key of the webhook server.
    pub certificates: PathBuf,
}

static SHARED: OnceLock<SharedEnvironment> = OnceLock::new();

/// The shared environment, set up on first use (chart install, token, operator start).
pub fn shared() -> &'static SharedEnvironment {
    SHARED.get_or_init(|| {
        let work = log_directory().join(format!("shared-{}", std::process::id()));
        let certificates = work.join("certs");
        let bundle =
            dbservice_operator::certificates::generate_bundle(&["localhost".into()], &["127.0.0.1".parse().unwrap()])
                .unwrap();
        dbservice_operator::certificates::write_bundle(&bundle, &certificates).unwrap();
        let webhook_port = free_port();
        install_chart_url_mode(webhook_port, &bundle.ca_certificate);
        let operator_kubeconfig = service_account_kubeconfig(&work);
        let options = OperatorOptions {
            identity: format!("e2e-shared-{}", std::process::id()),
            lease_namespace: RELEASE_NAMESPACE.into(),
            lease_duration_seconds: 15,
            watch_namespace: String::new(),
            selector: format!("!{ISOLATION_LABEL}"),
            lease_name: CHART_LEASE.into(),
            extra_arguments: vec![],
        };
        let operator = OperatorProcess::start(&options, &operator_kubeconfig, &certificates, webhook_port);
        let deadline = Instant::now() + Duration::from_secs(60);
        while !operator.is_leader() {
            assert!(Instant::now() < deadline, "shared operator never became leader; log:\n{}", operator.log_tail());
            std::thread::sleep(Duration::from_millis(200));
        }
        SharedEnvironment { operator, certificates }
    })
}

/// Runs helm with the admin kubeconfig; panics with its output on failure.
pub fn helm(arguments: &[&str]) -> String {
    let output = Command::new(tool("helm"))
        .args(arguments)
        .env("KUBECONFIG", admin_kubeconfig().expect("cluster"))
        .output()
        .expect("helm runs");
    assert!(
        output.status.success(),
        "helm {arguments:?} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).to_string()
}

fn install_chart_url_mode(webhook_port: u16, ca_certificate: &str) {
    use base64::Engine;
    let chart = repository().join("charts/dbservice-operator");
    let ca_bundle = base64::engine::general_purpose::STANDARD.encode(ca_certificate);
    helm(&[
        "upgrade",
        "--install",
        RELEASE,
        chart.to_str().unwrap(),
        "--namespace",
        RELEASE_NAMESPACE,
        "--create-namespace",
        "--set",
        "deployment.enabled=false",
        "--set",
        &format!("webhook.url=https://127.0.0.1:{webhook_port}"),
        "--set",
        &format!("webhook.caBundle={ca_bundle}"),
        "--wait",
        "--timeout",
        "120s",
    ]);
    kubectl(&["wait", "--for=condition=Established", "crd/databaseservices.dbservice.dev", "--timeout=60s"]);
}

/// A kubeconfig holding a TokenRequest token of the chart's ServiceAccount.
pub fn service_account_kubeconfig(directory: &Path) -> PathBuf {
    service_account_kubeconfig_for(directory, SERVICE_ACCOUNT, RELEASE_NAMESPACE)
}

/// A kubeconfig holding a TokenRequest token of `account` in `namespace`.
pub fn service_account_kubeconfig_for(directory: &Path, account: &str, namespace: &str) -> PathBuf {
    service_account_kubeconfig_with(directory, account, namespace, &[])
}

/// Like [`service_account_kubeconfig_for`], with more `kubectl create token` flags (e.g. the
/// object the token is bound to).
pub fn service_account_kubeconfig_with(directory: &Path, account: &str, namespace: &str, flags: &[&str]) -> PathBuf {
    let mut arguments = vec!["create", "token", account, "-n", namespace, "--duration=6h"];
    arguments.extend_from_slice(flags);
    let token = kubectl(&arguments);
    let admin: serde_json::Value =
        serde_saphyr::from_str(&std::fs::read_to_string(admin_kubeconfig().unwrap()).unwrap()).unwrap();
    let cluster = &admin["clusters"][0]["cluster"];
    // Copy the cluster entry as it is (CA data or CA file path), only the user changes.
    let cluster: serde_json::Value = serde_json::to_value(cluster).unwrap();
    let kubeconfig = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "e2e", "cluster": cluster}],
        "users": [{"name": account, "user": {"token": token.trim()}}],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": account}}],
        "current-context": "e2e",
    });
    std::fs::create_dir_all(directory).unwrap();
    let path = directory.join(format!("{account}.kubeconfig"));
    std::fs::write(&path, serde_saphyr::to_string(&kubeconfig).unwrap()).unwrap();
    path
}
