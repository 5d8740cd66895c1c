//! In-place major upgrades (issue 24): a `spec.version` of a newer major than the one running is
//! carried out with `pg_upgrade` by the primary's agent, orchestrated by the operator. The types
//! here are what the operator shows (`status.majorUpgrade`) and what the agents report
//! (`InstanceReport::major_upgrade`), plus the pure rules both sides share.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Environment variable of the postgres container: the previous major's `bin` directory, copied
/// from the previous image by the `previous-binaries` init container during an upgrade.
pub const PREVIOUS_BINDIR_VARIABLE: &str = "DBSERVICE_PREVIOUS_BINDIR";
/// Environment variable of the postgres container: `copy` or `link` (see [`UpgradeMethod`]).
pub const UPGRADE_METHOD_VARIABLE: &str = "DBSERVICE_UPGRADE_METHOD";
/// Where the previous major's files are copied, keeping their layout (`usr/lib/postgresql/<major>`,
/// `usr/share/postgresql/<major>`) so that the binaries find their libraries and share directory.
pub const PREVIOUS_BINARIES_DIRECTORY: &str = "/dbservice/previous";

/// How `pg_upgrade` moves the data (`spec.upgradeMethod`).
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum UpgradeMethod {
    /// Copies every file: needs free space for a second copy; the old data directory stays
    /// untouched until the new server accepted writes (the way back).
    #[default]
    Copy,
    /// Hard links: fast and little space, but the way back ends when the new server first starts.
    Link,
}

impl UpgradeMethod {
    /// The value of [`UPGRADE_METHOD_VARIABLE`].
    pub fn as_str(self) -> &'static str {
        match self {
            UpgradeMethod::Copy => "copy",
            UpgradeMethod::Link => "link",
        }
    }
}

/// Where an in-place major upgrade is.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum MajorUpgradePhase {
    /// `spec.backup` is set: the backup taken first (`DatabaseServiceBackup` NAME-before-pgN).
    BackingUp,
    /// The primary's pod runs the new image; its agent runs `pg_upgrade` and starts the server.
    Upgrading,
    /// The primary runs the new major; the standbys are cloned from it again.
    Recloning,
    /// Every instance runs the new major.
    Completed,
    /// The upgrade failed before the new major accepted writes: the primary's pod returns to the
    /// old image, whose agent swaps the untouched old data directory back.
    RollingBack,
    /// The upgrade failed before the new major accepted writes: the old major runs on its data.
    RolledBack,
}

/// One timed step of an upgrade.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpgradeStep {
    /// What was done.
    #[schemars(length(max = 63))]
    pub name: String,
    /// How long it took.
    pub milliseconds: u64,
}

/// `status.majorUpgrade`: the last in-place major upgrade.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MajorUpgradeStatus {
    /// Where it is.
    pub phase: MajorUpgradePhase,
    /// The version before.
    #[schemars(length(max = 32))]
    pub from_version: String,
    /// The image before (its binaries are copied into the pods for pg_upgrade).
    #[schemars(length(max = 512))]
    pub from_image: String,
    /// The version asked for.
    #[schemars(length(max = 32))]
    pub to_version: String,
    /// The image of that version.
    #[schemars(length(max = 512))]
    pub to_image: String,
    /// The instance being upgraded (the primary when the upgrade began).
    #[schemars(length(max = 63))]
    pub primary: String,
    /// When the upgrade began (RFC 3339).
    #[schemars(length(max = 40))]
    pub started_at: String,
    /// When the primary was stopped for the upgrade (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 40))]
    pub primary_stopped_at: Option<String>,
    /// From the primary's stop to the new major's server accepting connections.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub downtime_milliseconds: Option<u64>,
    /// The backup taken first (a `DatabaseServiceBackup`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    pub backup: Option<String>,
    /// The steps the primary's agent timed (pg_upgrade --check, pg_upgrade, ...).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub steps: Vec<UpgradeStep>,
    /// Statistics rebuilt by `vacuumdb --analyze-in-stages` ("stage 2 of 3", "done").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    pub analyze: Option<String>,
    /// Why it was rolled back, or what it waits for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub message: Option<String>,
}

impl MajorUpgradeStatus {
    /// Whether the upgrade is under way (not completed, not rolled back).
    pub fn in_progress(&self) -> bool {
        !matches!(self.phase, MajorUpgradePhase::Completed | MajorUpgradePhase::RolledBack)
    }

    /// Whether failover is held: the primary is down on purpose, or the standbys are of another
    /// major than the primary (promoting one would fork the database across majors).
    pub fn holds_failover(&self) -> bool {
        matches!(
            self.phase,
            MajorUpgradePhase::Upgrading | MajorUpgradePhase::Recloning | MajorUpgradePhase::RollingBack
        )
    }

    /// Whether the primary's pod runs (or is to run) the new image.
    pub fn primary_released(&self) -> bool {
        matches!(self.phase, MajorUpgradePhase::Upgrading | MajorUpgradePhase::Recloning)
    }
}

/// What an instance's agent says of a major upgrade (`InstanceReport::major_upgrade`).
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum InstanceUpgradeState {
    /// The data is of an older major than the binaries, and the agent waits for its turn.
    Waiting,
    /// `pg_upgrade` refused or failed: the old data directory is as it was.
    Failed,
    /// The data was upgraded and the new server runs (the way back is still open until it
    /// accepted writes).
    Upgraded,
}

/// An agent's report of its part in a major upgrade.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InstanceUpgradeReport {
    /// Where it is.
    pub state: InstanceUpgradeState,
    /// The major of the data before.
    pub from_major: u32,
    /// The major of the binaries.
    pub to_major: u32,
    /// Timed steps.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<UpgradeStep>,
    /// pg_upgrade's reason for a failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// `vacuumdb --analyze-in-stages` progress once the new server runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub analyze: Option<String>,
}

/// The name of the backup taken before upgrading `database` to `major`.
pub fn backup_name(database: &str, major: u32) -> String {
    let suffix = format!("-before-pg{major}");
    let keep = 63usize.saturating_sub(suffix.len()).min(database.len());
    format!("{}{suffix}", database[..keep].trim_end_matches('-'))
}

/// The archive's server name once a database was upgraded in place to `major`: a new system
/// identifier starts a new archive (the old one keeps the old system's WAL and backups, and a
/// store refuses to mix two systems, see `store::owner`).
pub fn upgraded_server_name(server_name: &str, major: u32) -> String {
    format!("{server_name}-pg{major}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backup_name_fits_an_object_name() {
        assert_eq!(backup_name("orders", 17), "orders-before-pg17");
        let long = "a".repeat(63);
        assert_eq!(backup_name(&long, 17).len(), 63);
        assert!(backup_name(&long, 17).ends_with("-before-pg17"));
    }

    #[test]
    fn an_upgraded_archive_has_its_own_server_name() {
        assert_eq!(upgraded_server_name("orders", 17), "orders-pg17");
    }
}
