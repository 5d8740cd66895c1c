//! `spec.roles` and `spec.databases` on real PostgreSQL (issue 23): the primary's agent creates
//! the declared roles (password from a Secret its Role may read) and databases (owner,
//! extensions), puts drift back, takes a rotated password, removes only on `ensure: absent`, and
//! the operator shows its pass in `status.declared`. The agent's `/metrics`, with a query of the
//! user's from a ConfigMap, is scraped through the API server's pod proxy.

use crate::environment::{admin_client, install_chart, real_database, real_namespace, real_node_or_skip, wait_running};
use crate::postgres::kubectl_quiet;
use crate::support::eventually;
use dbservice_operator::api::database_service::DatabaseService;
use dbservice_operator::api::roles::{DatabaseSpec, ExtensionSpec, ObjectState, PasswordSecret, RoleSpec};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Patch, PatchParams, PostParams};
use kube::Api;
use std::time::Duration;

const DATABASE: &str = "declared";
const POD: &str = "declared-0";
/// A pass runs when the declarations change, and every minute to put drift back and read the
/// Secrets again.
const PASS_LIMIT: Duration = Duration::from_secs(150);

/// A network login inside the instance as `user` with `password` into `database` (TLS).
fn login(namespace: &str, user: &str, password: &str, database: &str) -> Result<(), String> {
    crate::environment::network_login(namespace, POD, user, &format!("'{password}'"), database)
}

fn password_secret(password: &str) -> Secret {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "reporting-password"},
        "stringData": {"password": password},
    }))
    .unwrap()
}

/// The states of `status.declared`, once it is the outcome of the current declarations.
async fn declared_states(databases: &Api<DatabaseService>) -> Option<Vec<(String, ObjectState)>> {
    let database = databases.get(DATABASE).await.ok()?;
    let declared = database.status?.declared?;
    let current = database.spec.declarations().fingerprint();
    (declared.declarations.as_deref() == Some(current.as_str())).then(|| {
        declared.roles.iter().chain(&declared.databases).map(|object| (object.name.clone(), object.state)).collect()
    })
}

#[tokio::test]
async fn declared_roles_and_databases_are_created_kept_rotated_and_removed() {
    let Some(node) = real_node_or_skip("declared_roles_and_databases_are_created_kept_rotated_and_removed") else {
        return;
    };
    install_chart(node);
    let client = admin_client().await;
    let namespace = real_namespace(&client, "roles").await;
    let ns = namespace.name.as_str();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    secrets.create(&PostParams::default(), &password_secret("first-password")).await.unwrap();
    let databases: Api<DatabaseService> = Api::namespaced(client.clone(), ns);
    let mut database = real_database(node, DATABASE, 1, "Delete");
    database.spec.roles = vec![
        RoleSpec { name: "readers".into(), login: Some(false), ..Default::default() },
        RoleSpec {
            name: "reporting".into(),
            connection_limit: Some(5),
            in_roles: vec!["readers".into(), "pg_read_all_data".into()],
            password_secret: Some(PasswordSecret { name: "reporting-password".into(), key: None }),
            ..Default::default()
        },
    ];
    database.spec.databases = vec![DatabaseSpec {
        name: "analytics".into(),
        owner: Some("reporting".into()),
        extensions: vec![ExtensionSpec { name: "pgcrypto".into(), ensure: None }],
        ..Default::default()
    }];
    // The user's own metric: a query in a ConfigMap, run by the agent as the application's role.
    let config_maps: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(client.clone(), ns);
    let queries = serde_json::json!({
        "metadata": {"name": "app-queries"},
        "data": {"queries.json": r#"[{"name": "current_database_owner", "labels": ["datname", "owner"],
            "query": "SELECT current_database() AS datname, current_user AS owner, 1 AS value"}]"#},
    });
    config_maps.create(&PostParams::default(), &serde_json::from_value(queries).unwrap()).await.unwrap();
    database.spec.monitoring = Some(dbservice_operator::api::monitoring::MonitoringSpec {
        custom_queries: vec![dbservice_operator::api::monitoring::ConfigMapKeyReference {
            name: "app-queries".into(),
            key: None,
        }],
    });
    databases.create(&PostParams::default(), &database).await.unwrap();
    wait_running(&client, ns, DATABASE, 1, Duration::from_secs(300)).await;

    let states = eventually("status.declared: every object present", PASS_LIMIT, || async {
        declared_states(&databases)
            .await
            .filter(|states| states.iter().all(|(_, state)| *state == ObjectState::Present))
    })
    .await;
    assert_eq!(states.len(), 3, "{states:?}");
    assert_eq!(login(ns, "reporting", "first-password", "analytics"), Ok(()));
    // The status view shows them as people read them.
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_dbservice-operator"))
        .args(["status", DATABASE, "-n", ns])
        .env("KUBECONFIG", crate::support::admin_kubeconfig().unwrap())
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(printed.contains("role     reporting") && printed.contains("database analytics"), "{printed}");
    assert!(printed.contains(&format!("primary: {POD}")) && !printed.contains("first-password"), "{printed}");
    let facts = "SELECT r.rolconnlimit || ',' || pg_has_role('reporting', 'readers', 'MEMBER') || ',' \
        || (SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = 'analytics') \
        FROM pg_roles r WHERE r.rolname = 'reporting'";
    assert_eq!(kubectl_quiet(ns, POD, facts).unwrap().trim(), "5,true,reporting");
    let extension = "SELECT extname FROM pg_extension WHERE extname = 'pgcrypto'";
    let output = std::process::Command::new(crate::support::tool("kubectl"))
        .args(["-n", ns, "exec", POD, "-c", "postgres", "--", "psql", "-X", "-h", "/var/run/postgresql"])
        .args(["-U", "postgres", "-d", "analytics", "-Atc", extension])
        .env("KUBECONFIG", crate::support::admin_kubeconfig().unwrap())
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "pgcrypto");

    // The agent's /metrics, through the API server's pod proxy as a Prometheus in the cluster
    // would reach it: PostgreSQL up, this instance primary, the declared database's size.
    let path = format!("/api/v1/namespaces/{ns}/pods/{POD}:9187/proxy/metrics");
    let metrics = eventually("the agent's /metrics", Duration::from_secs(60), || async {
        client.request_text(http::Request::get(&path).body(Vec::new()).unwrap()).await.ok()
    })
    .await;
    for line in ["dbservice_postgres_up 1", "dbservice_postgres_primary 1", "# EOF"] {
        assert!(metrics.lines().any(|sample| sample == line), "{line:?} missing from:\n{metrics}");
    }
    assert!(metrics.contains("dbservice_postgres_database_size_bytes{datname=\"analytics\"}"), "{metrics}");
    let user_metric = "dbservice_user_current_database_owner{datname=\"app\",owner=\"app_user\"} 1";
    assert!(metrics.lines().any(|sample| sample == user_metric), "{user_metric:?} missing from:\n{metrics}");
    assert!(metrics.lines().any(|sample| sample == "dbservice_postgres_scrape_errors 0"), "{metrics}");

    // Drift made by hand is put back; a rotated Secret's password takes over.
    kubectl_quiet(ns, POD, "ALTER ROLE reporting CONNECTION LIMIT 50; REVOKE readers FROM reporting").expect("drift");
    let rotated = Patch::Merge(serde_json::json!({"stringData": {"password": "second-password"}}));
    secrets.patch("reporting-password", &PatchParams::default(), &rotated).await.unwrap();
    eventually("the drift put back and the password rotated", PASS_LIMIT, || async {
        let kept = kubectl_quiet(ns, POD, facts)?.trim() == "5,true,reporting";
        (kept && login(ns, "reporting", "second-password", "analytics").is_ok()).then_some(())
    })
    .await;
    let old = login(ns, "reporting", "first-password", "analytics").expect_err("the old password");
    assert!(old.contains("password authentication failed"), "{old}");

    // ensure: absent removes the database (its data goes with it: that is what absent says) and
    // the role (its objects go to the application's role first).
    kubectl_quiet(ns, POD, "CREATE TABLE reporting_owned (n int); ALTER TABLE reporting_owned OWNER TO reporting")
        .expect("a table owned by the role");
    let absent = Patch::Merge(serde_json::json!({"spec": {
        "roles": [{"name": "readers", "login": false}, {"name": "reporting", "ensure": "absent"}],
        "databases": [{"name": "analytics", "ensure": "absent"}],
    }}));
    databases.patch(DATABASE, &PatchParams::default(), &absent).await.unwrap();
    let states = eventually("status.declared: the role and the database absent", PASS_LIMIT, || async {
        declared_states(&databases).await
    })
    .await;
    assert_eq!(
        states,
        vec![
            ("readers".to_string(), ObjectState::Present),
            ("reporting".to_string(), ObjectState::Absent),
            ("analytics".to_string(), ObjectState::Absent)
        ]
    );
    let gone = "SELECT (SELECT count(*) FROM pg_roles WHERE rolname = 'reporting') || ',' \
        || (SELECT count(*) FROM pg_database WHERE datname = 'analytics') || ',' \
        || (SELECT pg_get_userbyid(relowner) FROM pg_class WHERE relname = 'reporting_owned')";
    assert_eq!(kubectl_quiet(ns, POD, gone).unwrap().trim(), "0,0,app_user");
}
