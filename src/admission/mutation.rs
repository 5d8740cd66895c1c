//! Defaulting for the mutating webhook: a minimal, idempotent JSONPatch.

use crate::api::database_service::{default_image, DatabaseService, DeletionPolicy, DEFAULT_REPLICAS, FINALIZER};
use crate::api::version::major_version;
use kube::api::ObjectMeta;
use serde_json::{json, Value};

/// Computes the JSONPatch that fills defaults and adds the cleanup finalizer.
///
/// Returns `None` when nothing needs to change, so that a second pass over the output
/// of a first pass yields no patch. On UPDATE, an image that was the default for the
/// old version follows a version change (otherwise a minor upgrade would keep the old image).
pub fn default_patch(object: &DatabaseService, old: Option<&DatabaseService>) -> Option<json_patch::Patch> {
    // An object being deleted only waits for its finalizers: filling defaults would change its
    // spec (and generation) under the controller's cleanup, and new finalizers are refused anyway.
    if object.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let mut operations: Vec<Value> = Vec::new();
    let spec = &object.spec;
    if spec.replicas.is_none() {
        operations.push(json!({"op": "add", "path": "/spec/replicas", "value": DEFAULT_REPLICAS}));
    }
    if spec.deletion_policy.is_none() {
        operations.push(json!({"op": "add", "path": "/spec/deletionPolicy", "value": DeletionPolicy::default()}));
    }
    match (&spec.image, old) {
        // Only a well-formed version makes a meaningful default image ("postgres:latest" would not be).
        (None, _) if major_version(&spec.version).is_some() => {
            operations.push(json!({"op": "add", "path": "/spec/image", "value": default_image(&spec.version)}));
        }
        (Some(image), Some(old))
            if old.spec.version != spec.version
                && *image == default_image(&old.spec.version)
                && major_version(&spec.version).is_some() =>
        {
            operations.push(json!({"op": "replace", "path": "/spec/image", "value": default_image(&spec.version)}));
        }
        _ => {}
    }
    match &object.metadata.finalizers {
        // No metadata at all (possible before schema validation, in the mutating webhook): a
        // patch must add the parent first. Adding /metadata replaces an empty one, so this is
        // also right when the object had `metadata: {}`.
        None if object.metadata == ObjectMeta::default() => {
            operations.push(json!({"op": "add", "path": "/metadata", "value": {"finalizers": [FINALIZER]}}));
        }
        None => operations.push(json!({"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]})),
        Some(finalizers) if !finalizers.iter().any(|finalizer| finalizer == FINALIZER) => {
            operations.push(json!({"op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER}));
        }
        Some(_) => {}
    }
    if operations.is_empty() {
        return None;
    }
    Some(serde_json::from_value(Value::Array(operations)).expect("patch operations are well-formed"))
}
