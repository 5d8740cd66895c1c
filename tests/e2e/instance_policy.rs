//! The chart's ValidatingAdmissionPolicy that narrows the instance agents' Role (issue 22): the
//! Role names every pod of a database, the policy lets an agent's token change only the pod it
//! is bound to, and there only the agent's annotations. Checked against the real kube-apiserver,
//! with tokens from the TokenRequest API as the kubelet mounts them (bound to a pod).

use crate::support::operator::{service_account_kubeconfig_with, shared};
use crate::support::{client_for, cluster_or_skip, TestNamespace};
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Patch, PatchParams, PostParams};
use kube::Api;
use serde_json::json;

fn database_pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {
            "app.kubernetes.io/managed-by": "dbservice-operator",
            "app.kubernetes.io/instance": "db",
            "dbservice.dev/role": "standby"}},
        "spec": {"serviceAccountName": "db-instance", "containers": [{"name": "postgres", "image": "postgres:16.4"}]}
    }))
    .unwrap()
}

/// The HTTP status and message of a failed patch, or None when it succeeded.
async fn patch(pods: &Api<Pod>, name: &str, body: serde_json::Value) -> Option<(u16, String)> {
    match pods.patch(name, &PatchParams::default(), &Patch::Merge(&body)).await {
        Ok(_) => None,
        Err(kube::Error::Api(status)) => Some((status.code, status.message)),
        Err(error) => panic!("patch {name}: {error}"),
    }
}

#[tokio::test]
async fn an_instance_agent_may_change_only_its_own_pods_report_annotations() {
    let Some(kubeconfig) = cluster_or_skip("an_instance_agent_may_change_only_its_own_pods_report_annotations") else {
        return;
    };
    let _ = shared(); // the chart, with its policy, is installed
    let admin = client_for(&kubeconfig).await;
    let namespace = TestNamespace::create(&admin, "agent-policy").await;
    let ns = namespace.name.as_str();
    // What the operator gives a database's agents (operator::database::access), by hand.
    let account: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": "db-instance"}})).unwrap();
    Api::<ServiceAccount>::namespaced(admin.clone(), ns).create(&PostParams::default(), &account).await.unwrap();
    let role: Role = serde_json::from_value(json!({
        "metadata": {"name": "db-instance"},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "resourceNames": ["db-0", "db-1"], "verbs": ["get", "patch"]}]
    }))
    .unwrap();
    Api::<Role>::namespaced(admin.clone(), ns).create(&PostParams::default(), &role).await.unwrap();
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "db-instance"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "db-instance"},
        "subjects": [{"kind": "ServiceAccount", "name": "db-instance", "namespace": ns}]
    }))
    .unwrap();
    Api::<RoleBinding>::namespaced(admin.clone(), ns).create(&PostParams::default(), &binding).await.unwrap();
    let admin_pods: Api<Pod> = Api::namespaced(admin.clone(), ns);
    for name in ["db-0", "db-1"] {
        admin_pods.create(&PostParams::default(), &database_pod(name)).await.unwrap();
    }

    let work = tempfile::tempdir().unwrap();
    let bound = service_account_kubeconfig_with(
        &work.path().join("bound"),
        "db-instance",
        ns,
        &["--bound-object-kind=Pod", "--bound-object-name=db-0"],
    );
    let pods: Api<Pod> = Api::namespaced(client_for(&bound).await, ns);
    let report = json!({"metadata": {"annotations": {"dbservice.dev/instance": "{\"role\":\"primary\"}"}}});
    assert_eq!(patch(&pods, "db-0", report.clone()).await, None, "its own report is allowed");
    let recovery = json!({"metadata": {"annotations": {"dbservice.dev/recovery": "{}"}}});
    assert_eq!(patch(&pods, "db-0", recovery).await, None, "its own recovery progress is allowed");

    let denied = [
        ("db-1", report.clone(), "only its own pod"),
        ("db-0", json!({"metadata": {"labels": {"dbservice.dev/role": "primary"}}}), "labels or spec"),
        ("db-0", json!({"metadata": {"annotations": {"other": "x"}}}), "only the annotations"),
    ];
    for (pod, body, message) in denied {
        let (code, text) = patch(&pods, pod, body.clone()).await.unwrap_or_else(|| panic!("{pod} {body} was allowed"));
        assert_eq!(code, 403, "{text}");
        assert!(text.contains(message), "{pod} {body}: {text}");
    }
    // A token bound to no pod changes no pod.
    let unbound = service_account_kubeconfig_with(&work.path().join("unbound"), "db-instance", ns, &[]);
    let unbound_pods: Api<Pod> = Api::namespaced(client_for(&unbound).await, ns);
    let (code, text) = patch(&unbound_pods, "db-0", report).await.expect("an unbound token is denied");
    assert_eq!(code, 403, "{text}");
    assert!(text.contains("token bound to no pod"), "{text}");
    // The operator (here: an administrator) still labels pods.
    let label = json!({"metadata": {"labels": {"dbservice.dev/role": "primary"}}});
    assert_eq!(patch(&admin_pods, "db-0", label).await, None);
}
