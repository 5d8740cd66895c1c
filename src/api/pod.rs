//! The contract between the operator and the database pods it builds: where the data and the
//! agent's binary live, the port, the replication role, the restart stamp. Both sides read these.

/// PostgreSQL port.
pub const POSTGRES_PORT: i32 = 5432;
/// Port of the instance agent's `/metrics` (PostgreSQL in Prometheus; 9187 as postgres_exporter).
pub const METRICS_PORT: i32 = 9187;
/// Where the credentials Secret's passwords are mounted as files (application, replication).
pub const CREDENTIALS_DIRECTORY: &str = "/dbservice/credentials";
/// Where the replication Secret's password is mounted as a file.
pub const REPLICATION_DIRECTORY: &str = "/dbservice/replication";
/// Where the superuser Secret's password is mounted as a file.
pub const SUPERUSER_DIRECTORY: &str = "/dbservice/superuser";
/// Where the server certificate Secret is mounted (tls.crt, tls.key, ca.crt).
pub const TLS_DIRECTORY: &str = "/dbservice/tls";
/// The superuser role (the application's role is never one).
pub const SUPERUSER: &str = "postgres";
/// Role used by standbys to stream from the primary.
pub const REPLICATION_USER: &str = "replicator";
/// Pod-template annotation whose change restarts every pod (like `kubectl rollout restart`).
pub const RESTART_ANNOTATION: &str = "dbservice.dev/restartedAt";
/// Pod-template annotation: the fingerprint of the parameters whose change takes a restart
/// ([`crate::api::postgresql::restart_parameters`]); its change rolls the instances, standbys first.
pub const RESTART_PARAMETERS_ANNOTATION: &str = "dbservice.dev/restart-parameters";
/// Where PostgreSQL keeps its data inside the data volume (a subdirectory, so lost+found is no problem).
pub const PGDATA: &str = "/var/lib/postgresql/data/pgdata";
/// emptyDir the init container copies the instance agent into (shared convention of the pod template).
pub const AGENT_VOLUME: &str = "dbservice-bin";
/// Where [`AGENT_VOLUME`] is mounted in the init and postgres containers.
pub const AGENT_DIRECTORY: &str = "/dbservice/bin";

/// The environment variable of a standby's `restore_command` (the archive's `wal-restore`), set
/// with archiving by the operator and read by the instance agent.
pub const STANDBY_RESTORE_COMMAND_VARIABLE: &str = "DBSERVICE_STANDBY_RESTORE_COMMAND";
/// The init container that copies the agent.
pub const AGENT_INIT_CONTAINER: &str = "install-dbservice";
/// Path of the operator binary in the operator image.
pub const OPERATOR_BINARY: &str = "/usr/local/bin/dbservice-operator";
