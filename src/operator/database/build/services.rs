//! Build (pure): Service NAME (the primary), NAME-replicas (the standbys) and NAME-headless
//! (pod DNS).

use crate::api::database_service::DatabaseService;
use crate::api::names::{selector_labels, ChildNames, PRIMARY_ROLE, ROLE_LABEL, STANDBY_ROLE};
use crate::api::pod::POSTGRES_PORT;
use crate::operator::database::build::metadata;
use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;
use std::collections::BTreeMap;

fn service(database: &DatabaseService, name: String, selector: BTreeMap<String, String>, headless: bool) -> Service {
    Service {
        metadata: metadata(database, name),
        spec: Some(ServiceSpec {
            selector: Some(selector),
            cluster_ip: headless.then(|| "None".to_string()),
            // Pods must resolve each other before they are ready (a standby bootstraps from the primary).
            publish_not_ready_addresses: headless.then_some(true),
            ports: Some(vec![ServicePort {
                name: Some("postgres".into()),
                port: POSTGRES_PORT,
                target_port: Some(IntOrString::String("postgres".into())),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Service NAME (the primary), NAME-replicas (the standbys) and NAME-headless (pod DNS).
pub fn services(database: &DatabaseService) -> Vec<Service> {
    let name = database.name_any();
    // The operator labels exactly one pod primary (none during a failover): never two behind NAME.
    let mut primary = selector_labels(&name);
    primary.insert(ROLE_LABEL.into(), PRIMARY_ROLE.into());
    let mut standbys = selector_labels(&name);
    standbys.insert(ROLE_LABEL.into(), STANDBY_ROLE.into());
    vec![
        service(database, name.clone(), primary, false),
        service(database, ChildNames::replicas_service(&name), standbys, false),
        service(database, ChildNames::headless_service(&name), selector_labels(&name), true),
    ]
}
