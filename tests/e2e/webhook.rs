//! The real kube-apiserver calls our webhooks through the chart's configurations (URL mode).

use crate::support::{
    client_for, cluster_or_skip, database_from_yaml, operator::shared, sample_database, TestNamespace,
};
use dbservice_operator::api::database_service::{DatabaseService, DeletionPolicy, FINALIZER};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Patch, PatchParams, PostParams};
use kube::Api;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::AsyncReadExt;

fn rejection_message(error: kube::Error) -> String {
    match error {
        kube::Error::Api(status) => status.message,
        other => panic!("expected an API rejection, got {other}"),
    }
}

#[tokio::test]
async fn bad_objects_are_rejected_with_every_field_error() {
    let Some(kubeconfig) = cluster_or_skip("bad_objects_are_rejected_with_every_field_error") else { return };
    shared();
    let client = client_for(&kubeconfig).await;
    let namespace = TestNamespace::create(&client, "reject").await;
    let api: Api<DatabaseService> = Api::namespaced(client.clone(), &namespace.name);
    let bad = database_from_yaml(
        "apiVersion: dbservice.dev/v1\nkind: DatabaseService\nmetadata:\n  name: bad\nspec:\n  version: latest\n  storageSize: 100Mi\n  databaseName: app\n  username: postgres\n  image: postgres:latest\n",
    );
    let message = rejection_message(api.create(&PostParams::default(), &bad).await.unwrap_err());
    assert!(message.contains("admission webhook"), "not rejected by our webhook: {message}");
    for expected in [
        r#"spec.version: Invalid value: "latest": must match ^\d+(\.\d+){0,2}$"#,
        r#"spec.storageSize: Invalid value: "100Mi": must be at least 1Gi"#,
        r#"spec.username: Forbidden: "postgres" is reserved"#,
        r#"spec.image: Invalid value: "postgres:latest""#,
    ] {
        assert!(message.contains(expected), "missing {expected:?} in {message}");
    }
    assert!(api.get_opt("bad").await.unwrap().is_none(), "a rejected object must not be stored");

    let bad_import = database_from_yaml(
        "apiVersion: dbservice.dev/v1\nkind: DatabaseService\nmetadata:\n  name: bad-import\nspec:\n  version: \"16\"\n  \
         storageSize: 1Gi\n  databaseName: app\n  username: app_user\n  bootstrap:\n    import:\n      source: \
         {host: \"http://legacy\", sslMode: strict, username: app, passwordSecret: {name: legacy, key: password}}\n      \
         databases: [app, template1]\n",
    );
    let message = rejection_message(api.create(&PostParams::default(), &bad_import).await.unwrap_err());
    for expected in [
        r#"spec.bootstrap.import.source.host: Invalid value: "http://legacy""#,
        r#"spec.bootstrap.import.source.sslMode: Unsupported value: "strict""#,
        r#"spec.bootstrap.import.databases[1]: Forbidden: "template1" belongs to PostgreSQL"#,
    ] {
        assert!(message.contains(expected), "missing {expected:?} in {message}");
    }
}

#[tokio::test]
async fn updates_that_shrink_storage_change_major_or_identity_are_rejected() {
    let Some(kubeconfig) = cluster_or_skip("updates_that_shrink_storage_change_major_or_identity_are_rejected") else {
        return;
    };
    shared();
    let client = client_for(&kubeconfig).await;
    let namespace = TestNamespace::create(&client, "update").await;
    let api: Api<DatabaseService> = Api::namespaced(client.clone(), &namespace.name);
    let mut database = sample_database("grow");
    database.spec.storage_size = "2Gi".into();
    api.create(&PostParams::default(), &database).await.unwrap();
    let patch = serde_json::json!({"spec": {"storageSize": "1Gi", "version": "15.2", "username": "someone_else"}});
    let message =
        rejection_message(api.patch("grow", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap_err());
    assert!(message.contains("spec.storageSize") && message.contains("never shrink"), "{message}");
    assert!(message.contains("a major version never goes down"), "{message}");
    assert!(message.contains("spec.username") && message.contains("immutable"), "{message}");
    // Growing storage and a minor version change are fine.
    let patch = serde_json::json!({"spec": {"storageSize": "3Gi", "version": "16.5"}});
    let updated = api.patch("grow", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    assert_eq!(updated.spec.storage_size, "3Gi");
    // The default image follows the version (it was filled by the mutating webhook).
    assert_eq!(updated.spec.image.as_deref(), Some("postgres:16.5"));
}

#[tokio::test]
async fn created_objects_get_defaults_and_the_finalizer() {
    let Some(kubeconfig) = cluster_or_skip("created_objects_get_defaults_and_the_finalizer") else { return };
    shared();
    let client = client_for(&kubeconfig).await;
    let namespace = TestNamespace::create(&client, "defaults").await;
    let api: Api<DatabaseService> = Api::namespaced(client.clone(), &namespace.name);
    let created = api.create(&PostParams::default(), &sample_database("defaulted")).await.unwrap();
    assert_eq!(created.spec.replicas, Some(1));
    assert_eq!(created.spec.deletion_policy, Some(DeletionPolicy::Retain));
    assert_eq!(created.spec.image.as_deref(), Some("postgres:16.4"));
    assert!(created.metadata.finalizers.unwrap_or_default().contains(&FINALIZER.to_string()));
}

#[tokio::test]
async fn a_dry_run_create_returns_the_defaulted_object_without_storing_it() {
    let Some(kubeconfig) = cluster_or_skip("a_dry_run_create_returns_the_defaulted_object_without_storing_it") else {
        return;
    };
    shared();
    let client = client_for(&kubeconfig).await;
    let namespace = TestNamespace::create(&client, "dryrun").await;
    let api: Api<DatabaseService> = Api::namespaced(client.clone(), &namespace.name);
    let parameters = PostParams { dry_run: true, ..Default::default() };
    let returned = api.create(&parameters, &sample_database("dry")).await.unwrap();
    assert_eq!(returned.spec.replicas, Some(1));
    assert_eq!(returned.spec.image.as_deref(), Some("postgres:16.4"));
    assert!(returned.metadata.finalizers.unwrap_or_default().contains(&FINALIZER.to_string()));
    assert!(api.get_opt("dry").await.unwrap().is_none(), "a dry run must not store the object");
    // And a dry run of a bad object is denied like a real one.
    let mut bad = sample_database("dry-bad");
    bad.spec.version = "v16".into();
    let message = rejection_message(api.create(&parameters, &bad).await.unwrap_err());
    assert!(message.contains(r#"spec.version: Invalid value: "v16""#), "{message}");
}

#[tokio::test]
async fn backup_settings_and_recovery_targets_are_checked_on_admission() {
    let Some(kubeconfig) = cluster_or_skip("backup_settings_and_recovery_targets_are_checked_on_admission") else {
        return;
    };
    shared();
    let client = client_for(&kubeconfig).await;
    let namespace = TestNamespace::create(&client, "backup-admission").await;
    let api: Api<DatabaseService> = Api::namespaced(client.clone(), &namespace.name);
    let store = "{endpoint: \"http://10.85.0.1:9000\", bucket: backups, path: prod, serverName: orders, credentialsSecret: {name: s3}}";
    let object = |name: &str, schedule: &str, target: &str| {
        database_from_yaml(&format!(
            "apiVersion: dbservice.dev/v1\nkind: DatabaseService\nmetadata:\n  name: {name}\nspec:\n  version: \"16\"\n  \
             storageSize: 1Gi\n  databaseName: app\n  username: app_user\n  backup:\n    objectStore: {{endpoint: \
             \"http://10.85.0.1:9000\", bucket: backups, path: restored, credentialsSecret: {{name: s3}}}}\n    \
             schedule: \"{schedule}\"\n    retentionPolicy: 30d\n  bootstrap:\n    recovery:\n      source: {store}\n      \
             target: {target}\n"
        ))
    };
    let bad = object("bad-backup", "0 0 1 * * *", "{name: before-migration}");
    let message = rejection_message(api.create(&PostParams::default(), &bad).await.unwrap_err());
    assert!(message.contains("admission webhook"), "not rejected by our webhook: {message}");
    for expected in [
        r#"spec.backup.schedule: Invalid value: "0 0 1 * * *": schedule "0 0 1 * * *" must have 5 fields"#,
        "spec.bootstrap.recovery.target.name: Invalid value: \"\": needs spec.bootstrap.recovery.backupId",
    ] {
        assert!(message.contains(expected), "missing {expected:?} in {message}");
    }
    assert!(api.get_opt("bad-backup").await.unwrap().is_none(), "a rejected object must not be stored");

    let good = object("restored", "0 1 * * *", "{time: \"2026-12-01T00:30:00Z\"}");
    let stored = api.create(&PostParams::default(), &good).await.unwrap();
    let recovery = stored.spec.bootstrap.and_then(|bootstrap| bootstrap.recovery).expect("recovery stored");
    assert_eq!(recovery.target.and_then(|target| target.time).as_deref(), Some("2026-12-01T00:30:00Z"));
    // The recovery source and target describe how the database was born: immutable (CRD rule).
    let patch = serde_json::json!({"spec": {"bootstrap": {"recovery": {"target": {"time": "2026-12-01T00:40:00Z"}}}}});
    let message =
        rejection_message(api.patch("restored", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap_err());
    assert!(message.contains("spec.bootstrap") && message.contains("immutable"), "{message}");
}

/// A user who may create DatabaseServices but not read Secrets must not make the operator read one
/// and send a request signed with it to an endpoint of their choice: the webhook asks the
/// apiserver (SubjectAccessReview with the request's user) before it reads any Secret, and denies.
#[tokio::test]
async fn a_secret_the_author_cannot_read_is_denied_and_only_the_controller_contacts_a_store() {
    let Some(kubeconfig) =
        cluster_or_skip("a_secret_the_author_cannot_read_is_denied_and_only_the_controller_contacts_a_store")
    else {
        return;
    };
    shared();
    let admin = client_for(&kubeconfig).await;
    let namespace = TestNamespace::create(&admin, "secret-access").await;
    let ns = namespace.name.as_str();
    let access_key_id = "AKIAEXFILTRATIONTEST";
    let secret = Secret {
        metadata: ObjectMeta { name: Some("s3".into()), ..Default::default() },
        string_data: Some(
            [("accessKeyId".to_string(), access_key_id.to_string()), ("secretAccessKey".to_string(), "x".repeat(40))]
                .into(),
        ),
        ..Default::default()
    };
    Api::<Secret>::namespaced(admin.clone(), ns).create(&PostParams::default(), &secret).await.unwrap();
    let author = "author@example.com";
    let role: Role = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "databaseservice-author"},
        "rules": [{"apiGroups": ["dbservice.dev"], "resources": ["databaseservices"], "verbs": ["create", "get", "list"]}]
    }))
    .unwrap();
    Api::<Role>::namespaced(admin.clone(), ns).create(&PostParams::default(), &role).await.unwrap();
    let binding: RoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "databaseservice-author"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "databaseservice-author"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": author}]
    }))
    .unwrap();
    Api::<RoleBinding>::namespaced(admin.clone(), ns).create(&PostParams::default(), &binding).await.unwrap();

    // The endpoint the author names: it records every request and whether it carried the key.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let requests = Arc::new(Mutex::new(Vec::<String>::new()));
    let recorded = requests.clone();
    let listening = tokio::spawn(async move {
        while let Ok((mut connection, _)) = listener.accept().await {
            let mut buffer = vec![0; 16 * 1024];
            let read = tokio::time::timeout(Duration::from_secs(5), connection.read(&mut buffer)).await;
            let text = match read {
                Ok(Ok(length)) => String::from_utf8_lossy(&buffer[..length]).into_owned(),
                _ => String::new(),
            };
            recorded.lock().unwrap().push(text);
        }
    });

    let object = |name: &str| {
        database_from_yaml(&format!(
            "apiVersion: dbservice.dev/v1\nkind: DatabaseService\nmetadata:\n  name: {name}\nspec:\n  version: \"16\"\n  \
             storageSize: 1Gi\n  databaseName: app\n  username: app_user\n  bootstrap:\n    recovery:\n      source: \
             {{endpoint: \"{endpoint}\", bucket: backups, serverName: orders, credentialsSecret: {{name: s3}}}}\n"
        ))
    };
    let options = kube::config::KubeConfigOptions::default();
    let kubeconfig_file = kube::config::Kubeconfig::read_from(&kubeconfig).unwrap();
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig_file, &options).await.unwrap();
    config.auth_info.impersonate = Some(author.into());
    config.auth_info.impersonate_groups = Some(vec!["system:authenticated".into()]);
    let as_author = kube::Client::try_from(config).unwrap();
    let authors: Api<DatabaseService> = Api::namespaced(as_author, ns);
    // The RBAC authorizer sees a new binding a moment after it was created (its informer): until
    // then the author is refused by RBAC, before admission.
    crate::support::eventually("the author's Role binding in effect", Duration::from_secs(30), || async {
        authors.list(&Default::default()).await.ok().map(|_| ())
    })
    .await;
    let message = rejection_message(authors.create(&PostParams::default(), &object("stolen")).await.unwrap_err());
    assert!(message.contains("admission webhook"), "not rejected by our webhook: {message}");
    assert!(
        message.contains(&format!(
            "spec.bootstrap.recovery.source.credentialsSecret.name: Forbidden: User \"{author}\" may not read Secret \"s3\""
        )),
        "{message}"
    );
    // The review answered synchronously: any request to the endpoint was made before it.
    assert!(requests.lock().unwrap().is_empty(), "the store was contacted: {:?}", requests.lock().unwrap());

    // A server certificate Secret is mounted by the pods (whose image the author chooses): the
    // same rule applies to it.
    let mounting = database_from_yaml(
        "apiVersion: dbservice.dev/v1\nkind: DatabaseService\nmetadata:\n  name: mounting\nspec:\n  version: \"16\"\n  \
         storageSize: 1Gi\n  databaseName: app\n  username: app_user\n  tls:\n    serverCertificateSecret: s3\n",
    );
    let message = rejection_message(authors.create(&PostParams::default(), &mounting).await.unwrap_err());
    assert!(
        message.contains(&format!(
            "spec.tls.serverCertificateSecret: Forbidden: User \"{author}\" may not read Secret \"s3\""
        )),
        "{message}"
    );

    // A ConfigMap of custom queries: the agents run what it holds and publish the answers.
    let querying = database_from_yaml(
        "apiVersion: dbservice.dev/v1\nkind: DatabaseService\nmetadata:\n  name: querying\nspec:\n  version: \"16\"\n  \
         storageSize: 1Gi\n  databaseName: app\n  username: app_user\n  monitoring:\n    customQueries: [{name: private-queries}]\n",
    );
    let message = rejection_message(authors.create(&PostParams::default(), &querying).await.unwrap_err());
    assert!(
        message.contains(&format!(
            "spec.monitoring.customQueries[0].name: Forbidden: User \"{author}\" may not read ConfigMap \"private-queries\""
        )),
        "{message}"
    );

    // An import's source password: the first primary's agent connects with it.
    let importing = database_from_yaml(
        "apiVersion: dbservice.dev/v1\nkind: DatabaseService\nmetadata:\n  name: importing\nspec:\n  version: \"16\"\n  \
         storageSize: 1Gi\n  databaseName: app\n  username: app_user\n  bootstrap:\n    import:\n      source: \
         {host: legacy.prod.svc, username: app, passwordSecret: {name: s3, key: secretAccessKey}}\n      databases: [app]\n",
    );
    let message = rejection_message(authors.create(&PostParams::default(), &importing).await.unwrap_err());
    assert!(
        message.contains(&format!(
            "spec.bootstrap.import.source.passwordSecret.name: Forbidden: User \"{author}\" may not read Secret \"s3\""
        )),
        "{message}"
    );

    // The same object by someone who may read the Secret is admitted (admission contacts no store:
    // tests/real_node/trust.rs proves it with a forged review); the controller, acting on the
    // object the apiserver stored, checks the target against the store before it makes a pod: the
    // listener sees that signed request (it would have seen an exfiltration).
    let databases: Api<DatabaseService> = Api::namespaced(admin.clone(), ns);
    databases.create(&PostParams::default(), &object("restored")).await.unwrap();
    crate::support::eventually("the controller's signed request at the store", Duration::from_secs(60), || async {
        requests.lock().unwrap().iter().any(|request| request.contains(access_key_id)).then_some(())
    })
    .await;
    listening.abort();
}
