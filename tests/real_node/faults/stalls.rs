//! Faults of processes that stop without dying: the primary's PostgreSQL stalled briefly (no
//! failover), stalled until fenced and then continued (it must never commit again beside the new
//! primary), and the primary's agent alone stopped (its watchdog fences PostgreSQL in time).

use super::host::{self, HostProcess};
use super::{Bed, RENEW_DEADLINE};
use crate::failover::{epoch_now, ledger_entries, SETTLE_TIMEOUT};
use crate::support::eventually;
use dbservice_operator::api::synchronous::DataDurability;
use std::time::{Duration, Instant};

/// Signals the postmaster of `pod` and every process it started (its backends rewrite their
/// environment for their process titles, so they are found by parent, not by environment).
fn signal_server(postmaster: &HostProcess, signal: i32) {
    dbservice_operator::instance::postgres::signal_server(postmaster.pid, signal);
    if signal == libc::SIGSTOP {
        // The fault is real only if the serving postmaster stopped (a CI run once stopped nothing
        // that served: its writer committed through the whole "stall").
        let deadline = Instant::now() + Duration::from_secs(1);
        while host::state(postmaster.pid) != Some('T') && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let state = host::state(postmaster.pid);
        assert_eq!(state, Some('T'), "the postmaster {postmaster:?} did not stop");
    }
}

#[tokio::test]
async fn a_two_second_stall_of_the_primary_starts_no_failover() {
    two_second_stall("primary's PostgreSQL stopped for 2 s", None).await;
}

/// Issue 38: the same under `required` durability (3 instances).
#[tokio::test]
async fn a_two_second_stall_under_required_durability_starts_no_failover() {
    two_second_stall(
        "primary's PostgreSQL stopped for 2 s, required durability, 3 instances",
        Some(DataDurability::Required),
    )
    .await;
}

async fn two_second_stall(fault: &str, durability: Option<DataDurability>) {
    let Some(bed) = Bed::start_in_mode(fault, durability).await else { return };
    let primary = bed.primary().await;
    let (since, failed_at) = (bed.last_id(), epoch_now());
    let postmaster = host::postmaster(bed.ns(), &primary).expect("the primary's postmaster");
    signal_server(&postmaster, libc::SIGSTOP);
    tokio::time::sleep(Duration::from_secs(2)).await;
    signal_server(&postmaster, libc::SIGCONT);
    let outcome = bed.conclude(fault, failed_at, since).await;
    assert_eq!(bed.primary().await, primary, "a 2-second stall moved the primary");
    let started = ledger_entries(bed.ns(), "FailoverStarted");
    assert!(started.is_empty(), "a 2-second stall started a failover: {started:?}");
    assert!(outcome.acknowledged >= 20, "the writer committed through the stall: {outcome:?}");
    assert_eq!(outcome.lost, 0);
    assert!(outcome.overlaps.is_empty(), "{:?}", outcome.overlaps);
}

#[tokio::test]
async fn a_primary_stalled_until_fenced_then_continued_never_commits_beside_the_new_one() {
    let fault = "primary's PostgreSQL stopped until fenced, then continued";
    let Some(bed) = Bed::start(fault, 2).await else { return };
    let primary = bed.primary().await;
    let (since, failed_at) = (bed.last_id(), epoch_now());
    let postmaster = host::postmaster(bed.ns(), &primary).expect("the primary's postmaster");
    // Every process of the server now, to continue later whatever survived the fence.
    let stalled = dbservice_operator::instance::postgres::server_processes(postmaster.pid);
    signal_server(&postmaster, libc::SIGSTOP);
    let replaced = eventually("another primary", SETTLE_TIMEOUT, || async {
        crate::failover::settled(&bed.client, bed.ns(), bed.instances).await.filter(|now| *now != primary)
    })
    .await;
    // Whatever was not killed wakes up now, with its open connections.
    for pid in &stalled {
        host::signal(*pid, libc::SIGCONT);
    }
    let outcome = bed.conclude(fault, failed_at, since).await;
    assert_ne!(replaced, primary);
    assert!(outcome.overlaps.is_empty(), "two writable primaries: {:?}", outcome.overlaps);
    // Issue 38: the default durability (preferred) had the standby confirm every commit.
    assert_eq!(outcome.lost, 0, "preferred durability lost acknowledged commits: {outcome:?}");
    // The README's target is 30 s; under the whole suite on two cores it measured 25-38 s.
    assert!(outcome.rto <= 60.0, "a hung primary is replaced within 60 s, took {:.1} s", outcome.rto);
}

/// Issue 38: the same fault under `required` durability with three instances (commits wait for
/// one of two standbys, the failover needs both final positions): no acknowledged commit lost.
#[tokio::test]
async fn a_primary_stalled_until_fenced_under_required_durability_loses_no_commit() {
    let fault = "primary's PostgreSQL stopped until fenced, required durability, 3 instances";
    let Some(bed) = Bed::start_durable(fault, 3, DataDurability::Required).await else { return };
    let primary = bed.primary().await;
    let (since, failed_at) = (bed.last_id(), epoch_now());
    let postmaster = host::postmaster(bed.ns(), &primary).expect("the primary's postmaster");
    let stalled = dbservice_operator::instance::postgres::server_processes(postmaster.pid);
    signal_server(&postmaster, libc::SIGSTOP);
    eventually("another primary", SETTLE_TIMEOUT, || async {
        crate::failover::settled(&bed.client, bed.ns(), bed.instances).await.filter(|now| *now != primary)
    })
    .await;
    for pid in &stalled {
        host::signal(*pid, libc::SIGCONT);
    }
    let outcome = bed.conclude(fault, failed_at, since).await;
    assert!(outcome.overlaps.is_empty(), "two writable primaries: {:?}", outcome.overlaps);
    assert_eq!(outcome.lost, 0, "required durability lost acknowledged commits: {outcome:?}");
    assert!(outcome.rto <= 60.0, "a hung primary is replaced within 60 s, took {:.1} s", outcome.rto);
}

#[tokio::test]
async fn the_primary_agent_stopped_for_a_minute_is_fenced_by_its_watchdog() {
    agent_stopped_for_a_minute("primary's agent alone stopped for 60 s", None).await;
}

/// Issue 38: the same under `required` durability (3 instances: the commits wait for one of two
/// standbys, so the writer goes on without the old primary): no acknowledged commit lost.
#[tokio::test]
async fn the_primary_agent_stopped_under_required_durability_loses_no_commit() {
    let fault = "primary's agent alone stopped for 60 s, required durability, 3 instances";
    agent_stopped_for_a_minute(fault, Some(DataDurability::Required)).await;
}

/// Stops the primary's agent (SIGSTOP) for a minute: its watchdog must kill PostgreSQL at the
/// renew deadline, and the operator, seeing the Lease lapse, fails over within the README's target
/// (asserted loosely here; `benches/fault-recovery.sh` compares three runs with the target).
async fn agent_stopped_for_a_minute(fault: &str, durability: Option<DataDurability>) {
    let Some(bed) = Bed::start_in_mode(fault, durability).await else { return };
    let primary = bed.primary().await;
    let agent = host::agent(bed.ns(), &primary).expect("the primary's agent runs on this machine");
    let postmaster = host::postmaster(bed.ns(), &primary).expect("the primary's postmaster");
    let (since, failed_at) = (bed.last_id(), epoch_now());
    let stopped = Instant::now();
    host::signal(agent.pid, libc::SIGSTOP);
    let fenced = eventually("the watchdog to stop the primary's PostgreSQL", Duration::from_secs(60), || async {
        (!host::running(postmaster.pid)).then(|| stopped.elapsed())
    })
    .await;
    let replaced = bed.primary_other_than(&primary).await;
    let promoted = stopped.elapsed();
    tokio::time::sleep(Duration::from_secs(60).saturating_sub(stopped.elapsed())).await;
    host::signal(agent.pid, libc::SIGCONT);
    let outcome = bed.conclude(fault, failed_at, since).await;
    eprintln!(
        "[figure] {fault}: PostgreSQL fenced {:.1} s after the agent stopped, {replaced} promoted after {:.1} s",
        fenced.as_secs_f64(),
        promoted.as_secs_f64()
    );
    assert!(fenced <= RENEW_DEADLINE + Duration::from_secs(2), "fenced only after {fenced:?}");
    assert!(promoted > fenced, "promoted at {promoted:?}, before the fence at {fenced:?}");
    assert!(outcome.overlaps.is_empty(), "two writable primaries: {:?}", outcome.overlaps);
    assert_eq!(outcome.lost, 0, "{fault}: acknowledged commits lost: {outcome:?}");
    // Before the operator watched the Lease this took 52 s (the readiness probe, then a standby's
    // own Lease clock); the target is 15 s.
    assert!(outcome.rto <= 30.0, "{fault}: recovery took {:.1} s", outcome.rto);
}
