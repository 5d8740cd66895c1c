//! Network faults: the primary cut off from the API server while its clients still reach it.

use super::host;
use super::Bed;
use crate::failover::{epoch_now, SETTLE_TIMEOUT};
use crate::support::{eventually, kubectl};
use std::time::{Duration, Instant};

/// The API server as the pods reach it: the `kubernetes` Service and its endpoint.
fn api_server_addresses() -> Vec<(String, String)> {
    let service = kubectl(&["-n", "default", "get", "service", "kubernetes", "-o", "jsonpath={.spec.clusterIP}"]);
    let endpoint = kubectl(&[
        "-n",
        "default",
        "get",
        "endpoints",
        "kubernetes",
        "-o",
        "jsonpath={.subsets[0].addresses[0].ip} {.subsets[0].ports[0].port}",
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
    let fault = "primary cut off from the API server, clients still reach it";
    let Some(bed) = Bed::start(fault, 2).await else { return };
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
    let replaced = eventually("another primary", SETTLE_TIMEOUT, || async {
        let status = bed.databases().get(crate::failover::DATABASE).await.ok()?.status?;
        status.failover.current_primary.filter(|now| *now != primary)
    })
    .await;
    let promoted = cut.elapsed();
    api_server_rules("-D", agent.pid);
    let outcome = bed.conclude(fault, failed_at, since).await;
    eprintln!(
        "[figure] {fault}: fenced {:.1} s after the cut, {replaced} promoted after {:.1} s",
        fenced.as_secs_f64(),
        promoted.as_secs_f64()
    );
    assert!(fenced <= Duration::from_secs(12), "fenced only after {fenced:?}");
    assert!(promoted > fenced, "promoted at {promoted:?}, before the fence at {fenced:?}");
    assert!(outcome.overlaps.is_empty(), "two writable primaries: {:?}", outcome.overlaps);
}
