//! The one validation function, pure, shared by the admission webhook and the reconciler.
//!
//! Every violation is reported at once with its field path, in the style of Kubernetes field
//! errors (`spec.version: Invalid value: "latest": must match ...`).

pub use crate::admission::field_error::{FieldError, FieldErrorKind, ValidationOutcome};
use crate::api::database_service::{DatabaseService, DatabaseServiceSpec, FailoverSpec, MAX_REPLICAS, MIN_REPLICAS};
use crate::api::pod::{REPLICATION_USER, SUPERUSER};
use crate::api::storage::{StorageGrowthSpec, STEP_PERCENT_RANGE, WHEN_USED_PERCENT_RANGE};
use crate::api::synchronous::acknowledges_alone;
pub use crate::api::version::{major_version, VERSION_PATTERN};
use crate::quantity::{parse_bytes, ParseQuantityError, MAX_BYTES};
use chrono::NaiveDate;
use std::sync::LazyLock;

/// Oldest supported PostgreSQL major version: the oldest one the real-node tests run (13 ended in
/// November 2025 and never ran here, so it is refused rather than accepted untested).
pub const OLDEST_SUPPORTED_MAJOR: u32 = 14;
/// Newest supported PostgreSQL major version.
pub const NEWEST_SUPPORTED_MAJOR: u32 = 18;
/// Longest DatabaseService name: child names add suffixes such as "-replicas" and the
/// StatefulSet's pods carry a revision hash label that must stay within 63 characters.
pub const MAX_NAME_LENGTH: usize = 52;

/// End of community support for each major (PostgreSQL versioning policy: five years).
const END_OF_LIFE: [(u32, (i32, u32, u32)); 5] =
    [(14, (2026, 11, 12)), (15, (2027, 11, 11)), (16, (2028, 11, 9)), (17, (2029, 11, 8)), (18, (2030, 11, 14))];

static IDENTIFIER_REGEX: LazyLock<regex::Regex> =
    LazyLock::new(|| regex::Regex::new(r"^[a-z_][a-z0-9_]*$").expect("identifier pattern compiles"));
static DNS_LABEL_REGEX: LazyLock<regex::Regex> =
    LazyLock::new(|| regex::Regex::new(r"^[a-z]([-a-z0-9]*[a-z0-9])?$").expect("label pattern compiles"));

pub use crate::admission::image_reference::{MAX_IMAGE_LENGTH, MAX_IMAGE_NAME_LENGTH};
/// Longest DNS subdomain (RFC 1123), the limit of a StorageClass name.
pub const MAX_DNS_SUBDOMAIN_LENGTH: usize = 253;

static DNS_SUBDOMAIN_REGEX: LazyLock<regex::Regex> = LazyLock::new(|| {
    regex::Regex::new(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
        .expect("subdomain pattern compiles")
});

/// Inputs of validation that come from the operator's configuration or the clock.
#[derive(Clone, Debug)]
pub struct ValidationSettings {
    /// Smallest allowed `spec.storageSize`, as written by the operator's flag (for messages).
    pub min_storage_size: String,
    /// The same minimum in bytes.
    pub min_storage_bytes: u128,
    /// Today's date, for end-of-life warnings.
    pub today: NaiveDate,
    /// Prefixes `spec.image` and `spec.pooler.image` must start with (the operator's
    /// `--allowed-image-prefixes`); empty allows any image.
    pub allowed_image_prefixes: Vec<String>,
    /// Images that already run (the controller's view): a policy set later does not stop them.
    pub running_images: Vec<String>,
    /// Whether `spec.bootstrap.import.roles: true` is allowed (the operator's
    /// `--allow-import-with-source-roles`): that restore runs as the superuser.
    pub allow_import_with_source_roles: bool,
}

impl ValidationSettings {
    /// Settings with the given minimum storage size and today's date.
    pub fn new(min_storage_size: &str) -> Result<Self, crate::quantity::ParseQuantityError> {
        Ok(Self {
            min_storage_bytes: parse_bytes(min_storage_size)?,
            min_storage_size: min_storage_size.to_string(),
            today: chrono::Utc::now().date_naive(),
            allowed_image_prefixes: Vec::new(),
            running_images: Vec::new(),
            allow_import_with_source_roles: false,
        })
    }

    /// The same settings allowing only images that start with one of `prefixes` (none: any).
    pub fn with_allowed_image_prefixes(self, prefixes: Vec<String>) -> Self {
        // An empty flag (`--allowed-image-prefixes=`) means no policy, not an empty prefix.
        let prefixes = prefixes.iter().map(|prefix| prefix.trim().to_string()).filter(|prefix| !prefix.is_empty());
        Self { allowed_image_prefixes: prefixes.collect(), ..self }
    }

    /// The same settings allowing `spec.bootstrap.import.roles: true` or not.
    pub fn with_import_with_source_roles(self, allowed: bool) -> Self {
        Self { allow_import_with_source_roles: allowed, ..self }
    }

    /// The settings of the in-pod agents, which re-check the spec before carrying it out: the
    /// storage minimum and the image policy are the operator's business (the agents act on neither).
    pub fn for_agents() -> Self {
        Self { allow_import_with_source_roles: true, ..Self::new("0").expect("0 is a quantity") }
    }
}

/// Validates a DatabaseService, on creation (`old` is None) or on update.
///
/// Updates that leave the spec unchanged (status, finalizers, labels) are never blocked, so that
/// the controller can always finish its work. An object being deleted is validated like any
/// other: while a finalizer holds it, its spec can still change, and the operator and the agents
/// act on it until it is gone.
pub fn validate(
    object: &DatabaseService,
    old: Option<&DatabaseService>,
    settings: &ValidationSettings,
) -> ValidationOutcome {
    let mut outcome = ValidationOutcome::default();
    if let Some(old) = old {
        if old.spec == object.spec {
            return outcome;
        }
    }
    let spec = &object.spec;
    let errors = &mut outcome.errors;
    validate_workload(object, old.map(|old| &old.spec), settings, errors);
    let mut postgresql_warnings = Vec::new();
    validate_server_features(object, errors, &mut postgresql_warnings);
    let name = object.metadata.name.as_deref().filter(|name| !name.is_empty()).unwrap_or("database");
    crate::admission::backup_validation::validate_backup_spec(name, spec, errors);
    crate::admission::import_validation::validate_import(spec, errors);
    validate_import_roles(spec, old.map(|old| &old.spec), settings, errors);
    if let Some(failover) = &spec.failover {
        validate_failover(failover, spec.replicas_or_default(), errors);
    }
    validate_synchronous_commit(spec, errors, &mut postgresql_warnings);
    if let Some(old) = old {
        validate_update(&old.spec, spec, errors);
        validate_scale_down(old, spec, errors);
        validate_major_upgrade_in_progress(old, spec, errors);
        validate_hibernation(old, spec, errors);
    }
    outcome.warnings = warnings(spec, settings);
    outcome.warnings.extend(postgresql_warnings);
    outcome
}

/// The name, the version, the storage, the replicas, the database and user names, the images,
/// the certificate Secret and the placement.
fn validate_workload(
    object: &DatabaseService,
    old: Option<&DatabaseServiceSpec>,
    settings: &ValidationSettings,
    errors: &mut Vec<FieldError>,
) {
    if let Some(name) = object.metadata.name.as_deref() {
        validate_name(name, errors);
    }
    let spec = &object.spec;
    validate_version(&spec.version, errors);
    validate_storage(spec, settings, errors);
    if let Some(growth) = &spec.storage_growth {
        validate_storage_growth(growth, &spec.storage_size, errors);
    }
    if let Some(replicas) = spec.replicas {
        if !(MIN_REPLICAS..=MAX_REPLICAS).contains(&replicas) {
            errors.push(FieldError::invalid(
                "spec.replicas",
                replicas,
                format!("must be between {MIN_REPLICAS} and {MAX_REPLICAS}"),
            ));
        }
    }
    validate_identifier("spec.databaseName", &spec.database_name, errors);
    validate_identifier("spec.username", &spec.username, errors);
    if [SUPERUSER, REPLICATION_USER].contains(&spec.username.as_str()) || spec.username.starts_with("pg_") {
        errors.push(FieldError {
            path: "spec.username".into(),
            kind: FieldErrorKind::Forbidden,
            detail: format!(
                "{:?} is reserved: \"{SUPERUSER}\" and names starting with \"pg_\" belong to PostgreSQL, \"{REPLICATION_USER}\" to replication",
                spec.username
            ),
        });
    }
    if let Some(image) = spec.image.as_deref() {
        validate_image(image, errors);
    }
    validate_image_sources(spec, old, settings, errors);
    if let Some(storage_class) = spec.storage_class_name.as_deref() {
        validate_storage_class(storage_class, errors);
    }
    if let Some(secret) = spec.user_server_certificate() {
        validate_secret_name("spec.tls.serverCertificateSecret", secret, errors);
    }
    crate::admission::placement_validation::validate_placement(&spec.placement, errors);
}

/// Server settings, declared roles and databases, monitoring, the pooler and initdb's arguments.
fn validate_server_features(
    object: &DatabaseService,
    errors: &mut Vec<FieldError>,
    postgresql_warnings: &mut Vec<String>,
) {
    let spec = &object.spec;
    let major =
        major_version(&spec.version).filter(|major| (OLDEST_SUPPORTED_MAJOR..=NEWEST_SUPPORTED_MAJOR).contains(major));
    if let Some(postgresql) = &spec.postgresql {
        crate::admission::postgresql_validation::validate_postgresql(postgresql, major, errors, postgresql_warnings);
    }
    crate::admission::roles_validation::validate_declarations(spec, major, errors);
    if let Some(monitoring) = &spec.monitoring {
        crate::admission::monitoring_validation::validate_monitoring(monitoring, errors);
    }
    if let Some(pooler) = &spec.pooler {
        let name = object.metadata.name.as_deref().unwrap_or_default();
        crate::admission::pooler_validation::validate_pooler(name, pooler, errors);
    }
    if let Some(initdb) = spec.initdb() {
        let recovering = spec.bootstrap.as_ref().is_some_and(|bootstrap| bootstrap.recovery.is_some());
        crate::admission::postgresql_validation::validate_initdb(initdb, recovering, errors);
    }
}

/// The object an in-pod agent acts on (pure): `database` itself when its spec passes the one
/// validation function (remembered in `accepted`); otherwise its status and metadata (failover,
/// fencing, the operator's wishes go on) with the last accepted spec, or, before any, its own spec
/// without the parts validation refused that the agents carry out with privileges (declared roles
/// and databases, server settings and pg_hba rules, custom queries, the import). The refusal, if
/// any, comes back for the log.
pub fn carried_out_by_agents(
    mut database: DatabaseService,
    accepted: &mut Option<DatabaseServiceSpec>,
) -> (DatabaseService, Option<String>) {
    let outcome = validate(&database, None, &ValidationSettings::for_agents());
    if outcome.is_allowed() {
        *accepted = Some(database.spec.clone());
        return (database, None);
    }
    let message = outcome.message();
    match accepted {
        Some(spec) => database.spec = spec.clone(),
        None => without_refused_parts(&mut database.spec, &outcome.errors),
    }
    (database, Some(message))
}

/// `spec` without what `errors` name among the parts agents carry out with privileges.
fn without_refused_parts(spec: &mut DatabaseServiceSpec, errors: &[FieldError]) {
    let index_of =
        |path: &str, prefix: &str| -> Option<usize> { path.strip_prefix(prefix)?.split(']').next()?.parse().ok() };
    let mut roles = std::collections::BTreeSet::new();
    let mut databases = std::collections::BTreeSet::new();
    for error in errors {
        let path = error.path.as_str();
        if let Some(index) = index_of(path, "spec.roles[") {
            roles.insert(index);
        } else if let Some(index) = index_of(path, "spec.databases[") {
            databases.insert(index);
        } else if path.starts_with("spec.roles") {
            spec.roles.clear();
        } else if path.starts_with("spec.databases") {
            spec.databases.clear();
        } else if path.starts_with("spec.postgresql") {
            spec.postgresql = None;
        } else if path.starts_with("spec.monitoring") {
            spec.monitoring = None;
        } else if path.starts_with("spec.bootstrap.import") {
            if let Some(bootstrap) = spec.bootstrap.as_mut() {
                bootstrap.import = None;
            }
        }
    }
    fn without<T>(items: &mut Vec<T>, dropped: &std::collections::BTreeSet<usize>) {
        let kept = std::mem::take(items).into_iter().enumerate().filter(|(index, _)| !dropped.contains(index));
        *items = kept.map(|(_, item)| item).collect();
    }
    without(&mut spec.roles, &roles);
    without(&mut spec.databases, &databases);
}

/// Longest failover delay and switchover timeout, in seconds.
pub const MAX_FAILOVER_SECONDS: u32 = 3600;
/// Shortest switchover timeout, in seconds: a clean stop and a promotion take a few seconds.
pub const MIN_SWITCHOVER_TIMEOUT_SECONDS: u32 = 5;
/// Largest maximumLagBytes (1 TiB): beyond that, a limit is no limit.
pub const MAX_FAILOVER_LAG_BYTES: u64 = 1 << 40;

/// `spec.failover.dataDurability` against `synchronousStandbys`: `required` and `preferred`
/// need at least one synchronous standby, and `required` one that exists (commits would wait
/// for ever).
fn validate_durability(failover: &FailoverSpec, standbys: u32, errors: &mut Vec<FieldError>) {
    use crate::api::synchronous::DataDurability;
    let Some(mode) = failover.data_durability else { return };
    if mode != DataDurability::None && failover.synchronous_standbys == Some(0) {
        errors.push(FieldError::invalid(
            "spec.failover.synchronousStandbys",
            0,
            format!(
                "must be at least 1 with dataDurability {mode}: use dataDurability none for asynchronous replication"
            ),
        ));
    }
    if mode == DataDurability::Required && failover.synchronous_standbys.is_none() && standbys == 0 {
        errors.push(FieldError::invalid(
            "spec.failover.dataDurability",
            mode,
            "needs replicas of at least 2: every commit would wait for a standby that does not exist".to_string(),
        ));
    }
}

/// `synchronous_commit` against synchronous replication: `off` and `local` acknowledge a commit
/// before any standby has it, so with a durability of `required` or `preferred` chosen in the
/// spec they would void the promise that a failover loses no acknowledged commit (refused; left
/// to the default, they make it `none`); `remote_write` keeps it unless the standby's machine
/// fails too (warned). Sessions and roles may still lower it for themselves: that is the
/// application's choice, per transaction, and documented.
fn validate_synchronous_commit(spec: &DatabaseServiceSpec, errors: &mut Vec<FieldError>, warnings: &mut Vec<String>) {
    let durability = spec.durability();
    let standbys = durability.standbys;
    let failover = spec.failover.as_ref();
    let chosen =
        failover.is_some_and(|failover| failover.data_durability.is_some() || failover.synchronous_standbys.is_some());
    if standbys == 0
        && !chosen
        && spec.replicas_or_default() >= 2
        && spec.synchronous_commit().is_some_and(acknowledges_alone)
    {
        warnings.push(
            "spec.postgresql.parameters[synchronous_commit] acknowledges commits no standby has: data durability is \
             none (asynchronous replication), not the default preferred"
                .to_string(),
        );
    }
    if standbys == 0 {
        return;
    }
    let mode = durability.mode;
    let Some(value) = spec.synchronous_commit() else { return };
    let path = "spec.postgresql.parameters[synchronous_commit]";
    match value.trim().to_ascii_lowercase().as_str() {
        _ if acknowledges_alone(value) => errors.push(FieldError {
            path: path.into(),
            kind: FieldErrorKind::Forbidden,
            detail: format!(
                "{value:?} acknowledges commits no standby has, voiding data durability {mode} with \
                 {standbys} synchronous standby(s): use on or remote_apply, or spec.failover.dataDurability: none \
                 for asynchronous replication"
            ),
        }),
        "remote_write" => warnings.push(format!(
            "{path} is remote_write: a commit is acknowledged once a standby has written it, before it is on the \
             standby's disk, so a failover loses it if the standby's machine fails too"
        )),
        _ => {}
    }
}

fn validate_failover(failover: &FailoverSpec, replicas: i32, errors: &mut Vec<FieldError>) {
    let standbys = u32::try_from(replicas.saturating_sub(1)).unwrap_or(0);
    validate_durability(failover, standbys, errors);
    if let Some(count) = failover.synchronous_standbys.filter(|count| *count > standbys) {
        errors.push(FieldError::invalid(
            "spec.failover.synchronousStandbys",
            count,
            format!("must be at most replicas - 1 = {standbys}: commits would wait for standbys that do not exist"),
        ));
    }
    if let Some(delay) = failover.delay_seconds.filter(|delay| *delay > MAX_FAILOVER_SECONDS) {
        errors.push(FieldError::invalid(
            "spec.failover.delaySeconds",
            delay,
            format!("must be at most {MAX_FAILOVER_SECONDS}"),
        ));
    }
    if let Some(lag) = failover.maximum_lag_bytes.filter(|lag| *lag > MAX_FAILOVER_LAG_BYTES) {
        errors.push(FieldError::invalid(
            "spec.failover.maximumLagBytes",
            lag,
            format!("must be at most {MAX_FAILOVER_LAG_BYTES} (1 TiB)"),
        ));
    }
    if let Some(timeout) = failover
        .switchover_timeout_seconds
        .filter(|timeout| !(MIN_SWITCHOVER_TIMEOUT_SECONDS..=MAX_FAILOVER_SECONDS).contains(timeout))
    {
        errors.push(FieldError::invalid(
            "spec.failover.switchoverTimeoutSeconds",
            timeout,
            format!("must be between {MIN_SWITCHOVER_TIMEOUT_SECONDS} and {MAX_FAILOVER_SECONDS}"),
        ));
    }
}

fn validate_name(name: &str, errors: &mut Vec<FieldError>) {
    if name.len() > MAX_NAME_LENGTH || !DNS_LABEL_REGEX.is_match(name) {
        errors.push(FieldError::invalid(
            "metadata.name",
            name,
            format!(
                "must be a lowercase DNS label of at most {MAX_NAME_LENGTH} characters (letters, digits and '-', starting with a letter), because it names Services and pods"
            ),
        ));
    }
}

fn validate_version(version: &str, errors: &mut Vec<FieldError>) {
    if version.is_empty() {
        errors.push(FieldError {
            path: "spec.version".into(),
            kind: FieldErrorKind::Required,
            detail: format!("must match {VERSION_PATTERN}"),
        });
        return;
    }
    match major_version(version) {
        None => errors.push(FieldError::invalid("spec.version", version, format!("must match {VERSION_PATTERN}"))),
        Some(major) if !(OLDEST_SUPPORTED_MAJOR..=NEWEST_SUPPORTED_MAJOR).contains(&major) => errors.push(FieldError {
            path: "spec.version".into(),
            kind: FieldErrorKind::Unsupported(version.to_string()),
            detail: format!("supported major versions are {OLDEST_SUPPORTED_MAJOR} to {NEWEST_SUPPORTED_MAJOR}"),
        }),
        Some(_) => {}
    }
}

fn validate_storage(spec: &DatabaseServiceSpec, settings: &ValidationSettings, errors: &mut Vec<FieldError>) {
    if spec.storage_size.is_empty() {
        errors.push(FieldError {
            path: "spec.storageSize".into(),
            kind: FieldErrorKind::Required,
            detail: "must be a quantity such as 10Gi".into(),
        });
        return;
    }
    match parse_bytes(&spec.storage_size) {
        Err(ParseQuantityError::Malformed(_)) => errors.push(FieldError::invalid(
            "spec.storageSize",
            shown(&spec.storage_size),
            "must be a quantity such as 10Gi (a number with an optional suffix Ki, Mi, Gi, Ti, k, M, G, T or an exponent such as e9, no spaces)",
        )),
        Err(ParseQuantityError::Negative(_)) => errors.push(FieldError::invalid(
            "spec.storageSize",
            &spec.storage_size,
            format!("must be at least {}", settings.min_storage_size),
        )),
        Err(ParseQuantityError::TooLarge(_)) => errors.push(FieldError::invalid(
            "spec.storageSize",
            shown(&spec.storage_size),
            format!("must be at most 8Ei ({MAX_BYTES} bytes)"),
        )),
        Ok(bytes) if bytes < settings.min_storage_bytes => errors.push(FieldError::invalid(
            "spec.storageSize",
            &spec.storage_size,
            format!("must be at least {}", settings.min_storage_size),
        )),
        Ok(_) => {}
    }
}

/// spec.storageGrowth: a limit no smaller than storageSize, a threshold and a step in range.
fn validate_storage_growth(growth: &StorageGrowthSpec, storage_size: &str, errors: &mut Vec<FieldError>) {
    match parse_bytes(&growth.limit) {
        Err(_) => errors.push(FieldError::invalid(
            "spec.storageGrowth.limit",
            shown(&growth.limit),
            "must be a quantity such as 100Gi",
        )),
        Ok(limit) if parse_bytes(storage_size).is_ok_and(|size| limit < size) => errors.push(FieldError::invalid(
            "spec.storageGrowth.limit",
            &growth.limit,
            format!("must be at least spec.storageSize ({storage_size})"),
        )),
        Ok(_) => {}
    }
    let when = growth.when_used_percent();
    if !WHEN_USED_PERCENT_RANGE.contains(&when) {
        let (low, high) = (WHEN_USED_PERCENT_RANGE.start(), WHEN_USED_PERCENT_RANGE.end());
        let detail = format!("must be between {low} and {high} (percent of the volume in use)");
        errors.push(FieldError::invalid("spec.storageGrowth.whenUsedPercent", when, detail));
    }
    let step = growth.step_percent();
    if !STEP_PERCENT_RANGE.contains(&step) {
        let (low, high) = (STEP_PERCENT_RANGE.start(), STEP_PERCENT_RANGE.end());
        let detail = format!("must be between {low} and {high} (percent of the current size)");
        errors.push(FieldError::invalid("spec.storageGrowth.stepPercent", step, detail));
    }
}

fn validate_identifier(path: &str, value: &str, errors: &mut Vec<FieldError>) {
    if value.is_empty() {
        errors.push(FieldError {
            path: path.into(),
            kind: FieldErrorKind::Required,
            detail: "must be a PostgreSQL identifier".into(),
        });
    } else if value.len() > 63 || !IDENTIFIER_REGEX.is_match(value) {
        errors.push(FieldError::invalid(
            path,
            value,
            "must be a PostgreSQL identifier: a lowercase letter or '_' first, then lowercase letters, digits or '_', at most 63 bytes",
        ));
    }
}

/// The tag of an image reference, if it has one (a digest reference has none).
pub fn image_tag(image: &str) -> Option<&str> {
    let without_digest = image.split('@').next().unwrap_or(image);
    let last_segment = without_digest.rsplit('/').next().unwrap_or(without_digest);
    last_segment.split_once(':').map(|(_, tag)| tag)
}

fn validate_image(image: &str, errors: &mut Vec<FieldError>) {
    crate::admission::image_reference::validate_image_at("spec.image", image, errors);
}

/// The platform team's bound on where images come from (`--allowed-image-prefixes`), for images
/// that are new: one the object had before, or that already runs, is not stopped by a policy set
/// after it (a fleet would otherwise stop healing the moment the policy is set).
fn validate_image_sources(
    spec: &DatabaseServiceSpec,
    old: Option<&DatabaseServiceSpec>,
    settings: &ValidationSettings,
    errors: &mut Vec<FieldError>,
) {
    let pooler_image = |spec: &DatabaseServiceSpec| spec.pooler.as_ref().and_then(|pooler| pooler.image.clone());
    let images = [
        ("spec.image", spec.image.clone(), old.and_then(|old| old.image.clone())),
        ("spec.pooler.image", pooler_image(spec), old.and_then(pooler_image)),
    ];
    for (path, image, before) in images {
        let Some(image) = image else { continue };
        if before.as_ref() == Some(&image) || settings.running_images.contains(&image) {
            continue;
        }
        validate_image_source(path, &image, &settings.allowed_image_prefixes, errors);
    }
}

/// `spec.bootstrap.import.roles: true` keeps the source's owners and grants, which takes a
/// restore as the superuser: whatever code the source's dump runs (a CHECK constraint's function
/// during COPY, or SQL a hostile source server makes pg_dump write) runs as the superuser. So the
/// author of a DatabaseService may choose it only where an administrator allowed it.
fn validate_import_roles(
    spec: &DatabaseServiceSpec,
    old: Option<&DatabaseServiceSpec>,
    settings: &ValidationSettings,
    errors: &mut Vec<FieldError>,
) {
    let with_roles = |spec: &DatabaseServiceSpec| {
        spec.bootstrap
            .as_ref()
            .and_then(|bootstrap| bootstrap.import.as_ref())
            .is_some_and(|import| import.with_roles())
    };
    if settings.allow_import_with_source_roles || !with_roles(spec) || old.is_some_and(with_roles) {
        return;
    }
    errors.push(FieldError {
        path: "spec.bootstrap.import.roles".into(),
        kind: FieldErrorKind::Forbidden,
        detail: "keeping the source's owners and grants restores as the superuser, so the source's dump would run code as the superuser: allowed only where the operator runs with --allow-import-with-source-roles (chart operator.allowImportWithSourceRoles)".into(),
    });
}

/// Whether `image` is under `prefix`: a prefix ending in `/` is a path; otherwise the image is the
/// prefix or continues it at a boundary (`/`, `:`, `@`), so `reg.example` does not admit
/// `reg.example.evil.io/x` nor `reg/db` admit `reg/db-evil/x`.
fn under_prefix(image: &str, prefix: &str) -> bool {
    match image.strip_prefix(prefix) {
        None => false,
        Some(rest) => prefix.ends_with('/') || rest.is_empty() || rest.starts_with(['/', ':', '@']),
    }
}

fn validate_image_source(path: &str, image: &str, allowed: &[String], errors: &mut Vec<FieldError>) {
    if allowed.is_empty() || allowed.iter().any(|prefix| under_prefix(image, prefix)) {
        return;
    }
    errors.push(FieldError {
        path: path.into(),
        kind: FieldErrorKind::Forbidden,
        detail: format!(
            "{:?} is not from an allowed registry: this operator runs images starting with {} only",
            shown(image),
            allowed.iter().map(|prefix| format!("{prefix:?}")).collect::<Vec<_>>().join(", ")
        ),
    });
}

fn validate_storage_class(name: &str, errors: &mut Vec<FieldError>) {
    if name.len() > MAX_DNS_SUBDOMAIN_LENGTH || !DNS_SUBDOMAIN_REGEX.is_match(name) {
        errors.push(FieldError::invalid(
            "spec.storageClassName",
            shown(name),
            format!("must be the name of a StorageClass: a lowercase RFC 1123 subdomain of at most {MAX_DNS_SUBDOMAIN_LENGTH} characters (lowercase letters, digits, '-' and '.', starting and ending with a letter or digit)"),
        ));
    }
}

fn validate_secret_name(path: &str, name: &str, errors: &mut Vec<FieldError>) {
    if name.len() > MAX_DNS_SUBDOMAIN_LENGTH || !DNS_SUBDOMAIN_REGEX.is_match(name) {
        errors.push(FieldError::invalid(
            path,
            shown(name),
            format!("must be the name of a Secret in this namespace: a lowercase RFC 1123 subdomain of at most {MAX_DNS_SUBDOMAIN_LENGTH} characters"),
        ));
    }
}

/// A value as quoted in a message: long values are cut, so that a denial stays readable and
/// small (control and bidirectional characters are escaped by the `{:?}` of the message).
fn shown(value: &str) -> String {
    const SHOWN: usize = 64;
    match value.char_indices().nth(SHOWN) {
        Some((cut, _)) => format!("{}... ({} bytes)", &value[..cut], value.len()),
        None => value.to_string(),
    }
}

/// A StatefulSet scales down from its highest ordinal: replicas at or below the primary's ordinal
/// would delete the primary's pod while it commits (and with it the Lease holder). The status
/// names the primary (and the instance being promoted); a switchover moves it first.
fn validate_scale_down(old: &DatabaseService, new: &DatabaseServiceSpec, errors: &mut Vec<FieldError>) {
    let Some(failover) = old.status.as_ref().map(|status| &status.failover) else { return };
    let replicas = new.replicas_or_default();
    if replicas >= old.spec.replicas_or_default() {
        return;
    }
    let primaries = [failover.current_primary.as_deref(), failover.target_primary.as_deref()];
    for primary in primaries.into_iter().flatten() {
        let Some(ordinal) = crate::api::names::instance_ordinal(primary) else { continue };
        if replicas <= ordinal {
            let name = old.metadata.name.as_deref().unwrap_or("<name>");
            errors.push(FieldError {
                path: "spec.replicas".into(),
                kind: FieldErrorKind::Forbidden,
                detail: format!(
                    "{replicas} replicas would remove {primary}, the primary: switch over first (annotate the DatabaseService with {}={name}-0) and scale down once it is done",
                    crate::api::failover::SWITCHOVER_ANNOTATION
                ),
            });
            return;
        }
    }
}

fn validate_update(old: &DatabaseServiceSpec, new: &DatabaseServiceSpec, errors: &mut Vec<FieldError>) {
    let immutable = |path: &str, old_value: String, new_value: String, errors: &mut Vec<FieldError>| {
        if old_value != new_value {
            errors.push(FieldError::invalid(path, new_value, format!("field is immutable (was {old_value:?})")));
        }
    };
    immutable("spec.databaseName", old.database_name.clone(), new.database_name.clone(), errors);
    immutable("spec.username", old.username.clone(), new.username.clone(), errors);
    immutable(
        "spec.storageClassName",
        old.storage_class_name.clone().unwrap_or_default(),
        new.storage_class_name.clone().unwrap_or_default(),
        errors,
    );
    if old.initdb() != new.initdb() {
        errors.push(FieldError {
            path: "spec.bootstrap.initdb".into(),
            kind: FieldErrorKind::Forbidden,
            detail: "field is immutable: initdb ran when the database was created".into(),
        });
    }
    if let (Ok(old_bytes), Ok(new_bytes)) = (parse_bytes(&old.storage_size), parse_bytes(&new.storage_size)) {
        if new_bytes < old_bytes {
            errors.push(FieldError::invalid(
                "spec.storageSize",
                &new.storage_size,
                format!("may grow but never shrink (was {:?}): volumes cannot be made smaller", old.storage_size),
            ));
        }
    }
    if let (Some(old_major), Some(new_major)) = (major_version(&old.version), major_version(&new.version)) {
        if new_major < old_major {
            errors.push(FieldError {
                path: "spec.version".into(),
                kind: FieldErrorKind::Forbidden,
                detail: format!(
                    "a major version never goes down ({old_major} to {new_major}): data of {old_major} cannot be read by {new_major}; recover a backup taken before the upgrade into a new DatabaseService instead"
                ),
            });
        }
    }
}

/// A major upgrade in progress runs to its end (or rollback) before the version changes again.
fn validate_major_upgrade_in_progress(old: &DatabaseService, new: &DatabaseServiceSpec, errors: &mut Vec<FieldError>) {
    let Some(upgrade) = old.status.as_ref().and_then(|status| status.major_upgrade.as_ref()) else { return };
    if upgrade.in_progress() && new.version != old.spec.version {
        errors.push(FieldError {
            path: "spec.version".into(),
            kind: FieldErrorKind::Forbidden,
            detail: format!(
                "the upgrade from {} to {} is in progress ({:?}): change the version once it completed or rolled back",
                upgrade.from_version, upgrade.to_version, upgrade.phase
            ),
        });
    }
}

/// Nothing runs while hibernated to carry out a new version, size or instance count: those wait
/// for the wake (which may come in the same change). A database hibernates only when settled:
/// not while a switchover, a failover, a rollout or a major upgrade is under way.
fn validate_hibernation(old: &DatabaseService, new: &DatabaseServiceSpec, errors: &mut Vec<FieldError>) {
    if !new.is_hibernated() {
        return;
    }
    let forbidden =
        |path: &str, detail: String| FieldError { path: path.into(), kind: FieldErrorKind::Forbidden, detail };
    let changed = [
        ("spec.version", old.spec.version != new.version),
        ("spec.image", old.spec.image != new.image),
        ("spec.replicas", old.spec.replicas_or_default() != new.replicas_or_default()),
        ("spec.storageSize", old.spec.storage_size != new.storage_size),
    ];
    for (path, _) in changed.iter().filter(|(_, changed)| *changed) {
        errors.push(forbidden(
            path,
            "cannot change while the database is hibernated: no instance runs to carry it out; wake it (spec.hibernated: false) in the same change or before".into(),
        ));
    }
    if old.spec.is_hibernated() {
        return;
    }
    let Some(status) = old.status.as_ref() else { return };
    let failover = &status.failover;
    let busy = if failover.transition.is_some() || failover.target_primary != failover.current_primary {
        Some("a switchover or failover is under way")
    } else if status.major_upgrade.as_ref().is_some_and(|upgrade| upgrade.in_progress()) {
        Some("a major upgrade is under way")
    } else if status.rollout_started_at.is_some() {
        Some("a version change is rolling out")
    } else {
        None
    };
    if let Some(busy) = busy {
        errors.push(forbidden("spec.hibernated", format!("{busy}: hibernate once it is done")));
    }
}

fn warnings(spec: &DatabaseServiceSpec, settings: &ValidationSettings) -> Vec<String> {
    let mut warnings = Vec::new();
    if let Some(major) = major_version(&spec.version) {
        let end_of_life = END_OF_LIFE
            .iter()
            .find(|(eol_major, _)| *eol_major == major)
            .and_then(|(_, (year, month, day))| NaiveDate::from_ymd_opt(*year, *month, *day));
        if let Some(end_of_life) = end_of_life {
            if settings.today >= end_of_life {
                warnings.push(format!(
                    "spec.version: PostgreSQL {major} reached end of life on {end_of_life} and receives no more fixes; plan a move to a newer major"
                ));
            }
        }
    }
    if spec.replicas_or_default() > 1 && spec.resources.is_none() {
        warnings.push(
            "spec.resources: replicas > 1 without resources: standbys may be scheduled where they starve the primary; set requests and limits".into(),
        );
    }
    if spec.deletion_policy == Some(crate::api::database_service::DeletionPolicy::Delete) {
        warnings.push(
            "spec.deletionPolicy: Delete removes the data volumes and credentials together with the DatabaseService"
                .into(),
        );
    }
    warnings
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_images(image: &str, pooler_image: Option<&str>) -> DatabaseService {
        let mut database: DatabaseService = serde_json::from_value(serde_json::json!({
            "apiVersion": "dbservice.dev/v1", "kind": "DatabaseService",
            "metadata": {"name": "orders", "namespace": "shop"},
            "spec": {"version": "16", "storageSize": "10Gi", "databaseName": "app", "username": "app_user",
                     "image": image},
        }))
        .unwrap();
        if let Some(pooler_image) = pooler_image {
            database.spec.pooler = Some(serde_json::from_value(serde_json::json!({"image": pooler_image})).unwrap());
        }
        database
    }

    #[test]
    fn images_outside_the_allowed_prefixes_are_refused_and_any_image_passes_without_a_policy() {
        let settings = ValidationSettings::new("1Gi").unwrap();
        let restricted = settings.clone().with_allowed_image_prefixes(vec!["registry.corp.example/".into()]);
        let allowed = with_images("registry.corp.example/postgres:16.4", Some("registry.corp.example/pgbouncer:1.24"));
        assert!(validate(&allowed, None, &restricted).errors.is_empty());
        let foreign = with_images("postgres:16.4", Some("evil.example/pgbouncer:1.24"));
        let errors: Vec<String> =
            validate(&foreign, None, &restricted).errors.iter().map(ToString::to_string).collect();
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(errors[0].starts_with("spec.image: Forbidden: \"postgres:16.4\" is not from an allowed registry"));
        assert!(errors[1].starts_with("spec.pooler.image: Forbidden:") && errors[1].contains("registry.corp.example/"));
        assert!(validate(&foreign, None, &settings).errors.is_empty(), "no policy: any image");
        // An image the object had, or that runs, is not stopped by a policy set after it.
        let mut changed = foreign.clone();
        changed.spec.replicas = Some(3);
        assert!(validate(&changed, Some(&foreign), &restricted).errors.is_empty());
        let running = ValidationSettings {
            running_images: vec!["postgres:16.4".into(), "evil.example/pgbouncer:1.24".into()],
            ..restricted.clone()
        };
        assert!(validate(&foreign, None, &running).errors.is_empty());
        // Prefixes end at a boundary.
        let bare = settings.with_allowed_image_prefixes(vec![" registry.corp.example ".into(), "reg/db".into()]);
        assert!(validate(&with_images("registry.corp.example/pg:16.4", None), None, &bare).errors.is_empty());
        assert!(validate(&with_images("reg/db:16.4", None), None, &bare).errors.is_empty());
        assert!(!validate(&with_images("registry.corp.example.evil.io/pg:16.4", None), None, &bare).errors.is_empty());
        assert!(!validate(&with_images("reg/db-evil/pg:16.4", None), None, &bare).errors.is_empty());
    }

    #[test]
    fn agents_carry_out_the_last_accepted_spec_and_before_any_drop_the_refused_grant() {
        let mut database = with_images("postgres:16.4", None);
        database.spec.roles =
            serde_json::from_value(serde_json::json!([{"name": "reporting"}, {"name": "audit"}])).unwrap();
        database.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        let mut escalating = database.clone();
        escalating.spec.roles[1].in_roles = vec!["pg_execute_server_program".into()];
        escalating.status = Some(Default::default());

        let mut accepted = None;
        let (carried, refusal) = carried_out_by_agents(escalating.clone(), &mut accepted);
        assert!(refusal.is_some_and(|reason| reason.contains("pg_execute_server_program")));
        let names: Vec<&str> = carried.spec.roles.iter().map(|role| role.name.as_str()).collect();
        assert_eq!(names, ["reporting"], "the refused role is dropped, the others kept");
        assert!(carried.status.is_some(), "the status still reaches the agent");

        let (carried, refusal) = carried_out_by_agents(database.clone(), &mut accepted);
        assert!(refusal.is_none() && carried.spec == database.spec && accepted.is_some());
        let (carried, refusal) = carried_out_by_agents(escalating, &mut accepted);
        assert!(refusal.is_some());
        assert_eq!(carried.spec, database.spec, "the last accepted spec stays in force");
    }
}
