//! The chart's monitoring against a real Prometheus (issue 23): Prometheus (built from the Go module
//! proxy by tests/cluster/build.sh) discovers the database pods through the API server with the
//! scrape configuration the chart's PodMonitor stands for, loads the chart's PrometheusRule (checked
//! by `promtool`), and every panel query of the chart's dashboard returns data. Then the two
//! failures the alerts exist for are caused for real: the object store becomes unreachable
//! (`DBServiceArchivingFailing` fires) and a standby loses its stream (`DBServiceReplicationBroken`
//! fires). A second test causes the other five: replay paused on a standby (`DBServiceReplicationLagHigh`),
//! transaction IDs consumed (`DBServiceWraparoundNear`), a sized volume filled
//! (`DBServiceDiskAlmostFull`) and the primary's server hung with the failover delayed
//! (`DBServiceDown`, `DBServiceNoPrimary`). The rules keep their expressions; only their `for` is
//! shortened to seconds, and two thresholds are scaled to what a test causes in seconds.

use crate::backups::BRIDGE_ADDRESS;
use crate::environment::psql_in_instance;
use crate::faults::{host, Bed};
use crate::object_store::{free_port, moto_server, skip_or_fail, Process, Store};
use crate::support::{admin_kubeconfig, eventually, repository, tool};
use serde_json::{json, Value};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

/// How long a shortened alert must hold before it fires.
const ALERT_FOR: &str = "4s";

/// The chart's monitoring objects, rendered as a user enabling all three gets them.
struct RenderedMonitoring {
    pod_monitor: Value,
    rules: Value,
    dashboard: Value,
}

/// `helm template` of one template of the chart with `sets`, as a user's values give it.
fn render_template(template: &str, sets: &[&str]) -> String {
    let mut command = Command::new(tool("helm"));
    command.args(["template", "--kube-version", crate::support::CHART_KUBE_VERSION, "monitoring"]);
    command.args(["charts/dbservice-operator", "--show-only", template]);
    for set in sets {
        command.args(["--set", set]);
    }
    let output = command.current_dir(repository()).output().expect("helm runs");
    assert!(output.status.success(), "helm template: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).unwrap()
}

fn render_chart() -> RenderedMonitoring {
    let text = render_template(
        "templates/database-monitoring.yaml",
        &[
            "databaseMonitoring.podMonitor.enabled=true",
            "databaseMonitoring.alerts.enabled=true",
            "databaseMonitoring.dashboard.enabled=true",
        ],
    );
    let mut rendered = RenderedMonitoring { pod_monitor: Value::Null, rules: Value::Null, dashboard: Value::Null };
    for document in text.split("\n---").filter(|document| !document.trim().is_empty()) {
        let object: Value = serde_saphyr::from_str(document).unwrap();
        match object["kind"].as_str() {
            Some("PodMonitor") => rendered.pod_monitor = object,
            Some("PrometheusRule") => rendered.rules = object["spec"].clone(),
            Some("ConfigMap") => {
                let json = object["data"]["dbservice-postgresql.json"].as_str().expect("the dashboard's key");
                rendered.dashboard = serde_json::from_str(json).unwrap();
            }
            other => panic!("unexpected {other:?} in the monitoring template"),
        }
    }
    assert!(!rendered.pod_monitor.is_null() && !rendered.rules.is_null() && !rendered.dashboard.is_null());
    rendered
}

/// The chart's PodMonitor of the pooler pods (`spec.pooler`), as a user enabling it gets it.
pub fn render_pooler_pod_monitor() -> Value {
    let text = render_template("templates/pooler-monitoring.yaml", &["databaseMonitoring.podMonitor.enabled=true"]);
    let object: Value = serde_saphyr::from_str(&text).unwrap();
    assert_eq!(object["kind"], "PodMonitor", "{object}");
    object
}

/// `__meta_kubernetes_pod_label_<name>` as Prometheus spells a label name.
fn meta_label(prefix: &str, name: &str) -> String {
    let sanitized: String = name.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
    format!("__meta_kubernetes_pod_{prefix}_{sanitized}")
}

/// The scrape configuration prometheus-operator generates for the PodMonitor, limited to
/// `namespace`: its selector and port as keep rules, the target labels it always sets, then the
/// endpoint's own relabelings.
pub fn scrape_config(pod_monitor: &Value, namespace: &str, kubeconfig: &Path) -> Value {
    let spec = &pod_monitor["spec"];
    let endpoint = &spec["podMetricsEndpoints"][0];
    let mut relabel = Vec::new();
    for (name, value) in spec["selector"]["matchLabels"].as_object().expect("a label selector") {
        relabel.push(json!({
            "action": "keep",
            "source_labels": [meta_label("label", name), meta_label("labelpresent", name)],
            "regex": format!("({});true", value.as_str().unwrap()),
        }));
    }
    relabel.push(json!({"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_name"],
        "regex": endpoint["port"]}));
    relabel.push(json!({"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"}));
    relabel.push(json!({"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"}));
    relabel.push(json!({"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"}));
    for rule in endpoint["relabelings"].as_array().into_iter().flatten() {
        let mut translated = serde_json::Map::new();
        for (key, value) in rule.as_object().unwrap() {
            let key = match key.as_str() {
                "sourceLabels" => "source_labels",
                "targetLabel" => "target_label",
                other => other,
            };
            translated.insert(key.to_string(), value.clone());
        }
        relabel.push(Value::Object(translated));
    }
    json!({
        "job_name": format!("podMonitor/{}", pod_monitor["metadata"]["name"].as_str().unwrap_or("databases")),
        // The chart's 30 s interval, shortened so that the test sees rates within seconds.
        "scrape_interval": "2s",
        "scrape_timeout": "2s",
        "metrics_path": endpoint["path"],
        "scheme": endpoint["scheme"],
        "kubernetes_sd_configs": [{
            "role": "pod",
            "kubeconfig_file": kubeconfig,
            "namespaces": {"names": [namespace]},
        }],
        "relabel_configs": relabel,
    })
}

/// The rules with every `for` shortened to [`ALERT_FOR`].
fn shortened(rules: &Value) -> Value {
    let mut rules = rules.clone();
    for group in rules["groups"].as_array_mut().unwrap() {
        group["interval"] = json!("2s");
        for rule in group["rules"].as_array_mut().unwrap() {
            rule["for"] = json!(ALERT_FOR);
        }
    }
    rules
}

/// Runs promtool with `arguments`; asserts it succeeds.
fn promtool(arguments: &[&str]) {
    let output = Command::new(tool("promtool")).args(arguments).output().expect("promtool runs");
    assert!(
        output.status.success(),
        "promtool {arguments:?}: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A Prometheus server on the host, stopped when dropped.
pub struct Prometheus {
    url: String,
    http: reqwest::Client,
    _process: Process,
}

impl Prometheus {
    /// Started with one scrape configuration and `rules`.
    pub fn start(work: &Path, config: &Value, rules: &Value) -> Prometheus {
        let rules_file = work.join("rules.json");
        std::fs::write(&rules_file, serde_json::to_vec_pretty(rules).unwrap()).unwrap();
        let config = json!({
            "global": {"scrape_interval": "2s", "evaluation_interval": "2s"},
            "rule_files": [rules_file],
            "scrape_configs": [config],
        });
        let config_file = work.join("prometheus.json");
        std::fs::write(&config_file, serde_json::to_vec_pretty(&config).unwrap()).unwrap();
        promtool(&["check", "rules", rules_file.to_str().unwrap()]);
        promtool(&["check", "config", "--syntax-only", config_file.to_str().unwrap()]);
        let port = free_port();
        let log = std::fs::File::create(work.join("prometheus.log")).unwrap();
        let process = Command::new(tool("prometheus"))
            .arg(format!("--config.file={}", config_file.display()))
            .arg(format!("--storage.tsdb.path={}", work.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("prometheus starts (tests/cluster/build.sh prometheus)");
        let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
        Prometheus { url: format!("http://127.0.0.1:{port}"), http, _process: Process(process) }
    }

    /// The `data` of a successful API answer; None while Prometheus does not answer yet.
    pub async fn get(&self, path: &str, query: &[(&str, &str)]) -> Option<Value> {
        let response = self.http.get(format!("{}{path}", self.url)).query(query).send().await.ok()?;
        let body: Value = response.json().await.ok()?;
        assert_eq!(body["status"], "success", "{path} {query:?}: {body}");
        Some(body["data"].clone())
    }

    /// The instant query's result vector (asserting the query evaluates).
    pub async fn query(&self, expression: &str) -> Vec<Value> {
        let data = self.get("/api/v1/query", &[("query", expression)]).await.expect("prometheus answers");
        data["result"].as_array().cloned().unwrap_or_default()
    }

    /// Waits until alert `name` fires; its labels.
    async fn firing(&self, name: &str, limit: Duration) -> Value {
        eventually(&format!("{name} to fire"), limit, || async {
            let data = self.get("/api/v1/alerts", &[]).await?;
            data["alerts"]
                .as_array()?
                .iter()
                .find(|alert| alert["labels"]["alertname"] == name && alert["state"] == "firing")
                .map(|alert| alert["labels"].clone())
        })
        .await
    }
}

/// Every panel query of the dashboard (Grafana's `$__rate_interval` as Prometheus' own window).
fn panel_queries(dashboard: &Value) -> Vec<(String, String)> {
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expression = target["expr"].as_str().unwrap().replace("$__rate_interval", "1m");
            queries.push((panel["title"].as_str().unwrap().to_string(), expression));
        }
    }
    queries
}

#[tokio::test]
async fn prometheus_scrapes_the_agents_runs_every_panel_and_fires_the_alerts_of_real_failures() {
    let fault = "monitoring: archiving and replication broken";
    let Some(moto) = moto_server() else {
        return skip_or_fail("no moto_server (python3 -m pip install 'moto[server]')");
    };
    let work = tempfile::Builder::new().prefix("dbservice-prometheus-").tempdir_in("/tmp").unwrap();
    let store = Store::start_on(&moto, &work.path().join("moto.log"), BRIDGE_ADDRESS).await;
    let Some(bed) = Bed::start_with(fault, 2, Some(&store.endpoint)).await else { return };
    let monitoring = render_chart();
    let kubeconfig = admin_kubeconfig().expect("the cluster's kubeconfig");
    let prometheus = Prometheus::start(
        work.path(),
        &scrape_config(&monitoring.pod_monitor, bed.ns(), &kubeconfig),
        &shortened(&monitoring.rules),
    );
    let watched_from = crate::failover::epoch_now();
    let primary = bed.primary().await;
    let standby = bed.other_than(&primary);

    // Both instances discovered through the API server, labelled as the PodMonitor says, and up.
    let targets = eventually("both agents scraped", Duration::from_secs(90), || async {
        let data = prometheus.get("/api/v1/targets", &[("state", "active")]).await?;
        let targets = data["activeTargets"].as_array()?.clone();
        (targets.len() == 2 && targets.iter().all(|target| target["health"] == "up")).then_some(targets)
    })
    .await;
    for target in &targets {
        assert_eq!(target["labels"]["namespace"], bed.ns(), "{target}");
        assert_eq!(target["labels"]["database"], crate::failover::DATABASE, "{target}");
    }

    // Every panel returns data once the rates have two samples of the writer's traffic.
    let queries = panel_queries(&monitoring.dashboard);
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    loop {
        let mut empty = Vec::new();
        for (title, expression) in &queries {
            if prometheus.query(expression).await.is_empty() {
                empty.push(title.as_str());
            }
        }
        if empty.is_empty() {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "dashboard panels without data after 90 s: {empty:?}");
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    eprintln!("[monitoring] {} dashboard queries return data", queries.len());

    // Every alert rule evaluates without error, and none fires on a healthy database.
    let rules = prometheus.get("/api/v1/rules", &[("type", "alert")]).await.unwrap();
    let rules: Vec<&Value> =
        rules["groups"].as_array().unwrap().iter().flat_map(|g| g["rules"].as_array().unwrap()).collect();
    let expected: usize =
        monitoring.rules["groups"].as_array().unwrap().iter().map(|g| g["rules"].as_array().unwrap().len()).sum();
    assert_eq!(rules.len(), expected, "every rule of the chart loaded");
    eventually("every rule evaluated", Duration::from_secs(30), || async {
        let data = prometheus.get("/api/v1/rules", &[("type", "alert")]).await?;
        let groups = data["groups"].as_array()?.clone();
        let all: Vec<Value> = groups.iter().flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default()).collect();
        for rule in &all {
            assert_ne!(rule["health"], "err", "{rule}");
        }
        all.iter().all(|rule| rule["health"] == "ok").then_some(())
    })
    .await;
    let healthy = prometheus.get("/api/v1/alerts", &[]).await.unwrap();
    assert_eq!(healthy["alerts"].as_array().map(Vec::len), Some(0), "alerts on a healthy database: {healthy}");

    // The object store unreachable from the primary: its next segment fails to archive.
    let port = store.endpoint.rsplit(':').next().unwrap().to_string();
    let agent = host::agent(bed.ns(), &primary).expect("the primary's agent runs on this machine");
    let block = ["iptables", "-A", "OUTPUT", "-p", "tcp", "-d", BRIDGE_ADDRESS, "--dport", &port, "-j", "REJECT"];
    host::in_network_of(agent.pid, &block);
    psql_in_instance(bed.ns(), &primary, "SELECT pg_switch_wal()");
    let archiving = prometheus.firing("DBServiceArchivingFailing", Duration::from_secs(180)).await;
    assert_eq!(archiving["pod"], primary.as_str(), "{archiving}");
    eprintln!("[monitoring] DBServiceArchivingFailing fired for {primary}");

    // The standby's stream cut: connections to the primary refused, its WAL receiver ended.
    let primary_address =
        crate::support::kubectl(&["-n", bed.ns(), "get", "pod", &primary, "-o", "jsonpath={.status.podIP}"]);
    let standby_agent = host::agent(bed.ns(), &standby).expect("the standby's agent runs on this machine");
    let cut =
        ["iptables", "-A", "OUTPUT", "-p", "tcp", "-d", primary_address.trim(), "--dport", "5432", "-j", "REJECT"];
    host::in_network_of(standby_agent.pid, &cut);
    for receiver in host::processes_of(bed.ns(), &standby) {
        if receiver.arguments.first().is_some_and(|name| name.contains("walreceiver")) {
            host::signal(receiver.pid, libc::SIGTERM);
        }
    }
    let replication = prometheus.firing("DBServiceReplicationBroken", Duration::from_secs(180)).await;
    assert_eq!(replication["pod"], standby.as_str(), "{replication}");
    eprintln!("[monitoring] DBServiceReplicationBroken fired for {standby}");
    picture_of_the_dashboard(&prometheus, &monitoring.dashboard, watched_from).await;
}

/// Draws the dashboard from what Prometheus recorded since `from` (epoch seconds), asserting
/// every panel has something to draw: `target/dashboard.svg`, and with
/// `DBSERVICE_WRITE_PICTURES=1` the manual's `images/dashboard.svg`.
async fn picture_of_the_dashboard(prometheus: &Prometheus, dashboard: &Value, from: f64) {
    use crate::dashboard_picture::{legend, render};
    let to = crate::failover::epoch_now();
    let (start, end, step) =
        (format!("{from:.0}"), format!("{to:.0}"), format!("{:.0}", ((to - from) / 150.0).max(2.0)));
    let mut panels = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        let mut series = Vec::new();
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expression = target["expr"].as_str().unwrap().replace("$__rate_interval", "1m");
            let range = [("query", expression.as_str()), ("start", &start), ("end", &end), ("step", &step)];
            let data = prometheus.get("/api/v1/query_range", &range).await.expect("prometheus answers");
            for result in data["result"].as_array().into_iter().flatten() {
                let points = result["values"].as_array().into_iter().flatten().filter_map(|pair| {
                    Some((pair[0].as_f64()?, pair[1].as_str()?.parse::<f64>().ok().filter(|value| value.is_finite())?))
                });
                let label = legend(target["legendFormat"].as_str().unwrap_or_default(), &result["metric"]);
                series.push((label, points.collect::<Vec<_>>()));
            }
        }
        let title = panel["title"].as_str().unwrap_or_default();
        assert!(series.iter().any(|(_, points)| !points.is_empty()), "panel {title:?} has nothing to draw");
        panels.push(series);
    }
    let picture = render(dashboard, &panels);
    std::fs::create_dir_all(repository().join("target")).unwrap();
    std::fs::write(repository().join("target/dashboard.svg"), &picture).unwrap();
    if std::env::var("DBSERVICE_WRITE_PICTURES").as_deref() == Ok("1") {
        std::fs::write(repository().join("docs/manual/src/images/dashboard.svg"), &picture).unwrap();
    }
    eprintln!("[monitoring] the dashboard drawn from {:.0} s of data: target/dashboard.svg", to - from);
}

/// `rules` with `from` replaced by `to` in alert `alert`'s expression (exactly once): a threshold
/// scaled for a test, the rest of the expression as the chart ships it.
fn with_threshold(mut rules: Value, alert: &str, from: &str, to: &str) -> Value {
    let rule = rules["groups"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .flat_map(|group| group["rules"].as_array_mut().unwrap().iter_mut())
        .find(|rule| rule["alert"] == alert)
        .unwrap_or_else(|| panic!("no rule {alert}"));
    let expression = rule["expr"].as_str().unwrap().to_string();
    assert_eq!(expression.matches(from).count(), 1, "{alert}: {expression}");
    rule["expr"] = json!(expression.replace(from, to));
    rules
}

/// The value of a one-sample instant query.
async fn single_value(prometheus: &Prometheus, expression: &str) -> f64 {
    let samples = eventually(&format!("a sample of {expression}"), Duration::from_secs(60), || async {
        let samples = prometheus.query(expression).await;
        (samples.len() == 1).then_some(samples)
    })
    .await;
    samples[0]["value"][1].as_str().unwrap().parse().unwrap()
}

#[tokio::test]
async fn prometheus_fires_lag_wraparound_disk_down_and_no_primary_alerts_of_real_failures() {
    let fault = "monitoring: lag, wraparound, full disk, hung primary";
    let Some(bed) = Bed::start_on_sized_volumes(fault, 2, None).await else { return };
    let primary = bed.primary().await;
    let standby = bed.other_than(&primary);
    // Thresholds scaled to what a test can cause in seconds: 8 MiB of replay lag instead of 1 GiB,
    // and transaction ID age 100,000 above today's instead of a billion.
    let age: u64 =
        psql_in_instance(bed.ns(), &primary, "select max(age(datfrozenxid)) from pg_database").trim().parse().unwrap();
    let wraparound = age + 100_000;
    let monitoring = render_chart();
    let rules = shortened(&monitoring.rules);
    let rules = with_threshold(rules, "DBServiceReplicationLagHigh", "> 1073741824", "> 8388608");
    let rules = with_threshold(rules, "DBServiceWraparoundNear", "> 1000000000", &format!("> {wraparound}"));
    let work = tempfile::Builder::new().prefix("dbservice-prometheus-").tempdir_in("/tmp").unwrap();
    let kubeconfig = admin_kubeconfig().expect("the cluster's kubeconfig");
    let prometheus =
        Prometheus::start(work.path(), &scrape_config(&monitoring.pod_monitor, bed.ns(), &kubeconfig), &rules);
    eventually("both agents scraped", Duration::from_secs(90), || async {
        let data = prometheus.get("/api/v1/targets", &[("state", "active")]).await?;
        let targets = data["activeTargets"].as_array()?.clone();
        (targets.len() == 2 && targets.iter().all(|target| target["health"] == "up")).then_some(())
    })
    .await;
    eventually("every rule evaluated", Duration::from_secs(30), || async {
        let data = prometheus.get("/api/v1/rules", &[("type", "alert")]).await?;
        let groups = data["groups"].as_array()?.clone();
        let all: Vec<Value> = groups.iter().flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default()).collect();
        all.iter().all(|rule| rule["health"] == "ok" && !rule["lastEvaluation"].is_null()).then_some(())
    })
    .await;
    let healthy = prometheus.get("/api/v1/alerts", &[]).await.unwrap();
    assert_eq!(healthy["alerts"].as_array().map(Vec::len), Some(0), "alerts before any fault: {healthy}");

    // Replay paused on the standby while the primary writes about 30 MB of WAL.
    psql_in_instance(bed.ns(), &standby, "select pg_wal_replay_pause()");
    psql_in_instance(
        bed.ns(),
        &primary,
        "create table lag_load as select n, repeat('x', 1000) as payload from generate_series(1, 25000) n",
    );
    let lag = prometheus.firing("DBServiceReplicationLagHigh", Duration::from_secs(120)).await;
    assert_eq!(lag["standby"], standby.as_str(), "{lag}");
    eprintln!("[monitoring] DBServiceReplicationLagHigh fired for {standby}");
    psql_in_instance(bed.ns(), &standby, "select pg_wal_replay_resume()");

    // 150,000 transactions, each taking an ID: the oldest unfrozen one ages past the threshold.
    psql_in_instance(
        bed.ns(),
        &primary,
        // One statement (a multi-statement string is one transaction, in which COMMIT is refused).
        "do $$ begin perform pg_catalog.set_config('synchronous_commit', 'off', false); \
         for i in 1..150000 loop perform pg_catalog.txid_current(); commit; end loop; end $$",
    );
    let wraparound_alert = prometheus.firing("DBServiceWraparoundNear", Duration::from_secs(120)).await;
    eprintln!("[monitoring] DBServiceWraparoundNear fired: {wraparound_alert}");

    // The standby's 1 GiB volume filled to 95% by a file beside its data directory.
    let selector = format!("{{namespace=\"{}\",pod=\"{standby}\"}}", bed.ns());
    let free = single_value(&prometheus, &format!("dbservice_instance_volume_free_bytes{selector}")).await;
    let size = single_value(&prometheus, &format!("dbservice_instance_volume_size_bytes{selector}")).await;
    assert!(size < 2.0 * 1024.0 * 1024.0 * 1024.0, "a sized volume, not the host's disk: {size} bytes");
    let fill = (free - 0.05 * size).max(0.0) as u64;
    let filler = "/var/lib/postgresql/data/filler";
    let write = format!("head -c {fill} /dev/zero > {filler}");
    crate::support::kubectl(&["-n", bed.ns(), "exec", &standby, "-c", "postgres", "--", "sh", "-c", &write]);
    let disk = prometheus.firing("DBServiceDiskAlmostFull", Duration::from_secs(120)).await;
    assert_eq!(disk["pod"], standby.as_str(), "{disk}");
    eprintln!("[monitoring] DBServiceDiskAlmostFull fired for {standby} ({fill} bytes written, {size} in all)");
    crate::support::kubectl(&["-n", bed.ns(), "exec", &standby, "-c", "postgres", "--", "rm", "-f", filler]);

    // The primary's PostgreSQL hung, with the failover delayed so that nothing replaces it: no
    // instance is primary, and the primary's server does not answer.
    let delayed = kube::api::Patch::Merge(json!({"spec": {"failover": {"delaySeconds": 600}}}));
    bed.databases().patch(crate::failover::DATABASE, &kube::api::PatchParams::default(), &delayed).await.unwrap();
    let postmaster = host::postmaster(bed.ns(), &primary).expect("the primary's postmaster");
    let stalled = dbservice_operator::instance::postgres::server_processes(postmaster.pid);
    dbservice_operator::instance::postgres::signal_server(postmaster.pid, libc::SIGSTOP);
    let down = prometheus.firing("DBServiceDown", Duration::from_secs(120)).await;
    let no_primary = prometheus.firing("DBServiceNoPrimary", Duration::from_secs(120)).await;
    for pid in &stalled {
        host::signal(*pid, libc::SIGCONT);
    }
    assert_eq!(down["pod"], primary.as_str(), "{down}");
    assert_eq!(no_primary["database"], crate::failover::DATABASE, "{no_primary}");
    eprintln!("[monitoring] DBServiceDown fired for {primary}; DBServiceNoPrimary fired for the database");
}
