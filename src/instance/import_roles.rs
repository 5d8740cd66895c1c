//! The roles of an import (`spec.bootstrap.import.roles`): `pg_dumpall --roles-only
//! --no-role-passwords` of the source, filtered so that nothing of PostgreSQL's or the operator's
//! is touched and nothing grants more than the application may have, then run in one transaction.
//!
//! Filtered out: the roles of the operator and of PostgreSQL (the superuser, the replication and
//! application roles, `pg_*`, `dbservice_*`; the application's role may still become a member of
//! imported roles), memberships in them, per-database settings (the
//! database may not be imported), and the `GRANTED BY` of memberships (the grantor may not exist
//! here). Turned off: SUPERUSER, REPLICATION and BYPASSRLS (a network login with them would be
//! the operator's superuser by another name). Roles that exist here already are not created again,
//! but get the source's attributes. Passwords never come along (they are not in the dump).

use std::collections::BTreeSet;

/// Attributes that are turned into their `NO` form.
const DROPPED_ATTRIBUTES: [(&str, &str); 3] =
    [("SUPERUSER", "NOSUPERUSER"), ("REPLICATION", "NOREPLICATION"), ("BYPASSRLS", "NOBYPASSRLS")];

/// A role name at the start of `text` as pg_dumpall writes it (quoted with `""` escapes, or a
/// plain lowercase word), and what follows it.
fn leading_name(text: &str) -> Option<(String, &str)> {
    if let Some(quoted) = text.strip_prefix('"') {
        let mut name = String::new();
        let mut characters = quoted.char_indices().peekable();
        while let Some((index, character)) = characters.next() {
            if character == '"' {
                if characters.peek().map(|(_, next)| *next) == Some('"') {
                    characters.next();
                    name.push('"');
                    continue;
                }
                return Some((name, &quoted[index + 1..]));
            }
            name.push(character);
        }
        return None;
    }
    let end = text.find([' ', ';']).unwrap_or(text.len());
    (end > 0).then(|| (text[..end].to_string(), &text[end..]))
}

/// Whether `name` belongs to PostgreSQL or the operator (`reserved` holds the operator's roles).
fn is_reserved(name: &str, reserved: &BTreeSet<String>) -> bool {
    reserved.contains(name) || name.starts_with("pg_") || name.starts_with("dbservice_")
}

/// The statements to run here, in order, from the dump's text. `reserved` holds the operator's
/// roles; the application's role is left as the operator keeps it, but may become a member of
/// imported roles (as it was at the source).
///
/// The filter reads one statement per line, which holds only while no name or comment spans
/// lines: a comment with a line break on a filtered role would otherwise leave its remaining lines
/// to run as statements (as the superuser). A line with an odd number of quotes marks such a
/// statement, and the whole dump is refused.
pub fn role_statements(
    dump: &str,
    reserved: &BTreeSet<String>,
    application_user: &str,
    existing: &BTreeSet<String>,
) -> Result<Vec<String>, String> {
    if let Some(line) =
        dump.lines().find(|line| line.matches('\'').count() % 2 == 1 || line.matches('"').count() % 2 == 1)
    {
        let shown: String = line.chars().take(80).collect();
        return Err(format!(
            "the source's roles have a name or comment over several lines ({shown:?}...): not imported; import without roles"
        ));
    }
    let kept_here = |name: &str| is_reserved(name, reserved) || name == application_user;
    let mut statements = Vec::new();
    for line in dump.lines() {
        let line = line.trim_end();
        if line.is_empty() || line.starts_with("--") {
            continue;
        }
        // Session settings and psql's \restrict guard of PostgreSQL 17.6+ dumps.
        if line.starts_with("SET ") || line.starts_with("\\restrict") || line.starts_with("\\unrestrict") {
            statements.push(line.to_string());
            continue;
        }
        if let Some(rest) = line.strip_prefix("CREATE ROLE ") {
            let Some((name, _)) = leading_name(rest) else { continue };
            if !kept_here(&name) && !existing.contains(&name) {
                statements.push(line.to_string());
            }
            continue;
        }
        if let Some(rest) = line.strip_prefix("ALTER ROLE ") {
            let Some((name, after)) = leading_name(rest) else { continue };
            if kept_here(&name) || after.trim_start().starts_with("IN DATABASE") {
                continue;
            }
            if after.trim_start().starts_with("WITH ") {
                let words: Vec<&str> = after.trim_end_matches(';').split_whitespace().collect();
                let words: Vec<&str> = words
                    .into_iter()
                    .map(|word| DROPPED_ATTRIBUTES.iter().find(|(on, _)| *on == word).map_or(word, |(_, off)| *off))
                    .collect();
                statements.push(format!("ALTER ROLE {} {};", &rest[..rest.len() - after.len()], words.join(" ")));
            } else {
                statements.push(line.to_string());
            }
            continue;
        }
        if let Some(rest) = line.strip_prefix("COMMENT ON ROLE ") {
            if leading_name(rest).is_some_and(|(name, _)| !kept_here(&name)) {
                statements.push(line.to_string());
            }
            continue;
        }
        if let Some(rest) = line.strip_prefix("GRANT ") {
            let Some((granted, after)) = leading_name(rest) else { continue };
            let Some(member_text) = after.trim_start().strip_prefix("TO ") else { continue };
            let Some((member, _)) = leading_name(member_text) else { continue };
            if kept_here(&granted) || is_reserved(&member, reserved) {
                continue;
            }
            let statement = match line.find(" GRANTED BY ") {
                Some(at) => format!("{};", &line[..at]),
                None => line.to_string(),
            };
            statements.push(statement);
            continue;
        }
        // Anything else pg_dumpall may add about roles (a security label) goes as it is.
        statements.push(line.to_string());
    }
    Ok(statements)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DUMP: &str = r#"--
-- PostgreSQL database cluster dump
--

\restrict abc123
SET default_transaction_read_only = off;
SET client_encoding = 'UTF8';
SET standard_conforming_strings = on;

--
-- Roles
--

CREATE ROLE boss;
ALTER ROLE boss WITH SUPERUSER INHERIT CREATEROLE CREATEDB LOGIN REPLICATION BYPASSRLS;
CREATE ROLE postgres;
ALTER ROLE postgres WITH SUPERUSER INHERIT CREATEROLE CREATEDB LOGIN REPLICATION BYPASSRLS;
CREATE ROLE readers;
ALTER ROLE readers WITH NOSUPERUSER INHERIT NOCREATEROLE NOCREATEDB NOLOGIN NOREPLICATION NOBYPASSRLS;
CREATE ROLE "Reporting ""A""";
ALTER ROLE "Reporting ""A""" WITH NOSUPERUSER INHERIT NOCREATEROLE NOCREATEDB LOGIN NOREPLICATION NOBYPASSRLS CONNECTION LIMIT 3;
CREATE ROLE app_user;
ALTER ROLE app_user WITH NOSUPERUSER INHERIT NOCREATEROLE NOCREATEDB LOGIN NOREPLICATION NOBYPASSRLS;
ALTER ROLE readers SET search_path TO 'shop', 'public';
ALTER ROLE readers IN DATABASE shop SET work_mem TO '8MB';
COMMENT ON ROLE readers IS 'read-only';
COMMENT ON ROLE postgres IS 'the superuser';

--
-- Role memberships
--

GRANT readers TO "Reporting ""A""" WITH INHERIT TRUE GRANTED BY postgres;
GRANT readers TO app_user GRANTED BY boss;
GRANT postgres TO boss;
GRANT pg_read_server_files TO readers;
GRANT pg_monitor TO readers WITH INHERIT TRUE GRANTED BY postgres;

\unrestrict abc123
"#;

    fn reserved() -> BTreeSet<String> {
        ["postgres", "standby"].into_iter().map(String::from).collect()
    }

    #[test]
    fn the_operators_and_postgresqls_roles_are_left_alone_and_no_superuser_comes_in() {
        let existing: BTreeSet<String> = ["app_user".to_string(), "readers".to_string()].into();
        let statements = role_statements(DUMP, &reserved(), "app_user", &existing).unwrap();
        let expected = [
            r"\restrict abc123",
            "SET default_transaction_read_only = off;",
            "SET client_encoding = 'UTF8';",
            "SET standard_conforming_strings = on;",
            "CREATE ROLE boss;",
            "ALTER ROLE boss WITH NOSUPERUSER INHERIT CREATEROLE CREATEDB LOGIN NOREPLICATION NOBYPASSRLS;",
            "ALTER ROLE readers WITH NOSUPERUSER INHERIT NOCREATEROLE NOCREATEDB NOLOGIN NOREPLICATION NOBYPASSRLS;",
            r#"CREATE ROLE "Reporting ""A""";"#,
            r#"ALTER ROLE "Reporting ""A""" WITH NOSUPERUSER INHERIT NOCREATEROLE NOCREATEDB LOGIN NOREPLICATION NOBYPASSRLS CONNECTION LIMIT 3;"#,
            "ALTER ROLE readers SET search_path TO 'shop', 'public';",
            "COMMENT ON ROLE readers IS 'read-only';",
            r#"GRANT readers TO "Reporting ""A""" WITH INHERIT TRUE;"#,
            "GRANT readers TO app_user;",
            r"\unrestrict abc123",
        ];
        assert_eq!(statements, expected);
    }

    #[test]
    fn a_comment_over_several_lines_refuses_the_dump_instead_of_running_its_lines() {
        // Dropping the first line (a reserved role) would leave the rest to run as statements.
        let dump = "CREATE ROLE readers;\nCOMMENT ON ROLE postgres IS 'x;\nALTER SYSTEM SET fsync = off;\n';\n";
        let refused = role_statements(dump, &reserved(), "app_user", &BTreeSet::new()).unwrap_err();
        assert!(refused.contains("over several lines"), "{refused}");
        let name = "CREATE ROLE \"a\nb\";\n";
        assert!(role_statements(name, &reserved(), "app_user", &BTreeSet::new()).is_err());
    }

    #[test]
    fn quoted_and_plain_names_are_read_whole() {
        assert_eq!(leading_name(r#""a ""b"" c" WITH LOGIN;"#), Some((r#"a "b" c"#.to_string(), " WITH LOGIN;")));
        assert_eq!(leading_name("readers;"), Some(("readers".to_string(), ";")));
        assert_eq!(leading_name(r#""unterminated"#), None);
        assert_eq!(leading_name(""), None);
    }
}
