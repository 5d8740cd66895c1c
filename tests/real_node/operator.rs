//! The operator as users run it: its image in a Deployment installed by the chart, self-managed
//! certificates, admission through the in-cluster Service, and restarts that lose no admission.

use crate::environment::{
    admin_client, install_chart, lease_holder, operator_pods, operator_pods_lock, real_node_or_skip,
};
use crate::support::operator::{RELEASE, RELEASE_NAMESPACE};
use crate::support::{eventually, kubectl, sample_database, TestNamespace};
use dbservice_operator::api::database_service::DatabaseService;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use kube::api::{DeleteParams, PostParams};
use kube::Api;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[tokio::test]
async fn chart_installs_the_image_and_its_webhooks_answer_through_the_service() {
    let Some(node) = real_node_or_skip("chart_installs_the_image_and_its_webhooks_answer_through_the_service") else {
        return;
    };
    let took = install_chart(node);
    eprintln!(
        "[figure] chart installed with 2 operator pods Ready in {:.1} s (0 when already installed)",
        took.as_secs_f64()
    );
    let client = admin_client().await;
    let _pods_stay = operator_pods_lock().read().await;

    // Two Ready pods of the image, one Lease holder among them.
    let pods = eventually("2 operator pods running", Duration::from_secs(120), || async {
        let pods = operator_pods();
        (pods.len() == 2).then_some(pods)
    })
    .await;
    // Only the pods found above: a terminating pod of an earlier release may still run another image.
    let mut arguments = vec!["-n", RELEASE_NAMESPACE, "get", "pods"];
    arguments.extend(pods.iter().map(String::as_str));
    arguments.extend(["-o", "jsonpath={.items[*].spec.containers[0].image}"]);
    let images = kubectl(&arguments);
    assert!(images.split_whitespace().all(|image| image == node.operator_image), "pods run {images}");
    let holder = eventually("a Lease holder", Duration::from_secs(60), || async {
        let holder = lease_holder();
        pods.contains(&holder).then_some(holder)
    })
    .await;
    // The holder's metric follows its Lease within a renewal.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let metrics: Vec<_> = pods.iter().map(|pod| (pod.clone(), leader_metric(pod))).collect();
        let leaders: Vec<_> = metrics.iter().filter(|(_, metric)| *metric == Some(1.0)).map(|(pod, _)| pod).collect();
        if leaders == vec![&holder] {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "exactly the Lease holder {holder} must lead; dbservice_leader: {metrics:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // Self-managed certificates: the operator made a CA and patched the webhook configurations with it.
    let configurations: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let configuration = configurations.get(RELEASE).await.expect("the chart's validating webhook configuration");
    let webhook = &configuration.webhooks.expect("webhooks")[0];
    assert!(webhook.client_config.service.is_some(), "webhooks are called through the Service");
    assert!(webhook.client_config.ca_bundle.as_ref().is_some_and(|bundle| !bundle.0.is_empty()), "caBundle patched");

    // A bad DatabaseService is refused by the in-cluster webhook with its field errors.
    let namespace = TestNamespace::create(&client, "real-admission").await;
    let databases: Api<DatabaseService> = Api::namespaced(client.clone(), &namespace.name);
    let mut bad = sample_database("bad");
    bad.spec.version = "banana".into();
    bad.spec.storage_size = "1Mi".into();
    let error = databases.create(&PostParams::default(), &bad).await.expect_err("a bad spec is denied");
    let message = error.to_string();
    assert!(message.contains("spec.version") && message.contains("spec.storageSize"), "field errors: {message}");

    // A good one is defaulted (replicas, finalizer, image) by the mutating webhook.
    let good = eventually("the mutating webhook", Duration::from_secs(30), || async {
        databases.create(&PostParams { dry_run: true, ..Default::default() }, &sample_database("good")).await.ok()
    })
    .await;
    assert_eq!(good.spec.replicas, Some(1));
    assert!(good.metadata.finalizers.unwrap_or_default().contains(&"dbservice.dev/cleanup".to_string()));
    assert_eq!(good.spec.image.as_deref(), Some("postgres:16.4"));
}

fn leader_metric(pod: &str) -> Option<f64> {
    let metrics =
        kubectl(&["get", "--raw", &format!("/api/v1/namespaces/{RELEASE_NAMESPACE}/pods/{pod}:8080/proxy/metrics")]);
    Some(crate::support::operator::metric_sum(&metrics, "dbservice_leader", &[]))
}

#[tokio::test]
async fn operator_restarts_lose_no_admission_and_the_lease_moves() {
    let Some(node) = real_node_or_skip("operator_restarts_lose_no_admission_and_the_lease_moves") else {
        return;
    };
    install_chart(node);
    let client = admin_client().await;
    let _pods_move = operator_pods_lock().write().await;
    let namespace = TestNamespace::create(&client, "real-restarts").await;
    let databases: Api<DatabaseService> = Api::namespaced(client.clone(), &namespace.name);
    eventually("2 operator pods and a holder", Duration::from_secs(120), || async {
        (operator_pods().len() == 2 && operator_pods().contains(&lease_holder())).then_some(())
    })
    .await;

    // A client sends server-side dry-run creates the whole time and counts what fails.
    let stop = Arc::new(AtomicBool::new(false));
    let succeeded = Arc::new(AtomicUsize::new(0));
    let failures = Arc::new(Mutex::new(Vec::<String>::new()));
    let sender = {
        let (databases, stop, succeeded, failures) =
            (databases.clone(), stop.clone(), succeeded.clone(), failures.clone());
        tokio::spawn(async move {
            let dry_run = PostParams { dry_run: true, ..Default::default() };
            let mut number = 0;
            while !stop.load(Ordering::SeqCst) {
                number += 1;
                match databases.create(&dry_run, &sample_database(&format!("probe-{number}"))).await {
                    Ok(_) => succeeded.fetch_add(1, Ordering::SeqCst),
                    Err(error) => {
                        failures.lock().unwrap().push(error.to_string());
                        0
                    }
                };
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };

    // The Lease holder's pod is deleted: the other replica takes the Lease.
    let first_holder = lease_holder();
    let started = Instant::now();
    kubectl(&["-n", RELEASE_NAMESPACE, "delete", "pod", &first_holder, "--wait=false"]);
    let second_holder = eventually("the Lease to move", Duration::from_secs(60), || async {
        let holder = lease_holder();
        (holder != first_holder && operator_pods().contains(&holder)).then_some(holder)
    })
    .await;
    eprintln!(
        "[figure] Lease moved from {first_holder} to {second_holder} in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    kubectl(&["-n", RELEASE_NAMESPACE, "rollout", "status", "deployment", RELEASE, "--timeout=180s"]);

    // A rolling restart replaces both pods, one at a time.
    let before = operator_pods();
    kubectl(&["-n", RELEASE_NAMESPACE, "rollout", "restart", "deployment", RELEASE]);
    kubectl(&["-n", RELEASE_NAMESPACE, "rollout", "status", "deployment", RELEASE, "--timeout=300s"]);
    let after = eventually("2 new operator pods", Duration::from_secs(120), || async {
        let pods = operator_pods();
        (pods.len() == 2 && pods.iter().all(|pod| !before.contains(pod))).then_some(pods)
    })
    .await;
    let third_holder = eventually("a new pod holding the Lease", Duration::from_secs(60), || async {
        let holder = lease_holder();
        after.contains(&holder).then_some(holder)
    })
    .await;
    // Keep sending a little longer: the last old pod's shutdown is the riskiest moment.
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::SeqCst);
    sender.await.unwrap();
    let failures = failures.lock().unwrap().clone();
    let succeeded = succeeded.load(Ordering::SeqCst);
    eprintln!(
        "[figure] admissions during the restarts: {succeeded} succeeded, {} failed; Lease now held by {third_holder}",
        failures.len()
    );
    assert!(succeeded > 20, "the client kept sending ({succeeded})");
    assert!(failures.is_empty(), "admissions failed during the restarts: {failures:?}");

    // Reconciliation continues under the new leader: a new DatabaseService gets its children.
    databases.create(&PostParams::default(), &sample_database("after-restart")).await.unwrap();
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client.clone(), &namespace.name);
    eventually("the new leader reconciles", Duration::from_secs(60), || async {
        secrets.get_opt("after-restart-credentials").await.ok()?.map(|_| ())
    })
    .await;
    databases.delete("after-restart", &DeleteParams::default()).await.unwrap();
}
