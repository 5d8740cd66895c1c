//! The resourceVersions at which the database Secrets were last found in today's form, on this
//! process (see `credentials_form`): the caches hold Secrets' metadata only, so a Secret's data
//! is read once per change rather than on every pass. Kept apart from `credentials_form` so that
//! the shared context can hold it without importing the pass.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Secret uid to the resourceVersion it was checked at.
#[derive(Clone, Debug, Default)]
pub struct CheckedSecrets(Arc<Mutex<HashMap<String, String>>>);

impl CheckedSecrets {
    /// Whether the Secret `uid` was checked at `version`.
    pub fn checked(&self, uid: &str, version: &str) -> bool {
        self.0.lock().expect("not poisoned").get(uid).is_some_and(|checked| checked == version)
    }

    /// Remembers that the Secret `uid` is in today's form at `version`.
    pub fn remember(&self, uid: &str, version: &str) {
        self.0.lock().expect("not poisoned").insert(uid.into(), version.into());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checked_version_is_not_read_again_but_a_new_one_is() {
        let checked = CheckedSecrets::default();
        assert!(!checked.checked("u", "1"));
        checked.remember("u", "1");
        assert!(checked.checked("u", "1") && !checked.checked("u", "2") && !checked.checked("v", "1"));
    }
}
