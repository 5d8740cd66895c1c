//! Admission of the placement fields (issue 23): what the apiserver would only refuse later, on
//! the StatefulSet the operator writes (where nobody sees the message), is refused here, naming
//! the DatabaseService field. Affinity terms are left to the apiserver's own pod validation of the
//! StatefulSet, except for the keys our anti-affinity uses.

use crate::admission::field_error::FieldError;
use crate::api::placement::PlacementSpec;
use std::sync::LazyLock;

/// A label key: an optional DNS subdomain prefix and `/`, then a name of at most 63 characters.
static LABEL_NAME: LazyLock<regex::Regex> = LazyLock::new(|| {
    regex::Regex::new(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$").expect("label name pattern compiles")
});
/// A DNS subdomain (as validation.rs has it; kept here too, since that module imports this one).
static DNS_SUBDOMAIN_REGEX: LazyLock<regex::Regex> = LazyLock::new(|| {
    regex::Regex::new(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
        .expect("subdomain pattern compiles")
});
/// A label value: empty, or at most 63 characters of letters, digits, `-`, `_` and `.`.
static LABEL_VALUE: LazyLock<regex::Regex> = LazyLock::new(|| {
    regex::Regex::new(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$").expect("label value pattern compiles")
});

fn label_key_valid(key: &str) -> bool {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    prefix.is_none_or(|prefix| prefix.len() <= 253 && DNS_SUBDOMAIN_REGEX.is_match(prefix)) && LABEL_NAME.is_match(name)
}

const LABEL_KEY_RULE: &str = "must be a label key: an optional DNS subdomain prefix and '/', then at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit";

fn check_label_key(path: &str, key: &str, errors: &mut Vec<FieldError>) {
    if !label_key_valid(key) {
        errors.push(FieldError::invalid(path, format!("{key:?}"), LABEL_KEY_RULE));
    }
}

/// Every placement error of `spec`.
pub fn validate_placement(placement: &PlacementSpec, errors: &mut Vec<FieldError>) {
    if let Some(key) = &placement.pod_anti_affinity_topology_key {
        check_label_key("spec.podAntiAffinityTopologyKey", key, errors);
    }
    for (key, value) in placement.node_selector.iter().flatten() {
        check_label_key(&format!("spec.nodeSelector[{key}]"), key, errors);
        if !LABEL_VALUE.is_match(value) {
            errors.push(FieldError::invalid(
                &format!("spec.nodeSelector[{key}]"),
                format!("{value:?}"),
                "must be a label value: at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit",
            ));
        }
    }
    if let Some(class) = &placement.priority_class_name {
        if class.len() > 253 || !DNS_SUBDOMAIN_REGEX.is_match(class) {
            errors.push(FieldError::invalid(
                "spec.priorityClassName",
                format!("{class:?}"),
                "must be the name of a PriorityClass: a lowercase RFC 1123 subdomain of at most 253 characters",
            ));
        }
    }
    for (index, toleration) in placement.tolerations.iter().flatten().enumerate() {
        let path = |field: &str| format!("spec.tolerations[{index}].{field}");
        let operator = toleration.operator.as_deref().unwrap_or("Equal");
        if !matches!(operator, "Equal" | "Exists") {
            errors.push(FieldError::invalid(&path("operator"), format!("{operator:?}"), "must be Equal or Exists"));
        }
        if let Some(key) = toleration.key.as_deref().filter(|key| !key.is_empty()) {
            check_label_key(&path("key"), key, errors);
        } else if operator != "Exists" {
            errors.push(FieldError::invalid(
                &path("operator"),
                format!("{operator:?}"),
                "must be Exists when the key is empty (a toleration of every taint)",
            ));
        }
        if operator == "Exists" && toleration.value.as_deref().is_some_and(|value| !value.is_empty()) {
            errors.push(FieldError::invalid(
                &path("value"),
                format!("{:?}", toleration.value.as_deref().unwrap_or_default()),
                "must be empty when the operator is Exists",
            ));
        }
        if let Some(effect) = toleration.effect.as_deref().filter(|effect| !effect.is_empty()) {
            if !matches!(effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
                errors.push(FieldError::invalid(
                    &path("effect"),
                    format!("{effect:?}"),
                    "must be NoSchedule, PreferNoSchedule or NoExecute",
                ));
            }
        }
        if toleration.toleration_seconds.is_some() && toleration.effect.as_deref() != Some("NoExecute") {
            errors.push(FieldError::invalid(
                &path("tolerationSeconds"),
                toleration.toleration_seconds.unwrap_or_default(),
                "is only meaningful with the effect NoExecute",
            ));
        }
    }
    for (index, constraint) in placement.topology_spread_constraints.iter().flatten().enumerate() {
        let path = |field: &str| format!("spec.topologySpreadConstraints[{index}].{field}");
        if constraint.max_skew < 1 {
            errors.push(FieldError::invalid(&path("maxSkew"), constraint.max_skew, "must be at least 1"));
        }
        check_label_key(&path("topologyKey"), &constraint.topology_key, errors);
        if !matches!(constraint.when_unsatisfiable.as_str(), "DoNotSchedule" | "ScheduleAnyway") {
            errors.push(FieldError::invalid(
                &path("whenUnsatisfiable"),
                format!("{:?}", constraint.when_unsatisfiable),
                "must be DoNotSchedule or ScheduleAnyway",
            ));
        }
    }
}
