//! Build (pure): the kubelet's probes of the PostgreSQL container.

use crate::api::pod::POSTGRES_PORT;
use k8s_openapi::api::core::v1::{ExecAction, Probe};

/// Readiness: PostgreSQL accepts connections.
pub fn readiness_probe() -> Probe {
    pg_isready_probe(5, 10, 3)
}

/// Liveness, only without the instance agent: with it, PostgreSQL is down on purpose at times
/// (fenced, waiting to rejoin, being rewound), the agent supervises it, and a kubelet restart
/// would only fight the agent.
pub fn liveness_probe(with_agent: bool) -> Option<Probe> {
    (!with_agent).then(|| pg_isready_probe(30, 10, 6))
}

fn pg_isready_probe(initial_delay: i32, period: i32, failure_threshold: i32) -> Probe {
    Probe {
        exec: Some(ExecAction {
            command: Some(vec![
                "/bin/sh".into(),
                "-c".into(),
                // Through the Unix socket: over TCP the superuser is refused by pg_hba.conf (issue
                // 37), and each probe left two FATAL lines in the server's log (issue 39).
                format!("exec pg_isready -h /var/run/postgresql -p {POSTGRES_PORT} -U \"$POSTGRES_USER\" -d \"$POSTGRES_DB\""),
            ]),
        }),
        initial_delay_seconds: Some(initial_delay),
        period_seconds: Some(period),
        timeout_seconds: Some(5),
        failure_threshold: Some(failure_threshold),
        ..Default::default()
    }
}
