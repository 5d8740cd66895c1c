//! Automatic growth of the data volumes (`spec.storageGrowth`, issue 42): when an instance reports
//! its volume past `whenUsedPercent`, every claim is grown by `stepPercent` of the current size,
//! never past `limit`. One growth at a time: the next waits until every claim has its new size
//! and the volumes report it. Pure: the claims change through the claim expansion of `decide`.

use crate::api::database_service::{DatabaseService, DatabaseServiceStatus, StorageStatus};
use crate::api::storage::{StorageGrowthSpec, VolumeReport};
use crate::operator::conditions::{self, types::STORAGE_GROWTH};
use crate::operator::database::failover::pass::report_of;
use crate::operator::database::observe::{claim_class, claim_request};
use crate::operator::journal::{Journal, Transition};
use crate::operator::ledger::LedgerEntry;
use crate::quantity::parse_bytes;
use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::ResourceExt;
use std::sync::Arc;

const MIB: u128 = 1024 * 1024;
const GIB: u128 = 1024 * MIB;

/// What growth asks for this pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Growth {
    /// Nothing: no growth asked for, no volume past the threshold, or a growth still under way.
    Idle,
    /// Grow every volume by a step.
    Grow(Step),
    /// `instance`'s volume is `used_percent` full and the volumes are at `limit` already.
    AtLimit { limit: String, instance: String, used_percent: u8 },
    /// Nothing to grow, and every volume reports at least [`ROOM_PERCENT`] below the threshold: a
    /// limit reached before no longer holds (space was freed), and is told again if they refill.
    Roomy,
}

/// How far below the threshold every volume must be before a reached limit is cleared: reports
/// come in steps of 5 %, and a volume that hovers at the threshold must not be told full again
/// at every step.
pub const ROOM_PERCENT: u8 = 10;

/// One growth: every volume from `from` to `to`, because `instance`'s is `used_percent` full; the
/// largest reported size and the smallest claim capacity now, to tell stale reports later.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    pub from: String,
    pub to: String,
    pub instance: String,
    pub used_percent: u8,
    pub reported_bytes: u64,
    pub capacity_bytes: u64,
}

/// The size every data volume should have: spec.storageSize, or what growth made of it.
pub fn wanted_size(spec_size: &str, status: Option<&DatabaseServiceStatus>) -> String {
    let grown = status.and_then(|status| status.storage.as_ref()?.grown_to.clone());
    match grown {
        Some(grown) if bytes(&grown) > bytes(spec_size) => grown,
        _ => spec_size.to_string(),
    }
}

/// The growth this pass asks for, from the instances' reports and the claims. Only the bound
/// claims of running instances count: a claim kept after a scale-down, or one not bound yet, has
/// no file system that reports, and must not hold the others' growth.
pub fn plan(database: &DatabaseService, pods: &[Arc<Pod>], claims: &[Arc<PersistentVolumeClaim>]) -> Growth {
    let Some(spec) = database.spec.storage_growth.as_ref() else { return Growth::Idle };
    let storage = database.status.as_ref().and_then(|status| status.storage.as_ref());
    let current = wanted_size(&database.spec.storage_size, database.status.as_ref());
    let volumes: Vec<(String, VolumeReport)> =
        pods.iter().filter_map(|pod| Some((pod.name_any(), report_of(pod)?.volume?))).collect();
    let in_use: Vec<&Arc<PersistentVolumeClaim>> = claims
        .iter()
        .filter(|claim| bound(claim) && pods.iter().any(|pod| claim.name_any() == format!("data-{}", pod.name_any())))
        .collect();
    let resizing = in_use.iter().any(|claim| resizing(claim, bytes(&current)));
    let capacity_now = in_use.iter().map(|claim| capacity(claim)).min().unwrap_or(0);
    let stale_up_to = stale_up_to(
        storage.and_then(|storage| storage.reported_bytes_before_growth),
        storage.and_then(|storage| storage.capacity_bytes_before_growth),
        capacity_now,
    );
    let seen = Seen { capacity_bytes: u64::try_from(capacity_now).unwrap_or(u64::MAX), stale_up_to };
    decide(spec, &current, &seen, &volumes, resizing)
}

/// Reports of a volume up to this size are from before the last growth: its largest report then,
/// once the claims' capacity has grown past what it was (a driver that rounds sizes up may not
/// grow a disk for a small step: the reports are then current as they are).
fn stale_up_to(reported_before: Option<u64>, capacity_before: Option<u64>, capacity_now: u128) -> u128 {
    match reported_before {
        Some(reported) if capacity_now > u128::from(capacity_before.unwrap_or(0)) => u128::from(reported),
        _ => 0,
    }
}

/// What tells a current report from a stale one, and the claims' capacity now.
#[derive(Clone, Copy, Debug, Default)]
pub struct Seen {
    /// The smallest capacity of the claims in use.
    pub capacity_bytes: u64,
    /// Reports of a volume no larger than this are from before the last growth.
    pub stale_up_to: u128,
}

impl Seen {
    /// The report is from after the last growth.
    fn is_current(&self, volume: &VolumeReport) -> bool {
        u128::from(volume.size_bytes) > self.stale_up_to
    }
}

/// The decision, from the current size, what tells stale reports (see [`Seen`]), the volumes'
/// reports and whether a claim is still being resized.
pub fn decide(
    spec: &StorageGrowthSpec,
    current: &str,
    seen: &Seen,
    volumes: &[(String, VolumeReport)],
    resizing: bool,
) -> Growth {
    if resizing {
        return Growth::Idle;
    }
    let fullest = volumes
        .iter()
        .filter(|(_, volume)| seen.is_current(volume))
        .filter(|(_, volume)| volume.used_percent >= spec.when_used_percent())
        .max_by_key(|(_, volume)| volume.used_percent);
    let Some((instance, volume)) = fullest else { return roomy_or_idle(spec, seen, volumes) };
    let (current_bytes, limit_bytes) = (bytes(current), bytes(&spec.limit));
    if current_bytes >= limit_bytes {
        return Growth::AtLimit {
            limit: spec.limit.clone(),
            instance: instance.clone(),
            used_percent: volume.used_percent,
        };
    }
    let step = (current_bytes * u128::from(spec.step_percent())).div_ceil(100);
    let to = if current_bytes + step >= limit_bytes { spec.limit.clone() } else { quantity(current_bytes + step) };
    Growth::Grow(Step {
        from: current.to_string(),
        to,
        instance: instance.clone(),
        used_percent: volume.used_percent,
        reported_bytes: volumes.iter().map(|(_, volume)| volume.size_bytes).max().unwrap_or(0),
        capacity_bytes: seen.capacity_bytes,
    })
}

/// [`Growth::Roomy`] when there are current reports and every one is well below the threshold.
fn roomy_or_idle(spec: &StorageGrowthSpec, seen: &Seen, volumes: &[(String, VolumeReport)]) -> Growth {
    let mut current = volumes.iter().filter(|(_, volume)| seen.is_current(volume)).peekable();
    let below = spec.when_used_percent().saturating_sub(ROOM_PERCENT);
    if current.peek().is_some() && current.all(|(_, volume)| volume.used_percent < below) {
        Growth::Roomy
    } else {
        Growth::Idle
    }
}

/// Records the growth in the status, condition `StorageGrowth`, the ledger and an Event; says once
/// when the limit stops it or a claim's StorageClass (`not_expandable`) cannot grow.
pub fn record(
    growth: &Growth,
    database: &DatabaseService,
    not_expandable: Option<&str>,
    status: &mut DatabaseServiceStatus,
    journal: &mut Journal,
    now: DateTime<Utc>,
) {
    let Some(spec) = database.spec.storage_growth.as_ref() else {
        conditions::remove(&mut status.conditions, STORAGE_GROWTH);
        return;
    };
    let generation = database.metadata.generation.unwrap_or(0);
    let transition = match growth {
        Growth::Grow(step) => {
            // Every growth is told, also a second one with the same reason.
            let transition = grown(step, spec, status, generation, now);
            journal.transition(&mut status.conditions, transition, generation, now);
            return;
        }
        Growth::AtLimit { limit, instance, used_percent } => {
            status.storage.get_or_insert_with(StorageStatus::default).at_limit = Some(true);
            let message = format!(
                "the data volume of {instance} is {used_percent}% full and at spec.storageGrowth.limit {limit}: \
                 raise the limit or free space"
            );
            let entry = LedgerEntry::at(now, generation, "StorageGrowthLimitReached", limit, limit, instance);
            growth_transition(false, "LimitReached", "StorageGrowthLimitReached", message, Some(entry))
        }
        Growth::Idle | Growth::Roomy => {
            let roomy = *growth == Growth::Roomy;
            match idle(database, spec, roomy, not_expandable, status, generation, now) {
                Some(transition) => transition,
                None => return,
            }
        }
    };
    journal.transition_on_change(&mut status.conditions, transition, generation, now);
}

/// A growth in the status, and its transition (condition `Grown`, or `AtLimit` when it reached
/// the limit).
fn grown(
    step: &Step,
    spec: &StorageGrowthSpec,
    status: &mut DatabaseServiceStatus,
    generation: i64,
    now: DateTime<Utc>,
) -> Transition<'static> {
    let Step { from, to, instance, used_percent, reported_bytes, capacity_bytes } = step;
    let storage = status.storage.get_or_insert_with(StorageStatus::default);
    storage.grown_to = Some(to.clone());
    storage.grown_from = Some(from.clone());
    storage.reported_bytes_before_growth = Some(*reported_bytes);
    storage.capacity_bytes_before_growth = Some(*capacity_bytes);
    storage.at_limit = None;
    let at_limit = *to == spec.limit;
    let message = format!(
        "the data volume of {instance} was {used_percent}% full: every volume grows from {from} to {to}{}",
        if at_limit { ", its limit: no further growth" } else { "" }
    );
    let entry = LedgerEntry::at(now, generation, "StorageGrown", from, to, format!("{instance} {used_percent}% full"));
    let reason = if at_limit { "AtLimit" } else { "Grown" };
    growth_transition(true, reason, "StorageGrown", message, Some(entry))
}

/// No growth this pass: a class that cannot grow is told; a reached limit is cleared (quietly)
/// once the volumes are `roomy` again; else condition `Ready` is set (quietly) unless a growth or
/// the limit is what it says.
fn idle(
    database: &DatabaseService,
    spec: &StorageGrowthSpec,
    roomy: bool,
    not_expandable: Option<&str>,
    status: &mut DatabaseServiceStatus,
    generation: i64,
    now: DateTime<Utc>,
) -> Option<Transition<'static>> {
    let current = wanted_size(&database.spec.storage_size, database.status.as_ref());
    let below_limit = bytes(&current) < bytes(&spec.limit);
    let storage = status.storage.get_or_insert_with(StorageStatus::default);
    if below_limit {
        storage.at_limit = None;
    }
    if let Some(class) = not_expandable {
        let why = if class.is_empty() {
            "a claim has no StorageClass".to_string()
        } else {
            format!("StorageClass {class:?} does not allow volume expansion")
        };
        let message = format!("{why}: spec.storageGrowth cannot grow the volumes when they fill");
        let entry = LedgerEntry::at(now, generation, "StorageGrowthImpossible", "", "", class);
        return Some(growth_transition(
            false,
            "ExpansionNotSupported",
            "StorageGrowthImpossible",
            message,
            Some(entry),
        ));
    }
    let at_limit = storage.at_limit == Some(true);
    if at_limit && roomy {
        storage.at_limit = None;
        let message = format!(
            "every volume is at spec.storageGrowth.limit {}, none {}% full now",
            spec.limit,
            spec.when_used_percent()
        );
        conditions::set(&mut status.conditions, STORAGE_GROWTH, true, "AtLimit", message, Some(generation), now);
        return None;
    }
    // The last growth, or the limit, is what the condition says until the limit is raised; Ready
    // is set again at every pass, so that its message follows the spec.
    let grown_to_limit = !below_limit && growth_condition_is(status, &["AtLimit"]);
    if at_limit || grown_to_limit || growth_condition_is(status, &["Grown"]) {
        return None;
    }
    let message = format!(
        "volumes grow by {}% when one is {}% full, up to {}",
        spec.step_percent(),
        spec.when_used_percent(),
        spec.limit
    );
    conditions::set(&mut status.conditions, STORAGE_GROWTH, true, "Ready", message, Some(generation), now);
    None
}

fn growth_transition(
    status: bool,
    reason: &'static str,
    event_reason: &'static str,
    message: String,
    entry: Option<LedgerEntry>,
) -> Transition<'static> {
    Transition {
        condition: STORAGE_GROWTH,
        status,
        condition_reason: reason,
        event_reason,
        warning: !status,
        message,
        entry,
    }
}

/// Condition `StorageGrowth` is there, True, with one of `reasons`.
fn growth_condition_is(status: &DatabaseServiceStatus, reasons: &[&str]) -> bool {
    status.conditions.iter().any(|condition| {
        condition.type_ == STORAGE_GROWTH && condition.status == "True" && reasons.contains(&condition.reason.as_str())
    })
}

/// The first StorageClass of the claims that is known not to allow expansion.
pub fn not_expandable<'a>(
    claims: &[Arc<PersistentVolumeClaim>],
    expandable: &'a std::collections::BTreeMap<String, bool>,
) -> Option<&'a str> {
    let classes: Vec<String> = claims.iter().map(|claim| claim_class(claim)).collect();
    expandable.iter().find(|(class, allowed)| !**allowed && classes.contains(class)).map(|(class, _)| class.as_str())
}

/// A claim not yet at `wanted`, or asked for more than it has (its resize still under way).
fn resizing(claim: &PersistentVolumeClaim, wanted: u128) -> bool {
    let requested = bytes(&claim_request(claim));
    requested < wanted || capacity(claim) < requested
}

/// A claim's capacity (its status).
fn capacity(claim: &PersistentVolumeClaim) -> u128 {
    claim
        .status
        .as_ref()
        .and_then(|status| status.capacity.as_ref()?.get("storage"))
        .map_or(0, |quantity| bytes(&quantity.0))
}

/// The claim is bound to a volume.
pub fn bound(claim: &PersistentVolumeClaim) -> bool {
    claim.status.as_ref().and_then(|status| status.phase.as_deref()) == Some("Bound")
}

fn bytes(quantity: &str) -> u128 {
    parse_bytes(quantity).unwrap_or(0)
}

/// `bytes` as a quantity: whole Gi when it is, else Mi rounded up.
fn quantity(bytes: u128) -> String {
    if bytes.is_multiple_of(GIB) {
        format!("{}Gi", bytes / GIB)
    } else {
        format!("{}Mi", bytes.div_ceil(MIB))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(limit: &str) -> StorageGrowthSpec {
        StorageGrowthSpec { limit: limit.into(), when_used_percent: Some(80), step_percent: Some(50) }
    }

    fn volume(name: &str, size: u64, used_percent: u8) -> (String, VolumeReport) {
        (name.into(), VolumeReport { size_bytes: size, used_percent })
    }

    const GI: u64 = 1 << 30;

    #[test]
    fn a_volume_past_the_threshold_grows_every_volume_by_the_step() {
        let volumes = [volume("db-0", GI - (40 << 20), 75), volume("db-1", GI - (40 << 20), 85)];
        let growth = decide(&spec("4Gi"), "1Gi", &Seen::default(), &volumes, false);
        assert_eq!(
            growth,
            Growth::Grow(Step {
                from: "1Gi".into(),
                to: "1536Mi".into(),
                instance: "db-1".into(),
                used_percent: 85,
                reported_bytes: GI - (40 << 20),
                capacity_bytes: 0
            })
        );
        assert_eq!(
            decide(&spec("4Gi"), "1Gi", &Seen::default(), &volumes[..1], false),
            Growth::Idle,
            "below the threshold"
        );
    }

    #[test]
    fn growth_stops_at_the_limit_and_says_so() {
        let full = [volume("db-0", GI, 90)];
        let to_limit = decide(&spec("1200Mi"), "1Gi", &Seen::default(), &full, false);
        assert!(matches!(&to_limit, Growth::Grow(step) if step.to == "1200Mi"), "{to_limit:?}");
        let at_limit = decide(&spec("1Gi"), "1Gi", &Seen::default(), &full, false);
        assert_eq!(at_limit, Growth::AtLimit { limit: "1Gi".into(), instance: "db-0".into(), used_percent: 90 });
    }

    #[test]
    fn no_second_growth_before_the_first_is_done() {
        let full = [volume("db-0", GI, 90)];
        assert_eq!(
            decide(&spec("4Gi"), "1536Mi", &Seen::default(), &full, true),
            Growth::Idle,
            "a claim still resizing"
        );
        // The claims are done, but the volume still reports its old size (and so its old use).
        let stale = Seen { capacity_bytes: 1536 << 20, stale_up_to: u128::from(GI) };
        assert_eq!(decide(&spec("4Gi"), "1536Mi", &stale, &full, false), Growth::Idle);
        let grown = [volume("db-0", 1536 * (1 << 20) - (60 << 20), 85)];
        let next = decide(&spec("4Gi"), "1536Mi", &stale, &grown, false);
        assert!(matches!(&next, Growth::Grow(step) if step.to == "2304Mi"), "{next:?}");
    }

    #[test]
    fn reports_are_stale_only_once_the_disks_really_grew() {
        assert_eq!(stale_up_to(None, None, 1 << 30), 0, "before any growth every report counts");
        // Asked 1536Mi, given 2Gi (rounded up), reported 1.9Gi; then asked 2304Mi, given 3Gi.
        let reported = 1900 << 20;
        assert_eq!(stale_up_to(Some(reported), Some(2 << 30), 3 << 30), u128::from(reported));
        // Asked 1843Mi while already given 2Gi: the disk did not grow, the report is current.
        assert_eq!(stale_up_to(Some(reported), Some(2 << 30), 2 << 30), 0);
    }

    #[test]
    fn the_wanted_size_is_the_larger_of_the_spec_and_the_growth() {
        let mut status = DatabaseServiceStatus::default();
        assert_eq!(wanted_size("1Gi", Some(&status)), "1Gi");
        status.storage = Some(StorageStatus { grown_to: Some("1536Mi".into()), ..StorageStatus::default() });
        assert_eq!(wanted_size("1Gi", Some(&status)), "1536Mi");
        assert_eq!(wanted_size("2Gi", Some(&status)), "2Gi", "the user asked for more since");
    }

    fn growing_database(limit: &str) -> DatabaseService {
        let mut database: DatabaseService = serde_json::from_value(serde_json::json!({
            "apiVersion": "dbservice.dev/v1", "kind": "DatabaseService",
            "metadata": {"name": "db", "namespace": "shop", "generation": 1},
            "spec": {"version": "17", "storageSize": "1Gi", "databaseName": "app", "username": "app_user",
                     "storageGrowth": {"limit": limit}},
        }))
        .unwrap();
        database.status = Some(DatabaseServiceStatus::default());
        database
    }

    fn condition(status: &DatabaseServiceStatus) -> (String, String) {
        let found = status.conditions.iter().find(|condition| condition.type_ == STORAGE_GROWTH).unwrap();
        (found.status.clone(), found.reason.clone())
    }

    #[test]
    fn a_growth_is_told_each_time_and_the_limit_once() {
        let database = growing_database("2Gi");
        let mut status = DatabaseServiceStatus::default();
        let mut journal = Journal::default();
        record(&Growth::Idle, &database, None, &mut status, &mut journal, Utc::now());
        assert_eq!(condition(&status), ("True".into(), "Ready".into()));
        assert!(journal.is_empty(), "nothing to tell yet");
        let grow = |to: &str| {
            Growth::Grow(Step {
                from: "1Gi".into(),
                to: to.into(),
                instance: "db-0".into(),
                used_percent: 85,
                reported_bytes: GI,
                capacity_bytes: GI,
            })
        };
        record(&grow("1536Mi"), &database, None, &mut status, &mut journal, Utc::now());
        record(&grow("2Gi"), &database, None, &mut status, &mut journal, Utc::now());
        assert_eq!(journal.reasons(), ["StorageGrown", "StorageGrown"]);
        assert_eq!(condition(&status), ("True".into(), "AtLimit".into()));
        let full = Growth::AtLimit { limit: "2Gi".into(), instance: "db-0".into(), used_percent: 90 };
        record(&full, &database, None, &mut status, &mut journal, Utc::now());
        record(&full, &database, None, &mut status, &mut journal, Utc::now());
        assert_eq!(journal.reasons(), ["StorageGrown", "StorageGrown", "StorageGrowthLimitReached"]);
        assert_eq!(condition(&status), ("False".into(), "LimitReached".into()));
        assert_eq!(status.storage.as_ref().and_then(|storage| storage.at_limit), Some(true));
        assert_eq!(journal.entries.len(), 3, "each told in the ledger too");
        // The limit raised: growth is ready again, and says the new limit.
        let mut raised = growing_database("4Gi");
        raised.status = Some(status.clone());
        record(&Growth::Idle, &raised, None, &mut status, &mut journal, Utc::now());
        assert_eq!(condition(&status), ("True".into(), "Ready".into()));
        let message = &status.conditions.iter().find(|condition| condition.type_ == STORAGE_GROWTH).unwrap().message;
        assert!(message.ends_with("up to 4Gi"), "{message}");
        assert_eq!(status.storage.as_ref().and_then(|storage| storage.at_limit), None);
        assert_eq!(journal.entries.len(), 3, "quietly");
    }

    #[test]
    fn a_limit_reached_is_cleared_once_space_is_freed_and_told_again_when_full_again() {
        let database = growing_database("1Gi");
        let mut status = DatabaseServiceStatus::default();
        let mut journal = Journal::default();
        let full = [volume("db-0", GI, 90)];
        let reached = decide(&spec("1Gi"), "1Gi", &Seen::default(), &full, false);
        record(&reached, &database, None, &mut status, &mut journal, Utc::now());
        assert_eq!(condition(&status), ("False".into(), "LimitReached".into()));
        // Below the threshold but not by ROOM_PERCENT: still reached, nothing told.
        let hovering = decide(&spec("1Gi"), "1Gi", &Seen::default(), &[volume("db-0", GI, 75)], false);
        assert_eq!(hovering, Growth::Idle);
        record(&hovering, &database, None, &mut status, &mut journal, Utc::now());
        assert_eq!(condition(&status), ("False".into(), "LimitReached".into()));
        // Space freed on every volume: the limit no longer holds anything, quietly.
        let freed = [volume("db-0", GI, 40), volume("db-1", GI, 65)];
        let roomy = decide(&spec("1Gi"), "1Gi", &Seen::default(), &freed, false);
        assert_eq!(roomy, Growth::Roomy);
        record(&roomy, &database, None, &mut status, &mut journal, Utc::now());
        assert_eq!(condition(&status), ("True".into(), "AtLimit".into()));
        assert_eq!(status.storage.as_ref().and_then(|storage| storage.at_limit), None);
        assert_eq!(journal.reasons(), ["StorageGrowthLimitReached"], "clearing is not an event");
        // Full again: told again, once.
        for _ in 0..2 {
            record(&reached, &database, None, &mut status, &mut journal, Utc::now());
        }
        assert_eq!(journal.reasons(), ["StorageGrowthLimitReached", "StorageGrowthLimitReached"]);
        assert_eq!(
            decide(&spec("1Gi"), "1Gi", &Seen::default(), &[], false),
            Growth::Idle,
            "no report is no proof of room"
        );
    }

    #[test]
    fn a_class_that_cannot_grow_is_told_once_before_any_volume_fills() {
        let database = growing_database("4Gi");
        let mut status = DatabaseServiceStatus::default();
        let mut journal = Journal::default();
        for _ in 0..2 {
            record(&Growth::Idle, &database, Some("fixed"), &mut status, &mut journal, Utc::now());
        }
        assert_eq!(journal.reasons(), ["StorageGrowthImpossible"]);
        assert_eq!(condition(&status), ("False".into(), "ExpansionNotSupported".into()));
        assert!(journal.events[0].warning);
        let mut without = database.clone();
        without.spec.storage_growth = None;
        record(&Growth::Idle, &without, None, &mut status, &mut journal, Utc::now());
        assert!(status.conditions.iter().all(|condition| condition.type_ != STORAGE_GROWTH), "gone with the spec");
    }

    #[test]
    fn sizes_are_whole_mebibytes_or_gibibytes() {
        assert_eq!(quantity(3 * GIB), "3Gi");
        assert_eq!(quantity(GIB + GIB / 2), "1536Mi");
        assert_eq!(quantity(GIB + 1), "1025Mi");
    }
}
