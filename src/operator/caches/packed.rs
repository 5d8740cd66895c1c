//! Cached JSON text packed with zstd against a dictionary of what the operator's own children look
//! like. Every DatabaseService's StatefulSet, Services, Pods and claims differ from one another in a
//! few names, so a StatefulSet spec of ~3 KB of text packs into a few hundred bytes: at 1,000
//! databases that is the difference between the caches dominating the operator's memory or not.
//!
//! The dictionary is built once per process from the pure builder ([`crate::operator::database::build::desired`]) with
//! the defaults the apiserver adds, so it follows the builder when the children change; it is never
//! stored anywhere, so no format has to stay stable across versions. Text that does not pack smaller
//! is kept as it is (zstd frames start with a magic number that JSON text never starts with).

use crate::api::database_service::DatabaseService;
use crate::api::names::FINGERPRINT_KEY;
use crate::operator::database::build::{desired, NewPasswords, WorkloadInputs};
use serde_json::{json, Value};
use std::borrow::Cow;
use std::fmt::Debug;
use std::sync::{Mutex, OnceLock};
use zstd::bulk::{Compressor, Decompressor};

/// The first bytes of every zstd frame; JSON text starts with `{`, `[`, `"`, a digit or a letter.
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xB5, 0x2F, 0xFD];

/// zstd level: on texts of a few KB against a dictionary, higher levels gain a few percent for
/// several times the CPU of every watch event.
const LEVEL: i32 = 3;

/// JSON text, zstd-packed against the process's dictionary when that is smaller.
#[derive(Clone, PartialEq, Eq)]
pub struct Packed(Box<[u8]>);

impl Packed {
    /// Packs `text`.
    pub fn new(text: &str) -> Self {
        let packed = codec().and_then(|codec| codec.compressor.lock().ok()?.compress(text.as_bytes()).ok());
        match packed {
            Some(packed) if packed.len() < text.len() => Self(packed.into_boxed_slice()),
            _ => Self(text.as_bytes().into()),
        }
    }

    /// The text, unpacked.
    pub fn text(&self) -> Cow<'_, str> {
        if !self.0.starts_with(&ZSTD_MAGIC) {
            return Cow::Borrowed(
                std::str::from_utf8(&self.0).expect("plain packed text is the UTF-8 it was made from"),
            );
        }
        let size =
            zstd::zstd_safe::get_frame_content_size(&self.0).ok().flatten().expect("packed frames record their size");
        let codec = codec().expect("a packed frame implies the codec that made it");
        let bytes = codec
            .decompressor
            .lock()
            .expect("the decompressor lock is never poisoned: decompressing cannot panic")
            .decompress(&self.0, size as usize)
            .expect("a packed frame unpacks with the dictionary it was packed with");
        Cow::Owned(String::from_utf8(bytes).expect("packed text is the UTF-8 it was made from"))
    }

    /// Bytes held.
    #[cfg(test)]
    pub fn stored_len(&self) -> usize {
        self.0.len()
    }
}

impl Debug for Packed {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        Debug::fmt(&self.text(), formatter)
    }
}

struct Codec {
    compressor: Mutex<Compressor<'static>>,
    decompressor: Mutex<Decompressor<'static>>,
}

/// The process-wide codec; None (texts stay plain) if zstd could not set it up.
fn codec() -> Option<&'static Codec> {
    static CODEC: OnceLock<Option<Codec>> = OnceLock::new();
    CODEC
        .get_or_init(|| {
            let dictionary = dictionary();
            Some(Codec {
                compressor: Mutex::new(Compressor::with_dictionary(LEVEL, &dictionary).ok()?),
                decompressor: Mutex::new(Decompressor::with_dictionary(&dictionary).ok()?),
            })
        })
        .as_ref()
}

/// A raw-content zstd dictionary: the texts the caches keep for a typical database, as the
/// apiserver serves them. zstd prefers recent (nearby) matches, so the most common come last.
pub fn dictionary() -> Vec<u8> {
    let database: DatabaseService = serde_json::from_value(json!({
        "apiVersion": "dbservice.dev/v1", "kind": "DatabaseService",
        "metadata": {"name": "orders", "namespace": "default", "uid": "9a8b7c6d-1111-2222-3333-444455556666"},
        "spec": {"version": "16.4", "storageSize": "10Gi", "databaseName": "app", "username": "app_user", "replicas": 1}
    }))
    .expect("the sample database is valid");
    let passwords = || NewPasswords {
        application: Some(String::new()),
        superuser: Some(String::new()),
        replication: Some(String::new()),
    };
    let inputs = |instance_image: Option<&str>| WorkloadInputs {
        image: "postgres:16.4".into(),
        replicas: 1,
        restarted_at: None,
        claim_template_size: "10Gi".into(),
        instance_image: instance_image.map(String::from),
    };
    let mut texts: Vec<String> = Vec::new();
    for instance_image in [None, Some("ghcr.io/dbservice/dbservice-operator:0.1.0")] {
        let children = desired(&database, &inputs(instance_image), passwords(), None);
        let mut stateful_set = serde_json::to_value(&children.stateful_set).expect("objects serialize");
        merge(&mut stateful_set, &stateful_set_defaults());
        let owner = stateful_set["metadata"]["ownerReferences"].clone();
        let labels = stateful_set["spec"]["template"]["metadata"]["labels"].clone();
        let mut fingerprint = json!({"data": {}, "metadata": {"ownerReferences": owner}});
        fingerprint["data"][FINGERPRINT_KEY] = json!("0123456789abcdef");
        texts.push(body(fingerprint));
        let mut claim = stateful_set["spec"]["volumeClaimTemplates"][0].clone();
        merge(&mut claim, &claim_defaults());
        claim["metadata"]["labels"] = labels.clone();
        claim["metadata"]["ownerReferences"] = owner;
        texts.push(body(claim));
        texts.push(body(pod(&stateful_set["spec"]["template"], labels)));
        for service in &children.services {
            let mut service = serde_json::to_value(service).expect("objects serialize");
            merge(&mut service, &service_defaults());
            texts.push(body(service));
        }
        texts.push(body(stateful_set));
    }
    texts.concat().into_bytes()
}

/// The text a compact cached object packs of an object as served: all but the identity
/// fields it keeps typed, and what the caches slim away (managedFields, most annotations).
fn body(mut object: Value) -> String {
    merge(
        &mut object,
        &json!({"metadata": {"creationTimestamp": "2026-12-01T00:00:00Z", "uid": "3f0c1e2a-7b7d-4c55-9d3e-2f1b8c9a0d11"}}),
    );
    if let Some(fields) = object.as_object_mut() {
        fields.remove("apiVersion");
        fields.remove("kind");
    }
    if let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        for identity in ["name", "namespace", "resourceVersion", "managedFields", "annotations"] {
            metadata.remove(identity);
        }
    }
    object.to_string()
}

/// A cached Pod as slimmed (only names, images, readiness and waiting reasons).
fn pod(template: &Value, mut labels: Value) -> Value {
    let containers: Vec<Value> = template["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|container| json!({"image": container["image"], "name": container["name"]}))
        .collect();
    let condition = |kind: &str| json!({"lastProbeTime": null, "lastTransitionTime": "2026-12-01T00:00:03Z", "status": "True", "type": kind});
    let statuses: Vec<Value> = containers
        .iter()
        .map(|container| json!({"name": container["name"], "ready": true, "restartCount": 0, "state": {}}))
        .collect();
    merge(
        &mut labels,
        &json!({"apps.kubernetes.io/pod-index": "0", "controller-revision-hash": "orders-7d9f8c6b5", "statefulset.kubernetes.io/pod-name": "orders-0"}),
    );
    json!({
        "metadata": {"generateName": "orders-", "labels": labels, "ownerReferences": [{"apiVersion": "apps/v1", "blockOwnerDeletion": true,
                     "controller": true, "kind": "StatefulSet", "name": "orders", "uid": "5c1f0e2a-7b7d-4c55-9d3e-2f1b8c9a0d11"}]},
        "spec": {"containers": containers},
        "status": {
            "conditions": [condition("PodReadyToStartContainers"), condition("Initialized"), condition("Ready"), condition("ContainersReady"), condition("PodScheduled")],
            "containerStatuses": statuses, "phase": "Running"
        }
    })
}

fn stateful_set_defaults() -> Value {
    let container = json!({"imagePullPolicy": "IfNotPresent", "resources": {}, "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File"});
    json!({
        "spec": {
            "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Retain", "whenScaled": "Retain"},
            "podManagementPolicy": "Parallel", "revisionHistoryLimit": 10,
            "template": {"metadata": {"creationTimestamp": null}, "spec": {
                "containers": [container], "initContainers": [container],
                "dnsPolicy": "ClusterFirst", "restartPolicy": "Always", "schedulerName": "default-scheduler",
                "terminationGracePeriodSeconds": 30
            }},
            "volumeClaimTemplates": [{"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"creationTimestamp": null},
                                      "spec": {"volumeMode": "Filesystem"}, "status": {"phase": "Pending"}}]
        },
        "metadata": {"generation": 1},
        "status": {"availableReplicas": 1, "collisionCount": 0, "currentReplicas": 1, "currentRevision": "orders-7d9f8c6b5",
                   "observedGeneration": 1, "readyReplicas": 1, "replicas": 1, "updateRevision": "orders-7d9f8c6b5", "updatedReplicas": 1}
    })
}

fn claim_defaults() -> Value {
    json!({
        "spec": {"storageClassName": "standard", "volumeName": "pvc-3f0c1e2a-7b7d-4c55-9d3e-2f1b8c9a0d11"},
        "status": {"accessModes": ["ReadWriteOnce"], "capacity": {"storage": "10Gi"}, "phase": "Bound"}
    })
}

fn service_defaults() -> Value {
    json!({"spec": {
        "clusterIP": "10.96.12.34", "clusterIPs": ["10.96.12.34"], "internalTrafficPolicy": "Cluster",
        "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack", "ports": [{"protocol": "TCP"}],
        "sessionAffinity": "None", "type": "ClusterIP"
    }})
}

/// Adds `defaults` into `value`: objects key by key; a one-element array of defaults applies to
/// every element of the array it meets (every container gets the container defaults).
fn merge(value: &mut Value, defaults: &Value) {
    match (value, defaults) {
        (Value::Object(object), Value::Object(defaults)) => {
            for (key, default) in defaults {
                match object.get_mut(key) {
                    Some(existing) => merge(existing, default),
                    None => {
                        object.insert(key.clone(), default.clone());
                    }
                }
            }
        }
        (Value::Array(elements), Value::Array(defaults)) if defaults.len() == 1 => {
            for element in elements {
                merge(element, &defaults[0]);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_text_unpacks_to_the_same_text() {
        for text in [r#"{"a":1,"b":[true,null,"x"]}"#, "{}", "", &"{\"k\":\"ab\"}".repeat(500)] {
            assert_eq!(Packed::new(text).text(), text);
        }
    }

    #[test]
    fn text_that_does_not_pack_smaller_stays_plain() {
        let packed = Packed::new("{}");
        assert_eq!(packed.stored_len(), 2);
        assert!(matches!(packed.text(), Cow::Borrowed("{}")));
    }

    #[test]
    fn another_databases_stateful_set_packs_to_a_fraction_of_its_text() {
        let database: DatabaseService = serde_json::from_value(json!({
            "metadata": {"name": "inventory-eu", "namespace": "team-payments", "uid": "0f1e2d3c-aaaa-bbbb-cccc-ddddeeeeffff"},
            "spec": {"version": "15.8", "storageSize": "50Gi", "databaseName": "stock", "username": "stock_owner", "replicas": 3}
        }))
        .unwrap();
        let inputs = WorkloadInputs {
            image: "postgres:15.8".into(),
            replicas: 3,
            restarted_at: None,
            claim_template_size: "50Gi".into(),
            instance_image: Some("registry.example/dbservice-operator:1.2.3".into()),
        };
        let passwords = NewPasswords { application: Some("p".into()), ..Default::default() };
        let mut stateful_set = serde_json::to_value(desired(&database, &inputs, passwords, None).stateful_set).unwrap();
        merge(&mut stateful_set, &stateful_set_defaults());
        let text = body(stateful_set);
        let packed = Packed::new(&text);
        assert_eq!(packed.text(), text);
        assert!(
            packed.stored_len() * 5 < text.len(),
            "a {} B StatefulSet packed to {} B",
            text.len(),
            packed.stored_len()
        );
    }

    #[test]
    fn defaults_reach_every_element_of_an_array_and_keep_what_is_set() {
        let mut value = json!({"containers": [{"name": "a"}, {"name": "b", "imagePullPolicy": "Always"}]});
        merge(&mut value, &json!({"containers": [{"imagePullPolicy": "IfNotPresent"}], "dnsPolicy": "ClusterFirst"}));
        assert_eq!(
            value,
            json!({"containers": [{"name": "a", "imagePullPolicy": "IfNotPresent"}, {"name": "b", "imagePullPolicy": "Always"}], "dnsPolicy": "ClusterFirst"})
        );
    }
}
