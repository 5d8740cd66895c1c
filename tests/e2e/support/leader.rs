//! Fixtures for tests that run their own operator processes in their own namespace.

use super::kubectl;
use super::operator::{RELEASE_NAMESPACE, SERVICE_ACCOUNT};

/// Lets the chart's ServiceAccount use a Lease in `namespace`, as a second installation of the
/// chart there would (the chart's Role only covers its own namespace).
pub fn grant_lease_rights(namespace: &str) {
    let manifest = format!(
        r#"apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: e2e-leases, namespace: {namespace}}}
rules:
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  verbs: [get, create, update, patch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: e2e-leases, namespace: {namespace}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: e2e-leases}}
subjects:
- {{kind: ServiceAccount, name: {SERVICE_ACCOUNT}, namespace: {RELEASE_NAMESPACE}}}
"#
    );
    let path = std::env::temp_dir().join(format!("e2e-leases-{namespace}.yaml"));
    std::fs::write(&path, manifest).unwrap();
    kubectl(&["apply", "-f", path.to_str().unwrap()]);
}
