//! What an in-place major upgrade adds to a PostgreSQL pod (pure): `pg_upgrade` needs the
//! previous major's binaries beside the new ones, so an init container of the previous image
//! copies them into an emptyDir, keeping their layout (the binaries find their libraries and share
//! directory relative to themselves), and the agent learns where they are and how to move the data.

use crate::api::database_service::DatabaseService;
use crate::api::major_upgrade::{
    MajorUpgradePhase, PREVIOUS_BINARIES_DIRECTORY, PREVIOUS_BINDIR_VARIABLE, UPGRADE_METHOD_VARIABLE,
};
use crate::api::version::major_version;
use crate::operator::database::build::security::restricted_security_context;
use crate::operator::database::build::volumes::read_only_mount;
use crate::operator::database::build::{plain_env, WorkloadInputs};
use k8s_openapi::api::core::v1::{Container, EmptyDirVolumeSource, PodSpec, Volume, VolumeMount};

/// Name of the init container and of its volume.
pub const PREVIOUS_BINARIES: &str = "previous-binaries";

/// The previous image and major, while the pods run the image an upgrade goes to (and keep them
/// after it completed, so that the template does not change again; the next image change drops it).
fn previous(database: &DatabaseService, inputs: &WorkloadInputs) -> Option<(String, u32)> {
    let upgrade = database.status.as_ref()?.major_upgrade.as_ref()?;
    let running_new = upgrade.to_image == inputs.image
        && !matches!(upgrade.phase, MajorUpgradePhase::RollingBack | MajorUpgradePhase::RolledBack);
    running_new.then(|| Some((upgrade.from_image.clone(), major_version(&upgrade.from_version)?))).flatten()
}

/// The shell command copying `major`'s files of the image it runs in.
fn copy_command(major: u32) -> String {
    let target = PREVIOUS_BINARIES_DIRECTORY;
    format!(
        "set -e; mkdir -p {target}/usr/lib/postgresql {target}/usr/share/postgresql; \
         cp -R /usr/lib/postgresql/{major} {target}/usr/lib/postgresql/; \
         if [ -d /usr/share/postgresql/{major} ]; then cp -R /usr/share/postgresql/{major} {target}/usr/share/postgresql/; fi"
    )
}

/// Adds the previous binaries to a pod whose first container runs PostgreSQL, during (and after)
/// an in-place major upgrade; and the upgrade method (`spec.upgradeMethod`) always.
pub fn add_major_upgrade(pod: &mut PodSpec, database: &DatabaseService, inputs: &WorkloadInputs) {
    let method = database.spec.upgrade_method.unwrap_or_default();
    let Some(postgres) = pod.containers.first_mut() else { return };
    if database.spec.upgrade_method.is_some() {
        postgres.env.get_or_insert_with(Vec::new).push(plain_env(UPGRADE_METHOD_VARIABLE, method.as_str()));
    }
    let Some((image, major)) = previous(database, inputs) else { return };
    postgres.env.get_or_insert_with(Vec::new).push(plain_env(
        PREVIOUS_BINDIR_VARIABLE,
        format!("{PREVIOUS_BINARIES_DIRECTORY}/usr/lib/postgresql/{major}/bin"),
    ));
    postgres
        .volume_mounts
        .get_or_insert_with(Vec::new)
        .push(read_only_mount(PREVIOUS_BINARIES, PREVIOUS_BINARIES_DIRECTORY));
    pod.init_containers.get_or_insert_with(Vec::new).push(Container {
        name: PREVIOUS_BINARIES.into(),
        image: Some(image),
        command: Some(vec!["/bin/sh".into(), "-c".into(), copy_command(major)]),
        security_context: Some(restricted_security_context()),
        volume_mounts: Some(vec![VolumeMount {
            name: PREVIOUS_BINARIES.into(),
            mount_path: PREVIOUS_BINARIES_DIRECTORY.into(),
            ..Default::default()
        }]),
        ..Default::default()
    });
    pod.volumes.get_or_insert_with(Vec::new).push(Volume {
        name: PREVIOUS_BINARIES.into(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Default::default()
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::major_upgrade::MajorUpgradeStatus;

    fn upgrading(phase: MajorUpgradePhase) -> DatabaseService {
        let mut database: DatabaseService = serde_json::from_value(serde_json::json!({
            "apiVersion": "dbservice.dev/v1", "kind": "DatabaseService", "metadata": {"name": "orders", "namespace": "shop", "uid": "1"},
            "spec": {"version": "17.11", "storageSize": "1Gi", "databaseName": "app", "username": "app_user"}
        }))
        .unwrap();
        database.status = Some(crate::api::database_service::DatabaseServiceStatus {
            major_upgrade: Some(MajorUpgradeStatus {
                phase,
                from_version: "15.18".into(),
                from_image: "postgres:15.18".into(),
                to_version: "17.11".into(),
                to_image: "postgres:17.11".into(),
                primary: "orders-0".into(),
                started_at: "2026-12-04T20:00:00Z".into(),
                primary_stopped_at: None,
                downtime_milliseconds: None,
                backup: None,
                steps: Vec::new(),
                analyze: None,
                message: None,
            }),
            ..Default::default()
        });
        database
    }

    fn inputs(image: &str) -> WorkloadInputs {
        WorkloadInputs {
            image: image.into(),
            replicas: 2,
            restarted_at: None,
            claim_template_size: "1Gi".into(),
            instance_image: Some("operator:1".into()),
        }
    }

    fn pod(database: &DatabaseService, image: &str) -> PodSpec {
        let inputs = inputs(image);
        crate::operator::database::build::stateful_set(database, &inputs).spec.template.spec.unwrap()
    }

    #[test]
    fn the_new_image_gets_the_previous_binaries_from_the_previous_image() {
        let pod = pod(&upgrading(MajorUpgradePhase::Upgrading), "postgres:17.11");
        let init = pod.init_containers.unwrap();
        let copy = init.iter().find(|container| container.name == PREVIOUS_BINARIES).unwrap();
        assert_eq!(copy.image.as_deref(), Some("postgres:15.18"));
        assert!(copy.command.as_ref().unwrap()[2].contains("cp -R /usr/lib/postgresql/15 "));
        let environment = pod.containers[0].env.clone().unwrap();
        let bindir = environment.iter().find(|variable| variable.name == PREVIOUS_BINDIR_VARIABLE).unwrap();
        assert_eq!(bindir.value.as_deref(), Some("/dbservice/previous/usr/lib/postgresql/15/bin"));
    }

    #[test]
    fn the_old_image_and_a_rollback_get_nothing() {
        for (phase, image) in [
            (MajorUpgradePhase::Upgrading, "postgres:15.18"),
            (MajorUpgradePhase::RollingBack, "postgres:17.11"),
            (MajorUpgradePhase::RolledBack, "postgres:17.11"),
        ] {
            let pod = pod(&upgrading(phase), image);
            assert!(!pod.init_containers.unwrap().iter().any(|container| container.name == PREVIOUS_BINARIES));
            assert!(!pod.volumes.unwrap().iter().any(|volume| volume.name == PREVIOUS_BINARIES));
        }
    }
}
