//! Admission of `spec.postgresql` (parameters against the major's `pg_settings` catalogue, pg_hba
//! rules line by line) and `spec.bootstrap.initdb` (issue 23), called by the one shared
//! validation function. A value the server would refuse at its next start or reload is refused
//! here, where the person who wrote it sees the message.

use crate::admission::field_error::{FieldError, FieldErrorKind};
use crate::api::parameters::{catalogue, owned_by, Kind, Setting};
use crate::api::postgresql::{
    InitdbSpec, PostgresqlSpec, MAX_HBA_RULES, MAX_HBA_RULE_LENGTH, MAX_PARAMETERS, MAX_PARAMETER_VALUE_LENGTH,
};
use std::sync::LazyLock;

/// An extension's setting: `library.name`.
static EXTENSION_SETTING: LazyLock<regex::Regex> = LazyLock::new(|| {
    regex::Regex::new(r"^[a-z_][a-z0-9_$]*(\.[a-z_][a-z0-9_$]*)+$").expect("extension setting pattern compiles")
});
/// A locale name as initdb takes it (the image's entrypoint passes it through a shell).
static LOCALE: LazyLock<regex::Regex> =
    LazyLock::new(|| regex::Regex::new(r"^[A-Za-z0-9_.@-]+$").expect("locale pattern compiles"));

/// Every error of `spec.postgresql` for major `major` (None: the version is invalid, reported
/// elsewhere), and warnings for settings that trade durability away.
pub fn validate_postgresql(
    spec: &PostgresqlSpec,
    major: Option<u32>,
    errors: &mut Vec<FieldError>,
    warnings: &mut Vec<String>,
) {
    validate_parameters(spec, major, errors, warnings);
    validate_hba(&spec.pg_hba, errors);
}

fn validate_parameters(
    spec: &PostgresqlSpec,
    major: Option<u32>,
    errors: &mut Vec<FieldError>,
    warnings: &mut Vec<String>,
) {
    if spec.parameters.is_empty() {
        return;
    }
    if spec.parameters.len() > MAX_PARAMETERS {
        errors.push(FieldError::invalid(
            "spec.postgresql.parameters",
            spec.parameters.len(),
            format!("must have at most {MAX_PARAMETERS} entries"),
        ));
        return;
    }
    let Some(major) = major else { return };
    let Some(settings) = catalogue(major) else {
        errors.push(FieldError {
            path: "spec.postgresql.parameters".into(),
            kind: FieldErrorKind::Forbidden,
            detail: format!("PostgreSQL {major} has no settings catalogue here, so its parameters cannot be checked"),
        });
        return;
    };
    let mut seen = std::collections::HashSet::new();
    for (name, value) in &spec.parameters {
        let path = format!("spec.postgresql.parameters[{name}]");
        let lower = name.to_ascii_lowercase();
        if !seen.insert(lower.clone()) {
            errors.push(FieldError::invalid(&path, name, "is set twice (setting names are case-insensitive)"));
            continue;
        }
        if let Some(controlled_by) = owned_by(&lower) {
            errors.push(FieldError { path, kind: FieldErrorKind::Forbidden, detail: controlled_by.to_string() });
            continue;
        }
        if value.len() > MAX_PARAMETER_VALUE_LENGTH || value.chars().any(|character| character.is_control()) {
            errors.push(FieldError::invalid(
                &path,
                shown(value),
                format!(
                    "must be at most {MAX_PARAMETER_VALUE_LENGTH} characters without line breaks or control characters"
                ),
            ));
            continue;
        }
        match settings.get(&lower) {
            Some(setting) => {
                if let Err(rule) = check_value(setting, value) {
                    errors.push(FieldError::invalid(&path, value, rule));
                }
            }
            None if EXTENSION_SETTING.is_match(&lower) => {}
            None => errors.push(FieldError {
                path,
                kind: FieldErrorKind::Unsupported(name.clone()),
                detail: format!("PostgreSQL {major} has no such setting (see pg_settings)"),
            }),
        }
    }
    for (name, risk) in [
        ("fsync", "a crash can corrupt the data directory"),
        ("full_page_writes", "a crash can leave torn pages"),
        ("synchronous_commit", "a crash of the primary loses the commits of the last moments"),
    ] {
        if spec.parameters.iter().any(|(key, value)| key.eq_ignore_ascii_case(name) && is_off(value)) {
            warnings.push(format!("spec.postgresql.parameters[{name}] is off: {risk}"));
        }
    }
}

pub(crate) use crate::api::postgresql::is_off;

fn shown(value: &str) -> String {
    let mut shown: String = value.chars().take(64).collect();
    if shown.len() < value.len() {
        shown.push('…');
    }
    shown
}

/// Checks `value` against `setting`'s type, unit, range and enum values, as PostgreSQL would.
pub fn check_value(setting: &Setting, value: &str) -> Result<(), String> {
    let trimmed = value.trim();
    match setting.kind {
        Kind::Bool => match trimmed.to_ascii_lowercase().as_str() {
            "on" | "off" | "true" | "false" | "yes" | "no" | "1" | "0" => Ok(()),
            _ => Err("must be a boolean: on or off".into()),
        },
        Kind::Enum => {
            if setting.enum_values.iter().any(|allowed| allowed.eq_ignore_ascii_case(trimmed)) {
                Ok(())
            } else {
                Err(format!("must be one of {}", setting.enum_values.join(", ")))
            }
        }
        Kind::String => Ok(()),
        Kind::Integer | Kind::Real => check_number(setting, trimmed),
    }
}

/// Bytes per unit of memory, milliseconds per unit of time.
fn unit_scale(unit: &str) -> Option<(bool, f64)> {
    let memory = |bytes: f64| Some((true, bytes));
    let time = |milliseconds: f64| Some((false, milliseconds));
    match unit {
        "B" => memory(1.0),
        "kB" => memory(1024.0),
        "8kB" => memory(8192.0),
        "16MB" => memory(16.0 * 1024.0 * 1024.0),
        "MB" => memory(1024.0 * 1024.0),
        "GB" => memory(1024.0 * 1024.0 * 1024.0),
        "TB" => memory(1024.0 * 1024.0 * 1024.0 * 1024.0),
        "us" => time(0.001),
        "ms" => time(1.0),
        "s" => time(1000.0),
        "min" => time(60_000.0),
        "h" => time(3_600_000.0),
        "d" => time(86_400_000.0),
        _ => None,
    }
}

fn check_number(setting: &Setting, value: &str) -> Result<(), String> {
    let split = value.find(|character: char| character.is_ascii_alphabetic()).unwrap_or(value.len());
    let (number, unit) = (value[..split].trim(), value[split..].trim());
    let integer = setting.kind == Kind::Integer;
    let amount = if integer && unit.is_empty() {
        parse_integer(number)
    } else {
        number.parse::<f64>().ok().filter(|amount| amount.is_finite())
    };
    let units_rule = match unit_scale(&setting.unit) {
        Some((true, _)) => " (units B, kB, MB, GB, TB)",
        Some((false, _)) => " (units us, ms, s, min, h, d)",
        None => "",
    };
    let kind_rule = if integer { "an integer" } else { "a number" };
    let Some(amount) = amount else {
        return Err(format!("must be {kind_rule}{}{units_rule}", unit_hint(setting)));
    };
    let in_setting_units = if unit.is_empty() {
        amount
    } else {
        let (Some((memory, scale)), Some((value_memory, value_scale))) = (unit_scale(&setting.unit), unit_scale(unit))
        else {
            return Err(if setting.unit.is_empty() {
                format!("must be {kind_rule} without a unit")
            } else {
                format!("has an unknown unit {unit:?}{units_rule}")
            });
        };
        if memory != value_memory || (memory && unit == "8kB") {
            return Err(format!("has an unknown unit {unit:?}{units_rule}"));
        }
        amount * value_scale / scale
    };
    let (minimum, maximum) = (setting.minimum.unwrap_or(f64::MIN), setting.maximum.unwrap_or(f64::MAX));
    // PostgreSQL rounds a value given in another unit to the setting's own.
    let rounded = if integer { in_setting_units.round() } else { in_setting_units };
    if rounded < minimum || rounded > maximum {
        return Err(format!(
            "must be between {} and {}{}",
            number_text(minimum),
            number_text(maximum),
            unit_hint(setting)
        ));
    }
    Ok(())
}

fn parse_integer(number: &str) -> Option<f64> {
    let (negative, digits) = match number.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, number.strip_prefix('+').unwrap_or(number)),
    };
    let magnitude = match digits.strip_prefix("0x").or_else(|| digits.strip_prefix("0X")) {
        Some(hex) => i64::from_str_radix(hex, 16).ok()?,
        None => digits.parse::<i64>().ok()?,
    };
    Some(if negative { -(magnitude as f64) } else { magnitude as f64 })
}

fn unit_hint(setting: &Setting) -> String {
    if setting.unit.is_empty() {
        String::new()
    } else {
        format!(" (in {} when no unit is given)", setting.unit)
    }
}

fn number_text(number: f64) -> String {
    if number.fract() == 0.0 && number.abs() < 1e15 {
        format!("{}", number as i64)
    } else {
        format!("{number}")
    }
}

/// Connection types of a pg_hba rule.
const HBA_TYPES: &[&str] = &["local", "host", "hostssl", "hostnossl", "hostgssenc", "hostnogssenc"];
/// Authentication methods a rule may use (`trust` and `password` are refused, below).
const HBA_METHODS: &[&str] =
    &["reject", "scram-sha-256", "md5", "gss", "sspi", "ident", "peer", "ldap", "radius", "cert", "pam", "bsd"];

/// Every error of `spec.postgresql.pgHba`, each rule on its own.
pub fn validate_hba(rules: &[String], errors: &mut Vec<FieldError>) {
    if rules.len() > MAX_HBA_RULES {
        errors.push(FieldError::invalid(
            "spec.postgresql.pgHba",
            rules.len(),
            format!("must have at most {MAX_HBA_RULES} rules"),
        ));
        return;
    }
    for (index, rule) in rules.iter().enumerate() {
        if let Err(detail) = check_hba_rule(rule) {
            errors.push(FieldError::invalid(&format!("spec.postgresql.pgHba[{index}]"), shown(rule), detail));
        }
    }
}

/// Splits a pg_hba line into fields (double quotes keep spaces and commas inside one).
fn hba_fields(rule: &str) -> Result<Vec<String>, String> {
    let mut fields = Vec::new();
    let mut current = String::new();
    let mut quoted = false;
    for character in rule.chars() {
        match character {
            '"' => {
                quoted = !quoted;
                current.push(character);
            }
            ' ' | '\t' if !quoted => {
                if !current.is_empty() {
                    fields.push(std::mem::take(&mut current));
                }
            }
            '#' if !quoted => break,
            _ => current.push(character),
        }
    }
    if quoted {
        return Err("has an unclosed double quote".into());
    }
    if !current.is_empty() {
        fields.push(current);
    }
    Ok(fields)
}

/// Checks one pg_hba rule: `TYPE DATABASE USER [ADDRESS [MASK]] METHOD [OPTION=VALUE ...]`.
pub fn check_hba_rule(rule: &str) -> Result<(), String> {
    if rule.len() > MAX_HBA_RULE_LENGTH || rule.chars().any(|character| character.is_control() && character != '\t') {
        return Err(format!("must be one line of at most {MAX_HBA_RULE_LENGTH} characters"));
    }
    let fields = hba_fields(rule)?;
    let Some(kind) = fields.first() else { return Err("is empty".into()) };
    if kind.starts_with("include") {
        return Err("may not include other files".into());
    }
    if !HBA_TYPES.contains(&kind.as_str()) {
        return Err(format!("must start with a connection type: {}", HBA_TYPES.join(", ")));
    }
    let local = kind == "local";
    let minimum = if local { 4 } else { 5 };
    if fields.len() < minimum {
        let shape = if local { "local DATABASE USER METHOD" } else { "TYPE DATABASE USER ADDRESS METHOD" };
        return Err(format!("must have the fields {shape} [OPTION=VALUE ...]"));
    }
    for (position, what) in [(1, "database"), (2, "user")] {
        if fields[position].split(',').any(|name| name.is_empty() || name.starts_with('@')) {
            return Err(format!("has a malformed {what} list (empty names, or @file references, which are refused)"));
        }
    }
    let mut method_at = 3;
    if !local {
        check_hba_address(&fields[3], fields.get(4).map(String::as_str))?;
        method_at = if fields[3].contains('/') || !looks_like_ip(&fields[3]) { 4 } else { 5 };
    }
    let Some(method) = fields.get(method_at) else {
        return Err("has no authentication method".into());
    };
    match method.as_str() {
        "trust" => return Err("may not use trust: it lets anyone in without a password".into()),
        "password" => {
            return Err("may not use password: it sends the password in clear text (use scram-sha-256)".into())
        }
        "peer" if !local => return Err("may use peer only with local connections".into()),
        other if !HBA_METHODS.contains(&other) => {
            return Err(format!("has an unknown authentication method {other:?} (one of {})", HBA_METHODS.join(", ")))
        }
        _ => {}
    }
    if let Some(option) = fields[method_at + 1..].iter().find(|option| !option.contains('=')) {
        return Err(format!("has an option {option:?} without a value (options are NAME=VALUE)"));
    }
    Ok(())
}

fn looks_like_ip(text: &str) -> bool {
    text.parse::<std::net::IpAddr>().is_ok()
}

fn check_hba_address(address: &str, next: Option<&str>) -> Result<(), String> {
    if ["all", "samehost", "samenet"].contains(&address) {
        return Ok(());
    }
    if let Some((ip, prefix)) = address.split_once('/') {
        let ip: std::net::IpAddr = ip.parse().map_err(|_| format!("has a malformed address {address:?}"))?;
        let bits = if ip.is_ipv4() { 32 } else { 128 };
        return match prefix.parse::<u8>() {
            Ok(length) if length <= bits => Ok(()),
            _ => Err(format!("has a malformed prefix length in {address:?} (0 to {bits})")),
        };
    }
    if looks_like_ip(address) {
        // An address without a prefix takes a mask in the next field.
        return match next.map(str::parse::<std::net::IpAddr>) {
            Some(Ok(_)) => Ok(()),
            _ => Err(format!("gives the address {address:?} without a /prefix or a mask")),
        };
    }
    let host = address.strip_prefix('.').unwrap_or(address);
    let label = |label: &str| {
        !label.is_empty()
            && label.len() <= 63
            && label.chars().all(|character| character.is_ascii_alphanumeric() || character == '-')
    };
    if host.len() <= 253 && host.split('.').all(label) {
        Ok(())
    } else {
        Err(format!(
            "has a malformed address {address:?} (a CIDR such as 10.0.0.0/8, a host name, all, samehost or samenet)"
        ))
    }
}

/// Every error of `spec.bootstrap.initdb`.
pub fn validate_initdb(initdb: &InitdbSpec, recovering: bool, errors: &mut Vec<FieldError>) {
    const PATH: &str = "spec.bootstrap.initdb";
    if recovering {
        errors.push(FieldError {
            path: PATH.into(),
            kind: FieldErrorKind::Forbidden,
            detail: "may not be set with spec.bootstrap.recovery: a recovered database keeps its source's locale, encoding, checksums and WAL segment size".into(),
        });
    }
    if let Some(locale) = initdb.locale.as_deref().filter(|locale| !LOCALE.is_match(locale)) {
        errors.push(FieldError::invalid(
            &format!("{PATH}.locale"),
            locale,
            "must be a locale name such as C, C.UTF-8 or en_US.UTF-8 (letters, digits, '_', '.', '@', '-')",
        ));
    }
    if let Some(encoding) = initdb.encoding.as_deref() {
        if encoding.is_empty()
            || !encoding.chars().all(|character| character.is_ascii_alphanumeric() || character == '_')
        {
            errors.push(FieldError::invalid(
                &format!("{PATH}.encoding"),
                encoding,
                "must be an encoding name such as UTF8, LATIN1 or SQL_ASCII",
            ));
        }
    }
    if let Some(size) = initdb.wal_segment_size_megabytes.filter(|size| !size.is_power_of_two() || *size > 1024) {
        errors.push(FieldError::invalid(
            &format!("{PATH}.walSegmentSizeMegabytes"),
            size,
            "must be a power of two from 1 to 1024",
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setting(name: &str) -> &'static Setting {
        &catalogue(15).unwrap()[name]
    }

    #[test]
    fn numbers_are_checked_in_the_settings_unit() {
        let shared_buffers = setting("shared_buffers");
        assert_eq!(check_value(shared_buffers, "256MB"), Ok(()));
        assert_eq!(check_value(shared_buffers, "16384"), Ok(()));
        assert!(check_value(shared_buffers, "64kB").unwrap_err().starts_with("must be between 16 and 1073741823"));
        assert!(check_value(shared_buffers, "1s").unwrap_err().contains("unknown unit"));
        assert!(check_value(shared_buffers, "lots").unwrap_err().starts_with("must be an integer"));
        let timeout = setting("statement_timeout");
        assert_eq!(check_value(timeout, "30s"), Ok(()));
        assert_eq!(check_value(timeout, "0"), Ok(()));
        assert!(check_value(timeout, "-1").is_err());
        assert!(check_value(setting("max_connections"), "10MB").unwrap_err().contains("without a unit"));
        assert_eq!(check_value(setting("random_page_cost"), "1.1"), Ok(()));
        assert!(check_value(setting("random_page_cost"), "-1").is_err());
        assert_eq!(check_value(setting("log_min_duration_statement"), "-1"), Ok(()));
    }

    #[test]
    fn booleans_and_enums_take_their_words() {
        assert_eq!(check_value(setting("jit"), "Off"), Ok(()));
        assert!(check_value(setting("jit"), "maybe").is_err());
        assert_eq!(check_value(setting("log_statement"), "ddl"), Ok(()));
        assert_eq!(check_value(setting("log_statement"), "some").unwrap_err(), "must be one of none, ddl, mod, all");
    }

    #[test]
    fn pg_hba_rules_are_checked_field_by_field() {
        for good in [
            "host all all 10.0.0.0/8 scram-sha-256",
            "hostssl app app_user 192.168.1.0 255.255.255.0 scram-sha-256",
            "hostssl all reporting .example.com cert clientcert=verify-full",
            "local all all peer map=admins",
            "host \"my db\" +readers all reject",
            "host all all ::1/128 md5 # a comment",
        ] {
            assert_eq!(check_hba_rule(good), Ok(()), "{good}");
        }
        for (bad, expected) in [
            ("host all all 0.0.0.0/0 trust", "may not use trust"),
            ("host all all all password", "clear text"),
            ("hosts all all all md5", "must start with a connection type"),
            ("host all all md5", "must have the fields"),
            ("host all all 10.0.0.0/33 md5", "prefix length"),
            ("host all all 10.0.0.1 md5", "without a /prefix or a mask"),
            ("host all all all peer", "only with local"),
            ("host all all all magic", "unknown authentication method"),
            ("host @dbs all all md5", "@file"),
            ("include_dir conf.d", "may not include"),
            ("host all all all md5 flag", "without a value"),
            ("host all all all md5\nlocal all all trust", "one line"),
        ] {
            let error = check_hba_rule(bad).unwrap_err();
            assert!(error.contains(expected), "{bad}: {error}");
        }
    }
}
