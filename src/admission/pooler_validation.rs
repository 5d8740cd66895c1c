//! Admission of `spec.pooler` (issue 25): sizes in range, a name short enough for the pooler's
//! Services, an image reference that pins a version, and only the PgBouncer parameters the user
//! may set, each with a value of its kind (PgBouncer refuses to start on a bad one: better a
//! clear denial now than a crash-looping pod).

use crate::admission::field_error::{FieldError, FieldErrorKind};
use crate::admission::image_reference::validate_image_at;
use crate::api::names::ChildNames;
use crate::api::pooler::{parameter_kind, ParameterKind, PoolerSpec, MAX_INSTANCES, MAX_PARAMETERS, MAX_PAUSE};

/// Longest value of a text parameter (a query).
const MAX_TEXT_LENGTH: usize = 1024;
/// Longest Service name.
const MAX_SERVICE_NAME_LENGTH: usize = 63;

fn valid_value(kind: ParameterKind, value: &str) -> Result<(), &'static str> {
    let whole = |value: &str| !value.is_empty() && value.len() <= 10 && value.bytes().all(|byte| byte.is_ascii_digit());
    match kind {
        ParameterKind::Boolean if value == "0" || value == "1" => Ok(()),
        ParameterKind::Boolean => Err("must be 0 or 1"),
        ParameterKind::Count if whole(value) => Ok(()),
        ParameterKind::Count => Err("must be a whole number"),
        ParameterKind::Seconds => match value.split_once('.') {
            None if whole(value) => Ok(()),
            Some((seconds, fraction)) if whole(seconds) && whole(fraction) => Ok(()),
            _ => Err("must be a number of seconds, such as 30 or 0.5"),
        },
        ParameterKind::Text if value.len() > MAX_TEXT_LENGTH => Err("must be at most 1024 characters"),
        // One line, no quoting games: the value ends up in PgBouncer's ini file.
        ParameterKind::Text if value.chars().any(|character| character.is_control()) => {
            Err("must be one line without control characters")
        }
        ParameterKind::Text => Ok(()),
    }
}

/// Every error of `spec.pooler` of DatabaseService `name`.
pub fn validate_pooler(name: &str, pooler: &PoolerSpec, errors: &mut Vec<FieldError>) {
    let longest = ChildNames::pooler_replicas_service(name);
    if longest.len() > MAX_SERVICE_NAME_LENGTH {
        let limit = MAX_SERVICE_NAME_LENGTH - (longest.len() - name.len());
        errors.push(FieldError::invalid(
            "metadata.name",
            name,
            format!("must be at most {limit} characters with spec.pooler: it names Service {longest}"),
        ));
    }
    if let Some(instances) = pooler.instances.filter(|instances| !(1..=MAX_INSTANCES).contains(instances)) {
        errors.push(FieldError::invalid(
            "spec.pooler.instances",
            instances,
            format!("must be between 1 and {MAX_INSTANCES}"),
        ));
    }
    if let Some(image) = pooler.image.as_deref() {
        validate_image_at("spec.pooler.image", image, errors);
    }
    if pooler.parameters.len() > MAX_PARAMETERS {
        let detail = format!("must set at most {MAX_PARAMETERS} parameters");
        errors.push(FieldError::invalid("spec.pooler.parameters", pooler.parameters.len(), detail));
    }
    for (parameter, value) in &pooler.parameters {
        let path = format!("spec.pooler.parameters.{parameter}");
        let Some(kind) = parameter_kind(parameter) else {
            errors.push(FieldError {
                path,
                kind: FieldErrorKind::Forbidden,
                detail: "is not a PgBouncer parameter spec.pooler may set: listening, authentication, TLS, files \
                         and the pool's mode and sizes are the operator's or spec.pooler's own fields"
                    .into(),
            });
            continue;
        };
        if let Err(detail) = valid_value(kind, value) {
            errors.push(FieldError::invalid(&path, value, detail));
        } else if let Some(detail) = breaks_switchover(parameter, value) {
            errors.push(FieldError::invalid(&path, value, detail));
        }
    }
}

/// Longest `server_login_retry`, in seconds: after a failed server login (the old primary gone,
/// the new one not yet there) PgBouncer refuses every new client of the pool for that long. The
/// operator sets 1; PgBouncer's 15 would add up to 15 s to every failover's outage.
pub const MAX_SERVER_LOGIN_RETRY_SECONDS: f64 = 2.0;

/// Why `value` of a well-formed `parameter` would break the pooled switchover or failover, if it
/// would: the operator relies on a short login retry and on clients waiting through a pause.
fn breaks_switchover(parameter: &str, value: &str) -> Option<String> {
    let seconds: f64 = value.parse().ok()?;
    match parameter {
        "server_login_retry" if seconds > MAX_SERVER_LOGIN_RETRY_SECONDS => Some(format!(
            "must be at most {MAX_SERVER_LOGIN_RETRY_SECONDS}: after a failover's first refused login PgBouncer \
             refuses the pool's clients for this many seconds (the operator sets 1)"
        )),
        "query_wait_timeout" if seconds > 0.0 && seconds < MAX_PAUSE.as_secs_f64() => Some(format!(
            "must be 0 (no limit) or at least {}: clients held by a switchover's pause (up to {} s) would get an error instead of their answer",
            MAX_PAUSE.as_secs(),
            MAX_PAUSE.as_secs()
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errors_of(name: &str, pooler: serde_json::Value) -> Vec<String> {
        let pooler: PoolerSpec = serde_json::from_value(pooler).unwrap();
        let mut errors = Vec::new();
        validate_pooler(name, &pooler, &mut errors);
        errors.iter().map(|error| format!("{}: {}", error.path, error.detail)).collect()
    }

    #[test]
    fn a_plain_pooler_and_well_formed_parameters_pass() {
        let parameters = serde_json::json!({
            "server_lifetime": "3600", "query_wait_timeout": "120.5", "log_connections": "0",
            "server_reset_query": "DISCARD ALL", "reserve_pool_size": "5",
        });
        let pooler =
            serde_json::json!({"instances": 3, "image": "example.com/pgbouncer:1.24.1", "parameters": parameters});
        assert_eq!(errors_of("orders", pooler), Vec::<String>::new());
        assert_eq!(errors_of("orders", serde_json::json!({})), Vec::<String>::new());
    }

    #[test]
    fn operator_parameters_bad_values_bad_sizes_and_long_names_are_refused() {
        let parameters = serde_json::json!({
            "auth_type": "trust", "listen_port": "1", "server_lifetime": "an hour",
            "log_connections": "yes", "server_reset_query": "DISCARD ALL\nauth_type = trust",
        });
        let errors = errors_of(
            &"n".repeat(48),
            serde_json::json!({"instances": 0, "image": "pgbouncer", "parameters": parameters}),
        );
        let joined = errors.join("\n");
        assert!(joined.contains("metadata.name: must be at most 47 characters with spec.pooler"), "{joined}");
        assert!(joined.contains("spec.pooler.instances: must be between 1 and 16"), "{joined}");
        assert!(joined.contains("spec.pooler.image"), "{joined}");
        assert!(joined.contains("spec.pooler.parameters.auth_type: is not a PgBouncer parameter"), "{joined}");
        assert!(joined.contains("spec.pooler.parameters.listen_port: is not"), "{joined}");
        assert!(joined.contains("spec.pooler.parameters.server_lifetime: must be a number of seconds"), "{joined}");
        assert!(joined.contains("spec.pooler.parameters.log_connections: must be 0 or 1"), "{joined}");
        assert!(joined.contains("spec.pooler.parameters.server_reset_query: must be one line"), "{joined}");
        assert_eq!(errors.len(), 8, "{joined}");
    }

    #[test]
    fn values_that_would_break_a_pooled_switchover_are_refused() {
        let refused = serde_json::json!({"server_login_retry": "15", "query_wait_timeout": "5"});
        let errors = errors_of("orders", serde_json::json!({"parameters": refused}));
        let joined = errors.join("\n");
        assert!(joined.contains("spec.pooler.parameters.server_login_retry: must be at most 2"), "{joined}");
        assert!(
            joined.contains("spec.pooler.parameters.query_wait_timeout: must be 0 (no limit) or at least 60"),
            "{joined}"
        );
        assert_eq!(errors.len(), 2, "{joined}");
        let kept = serde_json::json!({"server_login_retry": "0.5", "query_wait_timeout": "0"});
        assert_eq!(errors_of("orders", serde_json::json!({"parameters": kept})), Vec::<String>::new());
        let long_wait = serde_json::json!({"server_login_retry": "2", "query_wait_timeout": "120"});
        assert_eq!(errors_of("orders", serde_json::json!({"parameters": long_wait})), Vec::<String>::new());
    }
}
