//! `status --output json|yaml`: the status view as data, for scripts (the same fields the
//! screen shows, never a Secret's value: the view reads the Secrets' metadata only).

use crate::operator::status_view::StatusView;
use kube::ResourceExt;
use serde_json::{json, Value};

/// A format for data output.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    /// Indented JSON.
    Json,
    /// YAML.
    Yaml,
}

/// The view as one document: the DatabaseService's name, spec and status, its ledger, its
/// backups' names and statuses, and when its certificates expire.
pub fn status_document(view: &StatusView) -> Value {
    let database = &view.database;
    let backups: Vec<Value> = view
        .backups
        .iter()
        .map(|backup| json!({"name": backup.name_any(), "spec": backup.spec, "status": backup.status}))
        .collect();
    json!({
        "name": database.name_any(),
        "namespace": database.namespace(),
        "spec": database.spec,
        "status": database.status,
        "ledger": view.ledger,
        "backups": backups,
        "certificates": {
            "serverNotAfter": view.server_certificate_not_after,
            "caNotAfter": view.ca_not_after,
        },
    })
}

/// The document in `format`.
pub fn render(view: &StatusView, format: OutputFormat) -> String {
    render_document(&status_document(view), format)
}

/// Any document in `format` (the ledger's and the backups' too).
pub fn render_document(document: &Value, format: OutputFormat) -> String {
    match format {
        OutputFormat::Json => serde_json::to_string_pretty(document).unwrap_or_default() + "\n",
        OutputFormat::Yaml => crate::api::yaml::to_string(document).unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_document_carries_spec_status_ledger_and_certificates() {
        let database = serde_json::from_value(json!({
            "apiVersion": "dbservice.dev/v1", "kind": "DatabaseService",
            "metadata": {"name": "orders", "namespace": "shop"},
            "spec": {"version": "17", "storageSize": "1Gi", "databaseName": "app", "username": "app_user"},
            "status": {"phase": "Running", "currentPrimary": "orders-0"}
        }))
        .unwrap();
        let view = StatusView {
            database,
            ledger: Vec::new(),
            backups: Vec::new(),
            server_certificate_not_after: Some("2027-01-01T00:00:00Z".into()),
            ca_not_after: None,
        };
        let document: Value = serde_json::from_str(&render(&view, OutputFormat::Json)).unwrap();
        assert_eq!(document["status"]["phase"], "Running");
        assert_eq!(document["status"]["currentPrimary"], "orders-0");
        assert_eq!(document["spec"]["version"], "17");
        assert_eq!(document["certificates"]["serverNotAfter"], "2027-01-01T00:00:00Z");
        let yaml = render(&view, OutputFormat::Yaml);
        assert!(yaml.contains("phase: Running") && yaml.contains("name: orders"), "{yaml}");
    }
}
