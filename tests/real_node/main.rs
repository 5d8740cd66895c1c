//! Real-node suite: the chart installed as a user installs it (the operator's own image in a
//! Deployment on a real kubelet, self-managed certificates, webhooks called through the Service),
//! and real PostgreSQL in real pods under the operator. It needs the real node of the local control
//! plane (tests/cluster/real-node.sh, started by `make cluster-up`) and the operator image
//! (`make image`). Every test works in its own namespace; the pods of those namespaces are sent to
//! the real node by the namespace annotations of `real-node.sh namespace`.
//!
//! This binary reinstalls the shared chart release in Deployment mode; cargo runs test binaries
//! one after the other, so it never overlaps the kwok suite (tests/e2e), which uses URL mode.

mod backups;
mod configuration;
mod credentials;
mod dashboard_picture;
mod diagnostics;
mod environment;
mod failover;
mod faults;
mod hibernation;
mod import;
mod majors;
mod monitoring;
mod node;
#[path = "../support/object_store.rs"]
mod object_store;
mod operator;
mod owned_settings;
mod plugin;
mod pooler;
#[path = "../support/ports.rs"]
mod ports;
mod postgres;
mod recovery;
mod roles;
mod rolling;
mod security;
mod shadows;
mod storage_growth;
#[allow(dead_code)]
#[path = "../e2e/support/mod.rs"]
mod support;
mod synchronous;
mod tls;
mod trust;
mod upgrade;
