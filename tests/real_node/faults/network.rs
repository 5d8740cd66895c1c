//! Network faults: the primary cut off from the API server while its clients still reach it, and
//! a replication link too slow for a switchover's shutdown.

use super::host;
use super::{Bed, RENEW_DEADLINE};
use crate::failover::{epoch_now, SETTLE_TIMEOUT};
use crate::support::{eventually, kubectl};
use dbservice_operator::api::synchronous::DataDurability;
use std::time::{Duration, Instant};

/// The API server as the pods reach it: the `kubernetes` Service and its endpoint.
fn api_server_addresses() -> Vec<(String, String)> {
    let service = kubectl(&["-n", "default", "get", "service", "kubernetes", "-o", "jsonpath={.spec.clusterIP}"]);
    let endpoint = kubectl(&[
        "-n",
        "default",
        "get",
        "endpointslices",
        "-l",
        "kubernetes.io/service-name=kubernetes",
        "-o",
        "jsonpath={.items[0].endpoints[0].addresses[0]} {.items[0].ports[0].port}",
    ]);
    let (address, port) = endpoint.trim().split_once(' ').expect("the kubernetes Service has an endpoint");
    vec![(service.trim().to_string(), "443".to_string()), (address.to_string(), port.to_string())]
}

fn api_server_rules(action: &str, pid: u32) {
    for (address, port) in api_server_addresses() {
        host::in_network_of(
            pid,
            &["iptables", action, "OUTPUT", "-p", "tcp", "-d", &address, "--dport", &port, "-j", "DROP"],
        );
    }
}

#[tokio::test]
async fn a_primary_cut_off_from_the_api_server_fences_itself_before_a_standby_is_promoted() {
    cut_off_from_the_api_server("primary cut off from the API server, clients still reach it", None).await;
}

/// Issue 38: the same under `required` durability (3 instances): no acknowledged commit lost.
#[tokio::test]
async fn a_primary_cut_off_from_the_api_server_under_required_durability_loses_no_commit() {
    let fault = "primary cut off from the API server, required durability, 3 instances";
    cut_off_from_the_api_server(fault, Some(DataDurability::Required)).await;
}

/// Drops the primary's traffic to the API server (its clients still reach it): it must fence
/// itself at the renew deadline, before the operator, seeing the Lease lapse, promotes a standby.
async fn cut_off_from_the_api_server(fault: &str, durability: Option<DataDurability>) {
    let Some(bed) = Bed::start_in_mode(fault, durability).await else { return };
    let primary = bed.primary().await;
    let agent = host::agent(bed.ns(), &primary).expect("the primary's agent runs on this machine");
    let postmaster = host::postmaster(bed.ns(), &primary).expect("the primary's postmaster");
    let (since, failed_at) = (bed.last_id(), epoch_now());
    let cut = Instant::now();
    api_server_rules("-A", agent.pid);
    let fenced = eventually("the cut-off primary to fence itself", Duration::from_secs(60), || async {
        (!host::running(postmaster.pid)).then(|| cut.elapsed())
    })
    .await;
    let replaced = bed.primary_other_than(&primary).await;
    let promoted = cut.elapsed();
    api_server_rules("-D", agent.pid);
    let outcome = bed.conclude(fault, failed_at, since).await;
    eprintln!(
        "[figure] {fault}: fenced {:.1} s after the cut, {replaced} promoted after {:.1} s",
        fenced.as_secs_f64(),
        promoted.as_secs_f64()
    );
    assert!(fenced <= RENEW_DEADLINE + Duration::from_secs(2), "fenced only after {fenced:?}");
    assert!(promoted > fenced, "promoted at {promoted:?}, before the fence at {fenced:?}");
    assert!(outcome.overlaps.is_empty(), "two writable primaries: {:?}", outcome.overlaps);
    assert_eq!(outcome.lost, 0, "{fault}: acknowledged commits lost: {outcome:?}");
    // Before the operator watched the Lease this took 51 s; the target is 15 s.
    assert!(outcome.rto <= 30.0, "{fault}: recovery took {:.1} s", outcome.rto);
}

fn throttle_server(pid: u32, action: &str) {
    let limit = ["-p", "tcp", "--sport", "5432", "-m", "limit", "--limit", "20/second", "--limit-burst", "20"];
    host::in_network_of(pid, &[&["iptables", action, "OUTPUT"][..], &limit[..], &["-j", "ACCEPT"]].concat());
    host::in_network_of(pid, &["iptables", action, "OUTPUT", "-p", "tcp", "--sport", "5432", "-j", "DROP"]);
}

#[tokio::test]
async fn a_switchover_over_a_throttled_replication_link_loses_no_acknowledged_commit() {
    let fault = "switchover while the primary's replication link is throttled (20 packets/s)";
    switchover_over_a_throttled_link(fault, None).await;
}

/// Issue 38: the same under `required` durability (3 instances).
#[tokio::test]
async fn a_switchover_over_a_throttled_replication_link_under_required_durability_loses_no_commit() {
    let fault =
        "switchover while the primary's replication link is throttled (20 packets/s), required durability, 3 instances";
    switchover_over_a_throttled_link(fault, Some(DataDurability::Required)).await;
}

async fn switchover_over_a_throttled_link(fault: &str, durability: Option<DataDurability>) {
    let Some(bed) = Bed::start_in_mode(fault, durability).await else { return };
    let primary = bed.primary().await;
    let target = bed.other_than(&primary);
    let agent = host::agent(bed.ns(), &primary).expect("the primary's agent runs on this machine");
    // What the server sends from port 5432 is throttled to 20 packets/s (about 30 kB/s): its WAL
    // stream to the standby, and its answers to clients; not the agent's API calls. A few MB of WAL
    // then take minutes to reach the standby, longer than any shutdown may take. (No `prio` qdisc
    // in this kernel to shape one port with `tc`: iptables' limit match drops the excess instead.)
    throttle_server(agent.pid, "-A");
    crate::failover::exec_in(
        bed.ns(),
        &primary,
        "psql -X -q -h /var/run/postgresql -U \"$POSTGRES_USER\" -d \"$POSTGRES_DB\" \
         -c \"create table filler as select n, repeat('x', 200) as payload from generate_series(1, 20000) n\"",
    );
    let (since, failed_at) = (bed.last_id(), epoch_now());
    bed.request_switchover(&target).await;
    // Either it completes (the standby got every commit first) or it is abandoned with the old
    // primary primary again; the link heals once the database has settled one way or the other.
    let outcome_primary = eventually("the switchover to complete or be abandoned", SETTLE_TIMEOUT, || async {
        let database = bed.databases().get(crate::failover::DATABASE).await.ok()?;
        let requested = database.metadata.annotations.unwrap_or_default();
        let failover = database.status?.failover;
        let settled = failover.current_primary == failover.target_primary && failover.transition.is_none();
        (settled && !requested.contains_key(dbservice_operator::api::failover::SWITCHOVER_ANNOTATION))
            .then_some(failover.current_primary?)
    })
    .await;
    if let Some(agent) = host::agent(bed.ns(), &primary).filter(|now| now.pid == agent.pid) {
        throttle_server(agent.pid, "-D");
    }
    let outcome = bed.conclude(fault, failed_at, since).await;
    eprintln!(
        "[figure] {fault}: {}",
        if outcome_primary == target { "completed" } else { "abandoned, the old primary is primary again" }
    );
    assert_eq!(outcome.lost, 0, "a switchover lost acknowledged commits: {outcome:?}");
    assert!(outcome.overlaps.is_empty(), "two writable primaries: {:?}", outcome.overlaps);
}
