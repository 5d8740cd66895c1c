//! Where a database's instances run (issue 23): the user's scheduling rules for its pods, the
//! operator's default anti-affinity between instances of one database, and whether they get a
//! PodDisruptionBudget. Flattened into `DatabaseServiceSpec`: the fields sit at `spec.affinity`,
//! `spec.tolerations` and so on, as on a pod.

use k8s_openapi::api::core::v1::{Affinity, Toleration, TopologySpreadConstraint};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Topology key of the default anti-affinity: one instance per node.
pub const DEFAULT_ANTI_AFFINITY_TOPOLOGY_KEY: &str = "kubernetes.io/hostname";

/// How strongly instances of one database are kept apart ([`PlacementSpec::pod_anti_affinity_topology_key`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum PodAntiAffinity {
    /// The scheduler prefers different nodes, and shares one when it has to.
    #[default]
    Preferred,
    /// Different nodes or not at all: an instance without a free node stays Pending.
    Required,
    /// No rule of the operator's (only `affinity`'s own).
    Disabled,
}

/// Scheduling of the database's pods.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlacementSpec {
    /// Affinity rules of every instance's pod, as on a pod; the operator's anti-affinity between
    /// instances is added to them (see `enablePodAntiAffinity`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    /// Keep the instances of this database apart: `preferred` (default), `required` or `disabled`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_pod_anti_affinity: Option<PodAntiAffinity>,
    /// Topology the anti-affinity spreads over (default `kubernetes.io/hostname`: nodes; use
    /// `topology.kubernetes.io/zone` for zones).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_anti_affinity_topology_key: Option<String>,
    /// Tolerations of every instance's pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerations: Option<Vec<Toleration>>,
    /// Node labels every instance's node must have.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,
    /// Topology spread constraints of every instance's pod (their label selector is the user's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology_spread_constraints: Option<Vec<TopologySpreadConstraint>>,
    /// PriorityClass of every instance's pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
    /// PodDisruptionBudgets for the instances (default true): with a standby, a voluntary
    /// eviction of the primary waits until the operator has switched over, and standbys go one
    /// at a time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_pod_disruption_budget: Option<bool>,
}

impl PlacementSpec {
    /// `enablePodAntiAffinity` or its default.
    pub fn anti_affinity(&self) -> PodAntiAffinity {
        self.enable_pod_anti_affinity.unwrap_or_default()
    }

    /// `podAntiAffinityTopologyKey` or its default.
    pub fn anti_affinity_topology_key(&self) -> &str {
        self.pod_anti_affinity_topology_key.as_deref().unwrap_or(DEFAULT_ANTI_AFFINITY_TOPOLOGY_KEY)
    }

    /// `enablePodDisruptionBudget` or its default.
    pub fn disruption_budget_enabled(&self) -> bool {
        self.enable_pod_disruption_budget.unwrap_or(true)
    }
}
