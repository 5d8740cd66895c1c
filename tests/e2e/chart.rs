//! The Helm chart against the real apiserver: every certificate mode renders objects the
//! apiserver accepts, real installs create what they should, the ServiceAccount gets exactly
//! the rights it needs, and the operator manages its own certificates in self-managed mode.

use crate::support::operator::{
    free_port, helm, log_directory, service_account_kubeconfig_for, shared, OperatorOptions, OperatorProcess,
    RELEASE_NAMESPACE, SERVICE_ACCOUNT,
};
use crate::support::{
    client_for, cluster_or_skip, eventually, kubectl, repository, tool, TestNamespace, CHART_KUBE_VERSION,
};
use dbservice_operator::certificates::bundle_trusts;
use k8s_openapi::api::admissionregistration::v1::{MutatingWebhookConfiguration, ValidatingWebhookConfiguration};
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use std::process::{Command, Stdio};
use std::time::Duration;

/// Installs the chart as `release` beside the suite's own release: the CRD is already there, and
/// failurePolicy Ignore because its Service points at kwok pods that run nothing (other tests share the cluster).
fn install_release(release: &str, namespace: &str, settings: &[&str]) {
    let chart = repository().join("charts/dbservice-operator");
    let mut arguments = vec!["install", release, chart.to_str().unwrap(), "--namespace", namespace];
    arguments.extend(["--set", "crds.enabled=false", "--set", "webhook.failurePolicy=Ignore"]);
    arguments.extend(settings);
    arguments.extend(["--wait", "--timeout", "120s"]);
    helm(&arguments);
}

fn can_i(service_account: &str, namespace: &str, arguments: &[&str]) -> bool {
    let subject = format!("system:serviceaccount:{namespace}:{service_account}");
    let output = Command::new(tool("kubectl"))
        .args(["auth", "can-i"])
        .args(arguments)
        .args(["--as", &subject])
        .env("KUBECONFIG", crate::support::admin_kubeconfig().unwrap())
        .output()
        .unwrap();
    String::from_utf8_lossy(&output.stdout).trim() == "yes"
}

#[tokio::test]
async fn the_chart_service_account_has_exactly_the_rights_it_needs() {
    let Some(_) = cluster_or_skip("the_chart_service_account_has_exactly_the_rights_it_needs") else { return };
    shared();
    let allowed: &[&[&str]] = &[
        &["watch", "databaseservices.dbservice.dev", "--all-namespaces"],
        &["patch", "databaseservices.dbservice.dev/status", "-n", "default"],
        &["update", "databaseservices.dbservice.dev/finalizers", "-n", "default"],
        &["create", "statefulsets.apps", "-n", "default"],
        &["patch", "services", "-n", "default"],
        &["create", "secrets", "-n", "default"],
        &["delete", "persistentvolumeclaims", "-n", "default"],
        &["delete", "pods", "-n", "default"],
        &["create", "events.events.k8s.io", "-n", "default"],
        &["get", "storageclasses.storage.k8s.io"],
        &["update", "leases.coordination.k8s.io/dbservice-operator-leader", "-n", RELEASE_NAMESPACE],
        &["create", "leases.coordination.k8s.io", "-n", RELEASE_NAMESPACE],
        // Failover: each database's agents get an account, a Role and its primary Lease; the
        // operator holds what it grants (get/update on that Lease) and releases a gone pod's Lease.
        &["create", "serviceaccounts", "-n", "default"],
        &["create", "roles.rbac.authorization.k8s.io", "-n", "default"],
        &["create", "rolebindings.rbac.authorization.k8s.io", "-n", "default"],
        &["update", "leases.coordination.k8s.io/db-primary", "-n", "default"],
        // The primary Leases are watched: a lapsed one (its holder fenced itself) starts a failover.
        &["watch", "leases.coordination.k8s.io", "-n", "default"],
        // The pooler (spec.pooler): its Deployment applied, and removed with spec.pooler.
        &["patch", "deployments.apps", "-n", "default"],
        &["delete", "deployments.apps", "-n", "default"],
    ];
    for arguments in allowed {
        assert!(
            can_i(SERVICE_ACCOUNT, RELEASE_NAMESPACE, arguments),
            "the operator needs: kubectl auth can-i {}",
            arguments.join(" ")
        );
    }
    let denied: &[&[&str]] = &[
        &["*", "*"],
        &["create", "pods/exec", "-n", "default"],
        &["delete", "nodes"],
        &["create", "clusterroles.rbac.authorization.k8s.io"],
        &["delete", "customresourcedefinitions.apiextensions.k8s.io"],
        &["create", "databaseservices.dbservice.dev", "-n", "default"],
        // Per-database primary Leases need get/update/watch wherever databases live; never
        // delete, and no role can be bound or escalated beyond what the operator holds.
        &["delete", "leases.coordination.k8s.io", "-n", "kube-system"],
        &["bind", "roles.rbac.authorization.k8s.io", "-n", "default"],
        &["escalate", "roles.rbac.authorization.k8s.io", "-n", "default"],
        &["delete", "roles.rbac.authorization.k8s.io", "-n", "default"],
        &["patch", "validatingwebhookconfigurations.admissionregistration.k8s.io"],
    ];
    for arguments in denied {
        assert!(
            !can_i(SERVICE_ACCOUNT, RELEASE_NAMESPACE, arguments),
            "excessive right: kubectl auth can-i {}",
            arguments.join(" ")
        );
    }
}

#[tokio::test]
async fn the_url_mode_release_created_its_objects() {
    let Some(kubeconfig) = cluster_or_skip("the_url_mode_release_created_its_objects") else { return };
    shared();
    let client = client_for(&kubeconfig).await;
    let manifest = helm(&["get", "manifest", "dbservice-operator", "-n", RELEASE_NAMESPACE]);
    for kind in [
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "ValidatingWebhookConfiguration",
        "MutatingWebhookConfiguration",
        "CustomResourceDefinition",
    ] {
        assert!(manifest.contains(&format!("kind: {kind}")), "release lacks a {kind}");
    }
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let configuration = validating.get("dbservice-operator").await.unwrap();
    let webhook = &configuration.webhooks.unwrap()[0];
    assert_eq!(webhook.failure_policy.as_deref(), Some("Fail"));
    assert_eq!(webhook.side_effects, "None");
    assert_eq!(webhook.timeout_seconds, Some(5));
    assert!(webhook.client_config.url.as_deref().unwrap().ends_with("/validate"));
    let rule = &webhook.rules.as_ref().unwrap()[0];
    assert_eq!(rule.resources.as_deref(), Some(&["databaseservices".to_string()][..]));
    let mut operations = rule.operations.clone().unwrap();
    operations.sort();
    assert_eq!(operations, vec!["CREATE".to_string(), "UPDATE".to_string()]);
}

#[tokio::test]
async fn every_certificate_mode_renders_objects_the_apiserver_accepts() {
    let Some(kubeconfig) = cluster_or_skip("every_certificate_mode_renders_objects_the_apiserver_accepts") else {
        return;
    };
    shared();
    let chart = repository().join("charts/dbservice-operator");
    for mode in ["self-managed", "secret", "cert-manager", "url"] {
        let values = chart.join(format!("ci/{mode}-values.yaml"));
        let rendered = helm(&[
            "template",
            "--kube-version",
            CHART_KUBE_VERSION,
            "dryrun",
            chart.to_str().unwrap(),
            "--namespace",
            "dryrun-system",
            "-f",
            values.to_str().unwrap(),
        ]);
        // cert-manager's and the Prometheus operator's kinds need their CRDs, which this cluster does not have.
        let documents: Vec<&str> = rendered
            .split("\n---")
            .filter(|document| {
                !document.contains("apiVersion: cert-manager.io/")
                    && !document.contains("apiVersion: monitoring.coreos.com/")
                    && document.contains("kind:")
            })
            .collect();
        let manifest = documents.join("\n---\n");
        let mut child = Command::new(tool("kubectl"))
            .args([
                "apply",
                "--dry-run=server",
                "--server-side",
                "--field-manager=dryrun",
                "--force-conflicts",
                "-n",
                "dryrun-system",
                "-f",
                "-",
            ])
            .env("KUBECONFIG", &kubeconfig)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        child.stdin.take().unwrap().write_all(manifest.as_bytes()).unwrap();
        let output = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        // The namespace itself does not exist; everything else must be accepted.
        let real_errors: Vec<&str> = stderr
            .lines()
            .filter(|line| !line.contains("namespaces \"dryrun-system\" not found") && !line.trim().is_empty())
            .collect();
        assert!(
            real_errors.is_empty(),
            "mode {mode}: the apiserver rejected rendered objects:\n{}",
            real_errors.join("\n")
        );
    }
}

#[tokio::test]
async fn self_managed_and_secret_installs_work_and_the_operator_keeps_its_ca_bundle() {
    let Some(kubeconfig) =
        cluster_or_skip("self_managed_and_secret_installs_work_and_the_operator_keeps_its_ca_bundle")
    else {
        return;
    };
    let environment = shared();
    let client = client_for(&kubeconfig).await;
    let namespace = TestNamespace::create(&client, "chart").await;
    let ns = namespace.name.clone();
    let release = "selfmanaged-dbservice-operator";
    install_release(release, &ns, &["--set", "certificates.mode=self-managed"]);
    let installed = kubectl(&[
        "get",
        "deployment,service,serviceaccount,poddisruptionbudget,role,rolebinding",
        "-n",
        &ns,
        "-o",
        "name",
    ]);
    for object in [
        format!("deployment.apps/{release}"),
        format!("service/{release}-webhook"),
        format!("serviceaccount/{release}"),
        format!("poddisruptionbudget.policy/{release}"),
    ] {
        assert!(installed.contains(&object), "missing {object} in:\n{installed}");
    }
    let ready = kubectl(&["get", "deployment", release, "-n", &ns, "-o", "jsonpath={.status.readyReplicas}"]);
    assert_eq!(ready.trim(), "2", "both operator pods run (kwok)");
    assert!(can_i(
        release,
        &ns,
        &["patch", &format!("validatingwebhookconfigurations.admissionregistration.k8s.io/{release}")]
    ));
    assert!(!can_i(
        release,
        &ns,
        &["patch", "validatingwebhookconfigurations.admissionregistration.k8s.io/dbservice-operator"]
    ));

    // The operator, with this release's ServiceAccount, creates the Secret and patches the caBundle.
    let work = log_directory().join(format!("chart-{}", std::process::id()));
    let token = service_account_kubeconfig_for(&work, release, &ns);
    let tls = work.join("tls");
    let options = OperatorOptions {
        identity: format!("chart-{}", std::process::id()),
        lease_namespace: ns.clone(),
        lease_duration_seconds: 15,
        watch_namespace: ns.clone(),
        selector: "dbservice.dev/e2e-isolated=nothing".into(),
        lease_name: format!("{release}-leader"),
        extra_arguments: [
            "--manage-certificates",
            "--certificate-check-seconds",
            "1",
            "--certificate-secret",
            &format!("{release}-webhook-tls"),
            "--webhook-service",
            &format!("{release}-webhook"),
            "--validating-webhook-configuration",
            release,
            "--mutating-webhook-configuration",
            release,
        ]
        .iter()
        .map(|argument| argument.to_string())
        .collect(),
    };
    let _ = environment;
    std::fs::create_dir_all(&tls).unwrap();
    let operator = OperatorProcess::start_with_certificate_paths(&options, &token, &tls, free_port());
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let secret = eventually("the certificate Secret", Duration::from_secs(30), || async {
        secrets.get_opt(&format!("{release}-webhook-tls")).await.ok()?
    })
    .await;
    let data = secret.data.unwrap();
    let ca = data["ca.crt"].0.clone();
    let served = std::fs::read(tls.join("tls.crt")).unwrap();
    assert!(bundle_trusts(&ca, &served), "the served certificate is signed by the managed CA");
    assert_eq!(served, data["tls.crt"].0, "the served certificate is the one in the Secret");
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let bundle_of_validating =
        || async { validating.get(release).await.ok()?.webhooks?.first()?.client_config.ca_bundle.clone() };
    let bundle = eventually("the validating caBundle patched", Duration::from_secs(30), || async {
        bundle_of_validating().await
    })
    .await;
    assert!(
        bundle_trusts(&bundle.0, &served) && !bundle.0.windows(served.len()).any(|window| window == served),
        "caBundle holds the CA, not the leaf"
    );
    eventually("the mutating caBundle patched", Duration::from_secs(30), || async {
        let bundle = mutating.get(release).await.ok()?.webhooks?.first()?.client_config.ca_bundle.clone()?;
        bundle_trusts(&bundle.0, &served).then_some(())
    })
    .await;
    // Someone breaks the caBundle: the timer notices and repairs it.
    let broken = serde_json::json!([{"op": "replace", "path": "/webhooks/0/clientConfig/caBundle", "value": "Cg=="}]);
    let patch: json_patch::Patch = serde_json::from_value(broken).unwrap();
    validating.patch(release, &kube::api::PatchParams::default(), &kube::api::Patch::Json::<()>(patch)).await.unwrap();
    eventually("the broken caBundle repaired", Duration::from_secs(30), || async {
        let bundle = bundle_of_validating().await?;
        bundle_trusts(&bundle.0, &served).then_some(())
    })
    .await;
    let metrics = operator.metrics().unwrap();
    assert!(
        crate::support::operator::metric_sum(&metrics, "dbservice_certificate_expiry_seconds", &[]) > 86400.0 * 300.0,
        "expiry metric:\n{metrics}"
    );
    drop(operator);
    helm(&["uninstall", release, "--namespace", &ns, "--wait"]);

    // User-provided Secret mode: the given caBundle lands in the webhook configurations.
    let release = "usersecret-dbservice-operator";
    let bundle =
        dbservice_operator::certificates::generate_bundle(&[format!("{release}-webhook.{ns}.svc")], &[]).unwrap();
    let directory = work.join("user-certs");
    dbservice_operator::certificates::write_bundle(&bundle, &directory).unwrap();
    kubectl(&[
        "create",
        "secret",
        "tls",
        "user-webhook-tls",
        "-n",
        &ns,
        "--cert",
        directory.join("tls.crt").to_str().unwrap(),
        "--key",
        directory.join("tls.key").to_str().unwrap(),
    ]);
    use base64::Engine;
    let ca_bundle = base64::engine::general_purpose::STANDARD.encode(&bundle.ca_certificate);
    install_release(
        release,
        &ns,
        &[
            "--set",
            "certificates.mode=secret",
            "--set",
            "certificates.secret.name=user-webhook-tls",
            "--set",
            &format!("certificates.secret.caBundle={ca_bundle}"),
        ],
    );
    let configured =
        validating.get(release).await.unwrap().webhooks.unwrap()[0].client_config.ca_bundle.clone().unwrap();
    assert_eq!(configured.0, bundle.ca_certificate.as_bytes());
    let mounted = kubectl(&[
        "get",
        "deployment",
        release,
        "-n",
        &ns,
        "-o",
        "jsonpath={.spec.template.spec.volumes[*].secret.secretName}",
    ]);
    assert!(mounted.contains("user-webhook-tls"), "the user's Secret is mounted: {mounted}");
    helm(&["uninstall", release, "--namespace", &ns, "--wait"]);
}

/// Issue 26: the chart's CRDs are accepted by the real apiserver without a warning (schemars'
/// unsigned formats used to print `Warning: unrecognized format "uint32"` on every apply).
#[tokio::test]
async fn the_chart_crds_apply_without_warnings() {
    let Some(_) = cluster_or_skip("the_chart_crds_apply_without_warnings") else { return };
    shared();
    let chart = repository().join("charts/dbservice-operator");
    let rendered = helm(&[
        "template",
        "--kube-version",
        CHART_KUBE_VERSION,
        "dbservice-operator",
        chart.to_str().unwrap(),
        "--namespace",
        RELEASE_NAMESPACE,
        "--show-only",
        "templates/crd.yaml",
        "--show-only",
        "templates/backup-crd.yaml",
    ]);
    assert_eq!(rendered.matches("kind: CustomResourceDefinition").count(), 2, "both CRDs rendered:\n{rendered}");
    // A server-side dry run goes through the CRD strategy that warns (create and update alike)
    // without touching what the suite installed.
    let dry_run = "--dry-run=server";
    let mut child = Command::new(tool("kubectl"))
        .args([
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager",
            "e2e-crd-warnings",
            dry_run,
            "-f",
            "-",
        ])
        .env("KUBECONFIG", crate::support::admin_kubeconfig().unwrap())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(rendered.as_bytes()).unwrap();
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "kubectl apply {dry_run} failed: {stderr}");
    assert!(!stderr.to_lowercase().contains("warning"), "kubectl apply {dry_run} printed warnings: {stderr}");
    assert_eq!(String::from_utf8_lossy(&output.stdout).matches("serverside-applied").count(), 2);
}
