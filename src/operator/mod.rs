//! The operator: the controllers that only the leader runs. [`database`] turns each
//! DatabaseService into a running PostgreSQL and keeps it that way; [`backup`] runs the backups a
//! DatabaseServiceBackup or a schedule asks for. Both read the shared [`caches`] and write through
//! the same ledger, events and expectations. [`leader`] decides who leads.

pub mod backup;
pub mod caches;
pub mod conditions;
pub mod context;
pub mod database;
pub mod events;
pub mod expectations;
pub mod journal;
pub mod leader;
pub mod ledger;
pub mod publish;
pub mod server_side_apply;
pub mod status_view;
pub mod wiring;
