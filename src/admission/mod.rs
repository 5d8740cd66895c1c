//! Admission: the rules every DatabaseService must pass ([`validation`], one pure function shared
//! with the reconciler), the defaults filled in ([`mutation`]), and the HTTPS webhook server that
//! the kube-apiserver calls ([`webhook`], [`server`]) with its limits, connections and certificates.

pub mod backup_validation;
pub mod certificates;
pub mod connections;
pub mod field_error;
pub mod image_reference;
pub mod import_validation;
pub mod key_reference;
pub mod limits;
pub mod monitoring_validation;
pub mod mutation;
pub mod placement_validation;
pub mod pooler_validation;
pub mod postgresql_validation;
pub mod review;
pub mod roles_validation;
pub mod secret_access;
pub mod server;
pub mod tls;
pub mod validation;
pub mod webhook;
