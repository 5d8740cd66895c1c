//! A reference to one key of a Secret or ConfigMap in the database's namespace (a role's password,
//! a ConfigMap of custom queries): the same name and key rules wherever a spec names one.

use crate::admission::field_error::FieldError;
use std::sync::LazyLock;

/// A DNS subdomain: the name of a Secret or ConfigMap.
static OBJECT_NAME: LazyLock<regex::Regex> = LazyLock::new(|| {
    regex::Regex::new(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
        .expect("subdomain pattern compiles")
});
/// A key of a Secret's or ConfigMap's data.
static DATA_KEY: LazyLock<regex::Regex> =
    LazyLock::new(|| regex::Regex::new(r"^[-._a-zA-Z0-9]{1,253}$").expect("key pattern compiles"));
/// Longest object name.
const MAX_OBJECT_NAME_LENGTH: usize = 253;

/// Checks `name` (at `path.name`) and `key` (at `path.key`) of a reference to a `kind`
/// ("Secret", "ConfigMap") in this namespace.
pub fn validate_key_reference(path: &str, kind: &str, name: &str, key: Option<&str>, errors: &mut Vec<FieldError>) {
    if name.len() > MAX_OBJECT_NAME_LENGTH || !OBJECT_NAME.is_match(name) {
        errors.push(FieldError::invalid(
            &format!("{path}.name"),
            name,
            format!("must be the name of a {kind} in this namespace: a lowercase RFC 1123 subdomain of at most 253 characters"),
        ));
    }
    if let Some(key) = key.filter(|key| !DATA_KEY.is_match(key)) {
        errors.push(FieldError::invalid(
            &format!("{path}.key"),
            key,
            format!("must be a {kind} key: letters, digits, '-', '_' or '.', at most 253 characters"),
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errors(name: &str, key: Option<&str>) -> Vec<String> {
        let mut errors = Vec::new();
        validate_key_reference("spec.x", "Secret", name, key, &mut errors);
        errors.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn names_are_subdomains_and_keys_data_keys() {
        assert!(errors("reporting-password", Some("password")).is_empty());
        assert!(errors("a.b-c", None).is_empty());
        let refused = errors("Bad_Name", Some("no/slash"));
        assert_eq!(refused.len(), 2, "{refused:?}");
        assert!(refused[0].starts_with("spec.x.name: Invalid value: \"Bad_Name\": must be the name of a Secret"));
        assert!(refused[1].starts_with("spec.x.key: Invalid value: \"no/slash\": must be a Secret key"));
        assert_eq!(errors(&"a".repeat(254), None).len(), 1);
    }
}
