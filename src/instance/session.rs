//! Sessions of the agent (and of the tools it runs) on the local server as the superuser or
//! another privileged role (issue 37, CVE-2018-1058). The application's role owns its databases:
//! it can create functions and operators in their `public` schema and put that schema first with
//! `ALTER DATABASE ... SET search_path`. So every privileged session pins
//! `search_path = pg_catalog, pg_temp` in its startup packet (client options outrank database
//! and role settings, and apply before the first statement), its SQL names `pg_catalog.`
//! functions, and lock and statement timeouts keep a lock held by the application from stalling
//! failover, declared objects or upgrades.

use std::path::Path;
use std::time::Duration;

pub use crate::postgres_tls::{tool_options, SEARCH_PATH};

/// Longest wait for a lock: an application holding one fails the step (it is retried) instead
/// of stalling the agent.
pub const LOCK_TIMEOUT: Duration = Duration::from_secs(5);

/// Longest a privileged session may sit in a transaction it forgot (its locks go with it).
pub const IDLE_IN_TRANSACTION_TIMEOUT: Duration = Duration::from_secs(60);

/// Whether a session's SQL is the agent's own (privileged: search_path pinned) or a user's
/// (custom metrics queries: the database's own search_path, so that their names resolve).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sql {
    /// The agent's own statements.
    Privileged,
    /// Statements written by the user, run as an unprivileged role.
    UserWritten,
}

/// The libpq `options` startup parameter: pinned search_path (privileged SQL only), and the
/// lock, statement and idle-in-transaction timeouts.
pub fn options(sql: Sql, statement_timeout: Duration) -> String {
    let mut options = Vec::new();
    if sql == Sql::Privileged {
        options.push(format!("-c search_path={SEARCH_PATH}"));
    }
    for (name, value) in [
        ("lock_timeout", LOCK_TIMEOUT),
        ("statement_timeout", statement_timeout),
        ("idle_in_transaction_session_timeout", IDLE_IN_TRANSACTION_TIMEOUT),
    ] {
        options.push(format!("-c {name}={}", value.as_millis()));
    }
    options.join(" ")
}

/// A connection over the unix socket in `socket_dir` as `user` to `database`, with [`options`].
pub fn config(
    socket_dir: &Path,
    port: u16,
    user: &str,
    database: &str,
    sql: Sql,
    statement_timeout: Duration,
) -> tokio_postgres::Config {
    let mut config = tokio_postgres::Config::new();
    config
        .host_path(socket_dir)
        .port(port)
        .user(user)
        .dbname(database)
        .application_name("dbservice-instance")
        .options(options(sql, statement_timeout))
        .connect_timeout(statement_timeout);
    config
}

/// Every function the agent's, the pooler agent's, the backup job's and the pooler's SECURITY
/// DEFINER SQL calls (without its `pg_catalog.` qualifier). The unit test below fails when one is
/// called that is not listed; the real-node test `shadows` plants a shadow of each in the
/// application's schema.
pub const PRIVILEGED_SQL_FUNCTIONS: &[&str] = &[
    "age",
    "clock_timestamp",
    "count",
    "current_setting",
    "date_part",
    "format",
    "has_function_privilege",
    "max",
    "now",
    "pg_backend_pid",
    "pg_control_checkpoint",
    "pg_control_recovery",
    "pg_control_system",
    "pg_current_wal_insert_lsn",
    "pg_current_wal_lsn",
    "pg_database_size",
    "pg_drop_replication_slot",
    "pg_get_userbyid",
    "pg_is_in_recovery",
    "pg_last_wal_receive_lsn",
    "pg_last_wal_replay_lsn",
    "pg_last_xact_replay_timestamp",
    "pg_ls_waldir",
    "pg_promote",
    "pg_reload_conf",
    "pg_switch_wal",
    "pg_terminate_backend",
    "pg_wal_lsn_diff",
    "pg_walfile_name",
    "substr",
];

/// Every operator that SQL uses (same scope and test as [`PRIVILEGED_SQL_FUNCTIONS`]).
pub const PRIVILEGED_SQL_OPERATORS: &[&str] = &["!~", "*", "-", "<>", "=", ">", ">=", "||", "~"];

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, BTreeSet};
    use std::path::PathBuf;

    /// SQL syntax that looks like a call but names no function (and cannot be qualified).
    const NOT_CALLS: &[&str] = &["any", "array", "coalesce", "exists", "extract", "greatest", "in", "least", "values"];

    #[test]
    fn privileged_sessions_pin_the_search_path_and_bound_their_waits() {
        let options = options(Sql::Privileged, Duration::from_secs(30));
        assert!(options.starts_with("-c search_path=pg_catalog,pg_temp "), "{options}");
        for setting in ["lock_timeout=5000", "statement_timeout=30000", "idle_in_transaction_session_timeout=60000"] {
            assert!(options.contains(&format!("-c {setting}")), "{options}");
        }
        let user = super::options(Sql::UserWritten, Duration::from_secs(2));
        assert!(!user.contains("search_path") && user.contains("-c statement_timeout=2000"), "{user}");
        assert_eq!(tool_options(), "-c search_path=pg_catalog,pg_temp");
        let config = config(Path::new("/run"), 5432, "postgres", "app", Sql::Privileged, Duration::from_secs(30));
        assert_eq!(config.get_options(), Some(super::options(Sql::Privileged, Duration::from_secs(30)).as_str()));
        assert_eq!(config.get_dbname(), Some("app"));
    }

    fn rust_files(directory: &Path, files: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(directory).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                rust_files(&path, files);
            } else if path.extension().is_some_and(|extension| extension == "rs") {
                files.push(path);
            }
        }
    }

    /// The source of every module whose SQL runs privileged, its tests cut off.
    fn privileged_sources() -> Vec<(PathBuf, String)> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut files = vec![root.join("src/api/pooler.rs")];
        rust_files(&root.join("src/instance"), &mut files);
        rust_files(&root.join("src/pooler"), &mut files);
        // The base backup's session (the backup Job's and the agent's) runs as the superuser too.
        rust_files(&root.join("src/store"), &mut files);
        files
            .into_iter()
            .filter(|path| !path.ends_with("instance/session.rs"))
            .map(|path| {
                let source = std::fs::read_to_string(&path).unwrap();
                let code = source.split("#[cfg(test)]\nmod ").next().unwrap_or_default().to_string();
                (path, code)
            })
            .collect()
    }

    /// The string literals of Rust source (crude: comments, char literals, raw strings and line
    /// continuations are understood; that is all SQL here needs).
    fn literals(source: &str) -> Vec<String> {
        let chars: Vec<char> = source.chars().collect();
        let (mut found, mut at) = (Vec::new(), 0);
        while at < chars.len() {
            let previous_is_word = at > 0 && (chars[at - 1].is_alphanumeric() || chars[at - 1] == '_');
            if chars[at] == '/' && chars.get(at + 1) == Some(&'/') {
                while at < chars.len() && chars[at] != '\n' {
                    at += 1;
                }
            } else if chars[at] == 'r' && !previous_is_word && raw_string_at(&chars, at + 1) {
                let hashes = chars[at + 1..].iter().take_while(|c| **c == '#').count();
                let start = at + 2 + hashes;
                let end = (start..chars.len())
                    .find(|&i| {
                        chars[i] == '"' && chars[i + 1..].iter().take(hashes).filter(|c| **c == '#').count() == hashes
                    })
                    .unwrap();
                found.push(chars[start..end].iter().collect());
                at = end + 1 + hashes;
            } else if chars[at] == '\'' {
                // A char literal ('x', '\n') is skipped whole; a lifetime is one quote.
                at += match (chars.get(at + 1), chars.get(at + 2), chars.get(at + 3)) {
                    (Some('\\'), _, Some('\'')) => 4,
                    (Some(_), Some('\''), _) => 3,
                    _ => 1,
                };
            } else if chars[at] == '"' {
                let mut literal = String::new();
                at += 1;
                while chars[at] != '"' {
                    if chars[at] == '\\' && chars[at + 1] == '\n' {
                        at += 2;
                        while chars[at].is_whitespace() {
                            at += 1;
                        }
                    } else if chars[at] == '\\' {
                        literal.extend(&chars[at..at + 2]);
                        at += 2;
                    } else {
                        literal.push(chars[at]);
                        at += 1;
                    }
                }
                found.push(literal);
                at += 1;
            } else {
                at += 1;
            }
        }
        found
    }

    /// `r"`, `r#"`...: a raw string starts (and not a raw identifier, `r#type`).
    fn raw_string_at(chars: &[char], at: usize) -> bool {
        let hashes = chars[at..].iter().take_while(|c| **c == '#').count();
        chars.get(at + hashes) == Some(&'"')
    }

    /// `text` without its SQL string constants ('...').
    fn without_constants(text: &str) -> String {
        text.split('\'').step_by(2).collect::<Vec<_>>().join(" ")
    }

    /// Every `name(` in SQL text: (qualifier, name). Names after `::` (type modifiers) are no calls.
    fn calls(sql: &str) -> Vec<(Option<String>, String)> {
        let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
        let chars: Vec<char> = sql.chars().collect();
        let mut found = Vec::new();
        for (paren, _) in chars.iter().enumerate().filter(|(_, c)| **c == '(') {
            let start = (0..paren).rev().take_while(|&i| word(chars[i])).last().unwrap_or(paren);
            if start == paren || chars[start].is_ascii_digit() {
                continue;
            }
            let name: String = chars[start..paren].iter().collect::<String>().to_lowercase();
            let before = start.checked_sub(1).map(|i| chars[i]);
            match before {
                Some('"' | '$' | ':' | '{' | '!') => continue,
                Some('.') => {
                    let end = start - 1;
                    let qualifier_start = (0..end).rev().take_while(|&i| word(chars[i])).last().unwrap_or(end);
                    found.push((Some(chars[qualifier_start..end].iter().collect()), name));
                }
                _ => found.push((None, name)),
            }
        }
        found
    }

    fn is_sql(text: &str) -> bool {
        ["SELECT ", "WHERE ", "ALTER ", "CREATE ", "GRANT ", "DO $"].iter().any(|keyword| text.contains(keyword))
    }

    /// Operators of SQL text (runs of operator characters outside string constants).
    fn operators(sql: &str) -> BTreeSet<String> {
        let sql = without_constants(sql);
        let sql: String = sql.split('$').step_by(2).collect::<Vec<_>>().join(" ");
        let operator = |c: char| "+-*/<>=~!@#%^&|`?".contains(c);
        sql.split(|c: char| !operator(c)).filter(|run| !run.is_empty()).map(String::from).collect()
    }

    #[test]
    fn every_function_and_operator_of_privileged_sql_is_listed_and_qualified() {
        let mut unlisted: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        let mut unqualified: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        let mut unlisted_operators: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (path, source) in privileged_sources() {
            let file = path.display().to_string();
            for literal in literals(&source) {
                for (qualifier, name) in calls(&without_constants(&literal)) {
                    if NOT_CALLS.contains(&name.as_str()) || qualifier.as_deref().is_some_and(|q| q != "pg_catalog") {
                        continue;
                    }
                    if !PRIVILEGED_SQL_FUNCTIONS.contains(&name.as_str()) {
                        unlisted.entry(name.clone()).or_default().insert(file.clone());
                    }
                    if qualifier.is_none() {
                        unqualified.entry(name).or_default().insert(file.clone());
                    }
                }
                if is_sql(&literal) {
                    for operator in operators(&literal) {
                        if !PRIVILEGED_SQL_OPERATORS.contains(&operator.as_str()) {
                            unlisted_operators.entry(operator).or_default().insert(file.clone());
                        }
                    }
                }
            }
        }
        assert!(unlisted.is_empty(), "add to PRIVILEGED_SQL_FUNCTIONS (or NOT_CALLS): {unlisted:?}");
        assert!(unqualified.is_empty(), "qualify with pg_catalog.: {unqualified:?}");
        assert!(unlisted_operators.is_empty(), "add to PRIVILEGED_SQL_OPERATORS: {unlisted_operators:?}");
    }

    #[test]
    fn the_scanner_sees_calls_operators_and_literals() {
        let source = "let a = \"SELECT pg_catalog.now(), lower(x)::bit(8) FROM t WHERE a <> 'f(x)'\"; // \"g(\"\n\
                      let b = r#\"x\"y(\"#; let c = '\"';";
        let found = literals(source);
        assert_eq!(found.len(), 2, "{found:?}");
        let calls = calls(&without_constants(&found[0]));
        assert_eq!(calls, [(Some("pg_catalog".into()), "now".into()), (None, "lower".into())]);
        assert_eq!(operators(&found[0]), BTreeSet::from(["<>".to_string()]));
    }
}
