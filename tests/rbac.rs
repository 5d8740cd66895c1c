//! The chart grants the controller exactly what it uses: every kind of `CHILD_KINDS` (the list that
//! also wires the controller's watches) with its verbs, cluster-wide by default and only in the
//! watched namespace when operator.watchNamespace is set.

use dbservice_operator::operator::caches::CHILD_KINDS;
use std::path::{Path, PathBuf};
use std::process::Command;

fn helm() -> Option<PathBuf> {
    let repository = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cache =
        std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache/dbservice-operator/helm-v3.22.0/helm"));
    let candidates = [std::env::var_os("HELM").map(PathBuf::from), Some(repository.join(".cluster/bin/helm")), cache];
    candidates.into_iter().flatten().find(|path| path.exists())
}

/// The helm binary, or None (a skip) outside CI; under CI=true a missing helm fails the test.
fn helm_or_skip() -> Option<PathBuf> {
    let helm = helm();
    if helm.is_none() {
        assert_ne!(
            std::env::var("CI").as_deref(),
            Ok("true"),
            "no helm (make cluster-build); CI=true forbids skipping"
        );
        eprintln!("skipping: no helm (run make cluster-build or set HELM)");
    }
    helm
}

fn render(helm: &Path, extra: &[&str]) -> Vec<serde_json::Value> {
    let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("charts/dbservice-operator");
    let output = Command::new(helm)
        // helm template assumes Kubernetes 1.20 unless told; the chart's kubeVersion needs 1.30 or later.
        .args(["template", "--kube-version", "v1.37.0", "dbservice-operator", chart.to_str().unwrap()])
        .args(["--namespace", "dbservice-system"])
        .args(extra)
        .output()
        .expect("helm runs");
    assert!(output.status.success(), "helm template failed: {}", String::from_utf8_lossy(&output.stderr));
    let text = String::from_utf8(output.stdout).unwrap();
    serde_saphyr::from_multiple::<serde_json::Value>(&text)
        .expect("helm renders YAML")
        .into_iter()
        .filter(|value| !value.is_null())
        .collect()
}

fn strings(value: &serde_json::Value) -> Vec<String> {
    value
        .as_array()
        .map(|items| items.iter().filter_map(|item| item.as_str().map(String::from)).collect())
        .unwrap_or_default()
}

/// Asserts that the rules of the `kind` object named `name` grant every child kind its verbs.
fn assert_grants_children(documents: &[serde_json::Value], kind: &str, name: &str, namespace: Option<&str>) {
    let role = documents
        .iter()
        .find(|document| document["kind"].as_str() == Some(kind) && document["metadata"]["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("no {kind} {name}"));
    assert_eq!(role["metadata"]["namespace"].as_str(), namespace, "{kind} {name}");
    let rules = role["rules"].as_array().expect("rules");
    for child in CHILD_KINDS {
        let granted: Vec<String> = rules
            .iter()
            .filter(|rule| strings(&rule["apiGroups"]).contains(&child.api_group().to_string()))
            .filter(|rule| strings(&rule["resources"]).contains(&child.resource().to_string()))
            .filter(|rule| rule["resourceNames"].is_null())
            .flat_map(|rule| strings(&rule["verbs"]))
            .collect();
        for verb in child.verbs() {
            assert!(granted.contains(&verb.to_string()), "{kind} {name} lacks {verb} on {}", child.resource());
        }
    }
}

#[test]
fn the_chart_grants_every_child_kind_its_verbs_cluster_wide_or_in_the_watched_namespace() {
    let Some(helm) = helm_or_skip() else { return };
    let cluster_wide = render(&helm, &[]);
    assert_grants_children(&cluster_wide, "ClusterRole", "dbservice-operator", None);

    let namespaced = render(&helm, &["--set", "operator.watchNamespace=team-a"]);
    assert_grants_children(&namespaced, "Role", "dbservice-operator-controller", Some("team-a"));
    let cluster_role = namespaced.iter().find(|document| document["kind"].as_str() == Some("ClusterRole")).unwrap();
    for rule in cluster_role["rules"].as_array().unwrap() {
        let resources = strings(&rule["resources"]);
        assert!(
            !resources.iter().any(|resource| CHILD_KINDS.iter().any(|child| child.resource() == resource)),
            "namespaced mode must not grant {resources:?} cluster-wide"
        );
    }
}

/// The backup controller's permissions ([`PERMISSIONS`]) are granted cluster-wide, or only in
/// the watched namespace.
#[test]
fn the_chart_grants_the_backup_controller_its_permissions() {
    use dbservice_operator::operator::backup::PERMISSIONS;
    let Some(helm) = helm_or_skip() else { return };
    let check = |documents: &[serde_json::Value], kind: &str, name: &str| {
        let role = documents
            .iter()
            .find(|document| {
                document["kind"].as_str() == Some(kind) && document["metadata"]["name"].as_str() == Some(name)
            })
            .unwrap_or_else(|| panic!("no {kind} {name}"));
        let rules = role["rules"].as_array().expect("rules");
        for (group, resource, verbs) in PERMISSIONS {
            let granted: Vec<String> = rules
                .iter()
                .filter(|rule| strings(&rule["apiGroups"]).contains(&group.to_string()))
                .filter(|rule| strings(&rule["resources"]).contains(&resource.to_string()))
                .filter(|rule| rule["resourceNames"].is_null())
                .flat_map(|rule| strings(&rule["verbs"]))
                .collect();
            for verb in *verbs {
                assert!(granted.contains(&verb.to_string()), "{kind} {name} lacks {verb} on {group}/{resource}");
            }
        }
    };
    check(&render(&helm, &[]), "ClusterRole", "dbservice-operator");
    check(&render(&helm, &["--set", "operator.watchNamespace=team-a"]), "Role", "dbservice-operator-controller");
}
