//! Memory the controller's caches hold per DatabaseService: each cached kind as the apiserver
//! sends it (server-set metadata, managedFields, status), deserialized into the cached type and
//! slimmed as the watches do, measured with a counting allocator (bytes asked for and blocks, so
//! allocator overhead comes on top). Prints bytes per kind, per DatabaseService and for 1,000 and
//! 10,000 DatabaseServices.
//!
//!     cargo bench --bench cache-memory

use dbservice_operator::api::database_service::DatabaseService;
use dbservice_operator::operator::caches::Compact;
use dbservice_operator::operator::caches::Slim;
use dbservice_operator::operator::database::build::{desired, NewPasswords, WorkloadInputs};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret, Service};
use kube::core::PartialObjectMeta;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

struct Counting;

static BYTES: AtomicIsize = AtomicIsize::new(0);
static BLOCKS: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call is forwarded to the system allocator unchanged; only counters are added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        BYTES.fetch_add(layout.size() as isize, Ordering::Relaxed);
        BLOCKS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same layout as asked.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        BYTES.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        BLOCKS.fetch_sub(1, Ordering::Relaxed);
        // SAFETY: the pointer came from `alloc` with this layout.
        unsafe { System.dealloc(pointer, layout) }
    }
    unsafe fn realloc(&self, pointer: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        BYTES.fetch_add(new_size as isize - layout.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded unchanged.
        unsafe { System.realloc(pointer, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Bytes and blocks still held by what `make` returns (the JSON input is freed before counting).
fn retained<T>(make: impl FnOnce() -> T) -> (T, isize, isize) {
    let (bytes, blocks) = (BYTES.load(Ordering::SeqCst), BLOCKS.load(Ordering::SeqCst));
    let value = make();
    (value, BYTES.load(Ordering::SeqCst) - bytes, BLOCKS.load(Ordering::SeqCst) - blocks)
}

/// Server-set metadata as the apiserver adds it, with managedFields of two managers.
fn as_served(mut object: Value, kind_status: Value) -> Value {
    let metadata = object["metadata"].as_object_mut().expect("metadata");
    metadata.insert("uid".into(), json!("3f0c1e2a-7b7d-4c55-9d3e-2f1b8c9a0d11"));
    metadata.insert("resourceVersion".into(), json!("123456"));
    metadata.insert("creationTimestamp".into(), json!("2026-12-01T00:00:00Z"));
    metadata.insert("generation".into(), json!(1));
    let fields = json!({"f:metadata": {"f:labels": {".": {}, "f:app.kubernetes.io/name": {}}}, "f:spec": {"f:x": {}}});
    metadata.insert(
        "managedFields".into(),
        json!([
            {"manager": "dbservice-operator", "operation": "Apply", "apiVersion": "v1", "time": "2026-12-01T00:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": fields},
            {"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1", "time": "2026-12-01T00:00:01Z", "fieldsType": "FieldsV1", "fieldsV1": fields, "subresource": "status"}
        ]),
    );
    if !kind_status.is_null() {
        object["status"] = kind_status;
    }
    object
}

fn cached<K: DeserializeOwned + Slim>(served: &Value) -> K {
    let mut object: K = serde_json::from_value(served.clone()).expect("the served object parses");
    object.slim();
    object
}

fn measure<K: DeserializeOwned + Slim>(name: &str, served: Value, rows: &mut Vec<(String, isize, isize)>) {
    let text = serde_json::to_string(&served).unwrap();
    let (object, bytes, blocks) = retained(|| cached::<K>(&served));
    drop(object);
    // The store keeps each object in an Arc: the struct itself (its inline fields, empty Options
    // included) plus the two reference counts live on the heap too.
    let (bytes, blocks) = (bytes + std::mem::size_of::<K>() as isize + 16, blocks + 1);
    println!("{name:<34} {bytes:>7} B in {blocks:>4} blocks (served JSON {} B)", text.len());
    rows.push((name.to_string(), bytes, blocks));
}

fn to_value(object: &impl Serialize) -> Value {
    serde_json::to_value(object).unwrap()
}

fn main() {
    let database: DatabaseService = serde_json::from_value(json!({
        "apiVersion": "dbservice.dev/v1", "kind": "DatabaseService",
        "metadata": {"name": "orders", "namespace": "shop", "uid": "9a8b7c6d-1111-2222-3333-444455556666", "finalizers": ["dbservice.dev/cleanup"]},
        "spec": {"version": "16.4", "storageSize": "10Gi", "databaseName": "app", "username": "app_user", "replicas": 1}
    }))
    .unwrap();
    let inputs = WorkloadInputs {
        image: "postgres:16.4".into(),
        replicas: 1,
        restarted_at: None,
        claim_template_size: "10Gi".into(),
        instance_image: None,
    };
    let passwords = NewPasswords {
        application: Some("x".repeat(32)),
        superuser: Some("z".repeat(32)),
        replication: Some("y".repeat(32)),
    };
    let children = desired(&database, &inputs, passwords, None);
    let condition = |kind: &str| json!({"type": kind, "status": "True", "lastTransitionTime": "2026-12-01T00:00:05Z", "reason": "AllReady", "message": "all 1 instances are ready and serving 16.4", "observedGeneration": 1});
    let database_status = json!({
        "phase": "Running", "observedGeneration": 1, "readyReplicas": 1, "currentVersion": "16.4",
        "lastStableVersion": "16.4", "lastStableImage": "postgres:16.4",
        "conditions": [condition("Ready"), condition("StorageReady"), condition("CredentialsReady"), condition("Progressing")]
    });
    let owner = json!([{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "orders", "uid": "5c1f", "controller": true, "blockOwnerDeletion": true}]);
    let labels = json!({"app.kubernetes.io/name": "postgresql", "app.kubernetes.io/instance": "orders", "app.kubernetes.io/managed-by": "dbservice-operator", "dbservice.dev/role": "primary", "controller-revision-hash": "orders-7d9f8c6b5", "statefulset.kubernetes.io/pod-name": "orders-0", "apps.kubernetes.io/pod-index": "0"});
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "orders-0", "namespace": "shop", "generateName": "orders-", "labels": labels, "ownerReferences": owner,
                     "annotations": {"dbservice.dev/restartedAt": "2026-12-01T00:00:00Z"}},
        "spec": children.stateful_set.spec.template.spec.clone(),
    });
    let container_status = json!({"name": "postgres", "ready": true, "restartCount": 0, "image": "postgres:16.4", "imageID": "docker.io/library/postgres@sha256:0123456789abcdef", "containerID": "containerd://0123456789abcdef", "started": true, "state": {"running": {"startedAt": "2026-12-01T00:00:03Z"}}});
    let pod_condition = |kind: &str| json!({"type": kind, "status": "True", "lastProbeTime": null, "lastTransitionTime": "2026-12-01T00:00:03Z"});
    let pod_status = json!({
        "phase": "Running", "hostIP": "10.0.0.7", "podIP": "10.244.3.17", "podIPs": [{"ip": "10.244.3.17"}], "startTime": "2026-12-01T00:00:02Z", "qosClass": "Burstable",
        "conditions": [pod_condition("PodReadyToStartContainers"), pod_condition("Initialized"), pod_condition("Ready"), pod_condition("ContainersReady"), pod_condition("PodScheduled")],
        "containerStatuses": [container_status]
    });
    let claim = json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "data-orders-0", "namespace": "shop", "labels": {"app.kubernetes.io/name": "postgresql", "app.kubernetes.io/instance": "orders", "app.kubernetes.io/managed-by": "dbservice-operator"},
                     "finalizers": ["kubernetes.io/pvc-protection"],
                     "annotations": {"pv.kubernetes.io/bind-completed": "yes", "volume.kubernetes.io/storage-provisioner": "kubernetes.io/host-path"},
                     "ownerReferences": [{"apiVersion": "dbservice.dev/v1", "kind": "DatabaseService", "name": "orders", "uid": "9a8b", "controller": true, "blockOwnerDeletion": true}]},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "10Gi"}}, "storageClassName": "standard", "volumeMode": "Filesystem", "volumeName": "pvc-3f0c1e2a-7b7d-4c55-9d3e-2f1b8c9a0d11"}
    });
    let claim_status = json!({"phase": "Bound", "accessModes": ["ReadWriteOnce"], "capacity": {"storage": "10Gi"}});
    let stateful_set_status = json!({"replicas": 1, "readyReplicas": 1, "currentReplicas": 1, "updatedReplicas": 1, "availableReplicas": 1, "observedGeneration": 1, "currentRevision": "orders-7d9f8c6b5", "updateRevision": "orders-7d9f8c6b5", "collisionCount": 0});
    let mut secret = to_value(children.credentials.as_ref().unwrap());
    secret["apiVersion"] = json!("meta.k8s.io/v1");
    secret["kind"] = json!("PartialObjectMetadata");
    secret.as_object_mut().unwrap().remove("data");
    secret.as_object_mut().unwrap().remove("stringData");
    let mut ledger = to_value(&children.scripts);
    ledger["metadata"]["name"] = json!("orders-ledger");
    ledger["data"] =
        json!({"ledger": "2026-12-01T00:00:00Z gen=1 Created -> 16.4 x1 (provisioning started)\n".repeat(4)});

    let mut rows = Vec::new();
    measure::<DatabaseService>("DatabaseService", as_served(to_value(&database), database_status), &mut rows);
    measure::<Compact<StatefulSet>>(
        "StatefulSet (compact)",
        as_served(to_value(&children.stateful_set), stateful_set_status),
        &mut rows,
    );
    for service in &children.services {
        let name = format!("Service {} (compact)", service.metadata.name.as_deref().unwrap_or_default());
        measure::<Compact<Service>>(&name, as_served(to_value(service), json!({"loadBalancer": {}})), &mut rows);
    }
    measure::<Compact<ConfigMap>>(
        "ConfigMap scripts (fingerprint, compact)",
        as_served(to_value(&children.scripts), Value::Null),
        &mut rows,
    );
    measure::<Compact<ConfigMap>>("ConfigMap ledger (fingerprint, compact)", as_served(ledger, Value::Null), &mut rows);
    measure::<PartialObjectMeta<Secret>>("Secret (metadata only)", as_served(secret, Value::Null), &mut rows);
    measure::<Compact<Pod>>("Pod (slimmed, compact)", as_served(pod, pod_status), &mut rows);
    measure::<Compact<PersistentVolumeClaim>>(
        "PersistentVolumeClaim (compact)",
        as_served(claim, claim_status),
        &mut rows,
    );
    let bytes: isize = rows.iter().map(|row| row.1).sum();
    let blocks: isize = rows.iter().map(|row| row.2).sum();
    println!("\nper DatabaseService (1 instance): {bytes} B in {blocks} blocks");
    // Allocators add per-block overhead (8-16 B) and size-class rounding on top of the bytes asked for.
    let with_overhead = bytes + 16 * blocks;
    println!("with ~16 B per block:            {with_overhead} B");
    println!("1,000 DatabaseServices:           {:.1} MiB", with_overhead as f64 * 1000.0 / 1048576.0);
    println!("10,000 DatabaseServices:          {:.1} MiB", with_overhead as f64 * 10000.0 / 1048576.0);
}
