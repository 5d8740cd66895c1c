//! What the primary's agent keeps of a DatabaseService: `spec.roles`, `spec.databases`, and the
//! pooler's role and `auth_query` function (issue 25). Apart from [`crate::api::database_service`]
//! because it needs the children's names, which need the DatabaseService.

use crate::api::database_service::DatabaseService;
use crate::api::names::ChildNames;
use crate::api::pooler::{AUTH_PASSWORD_KEY, POOLER_ROLE};
use crate::api::roles::{Declarations, PasswordSecret, RoleSpec};

/// [`DatabaseServiceSpec::declarations`](crate::api::database_service::DatabaseServiceSpec::declarations),
/// plus with `spec.pooler` the pooler's role (its password from Secret NAME-pooler) and the
/// databases that get its `auth_query` function.
pub fn declarations(database: &DatabaseService) -> Declarations {
    let spec = &database.spec;
    let mut declarations = spec.declarations();
    if spec.pooler.is_some() {
        let name = database.metadata.name.clone().unwrap_or_default();
        declarations.roles.push(RoleSpec {
            name: POOLER_ROLE.into(),
            login: Some(true),
            password_secret: Some(PasswordSecret {
                name: ChildNames::pooler(&name),
                key: Some(AUTH_PASSWORD_KEY.into()),
            }),
            ..Default::default()
        });
        declarations.pooled_databases = std::iter::once(spec.database_name.clone())
            .chain(spec.databases.iter().filter(|database| database.present()).map(|database| database.name.clone()))
            .collect();
    }
    declarations
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pooler_adds_its_role_and_the_pooled_databases() {
        let database: DatabaseService = serde_json::from_value(serde_json::json!({
            "apiVersion": "dbservice.dev/v1", "kind": "DatabaseService", "metadata": {"name": "orders"},
            "spec": {"version": "16", "storageSize": "1Gi", "databaseName": "app", "username": "app_user",
                     "databases": [{"name": "reports"}, {"name": "old", "ensure": "absent"}], "pooler": {}}
        }))
        .unwrap();
        let kept = declarations(&database);
        let role = kept.roles.last().unwrap();
        assert_eq!(role.name, "dbservice_pooler");
        assert_eq!(role.password_secret.as_ref().unwrap().name, "orders-pooler");
        assert_eq!(kept.pooled_databases, ["app", "reports"]);
        let mut without = database.clone();
        without.spec.pooler = None;
        assert_eq!(declarations(&without), without.spec.declarations());
    }
}
