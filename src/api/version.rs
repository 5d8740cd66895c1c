//! The grammar of `spec.version`: what a PostgreSQL version string looks like and its major.

use std::sync::LazyLock;

/// Pattern every `spec.version` must match.
pub const VERSION_PATTERN: &str = r"^\d+(\.\d+){0,2}$";

static VERSION_REGEX: LazyLock<regex::Regex> =
    LazyLock::new(|| regex::Regex::new(VERSION_PATTERN).expect("version pattern compiles"));

/// Major version of a version string that matches [`VERSION_PATTERN`].
pub fn major_version(version: &str) -> Option<u32> {
    if !VERSION_REGEX.is_match(version) {
        return None;
    }
    version.split('.').next()?.parse().ok()
}
