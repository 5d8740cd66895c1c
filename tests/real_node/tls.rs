//! TLS on every PostgreSQL connection (issue 22), tried as a client on the network would: a
//! plain-text login and a plain-text replication connection are refused, `sslmode=verify-full`
//! works with the published CA and fails with another, standbys stream over TLS, and a replaced
//! CA reaches the running servers without a restart.

use crate::environment::{
    admin_client, install_chart, psql_in_instance, real_database, real_namespace, real_node_or_skip, trust_database_ca,
    wait_running, RealNode,
};

use crate::support::{eventually, kubectl};
use dbservice_operator::api::database_service::DatabaseService;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};
use std::time::Duration;

/// The client checks, one line each: `name: output` (output on one line).
const CHECKS: &str = r#"
host="$DATABASE.$NAMESPACE.svc"
one_line() { tr '\n' ' '; }
printf '%s\n' "$OTHER_CA" >/tmp/other.crt
echo "plain: $(PGSSLMODE=disable psql -h "$host" -X -Atc 'select 1' 2>&1 | one_line)"
echo "verified: $(psql "$DATABASE_URI" -X -Atc 'select ssl from pg_stat_ssl where pid = pg_backend_pid()' 2>&1 | one_line)"
echo "other-ca: $(PGSSLROOTCERT=/tmp/other.crt psql "$DATABASE_URI" -X -Atc 'select 1' 2>&1 | one_line)"
echo "replication-plain: $(PGSSLMODE=disable PGUSER=replicator PGPASSWORD="$REPLICATION_PASSWORD" psql "host=$host dbname=postgres replication=true" -X -Atc 'IDENTIFY_SYSTEM' 2>&1 | one_line)"
echo "replication-tls: $(PGSSLMODE=verify-full PGUSER=replicator PGPASSWORD="$REPLICATION_PASSWORD" psql "host=$host dbname=postgres replication=true" -X -Atc 'IDENTIFY_SYSTEM' 2>&1 | one_line)"
"#;

/// Waits (up to 4 minutes) until a server verified by NEW_CA answers, then checks OLD_CA.
const ROTATED: &str = r#"
printf '%s\n' "$NEW_CA" >/tmp/new.crt
printf '%s\n' "$OLD_CA" >/tmp/old.crt
for ((attempt = 1; attempt <= 120; attempt++)); do
  if PGSSLROOTCERT=/tmp/new.crt psql "$DATABASE_URI" -X -Atc 'select 1' >/dev/null 2>&1; then
    echo "rotated: after $attempt attempts"
    echo "old-ca: $(PGSSLROOTCERT=/tmp/old.crt psql "$DATABASE_URI" -X -Atc 'select 1' 2>&1 | tr '\n' ' ')"
    exit 0
  fi
  sleep 2
done
echo "rotated: never"
exit 1
"#;

/// Runs `script` in a client pod with the application's uri, the replication password and the
/// published CA (as an application mounts it); returns its log once it ended.
async fn client_script(
    client: &Client,
    node: &RealNode,
    namespace: &str,
    name: &str,
    script: &str,
    environment: &[(&str, &str)],
) -> String {
    let secret = "pg-credentials";
    let mut variables = vec![
        serde_json::json!({"name": "DATABASE_URI", "valueFrom": {"secretKeyRef": {"name": secret, "key": "uri"}}}),
        serde_json::json!({"name": "REPLICATION_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "pg-replication", "key": "password"}}}),
        serde_json::json!({"name": "DATABASE", "value": "pg"}),
        serde_json::json!({"name": "NAMESPACE", "value": namespace}),
        serde_json::json!({"name": "PGCONNECT_TIMEOUT", "value": "5"}),
    ];
    variables.extend(environment.iter().map(|(name, value)| serde_json::json!({"name": name, "value": value})));
    let mut pod = serde_json::json!({
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": {"runAsNonRoot": true, "runAsUser": 999},
            "containers": [{"name": "client", "image": node.postgres_image, "command": ["/bin/bash", "-c", script], "env": variables}],
        }
    });
    trust_database_ca(&mut pod, "pg");
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    pods.create(&PostParams::default(), &serde_json::from_value(pod).unwrap()).await.expect("client pod created");
    eventually(&format!("client pod {name} to finish"), Duration::from_secs(300), || async {
        let phase = pods.get_opt(name).await.ok().flatten()?.status?.phase?;
        matches!(phase.as_str(), "Succeeded" | "Failed").then_some(())
    })
    .await;
    let log = kubectl(&["-n", namespace, "logs", name]);
    let _ = pods.delete(name, &DeleteParams::default()).await;
    log
}

/// The output of check `name` in `log`.
fn check<'a>(log: &'a str, name: &str) -> &'a str {
    let prefix = format!("{name}: ");
    log.lines().find_map(|line| line.strip_prefix(prefix.as_str())).unwrap_or_else(|| panic!("no {name} in:\n{log}"))
}

async fn published_ca(client: &Client, namespace: &str) -> Option<String> {
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    config_maps.get_opt("pg-ca").await.ok().flatten()?.data?.get("ca.crt").cloned()
}

#[tokio::test]
async fn every_connection_is_tls_verified_by_the_published_ca_and_a_new_ca_needs_no_restart() {
    let Some(node) =
        real_node_or_skip("every_connection_is_tls_verified_by_the_published_ca_and_a_new_ca_needs_no_restart")
    else {
        return;
    };
    install_chart(node);
    let client = admin_client().await;
    let namespace = real_namespace(&client, "tls").await;
    let ns = namespace.name.as_str();
    let databases: Api<DatabaseService> = Api::namespaced(client.clone(), ns);
    databases.create(&PostParams::default(), &real_database(node, "pg", 2, "Delete")).await.unwrap();
    wait_running(&client, ns, "pg", 2, Duration::from_secs(300)).await;

    let (other_ca, _) =
        dbservice_operator::certificates::generate_ca_named("someone else's CA", time::Duration::days(1)).unwrap();
    let log = client_script(&client, node, ns, "tls-checks", CHECKS, &[("OTHER_CA", &other_ca)]).await;
    let plain = check(&log, "plain");
    assert!(plain.contains("pg_hba.conf rejects connection") && plain.contains("no encryption"), "plain text: {plain}");
    assert_eq!(check(&log, "verified").trim(), "t", "verify-full with the published CA, over TLS:\n{log}");
    let other = check(&log, "other-ca");
    assert!(other.contains("certificate verify failed"), "another CA: {other}");
    let replication_plain = check(&log, "replication-plain");
    assert!(
        replication_plain.contains("pg_hba.conf rejects") && replication_plain.contains("no encryption"),
        "replication in plain text: {replication_plain}"
    );
    let replication_tls = check(&log, "replication-tls");
    assert!(
        replication_tls
            .split('|')
            .next()
            .is_some_and(|system| !system.is_empty() && system.trim().bytes().all(|byte| byte.is_ascii_digit())),
        "replication over TLS: {replication_tls}"
    );
    // The standby streams over TLS.
    let streaming = psql_in_instance(
        ns,
        "pg-0",
        "select count(*) from pg_stat_replication join pg_stat_ssl using (pid) where state = 'streaming' and ssl",
    );
    assert_eq!(streaming.trim(), "1", "the standby streams over TLS");

    // A new CA (its Secret deleted): a new server certificate reaches the running servers, which
    // reload it; nothing restarts.
    let started = |pod: &str| psql_in_instance(ns, pod, "select pg_postmaster_start_time()");
    let started_before = (started("pg-0"), started("pg-1"));
    let old_ca = published_ca(&client, ns).await.expect("the CA is published");
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    secrets.delete("pg-ca", &DeleteParams::default()).await.unwrap();
    let new_ca = eventually("a new CA published", Duration::from_secs(60), || async {
        published_ca(&client, ns).await.filter(|ca| *ca != old_ca)
    })
    .await;
    let log =
        client_script(&client, node, ns, "tls-rotated", ROTATED, &[("NEW_CA", &new_ca), ("OLD_CA", &old_ca)]).await;
    assert!(check(&log, "rotated").starts_with("after"), "the new certificate was never served:\n{log}");
    // The old and the new CA have the same name: OpenSSL picks the old one by name and its
    // signature check fails ("EVP lib"), or it finds no issuer ("certificate verify failed").
    let old = check(&log, "old-ca");
    assert!(
        old.contains("SSL error") || old.contains("certificate verify failed"),
        "the old CA still verifies:\n{log}"
    );
    assert_eq!((started("pg-0"), started("pg-1")), started_before, "a server restarted");
    eventually("the standby streaming over TLS again", Duration::from_secs(120), || async {
        let streaming = psql_in_instance(
            ns,
            "pg-0",
            "select count(*) from pg_stat_replication join pg_stat_ssl using (pid) where state = 'streaming' and ssl",
        );
        (streaming.trim() == "1").then_some(())
    })
    .await;
}
