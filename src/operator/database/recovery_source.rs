//! The store-dependent rules of `spec.bootstrap.recovery`
//! ([`crate::admission::backup_validation::check_recovery_against_store`]), checked by the
//! controller before it creates the first pod or volume of a recovering DatabaseService: it reads
//! the source's backups and WAL listing and whether the new database's own archive path already
//! holds WAL, within [`STORE_CHECK_TIMEOUT`] and [`STORE_CHECK_BOUNDS`].
//!
//! This used to run at admission. It moved here because it reads Secrets and sends signed
//! requests to the endpoint the spec names: done for any review that reached the webhook port, a
//! forged one made the operator hand a Secret's key to an endpoint of the forger's choice. The
//! controller acts only on objects the apiserver stored, after admission asked whether their
//! author may read the Secrets they name.
//!
//! A target outside the archive stops the database before anything is made (condition
//! Recovered=False, reason [`TARGET_OUTSIDE_ARCHIVE`], phase Failed, a Warning event and a ledger
//! entry) and is checked again every [`RECHECK`] (the archive grows). An unreachable or slow store
//! does not block the recovery: it goes on, and an impossible target fails it later with its own
//! Recovered=False condition.

use crate::admission::backup_validation::check_recovery_against_store;
use crate::admission::validation::FieldError;
use crate::api::backup::ObjectStore;
use crate::api::database_service::{DatabaseService, DatabaseServiceStatus, Phase};
use crate::api::recovery::RECOVERED_CONDITION;
use crate::operator::conditions;
use crate::operator::journal::{Journal, Transition};
use crate::operator::ledger::LedgerEntry;
use crate::store::catalog::{list_backups_bounded, recoverable_window, CatalogBounds, RecoverableWindow};
use crate::store::client::{Addressing, S3Client, StoreSettings};
use crate::store::keys::KeyLayout;
use crate::store::manifest::BackupManifest;
use crate::store::signing::AccessKey;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

/// Longest time one pass spends on the stores.
pub const STORE_CHECK_TIMEOUT: Duration = Duration::from_secs(5);
/// How soon a database stopped for a target outside the archive is checked again.
pub const RECHECK: Duration = Duration::from_secs(30);
/// Reason of the Recovered=False condition of a target outside the archive.
pub const TARGET_OUTSIDE_ARCHIVE: &str = "TargetOutsideArchive";
/// How much of the stores one check reads.
pub const STORE_CHECK_BOUNDS: CatalogBounds =
    CatalogBounds { objects: 10_000, manifest_bytes: 16 * 1024 * 1024, keep_chunks: false };

/// What the stores hold for one recovering DatabaseService.
#[derive(Debug, Clone, Default)]
pub struct StoreContents {
    /// The source's completed base backups (without chunk lists).
    pub backups: Vec<BackupManifest>,
    /// The source's recoverable window.
    pub window: RecoverableWindow,
    /// The new database's own WAL archive path holds nothing (true without spec.backup).
    pub own_archive_is_empty: bool,
    /// A listing was cut at [`STORE_CHECK_BOUNDS`]: the window's end is a lower bound.
    pub truncated: bool,
}

/// A boxed future (the reader is a trait object in the admission state).
pub type ReadFuture<'a> = Pin<Box<dyn Future<Output = Result<StoreContents, String>> + Send + 'a>>;

/// Reads the stores of a recovering DatabaseService.
pub trait RecoverySourceReader: Send + Sync {
    /// What the source and the own archive path hold; Err with a one-line reason.
    fn read<'a>(&'a self, database: &'a DatabaseService) -> ReadFuture<'a>;
}

/// What the controller does with a recovering DatabaseService after reading the stores.
#[derive(Debug, PartialEq)]
pub enum StoreVerdict {
    /// Nothing to object to.
    Allow,
    /// Goes on, with this warning.
    Warn(String),
    /// Refused for these reasons.
    Deny(Vec<FieldError>),
}

/// The verdict given what reading the stores gave (pure).
pub fn verdict(database: &DatabaseService, read: Result<StoreContents, String>) -> StoreVerdict {
    match read {
        Err(reason) => StoreVerdict::Warn(format!(
            "spec.bootstrap.recovery was not checked against the store ({reason}): an impossible target fails the recovery later (condition Recovered)"
        )),
        Ok(contents) => {
            let errors = check_recovery_against_store(
                &database.spec,
                &contents.backups,
                &contents.window,
                contents.own_archive_is_empty,
            );
            // A time after the truncated listing's end may still be inside the window.
            let errors: Vec<FieldError> = errors
                .into_iter()
                .filter(|error| !(contents.truncated && error.detail.contains("outside the recoverable window")))
                .collect();
            match (errors.is_empty(), contents.truncated) {
                (false, _) => StoreVerdict::Deny(errors),
                (true, true) => StoreVerdict::Warn(format!(
                    "the source store holds more than {} objects: the end of the recoverable window was not checked",
                    STORE_CHECK_BOUNDS.objects
                )),
                (true, false) => StoreVerdict::Allow,
            }
        }
    }
}

/// Reads the stores with `reader` within [`STORE_CHECK_TIMEOUT`] and decides.
pub async fn check(reader: &dyn RecoverySourceReader, database: &DatabaseService) -> StoreVerdict {
    let read = match tokio::time::timeout(STORE_CHECK_TIMEOUT, reader.read(database)).await {
        Ok(read) => read,
        Err(_) => Err(format!("no answer within {} s", STORE_CHECK_TIMEOUT.as_secs())),
    };
    verdict(database, read)
}

/// The reader of the operator: credentials from the Secrets the spec names (read with the
/// operator's client, in the DatabaseService's namespace), then bounded S3 listings.
pub struct KubeStoreReader {
    client: kube::Client,
}

impl KubeStoreReader {
    /// A reader using `client` for the Secrets.
    pub fn new(client: kube::Client) -> Self {
        KubeStoreReader { client }
    }

    async fn connect(&self, namespace: &str, store: &ObjectStore, name: &str) -> Result<(S3Client, KeyLayout), String> {
        if store.ca_secret.is_some() {
            return Err("a store with caSecret is checked by the recovery itself".into());
        }
        let secrets: kube::Api<Secret> = kube::Api::namespaced(self.client.clone(), namespace);
        let credentials = &store.credentials_secret;
        let secret = secrets
            .get_opt(&credentials.name)
            .await
            .map_err(|error| format!("read Secret {}: {error}", credentials.name))?
            .ok_or_else(|| format!("Secret {} not found", credentials.name))?;
        let key = |wanted: &str| -> Result<String, String> {
            secret
                .data
                .as_ref()
                .and_then(|data| data.get(wanted))
                .map(|value| String::from_utf8_lossy(&value.0).trim().to_string())
                .ok_or_else(|| format!("Secret {} has no key {wanted}", credentials.name))
        };
        let access_key = AccessKey {
            id: key(credentials.access_key_id_key.as_deref().unwrap_or("accessKeyId"))?,
            secret: key(credentials.secret_access_key_key.as_deref().unwrap_or("secretAccessKey"))?,
        };
        let client = S3Client::new(StoreSettings {
            endpoint: store.endpoint.clone(),
            bucket: store.bucket.clone(),
            region: store.region.clone().unwrap_or_else(|| "us-east-1".into()),
            access_key,
            ca_file: None,
            timeout: STORE_CHECK_TIMEOUT,
            connect_timeout: None,
            addressing: Addressing::Path,
        })
        .map_err(|error| error.to_string())?;
        let layout = KeyLayout::new(store.path.as_deref().unwrap_or(""), store.server_name_or(name))
            .map_err(|error| error.to_string())?;
        Ok((client, layout))
    }

    async fn read_stores(&self, database: &DatabaseService) -> Result<StoreContents, String> {
        let Some(recovery) = database.spec.bootstrap.as_ref().and_then(|bootstrap| bootstrap.recovery.as_ref()) else {
            return Ok(StoreContents { own_archive_is_empty: true, ..Default::default() });
        };
        let namespace = database.namespace().ok_or("the object has no namespace")?;
        let name = database.name_any();
        let (source, layout) = self.connect(&namespace, &recovery.source, &name).await?;
        let (backups, backups_truncated) = list_backups_bounded(&source, &layout, &STORE_CHECK_BOUNDS)
            .await
            .map_err(|error| format!("source store: {error}"))?;
        let (wal, wal_truncated) = source
            .list_objects_bounded(&layout.wal_prefix(), STORE_CHECK_BOUNDS.objects)
            .await
            .map_err(|error| format!("source store: {error}"))?;
        let own_archive_is_empty = match &database.spec.backup {
            None => true,
            Some(backup) => {
                let (own, own_layout) = self.connect(&namespace, &backup.object_store, &name).await?;
                let (objects, _) = own
                    .list_objects_bounded(&own_layout.wal_prefix(), 1)
                    .await
                    .map_err(|error| format!("own store: {error}"))?;
                objects.is_empty()
            }
        };
        Ok(StoreContents {
            window: recoverable_window(&backups, &wal),
            backups,
            own_archive_is_empty,
            truncated: backups_truncated || wal_truncated,
        })
    }
}

impl RecoverySourceReader for KubeStoreReader {
    fn read<'a>(&'a self, database: &'a DatabaseService) -> ReadFuture<'a> {
        Box::pin(self.read_stores(database))
    }
}

/// Whether `database` recovers and nothing of it exists yet: the moment to check its target.
pub fn needs_check(database: &DatabaseService, observed: &crate::operator::database::observe::Observed) -> bool {
    let recovering = database.spec.bootstrap.as_ref().is_some_and(|bootstrap| bootstrap.recovery.is_some());
    recovering && observed.stateful_set.is_none() && observed.pods.is_empty() && observed.claims.is_empty()
}

/// Writes what a check decided into the pass's status and journal (pure); true when the pass
/// must create nothing. A refusal is journaled (Warning event, ledger entry) once per episode.
pub fn apply_verdict(
    verdict: StoreVerdict,
    status: &mut DatabaseServiceStatus,
    generation: i64,
    now: chrono::DateTime<chrono::Utc>,
    journal: &mut Journal,
) -> bool {
    let already = status
        .conditions
        .iter()
        .any(|condition| condition.type_ == RECOVERED_CONDITION && condition.reason == TARGET_OUTSIDE_ARCHIVE);
    match verdict {
        StoreVerdict::Deny(errors) => {
            let message = crate::admission::validation::ValidationOutcome { errors, warnings: Vec::new() }.message();
            let transition = Transition {
                condition: RECOVERED_CONDITION,
                status: false,
                condition_reason: TARGET_OUTSIDE_ARCHIVE,
                event_reason: TARGET_OUTSIDE_ARCHIVE,
                warning: true,
                entry: Some(LedgerEntry::at(now, generation, TARGET_OUTSIDE_ARCHIVE, "", "", message.clone())),
                message,
            };
            journal.transition_on_change(&mut status.conditions, transition, generation, now);
            status.phase = Some(Phase::Failed);
            status.observed_generation = Some(generation);
            true
        }
        StoreVerdict::Warn(warning) => {
            if already {
                conditions::remove(&mut status.conditions, RECOVERED_CONDITION);
            }
            journal.record(true, "RecoverySourceUnchecked", warning, None);
            false
        }
        StoreVerdict::Allow => {
            if already {
                conditions::remove(&mut status.conditions, RECOVERED_CONDITION);
            }
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::backup::{BootstrapSpec, CredentialsSecret, RecoverySpec, RecoveryTargetSpec};

    fn recovering(time: &str) -> DatabaseService {
        let mut database = DatabaseService::new("restored", Default::default());
        database.spec.version = "15".into();
        database.spec.bootstrap = Some(BootstrapSpec {
            initdb: None,
            import: None,
            recovery: Some(RecoverySpec {
                source: ObjectStore {
                    endpoint: "http://127.0.0.1:9".into(),
                    bucket: "backups".into(),
                    server_name: Some("orders".into()),
                    credentials_secret: CredentialsSecret { name: "s3".into(), ..Default::default() },
                    ..Default::default()
                },
                backup_id: None,
                target: Some(RecoveryTargetSpec { time: Some(time.into()), ..Default::default() }),
                allow_non_empty_archive: None,
            }),
        });
        database
    }

    fn contents(truncated: bool) -> StoreContents {
        let backups = vec![crate::store::selection::tests::backup("b", 10, 20)];
        let end = backups[0].end_time;
        StoreContents {
            window: RecoverableWindow {
                first_recoverability_point: Some(end),
                last_archived_wal_time: Some(end + chrono::Duration::minutes(30)),
            },
            backups,
            own_archive_is_empty: true,
            truncated,
        }
    }

    fn at(minutes: i64) -> String {
        let end = contents(false).backups[0].end_time;
        (end + chrono::Duration::minutes(minutes)).to_rfc3339()
    }

    #[test]
    fn a_target_within_the_second_of_the_last_archived_wal_passes() {
        // The store's times have whole seconds: the WAL archived at 30:00.9 shows 30:00.
        let end = contents(false).backups[0].end_time;
        let within = (end + chrono::Duration::minutes(30) + chrono::Duration::milliseconds(900)).to_rfc3339();
        assert_eq!(verdict(&recovering(&within), Ok(contents(false))), StoreVerdict::Allow);
        let after = (end + chrono::Duration::minutes(30) + chrono::Duration::seconds(1)).to_rfc3339();
        assert!(matches!(verdict(&recovering(&after), Ok(contents(false))), StoreVerdict::Deny(_)));
    }

    #[test]
    fn targets_inside_the_window_pass_and_outside_are_denied() {
        assert_eq!(verdict(&recovering(&at(10)), Ok(contents(false))), StoreVerdict::Allow);
        let StoreVerdict::Deny(errors) = verdict(&recovering(&at(40)), Ok(contents(false))) else {
            panic!("a time after the last archived WAL is denied")
        };
        assert!(errors[0].to_string().contains("outside the recoverable window"), "{errors:?}");
        let StoreVerdict::Deny(errors) = verdict(&recovering(&at(-5)), Ok(contents(false))) else {
            panic!("a time before every backup is denied")
        };
        assert!(errors[0].to_string().contains("no base backup ended before"), "{errors:?}");
    }

    #[test]
    fn an_unreadable_store_goes_on_with_a_warning() {
        let StoreVerdict::Warn(warning) = verdict(&recovering(&at(10)), Err("connection refused".into())) else {
            panic!("an unreachable store is no reason to deny")
        };
        assert!(warning.contains("not checked against the store (connection refused)"), "{warning}");
    }

    #[test]
    fn a_truncated_listing_cannot_deny_a_late_time() {
        let StoreVerdict::Warn(warning) = verdict(&recovering(&at(40)), Ok(contents(true))) else {
            panic!("the window's end is unknown when the listing was cut")
        };
        assert!(warning.contains("more than 10000 objects"), "{warning}");
    }

    struct Slow;
    impl RecoverySourceReader for Slow {
        fn read<'a>(&'a self, _: &'a DatabaseService) -> ReadFuture<'a> {
            Box::pin(async {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                Ok(StoreContents::default())
            })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_store_is_given_five_seconds() {
        let started = tokio::time::Instant::now();
        let outcome = check(&Slow, &recovering(&at(10))).await;
        assert_eq!(started.elapsed(), STORE_CHECK_TIMEOUT);
        assert!(matches!(outcome, StoreVerdict::Warn(warning) if warning.contains("no answer within 5 s")));
    }

    #[test]
    fn a_target_outside_the_archive_stops_the_pass_once_journaled_and_clears_when_it_fits() {
        let now = chrono::Utc::now();
        let mut status = DatabaseServiceStatus::default();
        let mut journal = Journal::default();
        let deny = || verdict(&recovering(&at(40)), Ok(contents(false)));
        assert!(apply_verdict(deny(), &mut status, 3, now, &mut journal));
        assert!(apply_verdict(deny(), &mut status, 3, now, &mut journal));
        assert_eq!(journal.entries.len(), 1, "one ledger entry per episode");
        assert_eq!(journal.events.len(), 1);
        assert!(journal.events[0].warning && journal.events[0].note.contains("outside the recoverable window"));
        assert_eq!(status.phase, Some(Phase::Failed));
        let recovered = status.conditions.iter().find(|condition| condition.type_ == RECOVERED_CONDITION).unwrap();
        assert_eq!((recovered.status.as_str(), recovered.reason.as_str()), ("False", TARGET_OUTSIDE_ARCHIVE));
        let allow = verdict(&recovering(&at(10)), Ok(contents(false)));
        assert!(!apply_verdict(allow, &mut status, 3, now, &mut journal));
        assert!(status.conditions.iter().all(|condition| condition.type_ != RECOVERED_CONDITION));
    }
}
