//! Admission of `spec.bootstrap.import` (issue 24): a source the agent can reach by name,
//! databases it may write, and no second way of making the first data.

use crate::admission::field_error::{FieldError, FieldErrorKind};
use crate::admission::key_reference::validate_key_reference;
use crate::api::database_service::DatabaseServiceSpec;
use crate::api::import::{MAX_IMPORTED_DATABASES, SSL_MODES};
use std::collections::BTreeSet;
use std::sync::LazyLock;

/// A host name (RFC 1123 labels) or an IPv4 address; IPv6 literals in brackets are not needed
/// for Services and are left out.
static HOST: LazyLock<regex::Regex> = LazyLock::new(|| {
    regex::Regex::new(r"^[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?(\.[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?)*$")
        .expect("host pattern compiles")
});
/// A database name the agent restores into (as `spec.databases` names them).
static DATABASE: LazyLock<regex::Regex> =
    LazyLock::new(|| regex::Regex::new(r"^[a-z_][a-z0-9_]{0,62}$").expect("database pattern compiles"));
/// A role name to connect as: anything libpq passes, without control characters.
static USER: LazyLock<regex::Regex> =
    LazyLock::new(|| regex::Regex::new(r"^[^\x00-\x1f\x7f]{1,63}$").expect("user pattern compiles"));
/// Databases that belong to PostgreSQL on both sides.
const RESERVED_DATABASES: [&str; 3] = ["postgres", "template0", "template1"];

/// Every error of `spec.bootstrap.import`.
pub fn validate_import(spec: &DatabaseServiceSpec, errors: &mut Vec<FieldError>) {
    let Some(bootstrap) = &spec.bootstrap else { return };
    let Some(import) = &bootstrap.import else { return };
    const PATH: &str = "spec.bootstrap.import";
    if bootstrap.recovery.is_some() {
        errors.push(FieldError {
            path: PATH.into(),
            kind: FieldErrorKind::Forbidden,
            detail: "not with spec.bootstrap.recovery: the first data comes from one of them".into(),
        });
    }
    let source = &import.source;
    if source.host.len() > 253 || !HOST.is_match(&source.host) {
        errors.push(FieldError::invalid(
            &format!("{PATH}.source.host"),
            &source.host,
            "must be a host name (a Service's DNS name) or an IPv4 address, at most 253 characters",
        ));
    }
    if let Some(port) = source.port.filter(|port| !(1..=65535).contains(port)) {
        errors.push(FieldError::invalid(&format!("{PATH}.source.port"), port, "must be between 1 and 65535"));
    }
    if !USER.is_match(&source.username) {
        errors.push(FieldError::invalid(
            &format!("{PATH}.source.username"),
            &source.username,
            "must be a role name of 1 to 63 characters without control characters",
        ));
    }
    if let Some(mode) = source.ssl_mode.as_deref().filter(|mode| !SSL_MODES.contains(mode)) {
        errors.push(FieldError {
            path: format!("{PATH}.source.sslMode"),
            kind: FieldErrorKind::Unsupported(mode.to_string()),
            detail: format!("supported values: {}", SSL_MODES.join(", ")),
        });
    }
    let secret = &source.password_secret;
    validate_key_reference(
        &format!("{PATH}.source.passwordSecret"),
        "Secret",
        &secret.name,
        secret.key.as_deref(),
        errors,
    );
    if import.databases.is_empty() || import.databases.len() > MAX_IMPORTED_DATABASES {
        errors.push(FieldError::invalid(
            &format!("{PATH}.databases"),
            import.databases.len(),
            format!("must list 1 to {MAX_IMPORTED_DATABASES} databases"),
        ));
    }
    let mut seen = BTreeSet::new();
    for (index, name) in import.databases.iter().enumerate() {
        let path = format!("{PATH}.databases[{index}]");
        if !DATABASE.is_match(name) {
            errors.push(FieldError::invalid(
                &path,
                name,
                "must be a lowercase letter or '_' first, then lowercase letters, digits or '_', at most 63 bytes",
            ));
        } else if RESERVED_DATABASES.contains(&name.as_str()) {
            errors.push(FieldError {
                path,
                kind: FieldErrorKind::Forbidden,
                detail: format!("{name:?} belongs to PostgreSQL; import the application's database instead"),
            });
        } else if !seen.insert(name) {
            errors.push(FieldError {
                path,
                kind: FieldErrorKind::Forbidden,
                detail: format!("{name:?} is listed twice"),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::backup::BootstrapSpec;
    use crate::api::import::{ImportSource, ImportSpec};
    use crate::api::roles::PasswordSecret;

    fn spec_with(import: ImportSpec) -> DatabaseServiceSpec {
        DatabaseServiceSpec {
            bootstrap: Some(BootstrapSpec { import: Some(import), ..Default::default() }),
            ..Default::default()
        }
    }

    fn good() -> ImportSpec {
        ImportSpec {
            source: ImportSource {
                host: "legacy.prod.svc.cluster.local".into(),
                port: Some(5432),
                username: "app".into(),
                password_secret: PasswordSecret { name: "legacy-credentials".into(), key: None },
                ssl_mode: Some("require".into()),
            },
            databases: vec!["app".into(), "reports".into()],
            roles: None,
        }
    }

    fn paths(import: ImportSpec) -> Vec<String> {
        let mut errors = Vec::new();
        validate_import(&spec_with(import), &mut errors);
        errors.into_iter().map(|error| error.path).collect()
    }

    #[test]
    fn a_complete_import_is_accepted() {
        assert!(paths(good()).is_empty());
    }

    #[test]
    fn bad_sources_and_databases_are_refused_each_with_its_field() {
        type Change = fn(&mut ImportSpec);
        let cases: Vec<(Change, &str)> = vec![
            (|import| import.source.host = "http://legacy".into(), "spec.bootstrap.import.source.host"),
            (|import| import.source.host = "-legacy".into(), "spec.bootstrap.import.source.host"),
            (|import| import.source.port = Some(0), "spec.bootstrap.import.source.port"),
            (|import| import.source.port = Some(70000), "spec.bootstrap.import.source.port"),
            (|import| import.source.username = String::new(), "spec.bootstrap.import.source.username"),
            (|import| import.source.username = "a\nb".into(), "spec.bootstrap.import.source.username"),
            (|import| import.source.ssl_mode = Some("strict".into()), "spec.bootstrap.import.source.sslMode"),
            (
                |import| import.source.password_secret.name = "Bad_Name".into(),
                "spec.bootstrap.import.source.passwordSecret.name",
            ),
            (|import| import.databases.clear(), "spec.bootstrap.import.databases"),
            (|import| import.databases = vec!["x".into(); 17], "spec.bootstrap.import.databases"),
            (|import| import.databases[1] = "Reports".into(), "spec.bootstrap.import.databases[1]"),
            (|import| import.databases[1] = "template1".into(), "spec.bootstrap.import.databases[1]"),
            (|import| import.databases[1] = "postgres".into(), "spec.bootstrap.import.databases[1]"),
            (|import| import.databases[1] = "app".into(), "spec.bootstrap.import.databases[1]"),
        ];
        for (change, path) in cases {
            let mut import = good();
            change(&mut import);
            let found = paths(import.clone());
            assert!(found.iter().any(|found| found == path), "{import:?}: {found:?}");
        }
    }

    #[test]
    fn import_and_recovery_together_are_refused() {
        let mut spec = spec_with(good());
        spec.bootstrap.as_mut().unwrap().recovery = Some(Default::default());
        let mut errors = Vec::new();
        validate_import(&spec, &mut errors);
        assert!(errors.iter().any(|error| error.path == "spec.bootstrap.import" && error.detail.contains("recovery")));
    }
}
