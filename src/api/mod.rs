//! The API: the CRD types of both kinds (`DatabaseService`, `DatabaseServiceBackup`), their
//! status, the names of the objects made for them, the contract between the operator and the
//! pods it runs (annotations, environment, paths), and the CRD documents generated from the types.
//! Types and pure helpers only: nothing in here talks to a server.

pub mod backup;
pub mod crd;
pub mod database_service;
pub mod database_service_backup;
pub mod declarations;
pub mod failover;
pub mod import;
pub mod major_upgrade;
pub mod monitoring;
pub mod names;
pub mod parameters;
pub mod placement;
pub mod pod;
pub mod pooler;
pub mod postgresql;
pub mod recovery;
pub mod reference;
pub mod roles;
pub mod storage;
pub mod synchronous;
pub mod version;
pub mod yaml;
