//! Secrets written by an older operator are brought to today's form (issue 37). The credentials
//! Secret of a database made before TLS has a `uri` without `sslmode=verify-full` (an application
//! using it would connect without verifying the server), and one made before Secret
//! NAME-replication still holds `replication-username` and `replication-password` (the password
//! of a role that streams the whole server, which applications must not have). Such a Secret is
//! rewritten in place: the `uri` rebuilt around the password it holds (never a new one), the
//! replication keys removed once Secret NAME-replication holds that password and no pod of the
//! database references them (a pod an older operator made, not yet replaced under the
//! StatefulSet's OnDelete strategy, would not start again without them). The superuser Secret
//! gets the same `uri` rule. A rebuilt `uri` is told as a Warning: an application that used it
//! without the database's CA no longer connects.
//!
//! The caches hold Secrets' metadata only, so a Secret is read once per resourceVersion it shows
//! (remembered in [`crate::operator::database::checked_secrets::CheckedSecrets`]): a Secret nobody changes is read once per operator process.

use crate::api::database_service::DatabaseService;
use crate::api::names::ChildNames;
use crate::operator::context::PassContext;
use crate::operator::database::build::credentials::{credentials_secret, superuser_secret};
pub use crate::operator::database::build::credentials::{
    env_references_replication_keys, pod_references_replication_keys, volume_references_replication_keys,
    REPLICATION_KEYS,
};
use crate::operator::database::build::tls::CA_CONFIG_MAP_KEY;
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

/// Whether the replication keys of the credentials Secret (`live`) may go (pure): Secret
/// NAME-replication (`replication`, its data; None: not there) holds the same password, and no
/// pod of the database references the keys (`pods_reference`). A different password is kept:
/// the old pods' servers and standbys may use the one the credentials hold.
pub fn replication_keys_go(
    live: &BTreeMap<String, ByteString>,
    replication: Option<&BTreeMap<String, ByteString>>,
    pods_reference: bool,
) -> bool {
    let held = text(live, "replication-password");
    let kept = replication.and_then(|data| text(data, "password"));
    !pods_reference && kept.is_some_and(|kept| held.is_none_or(|held| held == kept))
}

/// The event of a rewrite (pure): whether it is a Warning, and its note (also the ledger's). A
/// rebuilt `uri` asks for `sslmode=verify-full`: an application without the CA stops connecting.
pub fn rewrite_event(secret: &str, database: &str, rewrite: &Rewrite) -> (bool, String) {
    let mut note = format!("secret {secret} rewritten to today's form: {}", rewrite.describe());
    let warning = rewrite.set.contains_key("uri");
    if warning {
        let authority = ChildNames::certificate_authority(database);
        note.push_str(&format!(
            "; the uri now requires sslmode=verify-full: an application using it needs the database's CA, \
             key {CA_CONFIG_MAP_KEY} of ConfigMap {authority}"
        ));
    }
    (warning, note)
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
    // The replication keys may go once Secret NAME-replication exists and no pod references
    // them; rewrite_one compares the passwords.
    let pods_reference = observed.pods.iter().any(|pod| pod_references_replication_keys(pod));
    let replication = observed.replication.as_deref().filter(|_| !pods_reference);
    let credentials = |password: &str| credentials_secret(database, password);
    let superuser = |password: &str| superuser_secret(database, password);
    let secrets: [(_, TodaysForm<'_>, _); 2] =
        [(observed.credentials.as_ref(), &credentials, replication), (observed.superuser.as_ref(), &superuser, None)];
    for (cached, today, replication) in secrets {
        let Some(cached) = cached else { continue };
        if let Some(rewrite) = rewrite_one(database, cached, today, replication, context).await? {
            let generation = database.metadata.generation.unwrap_or(0);
            let (warning, note) = rewrite_event(&cached.name_any(), &database.name_any(), &rewrite);
            let entry = LedgerEntry::at(now, generation, REWRITTEN, "old form", "today's form", note.clone());
            journal.record(warning, REWRITTEN, note, Some(entry));
        }
    }
    Ok(())
}

/// Reads, decides and patches one Secret; what was rewritten, None when nothing was.
/// `replication`: Secret NAME-replication when the replication keys may go as far as the caches
/// tell (read, and its password compared, only when the Secret still holds them).
async fn rewrite_one(
    database: &DatabaseService,
    cached: &PartialObjectMeta<Secret>,
    today: TodaysForm<'_>,
    replication: Option<&PartialObjectMeta<Secret>>,
    context: &PassContext,
) -> Result<Option<Rewrite>, RewriteCredentialsError> {
    // Checked under what the caches told of the keys: when the last old pod goes, or
    // NAME-replication changes, the Secret is read again though it did not change.
    let checked_at = |version: &str| match replication {
        Some(replication) => format!("{version}+{}", replication.resource_version().unwrap_or_default()),
        None => version.to_string(),
    };
    let uid = cached.uid().unwrap_or_default();
    let checked = &context.shared.checked_secrets;
    if checked.checked(&uid, &checked_at(&cached.resource_version().unwrap_or_default())) {
        return Ok(None);
    }
    let name = cached.name_any();
    let failed = |name: &str, source| RewriteCredentialsError::Api { name: name.to_string(), source };
    let secrets: Api<Secret> =
        Api::namespaced(context.shared.client.clone(), &database.namespace().unwrap_or_default());
    let live = secrets.get(&name).await.map_err(|error| failed(&name, error))?;
    let live_version = live.resource_version().unwrap_or_default();
    let live_data = live.data.unwrap_or_default();
    let holds_keys = REPLICATION_KEYS.iter().any(|key| live_data.contains_key(*key));
    let drop: &[&str] = match replication {
        Some(replication) if holds_keys => {
            let replication_name = replication.name_any();
            let held = secrets.get_opt(&replication_name).await.map_err(|error| failed(&replication_name, error))?;
            let held = held.and_then(|secret| secret.data);
            if replication_keys_go(&live_data, held.as_ref(), false) {
                &REPLICATION_KEYS
            } else {
                &[]
            }
        }
        _ => &[],
    };
    let Some(rewrite) = decide_rewrite(&live_data, today, drop) else {
        checked.remember(&uid, &checked_at(&live_version));
        return Ok(None);
    };
    let patch = Patch::Merge(rewrite.merge_patch(&live_version));
    let written = secrets.patch(&name, &PatchParams::default(), &patch).await.map_err(|error| failed(&name, error))?;
    context.shared.metrics.count_write("Secret", "patch");
    let key = format!("{}/{}", database.namespace().unwrap_or_default(), database.name_any());
    context.expectations.expect(&key, "Secret", &name, written.resource_version());
    checked.remember(&uid, &checked_at(&written.resource_version().unwrap_or_default()));
    Ok(Some(rewrite))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::database::build::test_database;
    use k8s_openapi::api::core::v1::Pod;

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
    fn replication_keys_go_only_when_named_replication_holds_the_same_password_and_no_pod_uses_them() {
        let live = data(&[("password", "pw"), ("replication-username", "replicator"), ("replication-password", "r")]);
        let same = data(&[("username", "replicator"), ("password", "r")]);
        let other = data(&[("username", "replicator"), ("password", "new")]);
        assert!(replication_keys_go(&live, Some(&same), false));
        assert!(!replication_keys_go(&live, Some(&other), false), "a different password is kept");
        assert!(!replication_keys_go(&live, None, false), "NAME-replication not there");
        assert!(!replication_keys_go(&live, Some(&same), true), "a pod still references them");
        let username_only = data(&[("password", "pw"), ("replication-username", "replicator")]);
        assert!(replication_keys_go(&username_only, Some(&same), false), "no password to compare");
    }

    #[test]
    fn pods_of_older_operators_reference_the_keys_by_env_or_volume_and_the_cache_keeps_that() {
        use crate::operator::caches::Slim;
        let pod =
            |spec: serde_json::Value| -> Pod { serde_json::from_value(serde_json::json!({"spec": spec})).unwrap() };
        let by_env = pod(serde_json::json!({"containers": [{"name": "postgres", "image": "postgres:15", "env": [
            {"name": "PLAIN", "value": "x"},
            {"name": "REPLICATION_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "orders-credentials", "key": "replication-password"}}}
        ]}]}));
        let by_volume = pod(
            serde_json::json!({"containers": [{"name": "postgres", "image": "postgres:16"}], "volumes": [
                {"name": "credentials", "secret": {"secretName": "orders-credentials", "defaultMode": 288,
                 "items": [{"key": "password", "path": "password"}, {"key": "replication-password", "path": "replication-password"}]}}
            ]}),
        );
        let today = pod(serde_json::json!({"containers": [{"name": "postgres", "image": "postgres:16", "env": [
            {"name": "REPLICATION_PASSWORD_FILE", "value": "/credentials/replication/password"}]}], "volumes": [
            {"name": "replication", "secret": {"secretName": "orders-replication", "items": [{"key": "password", "path": "password"}]}}
        ]}));
        for (name, pod, references) in [("env", by_env, true), ("volume", by_volume, true), ("today", today, false)] {
            assert_eq!(pod_references_replication_keys(&pod), references, "{name}");
            let mut slimmed = pod.clone();
            slimmed.slim();
            assert_eq!(pod_references_replication_keys(&slimmed), references, "{name}, cached");
        }
    }

    #[test]
    fn a_rebuilt_uri_is_a_warning_that_names_the_ca() {
        let rebuilt = Rewrite { set: [("uri".to_string(), "u".to_string())].into(), remove: Vec::new() };
        let (warning, note) = rewrite_event("orders-credentials", "orders", &rebuilt);
        assert!(warning, "{note}");
        assert!(note.contains("sslmode=verify-full") && note.contains("key ca.crt of ConfigMap orders-ca"), "{note}");
        let removed = Rewrite { set: BTreeMap::new(), remove: vec!["replication-password".into()] };
        let (warning, note) = rewrite_event("orders-credentials", "orders", &removed);
        assert!(!warning, "{note}");
        assert_eq!(note, "secret orders-credentials rewritten to today's form: replication-password removed");
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
