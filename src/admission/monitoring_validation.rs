//! Admission of `spec.monitoring` (issue 23): ConfigMap references the agents can read. What the
//! ConfigMaps hold is read by the agents, which skip and report a malformed query (a ConfigMap
//! changes without the DatabaseService being reviewed).

use crate::admission::field_error::FieldError;
use crate::admission::key_reference::validate_key_reference;
use crate::api::monitoring::{MonitoringSpec, MAX_QUERY_CONFIG_MAPS};

/// Checks `spec.monitoring`.
pub fn validate_monitoring(monitoring: &MonitoringSpec, errors: &mut Vec<FieldError>) {
    let path = "spec.monitoring.customQueries";
    if monitoring.custom_queries.len() > MAX_QUERY_CONFIG_MAPS {
        let detail = format!("must name at most {MAX_QUERY_CONFIG_MAPS} ConfigMap keys");
        errors.push(FieldError::invalid(path, monitoring.custom_queries.len(), detail));
    }
    for (index, reference) in monitoring.custom_queries.iter().enumerate() {
        let reference_path = format!("{path}[{index}]");
        validate_key_reference(&reference_path, "ConfigMap", &reference.name, reference.key.as_deref(), errors);
    }
}
