//! Harness of the end-to-end suite: a real control plane (tests/cluster/up.sh or any cluster
//! named by KUBECONFIG), the chart installed in URL mode, and the operator as a local process
//! running with a token of the chart's ServiceAccount — like envtest, but with our own chart.

pub mod leader;
pub mod operator;

use dbservice_operator::api::database_service::DatabaseService;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::PostParams;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Root of the repository.
pub fn repository() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The admin kubeconfig: $KUBECONFIG, else the local control plane's.
pub fn admin_kubeconfig() -> Option<PathBuf> {
    let path =
        std::env::var_os("KUBECONFIG").map(PathBuf::from).unwrap_or_else(|| repository().join(".cluster/kubeconfig"));
    // Absolute: tools started in another directory (Prometheus in its work directory) read it too.
    std::fs::canonicalize(path).ok()
}

/// Whether end-to-end tests must run. Under CI=true a missing cluster fails the test loudly;
/// elsewhere the test is skipped with a message.
pub fn cluster_or_skip(test: &str) -> Option<PathBuf> {
    match admin_kubeconfig() {
        Some(path) => Some(path),
        None if std::env::var("CI").as_deref() == Ok("true") => {
            panic!("{test}: no cluster: run `make cluster-up` (or set KUBECONFIG); CI=true forbids skipping")
        }
        None => {
            eprintln!("skipping {test}: no cluster (run `make cluster-up` or set KUBECONFIG)");
            None
        }
    }
}

/// A kube client for a kubeconfig file.
pub async fn client_for(kubeconfig: &Path) -> Client {
    dbservice_operator::admission::tls::install_crypto_provider();
    let kubeconfig = Kubeconfig::read_from(kubeconfig).expect("kubeconfig readable");
    let config =
        Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await.expect("kubeconfig valid");
    Client::try_from(config).expect("client builds")
}

/// Like [`client_for`], without kube-client's retries of 429, 503 and 504: an eviction refused by a
/// PodDisruptionBudget (429) must come back as the refusal, not be retried until allowed (the
/// default retries up to 15 times, backing off up to minutes, so a refused eviction looked like a
/// slow one that went through once the budget allowed it).
pub async fn client_without_retries(kubeconfig: &Path) -> Client {
    dbservice_operator::admission::tls::install_crypto_provider();
    let kubeconfig = Kubeconfig::read_from(kubeconfig).expect("kubeconfig readable");
    let mut config =
        Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await.expect("kubeconfig valid");
    config.default_retry = false;
    Client::try_from(config).expect("client builds")
}

/// Path of a binary of the control plane (kubectl, helm): .cluster/bin first, then PATH.
pub fn tool(name: &str) -> PathBuf {
    let local = repository().join(".cluster/bin").join(name);
    if local.exists() {
        local
    } else {
        PathBuf::from(name)
    }
}

/// The Kubernetes `helm template` renders the chart for (it assumes 1.20 unless told, older than the
/// chart's kubeVersion): the minor of the crate's API types (k8s-openapi's `v1_37`).
pub const CHART_KUBE_VERSION: &str = "v1.37.0";

/// Runs kubectl with the admin kubeconfig; panics with its stderr on failure.
pub fn kubectl(arguments: &[&str]) -> String {
    let output = Command::new(tool("kubectl"))
        .args(arguments)
        .env("KUBECONFIG", admin_kubeconfig().expect("cluster"))
        .output()
        .expect("kubectl runs");
    assert!(output.status.success(), "kubectl {arguments:?} failed: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).to_string()
}

/// Polls `check` until it returns Some, or panics after `timeout` naming `what`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

static NAMESPACE_COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A namespace owned by one test, deleted when the test ends (pass or fail).
pub struct TestNamespace {
    /// Namespace name.
    pub name: String,
}

impl TestNamespace {
    /// Creates `e2e-<prefix>-<pid>-<n>`.
    pub async fn create(client: &Client, prefix: &str) -> Self {
        let name = format!("e2e-{prefix}-{}-{}", std::process::id(), NAMESPACE_COUNTER.fetch_add(1, Ordering::SeqCst));
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let namespace: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap();
        namespaces.create(&PostParams::default(), &namespace).await.expect("namespace created");
        // Service accounts are created by the controller-manager; pods need the default one.
        let accounts: Api<k8s_openapi::api::core::v1::ServiceAccount> = Api::namespaced(client.clone(), &name);
        eventually("the default ServiceAccount", Duration::from_secs(30), || async {
            accounts.get_opt("default").await.ok().flatten()
        })
        .await;
        Self { name }
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        // Finalizers of DatabaseServices left behind would keep the namespace Terminating
        // if the operator is gone; the shared operator outlives every test, so plain delete is enough.
        let _ = Command::new(tool("kubectl"))
            .args(["delete", "namespace", &self.name, "--wait=false", "--ignore-not-found"])
            .env("KUBECONFIG", admin_kubeconfig().unwrap_or_default())
            .output();
    }
}

/// A DatabaseService from YAML.
pub fn database_from_yaml(yaml: &str) -> DatabaseService {
    serde_saphyr::from_str(yaml).expect("valid DatabaseService YAML")
}

/// A typical DatabaseService named `name`.
pub fn sample_database(name: &str) -> DatabaseService {
    database_from_yaml(&format!(
        "apiVersion: dbservice.dev/v1\nkind: DatabaseService\nmetadata:\n  name: {name}\nspec:\n  version: \"16.4\"\n  storageSize: 1Gi\n  databaseName: app\n  username: app_user\n"
    ))
}

/// The Secret `s3` with the test store's access key (moto accepts any), as a user creates it for
/// `credentialsSecret`.
pub async fn create_store_secret(client: &Client, namespace: &str) {
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client.clone(), namespace);
    let mut secret = k8s_openapi::api::core::v1::Secret::default();
    secret.metadata.name = Some("s3".into());
    secret.string_data = Some(
        [("accessKeyId", "test-key"), ("secretAccessKey", "test-secret")]
            .into_iter()
            .map(|(key, value)| (key.to_string(), value.to_string()))
            .collect(),
    );
    secrets.create(&PostParams::default(), &secret).await.unwrap();
}

/// The ledger of DatabaseService `name` (empty while it has none).
pub async fn ledger_entries(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Vec<dbservice_operator::operator::ledger::LedgerEntry> {
    use dbservice_operator::operator::ledger::{parse, LEDGER_KEY};
    let config_maps: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
        kube::Api::namespaced(client.clone(), namespace);
    config_maps
        .get_opt(&format!("{name}-ledger"))
        .await
        .ok()
        .flatten()
        .and_then(|config_map| config_map.data?.get(LEDGER_KEY).cloned())
        .map(|text| parse(&text))
        .unwrap_or_default()
}
