//! The object-store engine (issue 12), run in database pods, in backup Jobs and by the operator's
//! commands: continuous WAL archiving ([`wal`]), base backups ([`base`]), point-in-time restore
//! ([`restore`]), the catalogue ([`catalog`]), backup choice ([`selection`]), retention
//! ([`retention`]) and the maintenance commands ([`commands`]).
//!
//! `dbservice-operator wal-archive %p %f` is PostgreSQL's `archive_command` and
//! `dbservice-operator wal-restore %f %p` its `restore_command`. Both are configured by
//! environment variables ([`config::StoreArgs`]) and talk to the store through our own small
//! S3 client ([`client::S3Client`]) on the hyper + rustls stack the operator already ships,
//! with requests signed by `aws-sigv4` (see docs/backups.md for why).

pub mod base;
pub mod catalog;
pub mod client;
pub mod commands;
pub mod compression;
pub mod config;
pub mod inventory;
pub mod keys;
pub mod manifest;
pub mod owner;
pub mod restore;
pub mod retention;
pub mod selection;
pub mod signing;
pub mod wal;
pub mod xml;
