//! The real node, the chart installed in Deployment mode on it, namespaces whose pods run there, and
//! short-lived psql client pods.

use crate::support::operator::{helm, RELEASE, RELEASE_NAMESPACE};
use crate::support::{admin_kubeconfig, client_for, eventually, kubectl, repository, TestNamespace};
use dbservice_operator::api::database_service::DatabaseService;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};
use std::collections::HashMap;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// What `real-node.sh up` recorded in .cluster/real-node.env, plus the operator image.
#[derive(Debug)]
pub struct RealNode {
    /// Full PostgreSQL version of the default major's image (the full suites'), e.g. 17.11.
    pub postgres_version: String,
    /// The local PostgreSQL image (docker.io/library/postgres:<version>).
    pub postgres_image: String,
    /// The other majors' versions with a local image postgres:<version> (PyPI wheels).
    pub other_versions: Vec<String>,
    /// StorageClass of the real node's volumes.
    pub storage_class: String,
    /// StorageClass of volumes of exactly the claimed size (a loop-mounted file system that a
    /// test can fill).
    pub sized_storage_class: String,
    /// The same in XFS, grown online by the test provisioner when a claim grows (expandable).
    pub growable_storage_class: String,
    /// The operator image built from the Dockerfile (images.sh operator).
    pub operator_image: String,
    /// A busybox image for the node's own checks.
    pub busybox_image: String,
    /// PgBouncer from the host's Debian package (spec.pooler.image).
    pub pgbouncer_image: String,
    /// The node's InternalIP (where the kubelet API listens).
    pub address: String,
}

/// The real node, or None (skip) when there is none; under CI=true a missing node fails loudly.
pub fn real_node_or_skip(test: &str) -> Option<&'static RealNode> {
    static NODE: OnceLock<Option<RealNode>> = OnceLock::new();
    let node = NODE.get_or_init(read_real_node).as_ref();
    if node.is_none() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{test}: no real node (.cluster/real-node.env): run `make cluster-up image`; CI=true forbids skipping"
        );
        eprintln!("skipping {test}: no real node (run `make cluster-up image`)");
    }
    node
}

fn read_real_node() -> Option<RealNode> {
    admin_kubeconfig()?;
    let text = std::fs::read_to_string(repository().join(".cluster/real-node.env")).ok()?;
    let values: HashMap<&str, &str> =
        text.lines().filter(|line| !line.starts_with('#')).filter_map(|line| line.split_once('=')).collect();
    let output = Command::new(repository().join("tests/cluster/images.sh")).arg("name").output().ok()?;
    let operator_image = String::from_utf8_lossy(&output.stdout).trim().to_string();
    let images = Command::new("ctr")
        .args(["--address", "/run/dbservice-containerd/containerd.sock", "-n", "k8s.io", "images", "ls", "-q"])
        .output()
        .expect("ctr runs");
    assert!(
        String::from_utf8_lossy(&images.stdout).lines().any(|image| image == operator_image),
        "the real node has no image {operator_image}: run `make image` (it builds the Dockerfile and imports it)"
    );
    Some(RealNode {
        postgres_version: values.get("REAL_NODE_POSTGRES_VERSION")?.to_string(),
        postgres_image: values.get("REAL_NODE_POSTGRES_IMAGE")?.to_string(),
        other_versions: values
            .get("REAL_NODE_POSTGRES_OTHER_VERSIONS")
            .map(|versions| versions.trim_matches('"').split_whitespace().map(String::from).collect())
            .unwrap_or_default(),
        storage_class: values.get("REAL_NODE_STORAGE_CLASS")?.to_string(),
        sized_storage_class: values.get("REAL_NODE_SIZED_STORAGE_CLASS")?.to_string(),
        growable_storage_class: values.get("REAL_NODE_GROWABLE_STORAGE_CLASS")?.to_string(),
        operator_image,
        busybox_image: values.get("REAL_NODE_BUSYBOX_IMAGE")?.to_string(),
        pgbouncer_image: values.get("REAL_NODE_PGBOUNCER_IMAGE")?.to_string(),
        address: values.get("REAL_NODE_ADDRESS")?.to_string(),
    })
}

impl RealNode {
    /// The default major (of the full suites and the demo).
    pub fn default_major(&self) -> u32 {
        self.postgres_version.split('.').next().and_then(|major| major.parse().ok()).expect("a version")
    }

    /// The full version of the node's image of `major`, default or other.
    pub fn version_of(&self, major: u32) -> String {
        std::iter::once(&self.postgres_version)
            .chain(&self.other_versions)
            .find(|version| version.split('.').next() == Some(major.to_string().as_str()))
            .unwrap_or_else(|| panic!("no image of PostgreSQL {major} on the real node (tests/cluster/images.sh node)"))
            .clone()
    }
}

/// The admin client.
pub async fn admin_client() -> Client {
    client_for(&admin_kubeconfig().expect("cluster")).await
}

/// Runs tests/cluster/real-node.sh with the given arguments.
pub fn real_node_script(arguments: &[&str]) {
    let status = Command::new(repository().join("tests/cluster/real-node.sh")).args(arguments).status().unwrap();
    assert!(status.success(), "real-node.sh {arguments:?} failed");
}

/// The chart as a user installs it, once per test binary: the operator Deployment with the local image
/// (2 replicas), self-managed certificates, webhooks through the Service. Returns the install time.
pub fn install_chart(node: &RealNode) -> Duration {
    static INSTALLED: OnceLock<Duration> = OnceLock::new();
    *INSTALLED.get_or_init(|| {
        let started = Instant::now();
        real_node_script(&["namespace", RELEASE_NAMESPACE]);
        let (repository_name, tag) = node.operator_image.rsplit_once(':').expect("image has a tag");
        let chart = repository().join("charts/dbservice-operator");
        helm(&[
            "upgrade",
            "--install",
            RELEASE,
            chart.to_str().unwrap(),
            "--namespace",
            RELEASE_NAMESPACE,
            "--reset-values",
            "--set",
            &format!("image.repository={repository_name}"),
            "--set",
            &format!("image.tag={tag}"),
            "--set",
            "replicaCount=2",
            // tests/real_node/import.rs keeps the source's roles (issue 37: an administrator's opt-in).
            "--set",
            "operator.allowImportWithSourceRoles=true",
            "--wait",
            "--timeout",
            "300s",
        ]);
        kubectl(&["-n", RELEASE_NAMESPACE, "rollout", "status", "deployment", RELEASE, "--timeout=180s"]);
        started.elapsed()
    })
}

/// The running, not terminating operator pods of the chart, by name.
pub fn operator_pods() -> Vec<String> {
    let list: serde_json::Value = serde_json::from_str(&kubectl(&[
        "-n",
        RELEASE_NAMESPACE,
        "get",
        "pods",
        "-l",
        "app.kubernetes.io/name=dbservice-operator",
        "-o",
        "json",
    ]))
    .unwrap();
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|pod| pod["metadata"]["deletionTimestamp"].is_null() && pod["status"]["phase"] == "Running")
        .filter_map(|pod| pod["metadata"]["name"].as_str().map(str::to_string))
        .collect()
}

/// Tests that need the operator pods to stay put read-lock this; the test that restarts them write-locks it.
pub fn operator_pods_lock() -> &'static tokio::sync::RwLock<()> {
    static LOCK: OnceLock<tokio::sync::RwLock<()>> = OnceLock::new();
    LOCK.get_or_init(|| tokio::sync::RwLock::new(()))
}

/// The holder of the operator's Lease.
pub fn lease_holder() -> String {
    kubectl(&[
        "-n",
        RELEASE_NAMESPACE,
        "get",
        "lease",
        &format!("{RELEASE}-leader"),
        "-o",
        "jsonpath={.spec.holderIdentity}",
    ])
}

/// A test's own namespace (the e2e suite's, deleted when the test ends) whose pods all run on the real
/// node: annotated by `real-node.sh namespace` before any pod is created in it.
pub async fn real_namespace(client: &Client, prefix: &str) -> TestNamespace {
    let namespace = TestNamespace::create(client, &format!("real-{prefix}")).await;
    real_node_script(&["namespace", &namespace.name]);
    crate::diagnostics::on_panic_describe(&namespace.name);
    namespace
}

/// What a pod's container printed so far (`kubectl logs`), empty while it has no log yet (a pod
/// that is not running is no failure: callers poll).
pub fn pod_logs(namespace: &str, pod: &str) -> String {
    let output = std::process::Command::new(crate::support::tool("kubectl"))
        .args(["-n", namespace, "logs", pod])
        .env("KUBECONFIG", crate::support::admin_kubeconfig().expect("cluster"))
        .output()
        .expect("kubectl runs");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A DatabaseService on the real node's storage.
pub fn real_database(node: &RealNode, name: &str, replicas: i32, deletion_policy: &str) -> DatabaseService {
    crate::support::database_from_yaml(&format!(
        "apiVersion: dbservice.dev/v1\nkind: DatabaseService\nmetadata:\n  name: {name}\nspec:\n  version: \"{}\"\n  \
         storageSize: 1Gi\n  databaseName: app\n  username: app_user\n  replicas: {replicas}\n  \
         storageClassName: {}\n  deletionPolicy: {deletion_policy}\n",
        node.postgres_version, node.storage_class
    ))
}

/// Waits until the DatabaseService reports phase Running with `replicas` ready; returns the time taken.
pub async fn wait_running(client: &Client, namespace: &str, name: &str, replicas: i32, timeout: Duration) -> Duration {
    let started = Instant::now();
    let databases: Api<DatabaseService> = Api::namespaced(client.clone(), namespace);
    eventually(&format!("{namespace}/{name} Running with {replicas} ready"), timeout, || async {
        let database = databases.get_opt(name).await.ok().flatten()?;
        let status = database.status?;
        (status.phase.map(|phase| phase.to_string()).as_deref() == Some("Running") && status.ready_replicas == replicas)
            .then_some(())
    })
    .await;
    started.elapsed()
}

/// Where a psql client pod connects.
pub enum Target<'a> {
    /// The Secret's `uri` (the primary Service).
    Uri,
    /// The given Service, with the Secret's user, password and database.
    Service(&'a str),
    /// The superuser Secret's `uri` (the primary Service, as the superuser postgres).
    SuperuserUri,
}

/// Makes a client pod trust the database's CA as an application would: ConfigMap NAME-ca
/// mounted, PGSSLROOTCERT naming its ca.crt (the Secrets' uri asks for sslmode=verify-full).
pub fn trust_database_ca(pod: &mut serde_json::Value, database: &str) {
    let spec = &mut pod["spec"];
    let volume = serde_json::json!({"name": "database-ca", "configMap": {"name": format!("{database}-ca")}});
    match spec["volumes"].as_array_mut() {
        Some(volumes) => volumes.push(volume),
        None => spec["volumes"] = serde_json::json!([volume]),
    }
    for container in spec["containers"].as_array_mut().into_iter().flatten() {
        let mount = serde_json::json!({"name": "database-ca", "mountPath": "/database-ca", "readOnly": true});
        match container["volumeMounts"].as_array_mut() {
            Some(mounts) => mounts.push(mount),
            None => container["volumeMounts"] = serde_json::json!([mount]),
        }
        let variable = serde_json::json!({"name": "PGSSLROOTCERT", "value": "/database-ca/ca.crt"});
        match container["env"].as_array_mut() {
            Some(environment) => environment.push(variable),
            None => container["env"] = serde_json::json!([variable]),
        }
    }
}

static CLIENT_COUNTER: AtomicUsize = AtomicUsize::new(0);

/// Runs `sql` with psql in a pod of `namespace` (credentials from the DatabaseService's Secret, never on a
/// command line). Ok(output) when psql exits 0, Err(log) otherwise. A Service that refuses the
/// connection is tried again for up to 20 s: right after a database says Running, kube-proxy may
/// not have programmed its Service's new endpoint yet (an endpointless Service rejects at once).
pub async fn psql(
    client: &Client,
    node: &RealNode,
    namespace: &str,
    database: &str,
    target: Target<'_>,
    sql: &str,
) -> Result<String, String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match psql_once(client, node, namespace, database, &target, sql).await {
            Err(log) if log.contains("Connection refused") && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            outcome => return outcome,
        }
    }
}

async fn psql_once(
    client: &Client,
    node: &RealNode,
    namespace: &str,
    database: &str,
    target: &Target<'_>,
    sql: &str,
) -> Result<String, String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let name = format!("psql-{}", CLIENT_COUNTER.fetch_add(1, Ordering::SeqCst));
    let secret = format!("{database}-credentials");
    let from_secret = |variable: &str, key: &str| serde_json::json!({"name": variable, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}});
    let (mut command, mut environment) = match target {
        Target::Uri => (vec!["psql".to_string(), "$(DATABASE_URI)".into()], vec![from_secret("DATABASE_URI", "uri")]),
        Target::SuperuserUri => {
            let superuser = format!("{database}-superuser");
            let uri = serde_json::json!({"name": "DATABASE_URI", "valueFrom": {"secretKeyRef": {"name": superuser, "key": "uri"}}});
            (vec!["psql".to_string(), "$(DATABASE_URI)".into()], vec![uri])
        }
        Target::Service(service) => (
            vec!["psql".to_string(), "-h".into(), format!("{service}.{namespace}.svc")],
            vec![
                from_secret("PGUSER", "username"),
                from_secret("PGPASSWORD", "password"),
                from_secret("PGDATABASE", "database"),
                serde_json::json!({"name": "PGSSLMODE", "value": "verify-full"}),
            ],
        ),
    };
    command.extend(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-Atc", sql].map(String::from));
    environment.push(serde_json::json!({"name": "PGCONNECT_TIMEOUT", "value": "5"}));
    let mut pod = serde_json::json!({
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": {"runAsNonRoot": true, "runAsUser": 999},
            "containers": [{"name": "psql", "image": node.postgres_image, "command": command, "env": environment}],
        }
    });
    trust_database_ca(&mut pod, database);
    let pod: Pod = serde_json::from_value(pod).unwrap();
    pods.create(&PostParams::default(), &pod).await.expect("client pod created");
    let phase = eventually(&format!("client pod {namespace}/{name} to finish"), Duration::from_secs(90), || async {
        let phase = pods.get_opt(&name).await.ok().flatten()?.status?.phase?;
        matches!(phase.as_str(), "Succeeded" | "Failed").then_some(phase)
    })
    .await;
    let output = kubectl(&["-n", namespace, "logs", &name]);
    let _ = pods.delete(&name, &DeleteParams::default()).await;
    if phase == "Succeeded" {
        Ok(output)
    } else {
        Err(output)
    }
}

/// Runs `sql` with psql inside instance `pod` over the local socket as the superuser (for
/// server-side views such as pg_stat_replication, and pg_switch_wal()), as an administrator's
/// `kubectl exec` does.
pub fn psql_in_instance(namespace: &str, pod: &str, sql: &str) -> String {
    kubectl(&[
        "-n",
        namespace,
        "exec",
        pod,
        "-c",
        "postgres",
        "--",
        "psql",
        "-X",
        "-h",
        "/var/run/postgresql",
        "-U",
        "postgres",
        "-d",
        "app",
        "-Atc",
        sql,
    ])
}

/// [`psql_in_instance`] that says None instead of failing: for polls, where the server may be
/// starting or restarting (its socket closing a connection is no answer yet).
pub fn try_psql_in_instance(namespace: &str, pod: &str, sql: &str) -> Option<String> {
    let output = std::process::Command::new(crate::support::tool("kubectl"))
        .args(["-n", namespace, "exec", pod, "-c", "postgres", "--", "psql", "-X", "-h", "/var/run/postgresql"])
        .args(["-U", "postgres", "-d", "app", "-Atc", sql])
        .env("KUBECONFIG", crate::support::admin_kubeconfig().expect("cluster"))
        .output()
        .ok()?;
    output.status.success().then(|| String::from_utf8_lossy(&output.stdout).to_string())
}

/// The DatabaseService's password, for the checks that it appears nowhere it must not.
pub async fn password_of(client: &Client, namespace: &str, database: &str) -> String {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let secret = secrets.get(&format!("{database}-credentials")).await.expect("credentials Secret");
    let bytes = secret.data.expect("data").remove("password").expect("password key").0;
    String::from_utf8(bytes).expect("password is UTF-8")
}

/// A network login inside instance `pod` into `database` over TLS, as `user` with `password`
/// (both shell words, e.g. `$APPLICATION_USER` and `$(cat FILE)`); its output when refused.
pub fn network_login(namespace: &str, pod: &str, user: &str, password: &str, database: &str) -> Result<(), String> {
    let script = format!(
        "PGPASSWORD={password} psql -X -Atc 'select 1' \"host=127.0.0.1 dbname={database} user={user} sslmode=require\" 2>&1"
    );
    let output = std::process::Command::new(crate::support::tool("kubectl"))
        .args(["-n", namespace, "exec", pod, "-c", "postgres", "--", "/bin/bash", "-c", &script])
        .env("KUBECONFIG", crate::support::admin_kubeconfig().expect("kubeconfig"))
        .output()
        .expect("kubectl runs");
    let text = String::from_utf8_lossy(&output.stdout).to_string();
    if output.status.success() && text.trim() == "1" {
        Ok(())
    } else {
        Err(text)
    }
}
