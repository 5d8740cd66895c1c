//! The two checkers every fault runs under. The Service writer (`failover::start_writer`) commits
//! through Service `<name>` and logs every acknowledged id: after the fault, every one of them
//! must be on the final primary (always for a switchover and in synchronous mode; counted for an
//! asynchronous failover). The pinned writer keeps one connection per server, whatever its role,
//! and logs each acknowledged commit with the server, the server's commit time and its timeline:
//! no server may acknowledge a commit while another one is primary (no overlapping writable
//! servers), whichever route a client takes.

use crate::environment::RealNode;
use crate::failover::DATABASE;
use crate::support::eventually;
use k8s_openapi::api::core::v1::Pod;
use kube::api::PostParams;
use kube::Api;
use std::time::Duration;

const PINNED_WRITER: &str = "pinned-writer";

/// One connection per server, re-established when it drops; one line per acknowledged commit:
/// `commit <server> <epoch seconds> <timeline>` (psql prints a RETURNING row only once the
/// autocommit has completed, and flushes after each statement). A standby refuses every insert.
const PINNED_WRITER_SCRIPT: &str = r#"
export PGCONNECT_TIMEOUT=2
# A connection to a server whose pod vanished fails within seconds instead of TCP's minutes.
TCP_TIMEOUTS="tcp_user_timeout=3000 keepalives_idle=1 keepalives_interval=1 keepalives_count=2"
until psql -h "$DATABASE.$NAMESPACE.svc" -X -q -c "create table if not exists pinned (server text, at timestamptz)"; do sleep 1; done
echo ready
pin() {
  server="$1"
  while :; do
    while :; do
      echo "insert into pinned values ('$server', clock_timestamp()) returning 'commit', server, extract(epoch from at), ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int;"
      sleep 0.1
    done | psql "host=$server.$DATABASE-headless.$NAMESPACE.svc $TCP_TIMEOUTS" -X -q -A -t -F ' ' 2>/dev/null
    sleep 0.3
  done
}
for ((ordinal = 0; ordinal < INSTANCES; ordinal++)); do pin "$DATABASE-$ordinal" & done
wait
"#;

/// Starts the pinned writer against `instances` servers and waits until it commits.
pub async fn start_pinned_writer(client: &kube::Client, node: &RealNode, namespace: &str, instances: usize) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let secret = format!("{DATABASE}-credentials");
    let from_secret = |variable: &str, key: &str| serde_json::json!({"name": variable, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}});
    let mut pod = serde_json::json!({
        "metadata": {"name": PINNED_WRITER},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": {"runAsNonRoot": true, "runAsUser": 999},
            "containers": [{
                "name": "writer",
                "image": node.postgres_image,
                "command": ["/bin/bash", "-c", PINNED_WRITER_SCRIPT],
                "env": [
                    from_secret("PGUSER", "username"),
                    from_secret("PGPASSWORD", "password"),
                    from_secret("PGDATABASE", "database"),
                    {"name": "DATABASE", "value": DATABASE},
                    {"name": "NAMESPACE", "value": namespace},
                    {"name": "INSTANCES", "value": instances.to_string()},
                    {"name": "PGSSLMODE", "value": "verify-full"},
                ],
            }],
        }
    });
    crate::environment::trust_database_ca(&mut pod, DATABASE);
    let pod: Pod = serde_json::from_value(pod).unwrap();
    pods.create(&PostParams::default(), &pod).await.expect("pinned writer pod created");
    eventually("the pinned writer committing", Duration::from_secs(120), || async {
        (pinned_log(namespace).len() >= 10).then_some(())
    })
    .await;
}

/// One commit the pinned writer saw acknowledged.
#[derive(Clone, Debug, PartialEq)]
pub struct PinnedCommit {
    /// The server (instance) it was sent to.
    pub server: String,
    /// The server's clock at the insert (every pod runs on this one machine: one clock).
    pub at: f64,
    /// The server's timeline.
    pub timeline: u32,
}

/// The pinned writer's acknowledged commits so far (none while its container starts).
pub fn pinned_log(namespace: &str) -> Vec<PinnedCommit> {
    parse_pinned(&crate::environment::pod_logs(namespace, PINNED_WRITER))
}

fn parse_pinned(text: &str) -> Vec<PinnedCommit> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            (fields.next()? == "commit").then_some(())?;
            Some(PinnedCommit {
                server: fields.next()?.to_string(),
                at: fields.next()?.parse().ok()?,
                timeline: fields.next()?.parse().ok()?,
            })
        })
        .collect()
}

/// A stretch of commits one server acknowledged on one timeline: one term as primary.
#[derive(Clone, Debug, PartialEq)]
pub struct Term {
    /// The server.
    pub server: String,
    /// Its timeline.
    pub timeline: u32,
    /// First commit.
    pub first: f64,
    /// Last commit.
    pub last: f64,
    /// Commits in it.
    pub commits: usize,
}

/// The terms in `commits`, ordered by their first commit.
pub fn terms(commits: &[PinnedCommit]) -> Vec<Term> {
    let mut terms: Vec<Term> = Vec::new();
    for commit in commits {
        match terms.iter_mut().find(|term| term.server == commit.server && term.timeline == commit.timeline) {
            Some(term) => {
                term.first = term.first.min(commit.at);
                term.last = term.last.max(commit.at);
                term.commits += 1;
            }
            None => terms.push(Term {
                server: commit.server.clone(),
                timeline: commit.timeline,
                first: commit.at,
                last: commit.at,
                commits: 1,
            }),
        }
    }
    terms.sort_by(|left, right| left.first.total_cmp(&right.first));
    terms
}

/// Pairs of terms of different servers that overlap in time: two writable primaries.
pub fn overlaps(terms: &[Term]) -> Vec<(Term, Term)> {
    let mut found = Vec::new();
    for (index, earlier) in terms.iter().enumerate() {
        for later in &terms[index + 1..] {
            if later.server != earlier.server && later.first <= earlier.last {
                found.push((earlier.clone(), later.clone()));
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn commit(server: &str, at: f64, timeline: u32) -> PinnedCommit {
        PinnedCommit { server: server.into(), at, timeline }
    }

    #[test]
    fn the_log_is_read_line_by_line_and_noise_is_skipped() {
        let text = "ready\ncommit ha-0 1000.5 1\nERROR: read-only\ncommit ha-1 1001.25 2\ncommit broken\n";
        assert_eq!(parse_pinned(text), vec![commit("ha-0", 1000.5, 1), commit("ha-1", 1001.25, 2)]);
    }

    #[test]
    fn a_clean_hand_over_has_no_overlap() {
        let log = [commit("ha-0", 1.0, 1), commit("ha-0", 2.0, 1), commit("ha-1", 3.0, 2), commit("ha-1", 4.0, 2)];
        let terms = terms(&log);
        assert_eq!(terms.len(), 2);
        assert_eq!((terms[0].server.as_str(), terms[0].commits), ("ha-0", 2));
        assert!(overlaps(&terms).is_empty());
    }

    #[test]
    fn an_old_primary_committing_after_the_new_one_began_is_an_overlap() {
        let log = [commit("ha-0", 1.0, 1), commit("ha-1", 3.0, 2), commit("ha-0", 3.5, 1), commit("ha-1", 4.0, 2)];
        let found = overlaps(&terms(&log));
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!((found[0].0.server.as_str(), found[0].1.server.as_str()), ("ha-0", "ha-1"));
    }

    #[test]
    fn a_server_primary_again_on_a_later_timeline_is_a_new_term() {
        let log = [commit("ha-0", 1.0, 1), commit("ha-1", 2.0, 2), commit("ha-0", 3.0, 3)];
        let terms = terms(&log);
        assert_eq!(terms.len(), 3);
        assert!(overlaps(&terms).is_empty());
    }
}
