//! The real node itself: pods start, and its safety properties hold (no way out of the machine, names
//! only from our CoreDNS, no anonymous kubelet API).

use crate::environment::{admin_client, real_namespace, real_node_or_skip};
use crate::support::{eventually, kubectl};
use k8s_openapi::api::core::v1::Pod;
use kube::api::PostParams;
use kube::Api;
use std::time::{Duration, Instant};

/// Creates a pod running `script` in busybox and returns its log once it finished successfully.
async fn run_busybox(pods: &Api<Pod>, namespace: &str, image: &str, name: &str, script: &str) -> String {
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "check", "image": image, "command": ["sh", "-c", script]}],
        }
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let phase = eventually(&format!("pod {name} to finish"), Duration::from_secs(60), || async {
        let phase = pods.get_opt(name).await.ok().flatten()?.status?.phase?;
        matches!(phase.as_str(), "Succeeded" | "Failed").then_some(phase)
    })
    .await;
    let log = kubectl(&["-n", namespace, "logs", name]);
    assert_eq!(phase, "Succeeded", "pod {name} failed:\n{log}");
    log
}

#[tokio::test]
async fn pods_start_and_cannot_reach_anything_outside_the_machine() {
    let Some(node) = real_node_or_skip("pods_start_and_cannot_reach_anything_outside_the_machine") else {
        return;
    };
    let client = admin_client().await;
    let namespace = real_namespace(&client, "node").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace.name);

    // Pod start time: create -> Ready, image present.
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "sleeper"},
        "spec": {"containers": [{"name": "sleep", "image": node.busybox_image, "command": ["sleep", "600"]}]}
    }))
    .unwrap();
    let created = Instant::now();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let scheduled_to = eventually("the pod Ready", Duration::from_secs(60), || async {
        let pod = pods.get_opt("sleeper").await.ok().flatten()?;
        let ready = pod.status.as_ref()?.conditions.as_ref()?.iter().any(|c| c.type_ == "Ready" && c.status == "True");
        ready.then(|| pod.spec.and_then(|spec| spec.node_name).unwrap_or_default())
    })
    .await;
    eprintln!("[figure] pod create -> Ready on the real node in {:.2} s", created.elapsed().as_secs_f64());
    assert_eq!(scheduled_to, "real-0", "the namespace annotations send pods to the real node");

    // No default route: only the Service CIDR is routed. Our DNS answers cluster names only, and
    // nothing outside the machine is reachable.
    let log = run_busybox(
        &pods,
        &namespace.name,
        &node.busybox_image,
        "network",
        "ip route; echo ---; nslookup kubernetes.default.svc.cluster.local && echo CLUSTER-NAME-OK; \
         nslookup deb.debian.org >/dev/null 2>&1 && echo EXTERNAL-NAME-RESOLVED; \
         wget -q -T 3 -O /dev/null http://192.0.2.1/ 2>&1 || echo OUTSIDE-UNREACHABLE; cat /etc/resolv.conf",
    )
    .await;
    let routes = log.split("---").next().unwrap();
    assert!(!routes.contains("default"), "pods must have no default route:\n{routes}");
    assert!(routes.contains("10.96.0.0/16"), "the Service CIDR is routed:\n{routes}");
    assert!(log.contains("CLUSTER-NAME-OK"), "cluster names resolve:\n{log}");
    assert!(!log.contains("EXTERNAL-NAME-RESOLVED"), "names outside the cluster must not resolve:\n{log}");
    assert!(log.contains("OUTSIDE-UNREACHABLE"), "addresses outside the machine must be unreachable:\n{log}");
    assert!(log.contains("nameserver 10.85.0.1") && !log.contains("10.255.255.53"), "only our CoreDNS:\n{log}");

    // The kubelet API refuses anonymous clients; the apiserver (with its client certificate) gets through.
    let anonymous = std::process::Command::new("curl")
        .args(["-sk", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "5"])
        .arg(format!("https://{}:10250/pods", node.address))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&anonymous.stdout), "401", "anonymous kubelet API access must be refused");
    let logs = kubectl(&["-n", &namespace.name, "logs", "network"]);
    assert!(logs.contains("CLUSTER-NAME-OK"), "kubectl logs works through the apiserver's certificate");
}
