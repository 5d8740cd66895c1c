//! Build (pure): the security settings of the pods and containers the operator creates.

use k8s_openapi::api::core::v1::{Capabilities, PodSecurityContext, SeccompProfile, SecurityContext};

/// The container security context of every container the operator creates (database pods and
/// backup Jobs): no privilege escalation, read-only root, non-root, no capabilities.
pub fn restricted_security_context() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(true),
        capabilities: Some(Capabilities { drop: Some(vec!["ALL".into()]), ..Default::default() }),
        ..Default::default()
    }
}

/// The pod security context of the database pods: the image's postgres user (999), a runtime
/// default seccomp profile, and the data volume's group fixed only when its root is wrong.
pub fn database_pod_security_context() -> PodSecurityContext {
    PodSecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(999),
        run_as_group: Some(999),
        fs_group: Some(999),
        // Only walk the volume when its root has the wrong group: a large data directory is
        // not re-chowned on every start, and pgdata's mode is left alone.
        fs_group_change_policy: Some("OnRootMismatch".into()),
        seccomp_profile: Some(SeccompProfile { type_: "RuntimeDefault".into(), ..Default::default() }),
        ..Default::default()
    }
}
