//! Build (pure): what the instance agents of one database may do in the API, and the primary Lease
//! they contend for. Least privilege: read and watch their one DatabaseService, publish reports on
//! the instances' own pods, read and replace the one Lease; nothing else.

use crate::api::database_service::{DatabaseService, GROUP, MAX_REPLICAS};
use crate::api::names::primary_lease_name;
use crate::api::names::{labels, owner_reference, ChildNames};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;

/// The agents' account, its Role and binding, and the primary Lease.
#[derive(Clone, Debug)]
pub struct InstanceAccess {
    /// ServiceAccount NAME-instance.
    pub service_account: ServiceAccount,
    /// Role NAME-instance.
    pub role: Role,
    /// RoleBinding NAME-instance.
    pub role_binding: RoleBinding,
    /// Lease NAME-primary, metadata only: its holder is the agents' business.
    pub lease: Lease,
}

fn metadata(database: &DatabaseService, name: String) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: database.namespace(),
        labels: Some(labels(&database.name_any())),
        owner_references: Some(vec![owner_reference(database)]),
        ..Default::default()
    }
}

fn rule(group: &str, resource: &str, names: Vec<String>, verbs: &[&str]) -> PolicyRule {
    PolicyRule {
        api_groups: Some(vec![group.into()]),
        resources: Some(vec![resource.into()]),
        resource_names: Some(names),
        verbs: verbs.iter().map(|verb| verb.to_string()).collect(),
        ..Default::default()
    }
}

/// `get` on the password Secrets `spec.roles` names (the primary's agent sets them as the roles'
/// passwords); admission checked that the author may read them.
fn password_secrets_rule(database: &DatabaseService) -> Option<PolicyRule> {
    let mut names =
        crate::api::roles::Declarations::password_secrets(&crate::api::declarations::declarations(database).roles);
    // The import source's password (spec.bootstrap.import), read by the first primary's agent.
    let import = database.spec.bootstrap.as_ref().and_then(|bootstrap| bootstrap.import.as_ref());
    if let Some(import) = import {
        if !names.contains(&import.source.password_secret.name) {
            names.push(import.source.password_secret.name.clone());
        }
    }
    (!names.is_empty()).then(|| rule("", "secrets", names, &["get"]))
}

/// `get` on the ConfigMaps of `spec.monitoring.customQueries` (the agents run their queries).
fn query_config_maps_rule(database: &DatabaseService) -> Option<PolicyRule> {
    let names = database.spec.monitoring.as_ref().map(|monitoring| monitoring.config_maps()).unwrap_or_default();
    (!names.is_empty()).then(|| rule("", "configmaps", names, &["get"]))
}

/// Builds the agents' access for `database`. The pod names cover every possible instance, so the
/// Role does not change when the database scales.
pub fn instance_access(database: &DatabaseService) -> InstanceAccess {
    let name = database.name_any();
    let account = ChildNames::instance_account(&name);
    let pods = (0..MAX_REPLICAS).map(|ordinal| format!("{name}-{ordinal}")).collect();
    InstanceAccess {
        service_account: ServiceAccount {
            metadata: metadata(database, account.clone()),
            automount_service_account_token: Some(false),
            ..Default::default()
        },
        role: Role {
            metadata: metadata(database, account.clone()),
            rules: Some(
                vec![
                    // The operator's wishes: status.currentPrimary/targetPrimary, the fencing annotation,
                    // watched (list and watch with a metadata.name field selector: this object only).
                    rule(GROUP, "databaseservices", vec![name.clone()], &["get", "list", "watch"]),
                    // The report annotation on the instance's own pod (patch; get for kubectl-like reads).
                    rule("", "pods", pods, &["get", "patch"]),
                    // The primary Lease: compare-and-swap with update (resourceVersion).
                    rule("coordination.k8s.io", "leases", vec![primary_lease_name(&name)], &["get", "update"]),
                ]
                .into_iter()
                .chain(password_secrets_rule(database))
                .chain(query_config_maps_rule(database))
                .collect(),
            ),
        },
        role_binding: RoleBinding {
            metadata: metadata(database, account.clone()),
            role_ref: RoleRef {
                api_group: Some("rbac.authorization.k8s.io".into()),
                kind: "Role".into(),
                name: account.clone(),
            },
            subjects: Some(vec![Subject {
                kind: "ServiceAccount".into(),
                name: account,
                namespace: database.namespace(),
                ..Default::default()
            }]),
        },
        lease: Lease { metadata: metadata(database, primary_lease_name(&name)), spec: None },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agents_get_only_their_database_pods_and_lease() {
        let mut database = DatabaseService::new("db", Default::default());
        database.metadata.namespace = Some("ns".into());
        database.metadata.uid = Some("uid".into());
        let access = instance_access(&database);
        let rules = access.role.rules.unwrap();
        assert_eq!(rules.len(), 3);
        for rule in &rules {
            assert!(!rule
                .verbs
                .iter()
                .any(|verb| ["create", "delete", "deletecollection", "*"].contains(&verb.as_str())));
            assert!(rule.resource_names.as_ref().is_some_and(|names| !names.is_empty()));
        }
        assert_eq!(rules[1].resource_names.as_ref().unwrap().len(), MAX_REPLICAS as usize);
        assert_eq!(rules[2].resource_names.as_deref(), Some(&["db-primary".to_string()][..]));
        assert_eq!(access.role_binding.subjects.unwrap()[0].name, "db-instance");
        assert_eq!(access.lease.metadata.name.as_deref(), Some("db-primary"));
    }

    #[test]
    fn agents_may_get_exactly_the_password_secrets_the_roles_name() {
        use crate::api::roles::{PasswordSecret, RoleSpec};
        let secret = |name: &str| Some(PasswordSecret { name: name.into(), key: Some("key".into()) });
        let mut database = DatabaseService::new("db", Default::default());
        database.metadata.namespace = Some("ns".into());
        database.metadata.uid = Some("uid".into());
        assert!(instance_access(&database)
            .role
            .rules
            .unwrap()
            .iter()
            .all(|rule| rule.resources.as_deref() != Some(&["secrets".to_string()][..])));
        database.spec.roles = vec![
            RoleSpec { name: "a".into(), password_secret: secret("shared"), ..Default::default() },
            RoleSpec { name: "b".into(), password_secret: secret("shared"), ..Default::default() },
            RoleSpec { name: "c".into(), password_secret: secret("own"), ..Default::default() },
            RoleSpec { name: "d".into(), ..Default::default() },
        ];
        let rules = instance_access(&database).role.rules.unwrap();
        let secrets =
            rules.iter().find(|rule| rule.resources.as_deref() == Some(&["secrets".to_string()][..])).unwrap();
        assert_eq!(secrets.resource_names.as_deref(), Some(&["own".to_string(), "shared".to_string()][..]));
        assert_eq!(secrets.verbs, vec!["get".to_string()]);
        database.spec.monitoring = Some(crate::api::monitoring::MonitoringSpec {
            custom_queries: vec![crate::api::monitoring::ConfigMapKeyReference { name: "queries".into(), key: None }],
        });
        let rules = instance_access(&database).role.rules.unwrap();
        let config_maps =
            rules.iter().find(|rule| rule.resources.as_deref() == Some(&["configmaps".to_string()][..])).unwrap();
        assert_eq!(config_maps.resource_names.as_deref(), Some(&["queries".to_string()][..]));
        // The import source's password joins them (once).
        database.spec.bootstrap = Some(crate::api::backup::BootstrapSpec {
            import: Some(crate::api::import::ImportSpec {
                source: crate::api::import::ImportSource {
                    password_secret: crate::api::roles::PasswordSecret { name: "legacy".into(), key: None },
                    ..Default::default()
                },
                databases: vec!["app".into()],
                roles: None,
            }),
            ..Default::default()
        });
        let rules = instance_access(&database).role.rules.unwrap();
        let secrets =
            rules.iter().find(|rule| rule.resources.as_deref() == Some(&["secrets".to_string()][..])).unwrap();
        let names = secrets.resource_names.as_deref().unwrap();
        assert_eq!(names, ["own".to_string(), "shared".to_string(), "legacy".to_string()]);
    }
}
