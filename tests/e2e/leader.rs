//! Leader election with real processes: only the holder writes; SIGKILL hands over within the
//! lease duration, SIGTERM (the Lease is released) within about a second.

use crate::controller::wait_for_phase;
use crate::support::leader::grant_lease_rights;
use crate::support::operator::{
    free_port, service_account_kubeconfig, shared, OperatorOptions, OperatorProcess, CHART_LEASE, ISOLATION_LABEL,
};
use crate::support::{client_for, cluster_or_skip, eventually, sample_database, TestNamespace};
use dbservice_operator::api::database_service::{DatabaseService, Phase};
use kube::api::{Patch, PatchParams, PostParams};
use kube::Api;
use std::path::Path;
use std::time::{Duration, Instant};

const LEASE_SECONDS: u64 = 6;

fn start(namespace: &str, name: &str, kubeconfig: &Path) -> OperatorProcess {
    start_on(namespace, name, kubeconfig, free_port())
}

fn start_on(namespace: &str, name: &str, kubeconfig: &Path, webhook_port: u16) -> OperatorProcess {
    let options = OperatorOptions {
        identity: format!("{name}-{}", std::process::id()),
        lease_namespace: namespace.into(),
        lease_duration_seconds: LEASE_SECONDS,
        watch_namespace: namespace.into(),
        selector: format!("{ISOLATION_LABEL}={namespace}"),
        lease_name: CHART_LEASE.into(),
        extra_arguments: vec![],
    };
    OperatorProcess::start(&options, kubeconfig, &shared().certificates, webhook_port)
}

/// Waits until exactly one of `candidates` leads; returns its index and how long it took.
async fn wait_for_single_leader(candidates: &[&OperatorProcess], timeout: Duration) -> (usize, Duration) {
    let started = Instant::now();
    let index = eventually("a single leader", timeout, || async {
        let leaders: Vec<usize> =
            candidates.iter().enumerate().filter(|(_, process)| process.is_leader()).map(|(index, _)| index).collect();
        (leaders.len() == 1).then(|| leaders[0])
    })
    .await;
    (index, started.elapsed())
}

#[tokio::test]
async fn only_the_leader_writes_and_leadership_moves_on_kill_and_on_terminate() {
    let Some(kubeconfig) = cluster_or_skip("only_the_leader_writes_and_leadership_moves_on_kill_and_on_terminate")
    else {
        return;
    };
    shared();
    let client = client_for(&kubeconfig).await;
    let namespace = TestNamespace::create(&client, "leader").await;
    let ns = namespace.name.clone();
    grant_lease_rights(&ns);
    let token = service_account_kubeconfig(
        &crate::support::operator::log_directory().join(format!("leader-{}", std::process::id())),
    );
    let first = start(&ns, "alpha", &token);
    let second = start(&ns, "beta", &token);
    let (leader_index, _) = wait_for_single_leader(&[&first, &second], Duration::from_secs(30)).await;
    let (mut leader, follower) = if leader_index == 0 { (first, second) } else { (second, first) };

    let api: Api<DatabaseService> = Api::namespaced(client.clone(), &ns);
    let mut database = sample_database("elected");
    database.metadata.labels = Some([(ISOLATION_LABEL.to_string(), ns.clone())].into());
    api.create(&PostParams::default(), &database).await.unwrap();
    wait_for_phase(&api, "elected", Phase::Running, Duration::from_secs(120)).await;
    assert!(leader.writes() > 0.0, "the leader made no writes");
    assert_eq!(follower.writes(), 0.0, "the follower wrote; log:\n{}", follower.log_tail());

    // SIGKILL: nobody releases the Lease; the follower takes over once it expires.
    leader.signal("KILL");
    let (_, took) = wait_for_single_leader(&[&follower], Duration::from_secs(LEASE_SECONDS * 3)).await;
    eprintln!("leader election: takeover after SIGKILL took {took:?} (lease {LEASE_SECONDS}s)");
    assert!(
        took <= Duration::from_secs(LEASE_SECONDS + 3),
        "takeover after SIGKILL took {took:?} (lease {LEASE_SECONDS}s)"
    );
    // The new leader reconciles: a spec change is acted on.
    api.patch("elected", &PatchParams::default(), &Patch::Merge(serde_json::json!({"spec": {"replicas": 2}})))
        .await
        .unwrap();
    eventually("the new leader scales to 2 ready instances", Duration::from_secs(90), || async {
        let status = api.get("elected").await.ok()?.status?;
        (status.ready_replicas == 2 && status.phase == Some(Phase::Running)).then_some(())
    })
    .await;

    // SIGTERM: the Lease is released, a standby takes over within about a second.
    let mut current = follower;
    let successor = start(&ns, "gamma", &token);
    assert!(!successor.is_leader());
    current.signal("TERM");
    let (_, took) = wait_for_single_leader(&[&successor], Duration::from_secs(LEASE_SECONDS * 2)).await;
    eprintln!("leader election: takeover after SIGTERM took {took:?}");
    assert!(took <= Duration::from_millis(2500), "takeover after SIGTERM took {took:?}");
    assert!(current.log_tail().contains("released the leader Lease"), "log:\n{}", current.log_tail());
    // The new leader handles the deletion (its finalizer), so the namespace can go.
    crate::controller::delete_and_wait_gone(&api, "elected").await;
}

/// Issue 26: SIGTERM while passes are in flight and admission clients hold connections open (idle
/// keep-alive ones, as the apiserver keeps, and ones that never send a request): the process
/// releases its Lease, exits within seconds, and the successor takes over and converges.
#[tokio::test]
async fn sigterm_exits_within_seconds_with_passes_in_flight_and_open_connections() {
    let Some(kubeconfig) = cluster_or_skip("sigterm_exits_within_seconds_with_passes_in_flight_and_open_connections")
    else {
        return;
    };
    shared();
    let client = client_for(&kubeconfig).await;
    let namespace = TestNamespace::create(&client, "sigterm").await;
    let ns = namespace.name.clone();
    grant_lease_rights(&ns);
    let token = service_account_kubeconfig(
        &crate::support::operator::log_directory().join(format!("sigterm-{}", std::process::id())),
    );
    // Names of their own: the log file is named after the identity, and the test above runs
    // alpha and beta in the same test process at the same time.
    let (first_port, second_port) = (free_port(), free_port());
    let first = start_on(&ns, "delta", &token, first_port);
    let second = start_on(&ns, "epsilon", &token, second_port);
    let (leader_index, _) = wait_for_single_leader(&[&first, &second], Duration::from_secs(30)).await;
    let (mut leader, follower, leader_port) =
        if leader_index == 0 { (first, second, first_port) } else { (second, first, second_port) };

    // Passes in flight: many new databases at once.
    const DATABASES: usize = 40;
    let api: Api<DatabaseService> = Api::namespaced(client.clone(), &ns);
    let names: Vec<String> = (0..DATABASES).map(|index| format!("stop-{index}")).collect();
    // Four at a time, as bench-scale creates.
    use futures::StreamExt;
    futures::stream::iter(names.iter().map(|name| {
        let api = api.clone();
        let mut database = sample_database(name);
        database.metadata.labels = Some([(ISOLATION_LABEL.to_string(), ns.clone())].into());
        async move { api.create(&PostParams::default(), &database).await.unwrap() }
    }))
    .buffer_unordered(4)
    .collect::<Vec<_>>()
    .await;
    eventually("the leader writes for the new databases", Duration::from_secs(30), || async {
        (leader.writes() >= 5.0).then_some(())
    })
    .await;

    // Open connections: idle keep-alive ones after a served request, and silent ones.
    let https = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .pool_idle_timeout(Duration::from_secs(300))
        .build()
        .unwrap();
    for _ in 0..4 {
        let response = https.post(format!("https://127.0.0.1:{leader_port}/validate")).body("{}").send().await.unwrap();
        assert!(response.status().is_client_error(), "a malformed review is refused: {}", response.status());
    }
    let silent: Vec<std::net::TcpStream> =
        (0..4).map(|_| std::net::TcpStream::connect(("127.0.0.1", leader_port)).unwrap()).collect();

    let exited = leader.terminate_timed(Duration::from_secs(30));
    let took = exited.unwrap_or_else(|log| panic!("{log}"));
    eprintln!("[figure] operator exit after SIGTERM with {DATABASES} databases being created and 8 open connections: {took:?}");
    assert!(took <= Duration::from_secs(8), "exit after SIGTERM took {took:?}; log:\n{}", leader.log_tail());
    let log = std::fs::read_to_string(&leader.log).unwrap();
    assert!(log.contains("released the leader Lease"), "log:\n{}", leader.log_tail());
    assert!(log.contains("stopped"), "log:\n{}", leader.log_tail());
    drop(silent);

    let (_, takeover) = wait_for_single_leader(&[&follower], Duration::from_secs(LEASE_SECONDS * 2)).await;
    eprintln!("[figure] takeover after that SIGTERM: {takeover:?}");
    assert!(takeover <= Duration::from_millis(2500), "takeover after SIGTERM took {takeover:?}");
    futures::future::join_all(
        names.iter().map(|name| wait_for_phase(&api, name, Phase::Running, Duration::from_secs(180))),
    )
    .await;
    futures::future::join_all(names.iter().map(|name| crate::controller::delete_and_wait_gone(&api, name))).await;
}
