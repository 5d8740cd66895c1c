//! Data volumes: owner references on the PVCs, expansion when spec.storageSize grows, and the
//! StorageReady condition (WaitForFirstConsumer claims are reported Pending, never waited on).

use super::reconcile::Journal;
use crate::api::{DatabaseService, DatabaseServiceStatus, StorageStatus};
use crate::controller::build::{self};
use crate::controller::conditions::{self, types};
use crate::controller::health::{self};
use crate::controller::ledger::LedgerEntry;
use crate::controller::{Context, ReconcileError};
use crate::quantity::parse_bytes;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;

/// Owns each PVC, grows it when spec.storageSize grew (if its class allows), and reports binding.
pub(super) async fn reconcile_claims(
    database: &DatabaseService,
    claims_api: &Api<PersistentVolumeClaim>,
    claims: &[PersistentVolumeClaim],
    status: &mut DatabaseServiceStatus,
    journal: &mut Journal,
    context: &Context,
) -> Result<(), ReconcileError> {
    let generation = database.metadata.generation.unwrap_or(0);
    let owner = build::owner_reference(database);
    let wanted_bytes = parse_bytes(&database.spec.storage_size).unwrap_or(0);
    let mut expansion_refused = Vec::new();
    for claim in claims {
        let claim_name = claim.name_any();
        let owned = claim.owner_references().iter().any(|reference| reference.uid == owner.uid);
        if !owned && claim.metadata.deletion_timestamp.is_none() {
            let mut references = claim.owner_references().to_vec();
            references.push(k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                controller: Some(false),
                ..owner.clone()
            });
            claims_api
                .patch(
                    &claim_name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"ownerReferences": references}})),
                )
                .await?;
            context.metrics.count_write("PersistentVolumeClaim", "patch");
        }
        let requested = claim
            .spec
            .as_ref()
            .and_then(|spec| {
                spec.resources.as_ref()?.requests.as_ref()?.get("storage").map(|quantity| quantity.0.clone())
            })
            .unwrap_or_default();
        if parse_bytes(&requested).unwrap_or(0) >= wanted_bytes {
            continue;
        }
        let class_name = claim.spec.as_ref().and_then(|spec| spec.storage_class_name.clone()).unwrap_or_default();
        let classes: Api<StorageClass> = Api::all(context.client.clone());
        let expandable =
            classes.get_opt(&class_name).await?.and_then(|class| class.allow_volume_expansion).unwrap_or(false);
        if !expandable {
            expansion_refused
                .push(format!("{claim_name} (StorageClass {class_name:?} does not allow volume expansion)"));
            continue;
        }
        claims_api
            .patch(
                &claim_name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"resources": {"requests": {"storage": database.spec.storage_size}}}})),
            )
            .await?;
        context.metrics.count_write("PersistentVolumeClaim", "patch");
        journal.record(
            false,
            "StorageExpanded",
            format!("PVC {claim_name} expanded from {requested} to {}", database.spec.storage_size),
            Some(LedgerEntry::now(
                generation,
                "StorageExpanded",
                requested.clone(),
                database.spec.storage_size.clone(),
                claim_name.clone(),
            )),
        );
    }
    let expected = database.spec.replicas_or_default().min(status.degraded_replicas.unwrap_or(i32::MAX));
    let bound = health::claims_bound(claims);
    status.storage = Some(StorageStatus {
        requested: database.spec.storage_size.clone(),
        bound_claims: bound,
        expected_claims: expected,
    });
    if !expansion_refused.is_empty() {
        let message = format!("cannot grow {}", expansion_refused.join(", "));
        if !status
            .conditions
            .iter()
            .any(|condition| condition.type_ == types::STORAGE_READY && condition.reason == "ExpansionNotSupported")
        {
            journal.record(true, "ExpansionNotSupported", message.clone(), None);
        }
        conditions::set(
            &mut status.conditions,
            types::STORAGE_READY,
            false,
            "ExpansionNotSupported",
            message,
            Some(generation),
        );
    } else if bound >= expected {
        conditions::set(
            &mut status.conditions,
            types::STORAGE_READY,
            true,
            "Bound",
            format!("{bound} of {expected} volumes bound"),
            Some(generation),
        );
    } else {
        conditions::set(
            &mut status.conditions,
            types::STORAGE_READY,
            false,
            "Pending",
            format!("{bound} of {expected} volumes bound (claims of a WaitForFirstConsumer class bind once their pod is scheduled)"),
            Some(generation),
        );
    }
    Ok(())
}
