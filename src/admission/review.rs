//! The AdmissionReview wire format (admission.k8s.io/v1), reduced to what the webhook reads.
//!
//! The request is parsed in one pass straight from the body: the objects stay borrowed raw JSON
//! ([`RawValue`]) until they are parsed into [`DatabaseService`], so no generic object tree is
//! ever built (an 8 MiB array inside an object used to cost ~280 MiB of RSS that way), and a
//! malformed spec becomes a denial with the request's uid rather than an anonymous 400.

use crate::api::database_service::{DatabaseService, DatabaseServiceSpec, DatabaseServiceStatus, GROUP};
use crate::api::failover::FailoverStatus;
use base64::Engine;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use kube::api::ObjectMeta;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::collections::BTreeMap;

/// API version of every AdmissionReview this webhook accepts and sends.
pub const API_VERSION: &str = "admission.k8s.io/v1";

/// The resource the webhook is registered for, as the apiserver names it in `request.resource`.
pub const RESOURCE: &str = "databaseservices";

/// An AdmissionReview as received.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Review<'body> {
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    #[serde(borrow)]
    request: Option<Request<'body>>,
}

/// Group, version and kind of `request.kind`.
#[derive(Debug, Default, Deserialize)]
pub struct GroupVersionKind {
    /// API group.
    #[serde(default)]
    pub group: String,
    /// API version.
    #[serde(default)]
    pub version: String,
    /// Kind.
    #[serde(default)]
    pub kind: String,
}

/// Group, version and resource of `request.resource`.
#[derive(Debug, Default, Deserialize)]
pub struct GroupVersionResource {
    /// API group.
    #[serde(default)]
    pub group: String,
    /// API version.
    #[serde(default)]
    pub version: String,
    /// Resource (plural).
    #[serde(default)]
    pub resource: String,
}

/// The admission request, with the objects still raw.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Request<'body> {
    /// Identifier echoed in the response.
    pub uid: String,
    /// Kind of the object.
    #[serde(default)]
    pub kind: GroupVersionKind,
    /// Resource being admitted.
    #[serde(default)]
    pub resource: GroupVersionResource,
    /// Subresource, empty for the main resource.
    #[serde(default)]
    pub sub_resource: Option<String>,
    /// CREATE, UPDATE, DELETE or CONNECT.
    #[serde(default)]
    pub operation: String,
    /// The new object (CREATE, UPDATE).
    #[serde(default, borrow)]
    pub object: Option<&'body RawValue>,
    /// The existing object (UPDATE, DELETE).
    #[serde(default, borrow)]
    pub old_object: Option<&'body RawValue>,
    /// Who sent the request.
    #[serde(default)]
    pub user_info: UserInfo,
}

/// The requesting user, as the apiserver authenticated them (`request.userInfo`).
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct UserInfo {
    /// The user's name.
    #[serde(default)]
    pub username: String,
    /// The user's UID, if any.
    #[serde(default)]
    pub uid: Option<String>,
    /// The user's groups.
    #[serde(default)]
    pub groups: Vec<String>,
    /// Other attributes of the authenticator.
    #[serde(default)]
    pub extra: std::collections::BTreeMap<String, Vec<String>>,
}

impl UserInfo {
    /// `User "name"`, as Kubernetes names a user in its messages.
    pub fn describe(&self) -> String {
        format!("User {:?}", self.username)
    }
}

/// Parses the body into an admission request, or explains in one line why it is not one.
pub fn parse_request(body: &[u8]) -> Result<Request<'_>, String> {
    let review: Review<'_> =
        serde_json::from_slice(body).map_err(|error| format!("malformed AdmissionReview: {error}"))?;
    if review.kind != "AdmissionReview" || review.api_version != API_VERSION {
        return Err(format!(
            "expected kind AdmissionReview in {API_VERSION}, got kind {:?} in {:?}",
            review.kind, review.api_version
        ));
    }
    let request = review.request.ok_or_else(|| "AdmissionReview has no request".to_string())?;
    if request.uid.is_empty() {
        return Err("AdmissionReview request has no uid".into());
    }
    Ok(request)
}

/// The admission operations, as the apiserver spells them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    /// A new object.
    Create,
    /// A change to an existing object.
    Update,
    /// A deletion.
    Delete,
}

impl Operation {
    /// The name used in metrics labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
            Operation::Delete => "DELETE",
        }
    }
}

/// A request the webhook understands, with its objects parsed.
#[derive(Debug)]
pub struct Admission {
    /// The operation.
    pub operation: Operation,
    /// The new object (CREATE and UPDATE).
    pub object: Option<DatabaseService>,
    /// The old object (UPDATE; DELETE when the apiserver sends it).
    pub old_object: Option<DatabaseService>,
    /// Who sent the request.
    pub user: UserInfo,
}

/// Why a well-formed review is not admitted.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The review is for something this webhook is not registered for (HTTP-level: 400 code).
    NotUnderstood(String),
    /// An object's fields have the wrong types (422, like a schema error).
    Malformed(String),
}

impl Request<'_> {
    /// Checks what the request is about and parses its objects.
    pub fn admission(&self) -> Result<Admission, Refusal> {
        let not_understood = |message: String| Err(Refusal::NotUnderstood(message));
        if self.kind.group != GROUP || self.kind.version != "v1" || self.kind.kind != "DatabaseService" {
            return not_understood(format!(
                "this webhook only admits {GROUP}/v1 DatabaseService, got kind {:?} in {:?}",
                self.kind.kind,
                format!("{}/{}", self.kind.group, self.kind.version)
            ));
        }
        if self.resource.group != GROUP || self.resource.resource != RESOURCE {
            return not_understood(format!(
                "this webhook only admits the resource {RESOURCE}.{GROUP}, got {:?}",
                format!("{}.{}", self.resource.resource, self.resource.group)
            ));
        }
        if let Some(sub_resource) = self.sub_resource.as_deref().filter(|sub_resource| !sub_resource.is_empty()) {
            return not_understood(format!("this webhook does not admit the subresource {sub_resource:?}"));
        }
        let operation = match self.operation.as_str() {
            "CREATE" => Operation::Create,
            "UPDATE" => Operation::Update,
            "DELETE" => Operation::Delete,
            other => return not_understood(format!("this webhook does not admit the operation {other:?}")),
        };
        let object = parse_object(self.object, "object")?;
        let old_object = parse_object(self.old_object, "oldObject")?;
        match operation {
            Operation::Create | Operation::Update if object.is_none() => {
                return not_understood(format!("{} without an object", operation.as_str()));
            }
            Operation::Update if old_object.is_none() => {
                return not_understood("UPDATE without an oldObject".into());
            }
            _ => {}
        }
        Ok(Admission { operation, object, old_object, user: self.user_info.clone() })
    }
}

/// A DatabaseService whose metadata may be missing: the mutating webhook runs before schema
/// validation, and such an object still gets its defaults (and a patch that creates metadata).
/// Of its status only the primary's names are read (a scale-down must not remove the primary);
/// the rest, like any unknown field, is skipped unparsed.
#[derive(Deserialize)]
struct Object {
    #[serde(default)]
    metadata: AdmittedMetadata,
    spec: DatabaseServiceSpec,
    #[serde(default)]
    status: Option<AdmittedStatus>,
}

/// The part of the status admission reads.
#[derive(Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct AdmittedStatus {
    current_primary: Option<String>,
    target_primary: Option<String>,
}

impl From<AdmittedStatus> for DatabaseServiceStatus {
    fn from(status: AdmittedStatus) -> Self {
        let failover = FailoverStatus {
            current_primary: status.current_primary,
            target_primary: status.target_primary,
            ..Default::default()
        };
        DatabaseServiceStatus { failover, ..Default::default() }
    }
}

/// The metadata of an admitted object without `managedFields`, which are skipped unparsed: in an
/// apiserver-sized UPDATE they are most of the metadata, and as a tree of JSON maps they were
/// most of the parsing (no admission rule reads them).
#[derive(Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct AdmittedMetadata {
    name: Option<String>,
    generate_name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    generation: Option<i64>,
    creation_timestamp: Option<Time>,
    deletion_timestamp: Option<Time>,
    deletion_grace_period_seconds: Option<i64>,
    labels: Option<BTreeMap<String, String>>,
    annotations: Option<BTreeMap<String, String>>,
    finalizers: Option<Vec<String>>,
    owner_references: Option<Vec<OwnerReference>>,
}

impl From<AdmittedMetadata> for ObjectMeta {
    fn from(metadata: AdmittedMetadata) -> Self {
        ObjectMeta {
            name: metadata.name,
            generate_name: metadata.generate_name,
            namespace: metadata.namespace,
            uid: metadata.uid,
            resource_version: metadata.resource_version,
            generation: metadata.generation,
            creation_timestamp: metadata.creation_timestamp,
            deletion_timestamp: metadata.deletion_timestamp,
            deletion_grace_period_seconds: metadata.deletion_grace_period_seconds,
            labels: metadata.labels,
            annotations: metadata.annotations,
            finalizers: metadata.finalizers,
            owner_references: metadata.owner_references,
            managed_fields: None,
            self_link: None,
        }
    }
}

/// Parses a raw object; `null` counts as absent.
fn parse_object(raw: Option<&RawValue>, field: &str) -> Result<Option<DatabaseService>, Refusal> {
    let Some(raw) = raw.filter(|raw| raw.get() != "null") else {
        return Ok(None);
    };
    serde_json::from_str::<Object>(raw.get())
        .map(|Object { metadata, spec, status }| {
            Some(DatabaseService { metadata: metadata.into(), spec, status: status.map(Into::into) })
        })
        .map_err(|error| Refusal::Malformed(format!("{field}: Invalid value: {error}")))
}

/// `response.status` of an AdmissionReview.
#[derive(Debug, Default, Serialize)]
pub struct Status {
    /// "Failure" when denied.
    pub status: &'static str,
    /// Human-readable reason, shown to the user by kubectl.
    pub message: String,
    /// Machine-readable reason such as "Invalid".
    pub reason: &'static str,
    /// HTTP-like code returned to the client (422, 400).
    pub code: u16,
}

/// `response` of an AdmissionReview.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Response {
    /// The request's uid.
    pub uid: String,
    /// Whether the request is admitted.
    pub allowed: bool,
    /// Why not, when denied.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
    /// The JSON Patch, base64 of its JSON (Go's []byte): the canonical form, and ~2.6x smaller
    /// than the array of numbers kube-core sends.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub patch: Option<String>,
    /// "JSONPatch" when there is a patch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub patch_type: Option<&'static str>,
    /// Warnings shown to the user.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

impl Response {
    /// An allowed response for `uid`.
    pub fn allow(uid: &str) -> Self {
        Self { uid: uid.to_string(), allowed: true, status: None, patch: None, patch_type: None, warnings: Vec::new() }
    }

    /// A denial with a reason and a code.
    pub fn deny(uid: &str, reason: &'static str, code: u16, message: String) -> Self {
        Self { allowed: false, status: Some(Status { status: "Failure", message, reason, code }), ..Self::allow(uid) }
    }

    /// Adds a JSON Patch (serialized and base64-encoded).
    pub fn with_patch(mut self, patch: &json_patch::Patch) -> Self {
        let json = serde_json::to_vec(patch).expect("a JSON Patch serializes");
        self.patch = Some(base64::engine::general_purpose::STANDARD.encode(json));
        self.patch_type = Some("JSONPatch");
        self
    }

    /// The whole AdmissionReview carrying this response, as JSON.
    pub fn into_review_json(self) -> Vec<u8> {
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct ReviewOut {
            api_version: &'static str,
            kind: &'static str,
            response: Response,
        }
        serde_json::to_vec(&ReviewOut { api_version: API_VERSION, kind: "AdmissionReview", response: self })
            .expect("an AdmissionReview serializes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn review(metadata: serde_json::Value, status: serde_json::Value) -> Vec<u8> {
        let object = serde_json::json!({
            "apiVersion": "dbservice.dev/v1", "kind": "DatabaseService", "metadata": metadata,
            "spec": {"version": "16.4", "storageSize": "1Gi", "databaseName": "app", "username": "app_user"},
            "status": status
        });
        serde_json::to_vec(&serde_json::json!({
            "apiVersion": API_VERSION, "kind": "AdmissionReview",
            "request": {"uid": "1", "operation": "CREATE", "object": object,
                        "kind": {"group": GROUP, "version": "v1", "kind": "DatabaseService"},
                        "resource": {"group": GROUP, "version": "v1", "resource": RESOURCE}}
        }))
        .unwrap()
    }

    #[test]
    fn managed_fields_and_status_are_skipped_but_the_primary_and_the_rest_of_the_metadata_are_kept() {
        let body = review(
            serde_json::json!({"name": "db", "namespace": "shop", "finalizers": ["a"], "labels": {"team": "x"},
                               "managedFields": "not even a list", "deletionTimestamp": "2026-12-01T00:00:00Z"}),
            serde_json::json!({"phase": 42, "conditions": "not even a list", "currentPrimary": "db-1"}),
        );
        let request = parse_request(&body).unwrap();
        let object = request.admission().unwrap().object.unwrap();
        assert_eq!(object.metadata.name.as_deref(), Some("db"));
        assert_eq!(object.metadata.namespace.as_deref(), Some("shop"));
        assert_eq!(object.metadata.finalizers, Some(vec!["a".to_string()]));
        assert_eq!(object.metadata.labels.unwrap()["team"], "x");
        assert!(object.metadata.deletion_timestamp.is_some());
        assert!(object.metadata.managed_fields.is_none());
        let status = object.status.expect("the primary's names are read");
        assert_eq!(status.failover.current_primary.as_deref(), Some("db-1"));
        assert_eq!(status.phase, None, "the rest of the status is skipped unparsed");
    }

    #[test]
    fn a_malformed_kept_metadata_field_is_still_a_malformed_object() {
        let body = review(serde_json::json!({"name": "db", "finalizers": "a"}), serde_json::Value::Null);
        let request = parse_request(&body).unwrap();
        assert!(matches!(request.admission(), Err(Refusal::Malformed(message)) if message.starts_with("object:")));
    }
}
