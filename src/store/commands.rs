//! The store's maintenance commands, run by hand or by a CronJob against an object store:
//! `dbservice-operator backup-list` and `backup-prune`.

use chrono::Utc;

/// Why `backup-list` or `backup-prune` failed.
#[derive(Debug, thiserror::Error)]
pub enum BackupCommandError {
    /// Bad settings.
    #[error(transparent)]
    Config(#[from] crate::store::config::StoreConfigError),
    /// The store could not be read.
    #[error(transparent)]
    Catalog(#[from] crate::store::catalog::CatalogError),
    /// Retention failed halfway.
    #[error(transparent)]
    Retention(#[from] crate::store::retention::EnforceRetentionError),
}

/// `dbservice-operator backup-list`: one JSON document with the backups (without their chunk
/// lists) and the recoverable window.
pub async fn list_command(args: crate::store::config::ListBackupsArgs) -> Result<(), BackupCommandError> {
    let (client, layout) = args.store.connect()?;
    let backups = crate::store::catalog::list_backups(&client, &layout).await?;
    let wal = crate::store::catalog::list_wal(&client, &layout).await?;
    let window = crate::store::catalog::recoverable_window(&backups, &wal);
    let backups: Vec<serde_json::Value> = backups
        .iter()
        .map(|backup| {
            let mut value = serde_json::to_value(backup).expect("a manifest serializes");
            value.as_object_mut().expect("an object").remove("chunks");
            value
        })
        .collect();
    let document = serde_json::json!({ "backups": backups, "walFiles": wal.len(), "recoverableWindow": window });
    println!("{}", serde_json::to_string_pretty(&document).expect("json serializes"));
    Ok(())
}

/// `dbservice-operator backup-prune`: prints what was (or, with --dry-run, would be) deleted.
pub async fn prune_command(args: crate::store::config::PruneBackupsArgs) -> Result<(), BackupCommandError> {
    let (client, layout) = args.store.connect()?;
    let now = args.at.unwrap_or_else(Utc::now);
    let plan = if args.dry_run {
        let backups = crate::store::catalog::list_backups(&client, &layout).await?;
        let wal: Vec<String> =
            crate::store::catalog::list_wal(&client, &layout).await?.into_iter().map(|object| object.key).collect();
        let base = client
            .list_objects(&layout.base_prefix())
            .await
            .map_err(crate::store::retention::EnforceRetentionError::from)?;
        let abandoned_backups = crate::store::retention::abandoned_backups(&base, &layout.base_prefix(), now);
        crate::store::retention::RetentionPlan {
            abandoned_backups,
            ..crate::store::retention::plan(&backups, &wal, args.retention, now)
        }
    } else {
        crate::store::retention::enforce(&client, &layout, args.retention, now).await?
    };
    let document = serde_json::json!({
        "dryRun": args.dry_run,
        "at": now,
        "expiredBackups": plan.expired_backups,
        "expiredWal": plan.expired_wal,
        "abandonedBackups": plan.abandoned_backups,
    });
    println!("{}", serde_json::to_string_pretty(&document).expect("json serializes"));
    Ok(())
}
