//! Admission of `spec.monitoring` (issue 23): ConfigMap references the agents can read. What the
//! ConfigMaps hold is read by the agents, which skip and report a malformed query (a ConfigMap
//! changes without the DatabaseService being reviewed).

use crate::admission::field_error::FieldError;
use crate::admission::roles_validation::{SECRET_KEY, SECRET_NAME};
use crate::api::monitoring::{MonitoringSpec, MAX_QUERY_CONFIG_MAPS};

/// Checks `spec.monitoring`.
pub fn validate_monitoring(monitoring: &MonitoringSpec, errors: &mut Vec<FieldError>) {
    let path = "spec.monitoring.customQueries";
    if monitoring.custom_queries.len() > MAX_QUERY_CONFIG_MAPS {
        let detail = format!("must name at most {MAX_QUERY_CONFIG_MAPS} ConfigMap keys");
        errors.push(FieldError::invalid(path, monitoring.custom_queries.len(), detail));
    }
    for (index, reference) in monitoring.custom_queries.iter().enumerate() {
        if reference.name.len() > 253 || !SECRET_NAME.is_match(&reference.name) {
            errors.push(FieldError::invalid(
                &format!("{path}[{index}].name"),
                &reference.name,
                "must be the name of a ConfigMap in this namespace: a lowercase RFC 1123 subdomain of at most 253 characters",
            ));
        }
        if reference.key.as_deref().is_some_and(|key| !SECRET_KEY.is_match(key)) {
            errors.push(FieldError::invalid(
                &format!("{path}[{index}].key"),
                reference.key.as_deref().unwrap_or_default(),
                "must be a ConfigMap key: letters, digits, '-', '_' or '.', at most 253 characters",
            ));
        }
    }
}
