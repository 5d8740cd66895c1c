//! `kubectl dbservice report NAME`: a support bundle of one DatabaseService (its object, Events,
//! ledger, child objects, Secrets' names and keys, the instances' and the operator's logs) in one
//! text, with every value of the Secrets it names replaced by `<redacted>`, wherever it appears.

use crate::api::database_service::DatabaseService;
use crate::api::names::ChildNames;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Event, PersistentVolumeClaim, Pod, Secret, Service};
use kube::api::{ListParams, LogParams};
use kube::{Api, Client, ResourceExt};
use std::collections::BTreeSet;
use std::fmt::Write;

/// What replaces a Secret's value in the bundle.
pub const REDACTED: &str = "<redacted>";
/// Lines of each container's log in the bundle.
const LOG_LINES: i64 = 400;
/// Keys whose values are names and public material, not secrets: not searched for in the bundle
/// (a username `postgres` would blank every mention of the server). Shown redacted all the same.
const NOT_SECRET_KEYS: [&str; 8] = ["username", "user", "database", "dbname", "host", "port", "ca.crt", "tls.crt"];
/// Values shorter than this are not searched for (a `1` or `true` would blank the bundle); they
/// still never appear as Secret values, which are all written as [`REDACTED`].
const SHORTEST_REDACTED: usize = 6;

/// The report could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// No such DatabaseService.
    #[error("no DatabaseService {name:?} in namespace {namespace:?}")]
    NotFound { name: String, namespace: String },
    /// Reading the DatabaseService failed (not allowed, unreachable).
    #[error("cannot read DatabaseService {name:?} in namespace {namespace:?}: {source}")]
    Read { name: String, namespace: String, source: kube::Error },
}

/// `text` with every occurrence of each of `secrets` (of at least [`SHORTEST_REDACTED`] bytes)
/// replaced by [`REDACTED`], longest first (a value inside another is not left half-shown).
pub fn redact(text: &str, secrets: &BTreeSet<String>) -> String {
    let mut values: Vec<&String> = secrets.iter().filter(|value| value.len() >= SHORTEST_REDACTED).collect();
    values.sort_by_key(|value| std::cmp::Reverse(value.len()));
    values.iter().fold(text.to_string(), |text, value| text.replace(value.as_str(), REDACTED))
}

/// The Secret as the bundle shows it: its name, type, labels and keys, each value redacted; its
/// values (as text, and every line of multi-line ones) added to `values`.
fn shown_secret(secret: &Secret, values: &mut BTreeSet<String>) -> String {
    let mut shown = format!("Secret {} (type {})\n", secret.name_any(), secret.type_.as_deref().unwrap_or("-"));
    for (key, value) in secret.data.iter().flatten() {
        if !NOT_SECRET_KEYS.contains(&key.as_str()) {
            let text = String::from_utf8_lossy(&value.0).to_string();
            values.extend(text.lines().map(|line| line.trim().to_string()));
            values.insert(text);
        }
        let _ = writeln!(shown, "  {key}: {REDACTED} ({} bytes)", value.0.len());
    }
    shown
}

/// The bundle of `name` in `namespace`.
pub async fn report(client: Client, namespace: &str, name: &str) -> Result<String, ReportError> {
    let databases: Api<DatabaseService> = Api::namespaced(client.clone(), namespace);
    let not_found = || ReportError::NotFound { name: name.into(), namespace: namespace.into() };
    let mut database = databases
        .get_opt(name)
        .await
        .map_err(|source| ReportError::Read { name: name.into(), namespace: namespace.into(), source })?
        .ok_or_else(not_found)?;
    database.metadata.managed_fields = None;
    let mut bundle = format!("# dbservice report of DatabaseService {namespace}/{name}\n");
    section(&mut bundle, "DatabaseService", yaml(&database));
    let mut secret_values = BTreeSet::new();
    section(&mut bundle, "Secrets (values redacted)", secrets(&client, namespace, &database, &mut secret_values).await);
    section(&mut bundle, "Events", events(&client, namespace, name).await);
    let ledger = Api::<ConfigMap>::namespaced(client.clone(), namespace).get_opt(&ChildNames::ledger(name)).await;
    section(&mut bundle, "Ledger", shown(ledger.map(|ledger| ledger.map(|map| yaml(&map.data)).unwrap_or_default())));
    section(&mut bundle, "Objects", children(&client, namespace, name).await);
    section(&mut bundle, "Instance logs", instance_logs(&client, namespace, name).await);
    section(&mut bundle, "Operator logs", operator_logs(&client).await);
    Ok(redact(&bundle, &secret_values))
}

fn section(bundle: &mut String, title: &str, body: String) {
    let _ = write!(bundle, "\n==== {title}\n{body}");
    if !bundle.ends_with('\n') {
        bundle.push('\n');
    }
}

fn yaml(value: &impl serde::Serialize) -> String {
    crate::api::yaml::to_string(value).unwrap_or_else(|error| format!("(not serializable: {error})\n"))
}

/// A result as text: its value, or why it could not be read (the bundle goes on).
fn shown(result: Result<String, kube::Error>) -> String {
    result.unwrap_or_else(|error| format!("(not readable: {error})\n"))
}

/// Every Secret labelled as the database's, and every Secret its spec names (roles' passwords,
/// the object stores' keys, the server certificate).
async fn secrets(
    client: &Client,
    namespace: &str,
    database: &DatabaseService,
    values: &mut BTreeSet<String>,
) -> String {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let selector = format!("app.kubernetes.io/instance={}", database.name_any());
    let mut names: BTreeSet<String> = match api.list(&ListParams::default().labels(&selector)).await {
        Ok(list) => list.items.iter().map(|secret| secret.name_any()).collect(),
        Err(error) => return format!("(not readable: {error})\n"),
    };
    names.extend(
        crate::admission::secret_access::referenced_secrets(&database.spec)
            .into_iter()
            .filter(|reference| reference.kind == crate::admission::secret_access::ReferencedKind::Secret)
            .map(|reference| reference.name),
    );
    let mut shown_all = String::new();
    for name in names {
        match api.get_opt(&name).await {
            Ok(Some(secret)) => shown_all.push_str(&shown_secret(&secret, values)),
            Ok(None) => {
                let _ = writeln!(shown_all, "Secret {name}: not found");
            }
            Err(error) => {
                let _ = writeln!(shown_all, "Secret {name}: not readable ({error})");
            }
        }
    }
    shown_all
}

async fn events(client: &Client, namespace: &str, name: &str) -> String {
    let api: Api<Event> = Api::namespaced(client.clone(), namespace);
    let list = match api.list(&ListParams::default()).await {
        Ok(list) => list.items,
        Err(error) => return format!("(not readable: {error})\n"),
    };
    let mut lines: Vec<(String, String)> = list
        .iter()
        .filter(|event| event.involved_object.name.as_deref().is_some_and(|object| object.starts_with(name)))
        .map(|event| {
            let time = event.last_timestamp.as_ref().map(|time| time.0.to_string()).unwrap_or_default();
            let line = format!(
                "{time} {} {}/{} {}: {}",
                event.type_.as_deref().unwrap_or("-"),
                event.involved_object.kind.as_deref().unwrap_or("-"),
                event.involved_object.name.as_deref().unwrap_or("-"),
                event.reason.as_deref().unwrap_or("-"),
                event.message.as_deref().unwrap_or("").trim()
            );
            (time, line)
        })
        .collect();
    lines.sort();
    lines.into_iter().map(|(_, line)| line + "\n").collect()
}

/// The database's pods, StatefulSet, Services and claims, without their managed fields.
async fn children(client: &Client, namespace: &str, name: &str) -> String {
    let selector = ListParams::default().labels(&format!("app.kubernetes.io/instance={name}"));
    let mut text = String::new();
    text.push_str(&shown(list_yaml::<Pod>(client, namespace, &selector).await));
    text.push_str(&shown(list_yaml::<StatefulSet>(client, namespace, &selector).await));
    text.push_str(&shown(list_yaml::<Service>(client, namespace, &selector).await));
    text.push_str(&shown(list_yaml::<PersistentVolumeClaim>(client, namespace, &selector).await));
    text
}

async fn list_yaml<K>(client: &Client, namespace: &str, selector: &ListParams) -> Result<String, kube::Error>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + serde::Serialize,
    K::DynamicType: Default,
{
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    let mut text = String::new();
    for mut object in api.list(selector).await?.items {
        object.meta_mut().managed_fields = None;
        let _ = write!(text, "--- # {} {}\n{}", K::kind(&K::DynamicType::default()), object.name_any(), yaml(&object));
    }
    Ok(text)
}

async fn instance_logs(client: &Client, namespace: &str, name: &str) -> String {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let selector = ListParams::default().labels(&format!("app.kubernetes.io/instance={name}"));
    match pods.list(&selector).await {
        Ok(list) => pod_logs(&pods, &list.items).await,
        Err(error) => format!("(not readable: {error})\n"),
    }
}

/// The operator's pods, found by their chart label in any namespace (the plugin does not know the
/// release's namespace).
async fn operator_logs(client: &Client) -> String {
    let all: Api<Pod> = Api::all(client.clone());
    let selector = ListParams::default().labels("app.kubernetes.io/name=dbservice-operator");
    let list = match all.list(&selector).await {
        Ok(list) => list.items,
        Err(error) => return format!("(not readable: {error})\n"),
    };
    let mut text = String::new();
    for pod in &list {
        let pods: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace().unwrap_or_default());
        text.push_str(&pod_logs(&pods, std::slice::from_ref(pod)).await);
    }
    if list.is_empty() {
        text.push_str("(no pod labelled app.kubernetes.io/name=dbservice-operator)\n");
    }
    text
}

/// The last [`LOG_LINES`] of every container of `pods`, each line prefixed `[pod/container]`.
async fn pod_logs(pods: &Api<Pod>, list: &[Pod]) -> String {
    let mut text = String::new();
    for pod in list {
        let containers =
            pod.spec.iter().flat_map(|spec| spec.containers.iter().map(|container| container.name.clone()));
        for container in containers.collect::<Vec<_>>() {
            let params =
                LogParams { container: Some(container.clone()), tail_lines: Some(LOG_LINES), ..LogParams::default() };
            let prefix = format!("[{}/{container}] ", pod.name_any());
            match pods.logs(&pod.name_any(), &params).await {
                Ok(log) => log.lines().for_each(|line| {
                    let _ = writeln!(text, "{prefix}{line}");
                }),
                Err(error) => {
                    let _ = writeln!(text, "{prefix}(no log: {error})");
                }
            }
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    #[test]
    fn every_value_of_a_secret_is_redacted_wherever_it_appears() {
        let secret = Secret {
            metadata: kube::api::ObjectMeta { name: Some("orders".into()), ..Default::default() },
            type_: Some("Opaque".into()),
            data: Some(
                [
                    ("password".to_string(), ByteString(b"s3cret-Pa55".to_vec())),
                    ("uri".to_string(), ByteString(b"postgresql://app:s3cret-Pa55@orders:5432/app".to_vec())),
                    (
                        "tls.key".to_string(),
                        ByteString(b"-----BEGIN KEY-----\nAAAABBBBCCCC\n-----END KEY-----\n".to_vec()),
                    ),
                    ("port".to_string(), ByteString(b"5432".to_vec())),
                    ("username".to_string(), ByteString(b"postgres".to_vec())),
                ]
                .into(),
            ),
            ..Default::default()
        };
        let mut values = BTreeSet::new();
        let shown = shown_secret(&secret, &mut values);
        assert!(shown.contains("password: <redacted> (11 bytes)") && !shown.contains("s3cret"), "{shown}");
        let log = "connecting with postgresql://app:s3cret-Pa55@orders:5432/app\nkey line AAAABBBBCCCC\nport 5432\n";
        let redacted = redact(log, &values);
        assert!(!redacted.contains("s3cret") && !redacted.contains("AAAABBBBCCCC"), "{redacted}");
        assert!(redacted.contains("port 5432"), "short values are not searched for: {redacted}");
        assert!(redact("[pg-0/postgres] started", &values).contains("postgres"), "a username is a name, not a secret");
        assert!(shown.contains("username: <redacted>"), "but the Secret's section shows no value at all");
    }
}
