//! The controllers of one process, run while it leads: per leadership term, the DatabaseService
//! controller and the backup controller, which shares its DatabaseService cache.

use crate::operator::context::Context;
use crate::operator::leader::run_each_term;
use futures::FutureExt;
use kube::Client;
use std::sync::Arc;
use tokio::sync::watch;

/// Runs the DatabaseService controller and the backup controller while `leader` is true; stops
/// within moments of losing leadership (passes in flight are cancelled before they write again)
/// and starts again when it comes back. Returns when `shutdown` turns true.
pub async fn run_while_leader(
    client: Client,
    context: Arc<Context>,
    leader: watch::Receiver<bool>,
    shutdown: watch::Receiver<bool>,
) {
    let leading = leader.clone();
    run_each_term("controllers", leader, shutdown, |end| {
        let (databases, subscription) =
            crate::operator::database::wiring::term(&client, &context, leading.clone(), &end);
        let backups = crate::operator::backup::term(&client, &context, leading.clone(), subscription, end.clone());
        futures::future::join(databases, backups).map(|_| ())
    })
    .await
}

/// The event publisher for this process.
pub fn recorder(client: Client, identity: &str) -> crate::operator::events::EventPublisher {
    crate::operator::events::EventPublisher::new(client, "dbservice-operator", identity)
}
