//! Secrets written by an older operator are brought to today's form (issue 37). The credentials
//! Secret of a database made before TLS has a `uri` without `sslmode=verify-full` (an application
//! using it would connect without verifying the server), and one made before Secret
//! NAME-replication still holds `replication-username` and `replication-password` (the password
//! of a role that streams the whole server, which applications must not have). Such a Secret is
//! rewritten in place: the `uri` rebuilt around the password it holds (never a new one), the
//! replication keys removed once Secret NAME-replication holds that password. The superuser
//! Secret gets the same `uri` rule.
//!
//! The caches hold Secrets' metadata only, so a Secret is read once per resourceVersion it shows
//! (remembered in [`crate::operator::database::checked_secrets::CheckedSecrets`]): a Secret nobody changes is read once per operator process.

use crate::api::database_service::DatabaseService;
use crate::operator::context::PassContext;
use crate::operator::database::build::credentials::{credentials_secret, superuser_secret};
use crate::operator::database::observe::Observed;
use crate::operator::journal::Journal;
use crate::operator::ledger::LedgerEntry;
use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::ByteString;
use kube::api::{Patch, PatchParams};
use kube::core::PartialObjectMeta;
use kube::{Api, ResourceExt};
use std::collections::BTreeMap;

/// Keys of the credentials Secret that an operator before Secret NAME-replication wrote.
pub const REPLICATION_KEYS: [&str; 2] = ["replication-username", "replication-password"];
/// Event reason and ledger action of a rewrite.
pub const REWRITTEN: &str = "CredentialsRewritten";

/// What makes a Secret's form old.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rewrite {
    /// Keys to set (today's values).
    pub set: BTreeMap<String, String>,
    /// Keys to remove.
    pub remove: Vec<String>,
}

impl Rewrite {
    /// What it changes, for the event and the ledger (no value).
    pub fn describe(&self) -> String {
        let mut parts: Vec<String> = self.set.keys().map(|key| format!("{key} rebuilt")).collect();
        parts.extend(self.remove.iter().map(|key| format!("{key} removed")));
        parts.join(", ")
    }

    /// The JSON merge patch: values base64 as `data` wants, removed keys null.
    pub fn merge_patch(&self, resource_version: &str) -> serde_json::Value {
        use base64::Engine;
        let mut data = serde_json::Map::new();
        for (key, value) in &self.set {
            data.insert(key.clone(), base64::engine::general_purpose::STANDARD.encode(value).into());
        }
        for key in &self.remove {
            data.insert(key.clone(), serde_json::Value::Null);
        }
        // The resourceVersion makes it conditional: a Secret changed since it was read is left to
        // the next pass.
        serde_json::json!({"metadata": {"resourceVersion": resource_version}, "data": data})
    }
}

fn text(data: &BTreeMap<String, ByteString>, key: &str) -> Option<String> {
    data.get(key).and_then(|value| String::from_utf8(value.0.clone()).ok())
}

/// Whether the `live` data of a Secret needs rewriting (pure). `today` builds today's Secret
/// around a password; `drop` names keys that must go. A `uri` without `sslmode=verify-full` is
/// rebuilt with the password the Secret holds; without a password nothing is rebuilt (a
/// credential is never made up here).
pub fn decide_rewrite(
    live: &BTreeMap<String, ByteString>,
    today: impl Fn(&str) -> Secret,
    drop: &[&str],
) -> Option<Rewrite> {
    let mut rewrite = Rewrite { set: BTreeMap::new(), remove: Vec::new() };
    let stale_uri = text(live, "uri").is_some_and(|uri| !uri.contains("sslmode=verify-full"));
    if let Some(password) = text(live, "password").filter(|password| stale_uri && !password.is_empty()) {
        let built = today(&password).data.unwrap_or_default();
        if let Some(uri) = text(&built, "uri") {
            rewrite.set.insert("uri".into(), uri);
        }
    }
    rewrite.remove = drop.iter().filter(|key| live.contains_key(**key)).map(|key| key.to_string()).collect();
    (!rewrite.set.is_empty() || !rewrite.remove.is_empty()).then_some(rewrite)
}

/// Builds a Secret in today's form around a password.
type TodaysForm<'a> = &'a (dyn Fn(&str) -> Secret + Sync);

/// Rewriting an old Secret failed.
#[derive(Debug, thiserror::Error)]
pub enum RewriteCredentialsError {
    /// Reading or patching the Secret failed.
    #[error("rewrite secret {name}: {source}")]
    Api {
        /// The Secret.
        name: String,
        /// Why.
        source: kube::Error,
    },
}

/// Brings the credentials and superuser Secrets of `database` to today's form, each read only
/// when its resourceVersion was not checked yet; records each rewrite (event and ledger entry).
pub async fn keep_credentials_form(
    database: &DatabaseService,
    observed: &Observed,
    context: &PassContext,
    journal: &mut Journal,
    now: DateTime<Utc>,
) -> Result<(), RewriteCredentialsError> {
    // The replication keys go only once Secret NAME-replication holds that password.
    let drop: &[&str] = if observed.replication.is_some() { &REPLICATION_KEYS } else { &[] };
    let credentials = |password: &str| credentials_secret(database, password);
    let superuser = |password: &str| superuser_secret(database, password);
    let secrets: [(_, TodaysForm<'_>, &[&str]); 2] =
        [(observed.credentials.as_ref(), &credentials, drop), (observed.superuser.as_ref(), &superuser, &[])];
    for (cached, today, drop) in secrets {
        let Some(cached) = cached else { continue };
        if let Some(description) = rewrite_one(database, cached, today, drop, context).await? {
            let generation = database.metadata.generation.unwrap_or(0);
            let note = format!("secret {} rewritten to today's form: {description}", cached.name_any());
            let entry = LedgerEntry::at(now, generation, REWRITTEN, "old form", "today's form", note.clone());
            journal.record(false, REWRITTEN, note, Some(entry));
        }
    }
    Ok(())
}

/// Reads, decides and patches one Secret; what was rewritten, None when nothing was.
async fn rewrite_one(
    database: &DatabaseService,
    cached: &PartialObjectMeta<Secret>,
    today: TodaysForm<'_>,
    drop: &[&str],
    context: &PassContext,
) -> Result<Option<String>, RewriteCredentialsError> {
    let (uid, version) = (cached.uid().unwrap_or_default(), cached.resource_version().unwrap_or_default());
    let checked = &context.shared.checked_secrets;
    if checked.checked(&uid, &version) {
        return Ok(None);
    }
    let name = cached.name_any();
    let failed = |source| RewriteCredentialsError::Api { name: name.clone(), source };
    let secrets: Api<Secret> =
        Api::namespaced(context.shared.client.clone(), &database.namespace().unwrap_or_default());
    let live = secrets.get(&name).await.map_err(failed)?;
    let live_version = live.resource_version().unwrap_or_default();
    let Some(rewrite) = decide_rewrite(live.data.as_ref().unwrap_or(&BTreeMap::new()), today, drop) else {
        checked.remember(&uid, &live_version);
        return Ok(None);
    };
    let patch = Patch::Merge(rewrite.merge_patch(&live_version));
    let written = secrets.patch(&name, &PatchParams::default(), &patch).await.map_err(failed)?;
    context.shared.metrics.count_write("Secret", "patch");
    let key = format!("{}/{}", database.namespace().unwrap_or_default(), database.name_any());
    context.expectations.expect(&key, "Secret", &name, written.resource_version());
    checked.remember(&uid, &written.resource_version().unwrap_or_default());
    Ok(Some(rewrite.describe()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::database::build::test_database;

    fn data(entries: &[(&str, &str)]) -> BTreeMap<String, ByteString> {
        entries.iter().map(|(key, value)| (key.to_string(), ByteString(value.as_bytes().to_vec()))).collect()
    }

    fn today_of(database: &DatabaseService) -> impl Fn(&str) -> Secret + '_ {
        move |password| credentials_secret(database, password)
    }

    #[test]
    fn todays_secret_needs_nothing() {
        let database = test_database(serde_json::json!({}));
        let live = credentials_secret(&database, "s3cret").data.unwrap();
        assert_eq!(decide_rewrite(&live, today_of(&database), &REPLICATION_KEYS), None);
    }

    #[test]
    fn a_pre_tls_uri_is_rebuilt_around_the_password_the_secret_holds() {
        let database = test_database(serde_json::json!({}));
        let live = data(&[
            ("username", "app_user"),
            ("password", "kept:pw"),
            ("uri", "postgresql://app_user:kept:pw@orders.shop.svc:5432/app"),
        ]);
        let rewrite = decide_rewrite(&live, today_of(&database), &REPLICATION_KEYS).unwrap();
        assert_eq!(rewrite.set["uri"], "postgresql://app_user:kept:pw@orders.shop.svc:5432/app?sslmode=verify-full");
        assert!(rewrite.remove.is_empty());
        assert_eq!(rewrite.describe(), "uri rebuilt");
        assert!(!rewrite.set.contains_key("password"), "the password is never rewritten");
    }

    #[test]
    fn replication_keys_go_only_when_asked_and_a_secret_without_a_password_is_not_rebuilt() {
        let database = test_database(serde_json::json!({}));
        let mut live = credentials_secret(&database, "pw").data.unwrap();
        live.extend(data(&[("replication-username", "replicator"), ("replication-password", "r")]));
        let rewrite = decide_rewrite(&live, today_of(&database), &REPLICATION_KEYS).unwrap();
        assert_eq!(rewrite.remove, ["replication-username", "replication-password"]);
        assert!(rewrite.set.is_empty());
        assert_eq!(decide_rewrite(&live, today_of(&database), &[]), None, "NAME-replication not made yet");
        let no_password = data(&[("uri", "postgresql://app_user@orders.shop.svc:5432/app")]);
        assert_eq!(decide_rewrite(&no_password, today_of(&database), &[]), None);
    }

    #[test]
    fn the_patch_is_conditional_sets_base64_and_removes_with_null() {
        let rewrite = Rewrite { set: [("uri".to_string(), "u".to_string())].into(), remove: vec!["r".into()] };
        let patch = rewrite.merge_patch("42");
        assert_eq!(
            patch,
            serde_json::json!({"metadata": {"resourceVersion": "42"}, "data": {"uri": "dQ==", "r": null}})
        );
    }
}
