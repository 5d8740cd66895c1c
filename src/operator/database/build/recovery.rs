//! Build (pure): the recovery plan and the source's credentials (and CA) added to the pod of a
//! DatabaseService that recovers from a backup.

use crate::api::database_service::DatabaseService;
use crate::api::recovery::{RecoveryPlan, CA_DIRECTORY, CA_FILE, CREDENTIALS_DIRECTORY, RECOVERY_PLAN_VARIABLE};
use crate::operator::database::build::plain_env;
use k8s_openapi::api::core::v1::{KeyToPath, PodSpec, SecretVolumeSource, Volume, VolumeMount};
use kube::ResourceExt;

const CREDENTIALS_VOLUME: &str = "dbservice-recovery-credentials";
const CA_VOLUME: &str = "dbservice-recovery-ca";

fn secret_volume(name: &str, secret: &str, items: Vec<(String, &str)>) -> Volume {
    Volume {
        name: name.into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret.into()),
            items: Some(
                items
                    .into_iter()
                    .map(|(key, path)| KeyToPath { key, path: path.into(), ..Default::default() })
                    .collect(),
            ),
            default_mode: Some(0o440),
            // Only the first start of the first instance reads it: a source Secret deleted after the
            // recovery must not keep the pods from starting.
            optional: Some(true),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Adds the recovery plan and the source's credentials (and CA) to a pod whose first container
/// runs the instance agent. Nothing changes without `spec.bootstrap.recovery`.
pub fn add_recovery(pod: &mut PodSpec, database: &DatabaseService) {
    let Some(plan) = RecoveryPlan::of(database.spec.bootstrap.as_ref(), &database.name_any()) else { return };
    let credentials = &plan.source.credentials_secret;
    let mut volumes = vec![secret_volume(
        CREDENTIALS_VOLUME,
        &credentials.name,
        vec![
            (credentials.access_key_id_key.clone().unwrap_or_else(|| "accessKeyId".into()), "accessKeyId"),
            (credentials.secret_access_key_key.clone().unwrap_or_else(|| "secretAccessKey".into()), "secretAccessKey"),
        ],
    )];
    let mut mounts = vec![VolumeMount {
        name: CREDENTIALS_VOLUME.into(),
        mount_path: CREDENTIALS_DIRECTORY.into(),
        read_only: Some(true),
        ..Default::default()
    }];
    if let Some(ca) = &plan.source.ca_secret {
        volumes.push(secret_volume(CA_VOLUME, &ca.name, vec![(ca.key.clone(), CA_FILE)]));
        mounts.push(VolumeMount {
            name: CA_VOLUME.into(),
            mount_path: CA_DIRECTORY.into(),
            read_only: Some(true),
            ..Default::default()
        });
    }
    pod.volumes.get_or_insert_with(Vec::new).extend(volumes);
    if let Some(postgres) = pod.containers.first_mut() {
        postgres.volume_mounts.get_or_insert_with(Vec::new).extend(mounts);
        let plan = serde_json::to_string(&plan).expect("a plan serializes");
        postgres.env.get_or_insert_with(Vec::new).push(plain_env(RECOVERY_PLAN_VARIABLE, plan));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::backup::RecoveryTargetSpec;
    use crate::api::recovery::tests::recovering;
    use crate::instance::recovery::restore_args_in_pod;
    use std::path::{Path, PathBuf};

    #[test]
    fn the_pod_gets_the_plan_and_the_source_credentials_as_files() {
        let target = RecoveryTargetSpec { time: Some("2026-12-01T00:30:00Z".into()), ..Default::default() };
        let database = recovering(Some(target));
        let mut pod = PodSpec { containers: vec![Default::default()], ..Default::default() };
        add_recovery(&mut pod, &database);
        let env = pod.containers[0].env.clone().unwrap();
        assert_eq!(env.len(), 1);
        let plan: RecoveryPlan = serde_json::from_str(env[0].value.as_deref().unwrap()).unwrap();
        assert_eq!(plan.target_description(), "time 2026-12-01T00:30:00Z");
        let volumes = pod.volumes.unwrap();
        let credentials = volumes[0].secret.as_ref().unwrap();
        assert_eq!(credentials.secret_name.as_deref(), Some("source-s3"));
        assert_eq!(credentials.optional, Some(true));
        let items = credentials.items.as_ref().unwrap();
        assert_eq!((items[0].key.as_str(), items[0].path.as_str()), ("id", "accessKeyId"));
        assert_eq!((items[1].key.as_str(), items[1].path.as_str()), ("secretAccessKey", "secretAccessKey"));
        assert_eq!(volumes[1].secret.as_ref().unwrap().secret_name.as_deref(), Some("source-ca"));

        let args = restore_args_in_pod(&plan, Path::new("/data/pgdata.recovery"), Path::new("/dbservice/bin/x"));
        assert_eq!(args.target_time.as_deref(), Some("2026-12-01T00:30:00Z"));
        assert_eq!(args.store.server_name, "orders");
        assert_eq!(args.store.access_key_id_file, Some(PathBuf::from("/dbservice/recovery-credentials/accessKeyId")));
        assert_eq!(args.store.ca_file, Some(PathBuf::from("/dbservice/recovery-ca/ca.crt")));
        assert!(!format!("{args:?}").contains("secret-value"));
    }

    #[test]
    fn without_recovery_the_pod_is_unchanged() {
        let database = DatabaseService::new("plain", Default::default());
        let mut pod = PodSpec { containers: vec![Default::default()], ..Default::default() };
        add_recovery(&mut pod, &database);
        assert_eq!(pod, PodSpec { containers: vec![Default::default()], ..Default::default() });
    }
}
