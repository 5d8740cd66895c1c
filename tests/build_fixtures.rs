//! Pure tests of `operator::database::build`: the child objects built from the DatabaseService fixtures in
//! `tests/fixtures/build/*.yaml` (one object per file, as stored, with a uid).

use dbservice_operator::api::database_service::DatabaseService;
use dbservice_operator::api::pod::{POSTGRES_PORT, RESTART_ANNOTATION};
use dbservice_operator::operator::database::build::{
    credentials_secret, generate_password, replication_secret, scripts_config_map, services, stateful_set,
    WorkloadInputs,
};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Container, PodSpec, Probe};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Every build fixture, with its file name for messages.
fn fixtures() -> Vec<(String, DatabaseService)> {
    let directory = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/build");
    let mut files: Vec<PathBuf> = std::fs::read_dir(directory)
        .expect("tests/fixtures/build exists")
        .map(|entry| entry.expect("directory entry is readable").path())
        .filter(|path| path.extension().is_some_and(|extension| extension == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no build fixture");
    files
        .into_iter()
        .map(|file| {
            let name = file.file_name().unwrap().to_string_lossy().into_owned();
            let text = std::fs::read_to_string(&file).unwrap();
            let database: DatabaseService =
                serde_saphyr::from_str(&text).unwrap_or_else(|error| panic!("{name}: not a DatabaseService: {error}"));
            (name, database)
        })
        .collect()
}

fn fixture(file: &str) -> DatabaseService {
    fixtures().into_iter().find(|(name, _)| name == file).unwrap_or_else(|| panic!("no fixture {file}")).1
}

/// Inputs as the reconciler decides them for a healthy, converged DatabaseService.
fn steady_inputs(database: &DatabaseService) -> WorkloadInputs {
    WorkloadInputs {
        image: database.spec.image_or_default(),
        replicas: database.spec.replicas_or_default(),
        restarted_at: None,
        claim_template_size: database.spec.storage_size.clone(),
        instance_image: None,
    }
}

fn name_of(database: &DatabaseService) -> &str {
    database.metadata.name.as_deref().unwrap()
}

fn namespace_of(database: &DatabaseService) -> &str {
    database.metadata.namespace.as_deref().unwrap()
}

fn pod_spec(stateful_set: &StatefulSet) -> &PodSpec {
    stateful_set.spec.template.spec.as_ref().unwrap()
}

fn postgres_container(stateful_set: &StatefulSet) -> &Container {
    let containers = &pod_spec(stateful_set).containers;
    assert_eq!(containers.len(), 1, "one container");
    &containers[0]
}

fn assert_owned_by(owner_references: Option<&Vec<OwnerReference>>, database: &DatabaseService, what: &str) {
    let references = owner_references.unwrap_or_else(|| panic!("{what} has no ownerReferences"));
    assert_eq!(references.len(), 1, "{what}: one owner");
    let reference = &references[0];
    assert_eq!(reference.api_version, "dbservice.dev/v1", "{what}");
    assert_eq!(reference.kind, "DatabaseService", "{what}");
    assert_eq!(reference.name, name_of(database), "{what}");
    assert_eq!(Some(&reference.uid), database.metadata.uid.as_ref(), "{what}");
    // controller: true lets the StatefulSet and friends be adopted and garbage-collected with it.
    assert_eq!(reference.controller, Some(true), "{what}");
}

fn exec_command(probe: &Probe) -> String {
    probe.exec.as_ref().and_then(|exec| exec.command.as_ref()).expect("an exec probe").join(" ")
}

#[test]
fn stateful_set_runs_the_image_and_replicas_of_the_inputs() {
    for (file, database) in fixtures() {
        let inputs = steady_inputs(&database);
        let built = stateful_set(&database, &inputs);
        assert_eq!(built.metadata.name.as_deref(), Some(name_of(&database)), "{file}");
        assert_eq!(built.metadata.namespace.as_deref(), Some(namespace_of(&database)), "{file}");
        assert_eq!(postgres_container(&built).image.as_deref(), Some(inputs.image.as_str()), "{file}");
        assert_eq!(built.spec.replicas, Some(inputs.replicas), "{file}");
    }
    // Defaults apply when the webhooks never filled them.
    let legacy = stateful_set(&fixture("defaults_absent.yaml"), &steady_inputs(&fixture("defaults_absent.yaml")));
    assert_eq!(postgres_container(&legacy).image.as_deref(), Some("postgres:15"));
    assert_eq!(legacy.spec.replicas, Some(1));
}

/// During a rollback or while degraded the reconciler's inputs win over the spec.
#[test]
fn stateful_set_follows_the_inputs_not_the_spec() {
    let database = fixture("replicated.yaml");
    let inputs = WorkloadInputs {
        image: "postgres:17.1".into(),
        replicas: 1,
        restarted_at: Some("2026-11-30T10:00:00Z".into()),
        claim_template_size: "20Gi".into(),
        instance_image: None,
    };
    let built = stateful_set(&database, &inputs);
    assert_eq!(postgres_container(&built).image.as_deref(), Some("postgres:17.1"));
    assert_eq!(built.spec.replicas, Some(1));
    let template_annotations = built.spec.template.metadata.as_ref().unwrap().annotations.as_ref();
    assert_eq!(
        template_annotations.and_then(|annotations| annotations.get(RESTART_ANNOTATION)).map(String::as_str),
        Some("2026-11-30T10:00:00Z")
    );
    let claim = &built.spec.volume_claim_templates.as_ref().unwrap()[0];
    let requested = claim.spec.as_ref().unwrap().resources.as_ref().unwrap().requests.as_ref().unwrap();
    assert_eq!(requested["storage"].0, "20Gi", "the claim template keeps the size it was created with");
}

#[test]
fn stateful_set_without_restart_has_no_restart_annotation() {
    for (file, database) in fixtures() {
        let built = stateful_set(&database, &steady_inputs(&database));
        let annotations = built.spec.template.metadata.as_ref().unwrap().annotations.clone();
        assert!(
            !annotations.unwrap_or_default().contains_key(RESTART_ANNOTATION),
            "{file}: restart annotation set without a restart"
        );
    }
}

#[test]
fn stateful_set_probes_use_pg_isready() {
    for (file, database) in fixtures() {
        let built = stateful_set(&database, &steady_inputs(&database));
        let container = postgres_container(&built);
        for (kind, probe) in [("readiness", &container.readiness_probe), ("liveness", &container.liveness_probe)] {
            let probe = probe.as_ref().unwrap_or_else(|| panic!("{file}: no {kind} probe"));
            let command = exec_command(probe);
            assert!(command.contains("pg_isready"), "{file}: {kind} probe runs {command:?}");
            assert!(command.contains(&format!("-p {POSTGRES_PORT}")), "{file}: {kind} probe port: {command:?}");
        }
    }
}

#[test]
fn stateful_set_takes_credentials_from_the_secret_and_holds_no_literal_password() {
    for (file, database) in fixtures() {
        let name = name_of(&database);
        let built = stateful_set(&database, &steady_inputs(&database));
        let env = postgres_container(&built).env.clone().unwrap_or_default();
        let from_secret: BTreeMap<String, (String, String)> = env
            .iter()
            .filter_map(|variable| {
                let reference = variable.value_from.as_ref()?.secret_key_ref.as_ref()?;
                Some((variable.name.clone(), (reference.name.clone(), reference.key.clone())))
            })
            .collect();
        let secret = format!("{name}-credentials");
        let superuser = format!("{name}-superuser");
        for (variable, secret, key) in [("APPLICATION_USER", &secret, "username"), ("POSTGRES_DB", &secret, "database")]
        {
            assert_eq!(
                from_secret.get(variable),
                Some(&(secret.clone(), key.to_string())),
                "{file}: {variable} must come from Secret {secret} key {key}"
            );
        }
        // Passwords only as files (every child process would inherit an environment variable).
        let plain =
            |name: &str| env.iter().find(|variable| variable.name == name).and_then(|variable| variable.value.clone());
        for variable in ["POSTGRES_PASSWORD", "APPLICATION_PASSWORD", "REPLICATION_PASSWORD"] {
            assert!(env.iter().all(|candidate| candidate.name != variable), "{file}: {variable} is in the environment");
        }
        let pod = built.spec.template.spec.as_ref().unwrap();
        let mounts = postgres_container(&built).volume_mounts.clone().unwrap_or_default();
        for (variable, secret, key) in [
            // The server's superuser is postgres, with a password of its own.
            ("POSTGRES_PASSWORD_FILE", &superuser, "password"),
            ("APPLICATION_PASSWORD_FILE", &secret, "password"),
            ("REPLICATION_PASSWORD_FILE", &format!("{name}-replication"), "password"),
        ] {
            let path = plain(variable).unwrap_or_else(|| panic!("{file}: {variable} missing"));
            let (directory, file_name) = path.rsplit_once('/').unwrap();
            assert_eq!(file_name, key, "{file}: {variable}");
            let mount = mounts.iter().find(|mount| mount.mount_path == directory).expect("the directory is a mount");
            assert_eq!(mount.read_only, Some(true), "{file}: {directory}");
            let volume = pod.volumes.as_ref().unwrap().iter().find(|volume| volume.name == mount.name).unwrap();
            let source = volume.secret.as_ref().expect("a Secret volume");
            assert_eq!(source.secret_name.as_deref(), Some(secret.as_str()), "{file}: {variable}");
            assert_eq!(source.default_mode, Some(0o440), "{file}: owner and the pod's group only");
            let keys: Vec<&str> = source.items.iter().flatten().map(|item| item.key.as_str()).collect();
            assert!(keys.contains(&key) && !keys.contains(&"uri"), "{file}: {keys:?}");
        }
        assert_eq!(plain("POSTGRES_USER").as_deref(), Some("postgres"), "{file}");
        let access = if database.spec.superuser_access_enabled() { "on" } else { "off" };
        assert_eq!(plain("SUPERUSER_NETWORK_ACCESS").as_deref(), Some(access), "{file}");
        for variable in &env {
            if variable.name.contains("PASSWORD") && !variable.name.ends_with("_FILE") {
                assert!(variable.value.is_none(), "{file}: {} has a literal value", variable.name);
            }
        }
        // The passwords of a real Secret appear nowhere in the StatefulSet.
        let password = generate_password();
        let replication_password = generate_password();
        let secret_object = credentials_secret(&database, &password);
        assert_eq!(secret_object.metadata.name.as_deref(), Some(secret.as_str()), "{file}");
        // The application's Secret holds no replication password (that role reads the whole server).
        let keys: Vec<&String> = secret_object.data.as_ref().unwrap().keys().collect();
        assert!(keys.iter().all(|key| !key.contains("replication")), "{file}: {keys:?}");
        let replication = replication_secret(&database, &replication_password);
        assert_eq!(replication.metadata.name, Some(format!("{name}-replication")), "{file}");
        let json = serde_json::to_string(&built).unwrap();
        assert!(!json.contains(&password), "{file}: the password is in the StatefulSet");
        assert!(!json.contains(&replication_password), "{file}: the replication password is in the StatefulSet");
    }
}

#[test]
fn stateful_set_points_standbys_at_the_primary_pod_through_the_headless_service() {
    for (file, database) in fixtures() {
        let (name, namespace) = (name_of(&database), namespace_of(&database));
        let built = stateful_set(&database, &steady_inputs(&database));
        let env = postgres_container(&built).env.clone().unwrap_or_default();
        let primary_host = env.iter().find(|variable| variable.name == "PRIMARY_HOST").and_then(|v| v.value.clone());
        assert_eq!(primary_host, Some(format!("{name}-0.{name}-headless.{namespace}.svc")), "{file}");
        assert_eq!(built.spec.service_name.as_deref(), Some(format!("{name}-headless").as_str()), "{file}");
    }
}

#[test]
fn stateful_set_volume_claim_template_has_the_size_and_class() {
    for (file, database) in fixtures() {
        let inputs = steady_inputs(&database);
        let built = stateful_set(&database, &inputs);
        let templates = built.spec.volume_claim_templates.clone().unwrap_or_default();
        assert_eq!(templates.len(), 1, "{file}: one claim template");
        // PVCs are named data-NAME-N, which the cleanup and the contract rely on.
        assert_eq!(templates[0].metadata.name.as_deref(), Some("data"), "{file}");
        let claim = templates[0].spec.as_ref().unwrap();
        assert_eq!(claim.storage_class_name, database.spec.storage_class_name, "{file}");
        assert_eq!(claim.access_modes, Some(vec!["ReadWriteOnce".to_string()]), "{file}");
        let requests = claim.resources.as_ref().unwrap().requests.as_ref().unwrap();
        assert_eq!(requests["storage"].0, inputs.claim_template_size, "{file}");
        let mounts = postgres_container(&built).volume_mounts.clone().unwrap_or_default();
        assert!(
            mounts.iter().any(|mount| mount.name == "data" && mount.mount_path == "/var/lib/postgresql/data"),
            "{file}: data volume not mounted: {mounts:?}"
        );
    }
    let with_class = stateful_set(&fixture("replicated.yaml"), &steady_inputs(&fixture("replicated.yaml")));
    let claim = with_class.spec.volume_claim_templates.unwrap().remove(0).spec.unwrap();
    assert_eq!(claim.storage_class_name.as_deref(), Some("fast-ssd"));
}

/// The pod must be admissible under the "restricted" Pod Security Standard.
#[test]
fn stateful_set_security_context_is_restricted() {
    for (file, database) in fixtures() {
        let built = stateful_set(&database, &steady_inputs(&database));
        let pod = pod_spec(&built).security_context.clone().unwrap_or_else(|| panic!("{file}: no pod securityContext"));
        assert_eq!(pod.run_as_non_root, Some(true), "{file}");
        assert_eq!(pod.seccomp_profile.map(|profile| profile.type_), Some("RuntimeDefault".to_string()), "{file}");
        let container = postgres_container(&built).security_context.clone().expect("container securityContext");
        assert_eq!(container.allow_privilege_escalation, Some(false), "{file}");
        assert_eq!(container.run_as_non_root, Some(true), "{file}");
        assert!(!container.privileged.unwrap_or(false), "{file}: privileged");
        let capabilities = container.capabilities.unwrap_or_default();
        assert_eq!(capabilities.drop, Some(vec!["ALL".to_string()]), "{file}");
        assert!(capabilities.add.unwrap_or_default().is_empty(), "{file}: capabilities added");
        assert_eq!(pod_spec(&built).automount_service_account_token, Some(false), "{file}");
    }
}

#[test]
fn children_are_owned_by_the_database_service() {
    for (file, database) in fixtures() {
        let built = stateful_set(&database, &steady_inputs(&database));
        assert_owned_by(built.metadata.owner_references.as_ref(), &database, &format!("{file}: StatefulSet"));
        for service in services(&database) {
            let what = format!("{file}: Service {}", service.metadata.name.clone().unwrap_or_default());
            assert_owned_by(service.metadata.owner_references.as_ref(), &database, &what);
        }
        let secret = credentials_secret(&database, "password");
        assert_owned_by(secret.metadata.owner_references.as_ref(), &database, &format!("{file}: Secret"));
        let scripts = scripts_config_map(&database);
        assert_owned_by(scripts.metadata.owner_references.as_ref(), &database, &format!("{file}: ConfigMap"));
    }
}

#[test]
fn stateful_set_copies_the_resources() {
    for (file, database) in fixtures() {
        let built = stateful_set(&database, &steady_inputs(&database));
        assert_eq!(postgres_container(&built).resources, database.spec.resources, "{file}");
    }
    let replicated = fixture("replicated.yaml");
    let built = stateful_set(&replicated, &steady_inputs(&replicated));
    let resources = postgres_container(&built).resources.clone().expect("resources set");
    assert_eq!(resources.requests.unwrap()["memory"].0, "1Gi");
    assert_eq!(resources.limits.unwrap()["cpu"].0, "2");
}

/// The apiserver rejects a StatefulSet whose selector does not match its pod template.
#[test]
fn stateful_set_selector_matches_the_pod_template_labels() {
    for (file, database) in fixtures() {
        let built = stateful_set(&database, &steady_inputs(&database));
        let spec = built.spec;
        let selector = spec.selector.match_labels.clone().unwrap_or_default();
        let template_labels = spec.template.metadata.as_ref().unwrap().labels.clone().unwrap_or_default();
        assert!(!selector.is_empty(), "{file}: empty selector");
        for (key, value) in &selector {
            assert_eq!(template_labels.get(key), Some(value), "{file}: template lacks selector label {key}");
        }
        assert_eq!(template_labels.get("app.kubernetes.io/instance").map(String::as_str), Some(name_of(&database)));
        assert_eq!(template_labels.get("app.kubernetes.io/name").map(String::as_str), Some("postgresql"));
        assert_eq!(template_labels.get("app.kubernetes.io/managed-by").map(String::as_str), Some("dbservice-operator"));
    }
}

#[test]
fn services_select_the_primary_the_standbys_and_every_pod() {
    for (file, database) in fixtures() {
        let name = name_of(&database);
        let built = services(&database);
        let by_name: BTreeMap<String, _> = built
            .iter()
            .map(|service| (service.metadata.name.clone().unwrap(), service.spec.clone().unwrap()))
            .collect();
        assert_eq!(
            by_name.keys().cloned().collect::<Vec<_>>(),
            vec![name.to_string(), format!("{name}-headless"), format!("{name}-replicas")],
            "{file}"
        );
        let selector = |service: &str| by_name[service].selector.clone().unwrap_or_default();
        let instance = ("app.kubernetes.io/instance".to_string(), name.to_string());

        let primary = selector(name);
        // The operator labels exactly one pod primary (the failover status decides which).
        assert_eq!(primary.get("dbservice.dev/role").map(String::as_str), Some("primary"), "{file}");
        assert!(!primary.contains_key("statefulset.kubernetes.io/pod-name"), "{file}: {primary:?}");
        assert!(primary.get(&instance.0) == Some(&instance.1), "{file}: primary selector {primary:?}");

        let standbys = selector(&format!("{name}-replicas"));
        assert_eq!(standbys.get("dbservice.dev/role").map(String::as_str), Some("standby"), "{file}");
        assert!(!standbys.contains_key("statefulset.kubernetes.io/pod-name"), "{file}: {standbys:?}");
        assert!(standbys.get(&instance.0) == Some(&instance.1), "{file}: standby selector {standbys:?}");

        let headless = &by_name[&format!("{name}-headless")];
        assert_eq!(headless.cluster_ip.as_deref(), Some("None"), "{file}");
        assert_eq!(headless.publish_not_ready_addresses, Some(true), "{file}");
        assert!(!selector(&format!("{name}-headless")).contains_key("dbservice.dev/role"), "{file}");

        for service in [name.to_string(), format!("{name}-replicas")] {
            assert_ne!(by_name[&service].cluster_ip.as_deref(), Some("None"), "{file}: {service} is headless");
        }
        for (service, spec) in &by_name {
            let ports = spec.ports.clone().unwrap_or_default();
            assert_eq!(ports.len(), 1, "{file}: {service} ports");
            assert_eq!(ports[0].port, POSTGRES_PORT, "{file}: {service}");
        }
    }
}

#[test]
fn services_target_the_containers_named_port() {
    let database = fixture("minimal.yaml");
    let built = stateful_set(&database, &steady_inputs(&database));
    let container_ports = postgres_container(&built).ports.clone().unwrap_or_default();
    for service in services(&database) {
        let target = service.spec.unwrap().ports.unwrap()[0].target_port.clone().unwrap();
        let matches = container_ports.iter().any(|port| match &target {
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(name) => {
                port.name.as_deref() == Some(name.as_str())
            }
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(number) => port.container_port == *number,
        });
        assert!(matches, "Service {:?} targets {target:?}, not a container port", service.metadata.name);
    }
}

#[test]
fn credentials_secret_has_connection_keys_and_a_uri_naming_the_host() {
    for (file, database) in fixtures() {
        let (name, namespace) = (name_of(&database), namespace_of(&database));
        let password = generate_password();
        let secret = credentials_secret(&database, &password);
        let data: BTreeMap<String, String> = secret
            .data
            .unwrap_or_default()
            .into_iter()
            .map(|(key, value)| (key, String::from_utf8(value.0).expect("UTF-8 values")))
            .collect();
        for key in ["username", "password", "database", "host", "port", "uri"] {
            assert!(data.contains_key(key), "{file}: key {key} missing from {:?}", data.keys());
        }
        assert_eq!(data["username"], database.spec.username, "{file}");
        assert_eq!(data["password"], password, "{file}");
        assert_eq!(data["database"], database.spec.database_name, "{file}");
        assert_eq!(data["port"], POSTGRES_PORT.to_string(), "{file}");
        let host = &data["host"];
        assert_eq!(host, &format!("{name}.{namespace}.svc"), "{file}: host is the primary Service");
        let uri = &data["uri"];
        assert!(uri.starts_with("postgresql://"), "{file}: {uri}");
        assert!(uri.contains(&format!("@{host}:{POSTGRES_PORT}/")), "{file}: uri {uri} does not name host {host}");
        assert!(
            uri.ends_with(&format!("/{}?sslmode=verify-full", database.spec.database_name)),
            "{file}: the uri names the database and asks for a verified TLS connection: {uri}"
        );
        assert_eq!(secret.type_.as_deref(), Some("Opaque"), "{file}");
    }
}

#[test]
fn generated_passwords_are_long_url_safe_and_distinct() {
    let first = generate_password();
    let second = generate_password();
    // 22 base64 characters carry 132 bits: at least 128 bits of entropy.
    assert!(first.len() >= 22, "{first} is {} characters", first.len());
    for password in [&first, &second] {
        assert!(
            password.chars().all(|character| character.is_ascii_alphanumeric() || character == '-' || character == '_'),
            "{password} is not URL-safe (it goes into a URI)"
        );
    }
    assert_ne!(first, second, "two passwords are the same");
}

#[test]
fn scripts_config_map_holds_the_entrypoint_and_primary_init() {
    for (file, database) in fixtures() {
        let name = name_of(&database);
        let config_map = scripts_config_map(&database);
        assert_eq!(config_map.metadata.name, Some(format!("{name}-scripts")), "{file}");
        let data = config_map.data.unwrap_or_default();
        for key in ["entrypoint.sh", "primary-init.sh"] {
            let script = data.get(key).unwrap_or_else(|| panic!("{file}: {key} missing"));
            assert!(script.starts_with("#!"), "{file}: {key} has no shebang");
        }
        // The StatefulSet mounts this very ConfigMap and runs the entrypoint from it.
        let built = stateful_set(&database, &steady_inputs(&database));
        let volumes = pod_spec(&built).volumes.clone().unwrap_or_default();
        assert!(
            volumes.iter().any(|volume| volume
                .config_map
                .as_ref()
                .is_some_and(|source| source.name == format!("{name}-scripts"))),
            "{file}: scripts ConfigMap not mounted"
        );
        let command = postgres_container(&built).command.clone().unwrap_or_default().join(" ");
        assert!(command.contains("/scripts/entrypoint.sh"), "{file}: command {command:?}");
    }
}

#[test]
fn a_backup_spec_archives_from_the_pod_when_the_operator_image_is_known() {
    let database = fixture("backup.yaml");
    let without_image = stateful_set(&database, &steady_inputs(&database));
    assert!(pod_spec(&without_image).init_containers.is_none(), "no binary to archive with, so no archiving");
    let inputs =
        WorkloadInputs { instance_image: Some("localhost/dbservice-operator:dev".into()), ..steady_inputs(&database) };
    let built = stateful_set(&database, &inputs);
    let pod = pod_spec(&built);

    let init = &pod.init_containers.as_ref().expect("an init container")[0];
    assert_eq!(init.name, "install-dbservice");
    assert_eq!(init.image.as_deref(), Some("localhost/dbservice-operator:dev"));
    assert_eq!(
        init.command.as_deref(),
        Some(&["/usr/local/bin/dbservice-operator".to_string(), "install-binary".into(), "/dbservice/bin".into()][..])
    );
    let volumes = pod.volumes.as_ref().unwrap();
    let binary_volume = volumes.iter().find(|volume| volume.name == "dbservice-bin").expect("dbservice-bin");
    assert!(binary_volume.empty_dir.is_some());
    let ca_volume = volumes.iter().find(|volume| volume.name == "dbservice-s3-ca").expect("the CA Secret volume");
    assert_eq!(ca_volume.secret.as_ref().unwrap().secret_name.as_deref(), Some("s3-ca"));

    let postgres = &pod.containers[0];
    let mount = postgres.volume_mounts.as_ref().unwrap().iter().find(|mount| mount.name == "dbservice-bin").unwrap();
    assert_eq!((mount.mount_path.as_str(), mount.read_only), ("/dbservice/bin", Some(true)));
    let env: BTreeMap<&str, &k8s_openapi::api::core::v1::EnvVar> =
        postgres.env.as_ref().unwrap().iter().map(|variable| (variable.name.as_str(), variable)).collect();
    let value =
        |name: &str| env.get(name).and_then(|variable| variable.value.as_deref()).unwrap_or_else(|| panic!("{name}"));
    assert_eq!(value("DBSERVICE_ARCHIVE_COMMAND"), "/dbservice/bin/dbservice-operator wal-archive %p %f");
    assert_eq!(value("DBSERVICE_ARCHIVE_TIMEOUT_SECONDS"), "60");
    assert_eq!(value("DBSERVICE_S3_ENDPOINT"), "http://10.85.0.1:9000");
    assert_eq!(value("DBSERVICE_S3_BUCKET"), "backups");
    assert_eq!(value("DBSERVICE_S3_PATH"), "prod");
    assert_eq!(value("DBSERVICE_BACKUP_SERVER_NAME"), "orders");
    assert_eq!(value("DBSERVICE_S3_CA_FILE"), "/dbservice/s3-ca/ca.crt");
    // The store's keys as files (PostgreSQL's archive_command would inherit an environment variable).
    assert!(!env.contains_key("AWS_ACCESS_KEY_ID") && !env.contains_key("AWS_SECRET_ACCESS_KEY"), "{env:?}");
    assert_eq!(value("DBSERVICE_S3_ACCESS_KEY_ID_FILE"), "/dbservice/s3-credentials/accessKeyId");
    assert_eq!(value("DBSERVICE_S3_SECRET_ACCESS_KEY_FILE"), "/dbservice/s3-credentials/secretAccessKey");
    let mount = postgres
        .volume_mounts
        .as_ref()
        .unwrap()
        .iter()
        .find(|mount| mount.mount_path == "/dbservice/s3-credentials")
        .unwrap();
    assert_eq!(mount.read_only, Some(true));
    let volume = pod_spec(&built).volumes.as_ref().unwrap().iter().find(|volume| volume.name == mount.name).unwrap();
    let source = volume.secret.as_ref().unwrap();
    assert_eq!((source.secret_name.as_deref(), source.default_mode), (Some("s3-credentials"), Some(0o440)));
    let items: Vec<(&str, &str)> =
        source.items.iter().flatten().map(|item| (item.key.as_str(), item.path.as_str())).collect();
    assert_eq!(items, [("id", "accessKeyId"), ("secretAccessKey", "secretAccessKey")]);

    // Without spec.backup the agent still comes in, but nothing is archived.
    let (_, plain) = fixtures().into_iter().find(|(_, database)| database.spec.backup.is_none()).unwrap();
    let with_image =
        WorkloadInputs { instance_image: Some("localhost/dbservice-operator:dev".into()), ..steady_inputs(&plain) };
    let plain_built = stateful_set(&plain, &with_image);
    let variables = pod_spec(&plain_built).containers[0].env.clone().unwrap_or_default();
    assert!(variables.iter().all(|variable| variable.name != "DBSERVICE_ARCHIVE_COMMAND"), "{variables:?}");
}

/// With the instance image, the agent runs the pod: the init container copies it into the shared
/// emptyDir, the postgres container finds it there, and the pod runs as the agents' account.
#[test]
fn the_instance_agent_comes_from_an_init_container() {
    let database = fixture("replicated.yaml");
    let name = name_of(&database);
    let inputs = WorkloadInputs { instance_image: Some("operator:1".into()), ..steady_inputs(&database) };
    let built = stateful_set(&database, &inputs);
    let pod = built.spec.template.spec.clone().unwrap();
    let init = &pod.init_containers.as_ref().unwrap()[0];
    assert_eq!(init.name, "install-dbservice");
    assert_eq!(init.image.as_deref(), Some("operator:1"));
    assert_eq!(init.command.as_ref().unwrap()[1..], ["install-binary".to_string(), "/dbservice/bin".to_string()]);
    assert_eq!(init.volume_mounts.as_ref().unwrap()[0].name, "dbservice-bin");
    let volume = pod.volumes.as_ref().unwrap().iter().find(|volume| volume.name == "dbservice-bin").unwrap();
    assert!(volume.empty_dir.is_some());
    let postgres = postgres_container(&built);
    let mount = postgres.volume_mounts.as_ref().unwrap().iter().find(|mount| mount.name == "dbservice-bin").unwrap();
    assert_eq!(mount.mount_path, "/dbservice/bin");
    let env: BTreeMap<String, Option<String>> =
        postgres.env.clone().unwrap().into_iter().map(|variable| (variable.name, variable.value)).collect();
    assert_eq!(env["DBSERVICE_AGENT"].as_deref(), Some("/dbservice/bin/dbservice-operator"));
    assert_eq!(env["DBSERVICE_DATABASE"].as_deref(), Some(name));
    assert!(!env.contains_key("PRIMARY_HOST"), "the role comes from the Lease, never the ordinal");
    assert!(postgres.liveness_probe.is_none(), "the agent supervises PostgreSQL");
    assert_eq!(pod.service_account_name, Some(format!("{name}-instance")));
    assert_eq!(pod.automount_service_account_token, Some(true));

    let without = stateful_set(&database, &steady_inputs(&database));
    let pod = without.spec.template.spec.clone().unwrap();
    assert!(pod.init_containers.is_none() && pod.service_account_name.is_none());
    assert_eq!(pod.automount_service_account_token, Some(false));
}

#[test]
fn pods_serve_the_certificate_secret_and_their_clients_verify_peers_by_its_ca() {
    for (file, database) in fixtures() {
        let name = name_of(&database);
        let built = stateful_set(&database, &steady_inputs(&database));
        let env = postgres_container(&built).env.clone().unwrap_or_default();
        let plain =
            |name: &str| env.iter().find(|variable| variable.name == name).and_then(|variable| variable.value.clone());
        let directory = plain("TLS_DIRECTORY").unwrap_or_else(|| panic!("{file}: TLS_DIRECTORY missing"));
        assert_eq!(plain("PGSSLMODE").as_deref(), Some("verify-full"), "{file}");
        assert_eq!(plain("PGSSLROOTCERT"), Some(format!("{directory}/ca.crt")), "{file}");
        let mounts = postgres_container(&built).volume_mounts.clone().unwrap_or_default();
        let mount = mounts.iter().find(|mount| mount.mount_path == directory).expect("the TLS directory is a mount");
        assert_eq!(mount.read_only, Some(true), "{file}");
        let pod = pod_spec(&built);
        let volume = pod.volumes.as_ref().unwrap().iter().find(|volume| volume.name == mount.name).unwrap();
        let source = volume.secret.as_ref().expect("a Secret volume");
        let expected = database
            .spec
            .tls
            .as_ref()
            .and_then(|tls| tls.server_certificate_secret.clone())
            .unwrap_or_else(|| format!("{name}-tls"));
        assert_eq!(source.secret_name.as_deref(), Some(expected.as_str()), "{file}");
        // PostgreSQL refuses a key file readable by others than its owner (root) and group.
        assert_eq!(source.default_mode, Some(0o440), "{file}");
        let keys: Vec<&str> = source.items.iter().flatten().map(|item| item.key.as_str()).collect();
        assert_eq!(keys, ["tls.crt", "tls.key", "ca.crt"], "{file}");
        // The probe goes through the Unix socket: over TCP pg_hba.conf refuses the superuser
        // (and every probe left two FATAL lines in the server's log, issue 39).
        let probe = exec_command(postgres_container(&built).readiness_probe.as_ref().unwrap());
        assert!(probe.contains("pg_isready -h /var/run/postgresql "), "{file}: {probe}");
    }
}
