//! Privileged SQL never resolves a name through a schema the application can write (issue 37,
//! CVE-2018-1058). The application's role owns its databases: it plants, in `public` of each,
//! a shadow of every function ([`PRIVILEGED_SQL_FUNCTIONS`]) and operator
//! ([`PRIVILEGED_SQL_OPERATORS`]) the agent's privileged SQL uses, and puts `public` ahead of
//! `pg_catalog` for every session of the database (`ALTER DATABASE ... SET search_path`, which a
//! database's owner may run). Each shadow records who ran it and tries to make the application a
//! superuser. Then declared objects change, and the primary's agent visits every database as the
//! superuser; no shadow may have run as anyone but the application, and the change must be made.
//!
//! On a main without the pinned search_path this fails: the agent's check of the pooler's
//! `auth_query` function in each pooled database calls `has_function_privilege('dbservice_pooler',
//! p.oid, 'EXECUTE')` unqualified, and with the database's search_path `public` comes first, so the
//! planted `public.has_function_privilege(text, oid, text)` hides `pg_catalog`'s and runs as the
//! superuser (as do the shadowed `=` of its WHERE clause), which the record shows and the shadow
//! uses to make the application a superuser. The shadows answer as the originals, so the agent
//! goes on as usual: only the record tells.

use crate::environment::{admin_client, install_chart, real_database, real_namespace, real_node_or_skip, wait_running};
use crate::support::eventually;
use dbservice_operator::api::database_service::DatabaseService;
use dbservice_operator::api::roles::{DatabaseSpec, ObjectState, RoleSpec};
use dbservice_operator::instance::session::{PRIVILEGED_SQL_FUNCTIONS, PRIVILEGED_SQL_OPERATORS};
use kube::api::{Patch, PatchParams, PostParams};
use kube::Api;
use std::time::Duration;

const DATABASE: &str = "shadows";
const POD: &str = "shadows-0";
const APPLICATION: &str = "app_user";
/// The databases the application owns and the agent visits: its own and a declared one (both
/// pooled, so the pooler's `auth_query` function is kept in each).
const OWNED: [&str; 2] = ["app", "reports"];
/// A pass runs when the declarations change, and every minute.
const PASS_LIMIT: Duration = Duration::from_secs(150);

/// psql inside the instance over the socket as `user` into `database`. Our own sessions pin the
/// search_path, as the agent's do: the planted database setting would otherwise apply to them.
fn psql_as(namespace: &str, user: &str, database: &str, sql: &str) -> Result<String, String> {
    let output = std::process::Command::new(crate::support::tool("kubectl"))
        .args(["-n", namespace, "exec", POD, "-c", "postgres", "--", "env"])
        .args(["PGOPTIONS=-c search_path=pg_catalog,pg_temp", "psql", "-X", "-v", "ON_ERROR_STOP=1"])
        .args(["-h", "/var/run/postgresql", "-U", user, "-d", database, "-Atc", sql])
        .env("KUBECONFIG", crate::support::admin_kubeconfig().expect("kubeconfig"))
        .output()
        .expect("kubectl runs");
    let text = String::from_utf8_lossy(&output.stdout).to_string();
    if output.status.success() {
        Ok(text)
    } else {
        Err(format!("{text}{}", String::from_utf8_lossy(&output.stderr)))
    }
}

fn sql_array(names: &[&str]) -> String {
    let quoted: Vec<String> = names.iter().map(|name| format!("'{name}'")).collect();
    format!("ARRAY[{}]::text[]", quoted.join(", "))
}

/// The record table and the function every shadow calls (as whoever runs the shadow).
const RECORDER: &str = r#"
SET search_path = pg_catalog, pg_temp;
CREATE TABLE public.shadow_calls (name text, current_role_name text, session_role_name text);
GRANT INSERT ON public.shadow_calls TO PUBLIC;
CREATE FUNCTION public.shadow_record(called text) RETURNS void LANGUAGE plpgsql AS $record$
BEGIN
  INSERT INTO public.shadow_calls VALUES (called, current_user, session_user);
  BEGIN
    EXECUTE 'ALTER ROLE @APPLICATION@ SUPERUSER';
  EXCEPTION WHEN OTHERS THEN NULL;
  END;
END
$record$;
"#;

/// Shadows of every overload of each listed function (its own signature; `name`, `"char"`,
/// `varchar` and `char` arguments as `text`; all `text`) and of each listed operator (its own
/// operand types, and widened to `text`), each answering as the original. A signature PL/pgSQL
/// cannot take is left out.
const SHADOWS: &str = r#"
DO $plant$
DECLARE
  narrow CONSTANT regtype[] := ARRAY['name', '"char"', 'character varying', 'character']::regtype[];
  f record;
  o record;
  variant text;
  arguments text;
  left_type text;
  right_type text;
  shadow text;
BEGIN
  FOR f IN
    SELECT p.oid, p.proname::text AS name, p.prokind, p.pronargs,
           p.proallargtypes IS NOT NULL AS not_all_in,
           p.proretset OR COALESCE(p.proargmodes && ARRAY['o', 'b', 't']::"char"[], false)
             OR p.prorettype = 'void'::regtype AS bare_return,
           pg_get_function_arguments(p.oid) AS exact, pg_get_function_result(p.oid) AS result,
           (SELECT string_agg(format_type(t, NULL), ', ' ORDER BY i)
              FROM unnest(p.proargtypes::oid[]) WITH ORDINALITY AS a(t, i)) AS types,
           (SELECT string_agg(CASE WHEN t::regtype = ANY (narrow) THEN 'text' ELSE format_type(t, NULL) END, ', ' ORDER BY i)
              FROM unnest(p.proargtypes::oid[]) WITH ORDINALITY AS a(t, i)) AS widened,
           (SELECT string_agg('text', ', ') FROM generate_series(1, p.pronargs)) AS all_text,
           (SELECT string_agg(CASE WHEN y.typtype = 'p' THEN '$' || i ELSE format('$%s::%s', i, format_type(t, NULL)) END,
                              ', ' ORDER BY i)
              FROM unnest(p.proargtypes::oid[]) WITH ORDINALITY AS a(t, i) JOIN pg_type y ON y.oid = t) AS passed,
           p.prorettype = 'void'::regtype AS void
    FROM pg_proc p
    WHERE p.pronamespace = 'pg_catalog'::regnamespace AND p.proname = ANY (@FUNCTIONS@)
  LOOP
    IF f.prokind = 'a' THEN
      BEGIN
        shadow := 'shadow_state_' || f.oid;
        EXECUTE format('CREATE FUNCTION public.%I(state text%s) RETURNS text LANGUAGE plpgsql AS '
            '$s$BEGIN PERFORM public.shadow_record(%L); RETURN state; END$s$',
            shadow, COALESCE(', ' || f.types, ''), f.name);
        EXECUTE format('CREATE AGGREGATE public.%I(%s) (SFUNC = public.%I, STYPE = text)',
            f.name, COALESCE(f.types, '*'), shadow);
      EXCEPTION WHEN OTHERS THEN RAISE NOTICE 'no shadow of aggregate %(%): %', f.name, f.types, SQLERRM;
      END;
      CONTINUE;
    END IF;
    FOREACH variant IN ARRAY ARRAY['exact', 'widened', 'all_text'] LOOP
      CONTINUE WHEN variant <> 'exact' AND f.not_all_in;
      arguments := CASE variant WHEN 'exact' THEN f.exact WHEN 'widened' THEN f.widened ELSE f.all_text END;
      BEGIN
        -- It answers as the original does (nothing for a set or OUT parameters), so that the agent
        -- goes on as usual and only the record tells.
        EXECUTE format('CREATE FUNCTION public.%I(%s) RETURNS %s LANGUAGE plpgsql AS '
            '$s$BEGIN PERFORM public.shadow_record(%L); %s END$s$',
            f.name, COALESCE(arguments, ''), f.result, f.name,
            CASE WHEN f.void THEN format('PERFORM pg_catalog.%I(%s); RETURN;', f.name, COALESCE(f.passed, ''))
                 WHEN f.bare_return THEN 'RETURN;'
                 ELSE format('RETURN pg_catalog.%I(%s);', f.name, COALESCE(f.passed, '')) END);
      EXCEPTION WHEN OTHERS THEN RAISE NOTICE 'no % shadow of %(%): %', variant, f.name, arguments, SQLERRM;
      END;
    END LOOP;
  END LOOP;
  FOR o IN
    SELECT op.oid, op.oprname::text AS name, op.oprleft, op.oprright, format_type(op.oprresult, NULL) AS result
    FROM pg_operator op
    WHERE op.oprnamespace = 'pg_catalog'::regnamespace AND op.oprname = ANY (@OPERATORS@)
  LOOP
    FOREACH variant IN ARRAY ARRAY['exact', 'widened'] LOOP
      left_type := CASE WHEN o.oprleft = 0 THEN NULL
        WHEN variant = 'widened' AND o.oprleft::regtype = ANY (narrow) THEN 'text' ELSE format_type(o.oprleft, NULL) END;
      right_type := CASE WHEN variant = 'widened' AND o.oprright::regtype = ANY (narrow) THEN 'text'
        ELSE format_type(o.oprright, NULL) END;
      CONTINUE WHEN variant = 'widened'
        AND left_type IS NOT DISTINCT FROM (CASE WHEN o.oprleft = 0 THEN NULL ELSE format_type(o.oprleft, NULL) END)
        AND right_type = format_type(o.oprright, NULL);
      shadow := format('shadow_operator_%s_%s', o.oid, variant);
      BEGIN
        EXECUTE format('CREATE FUNCTION public.%I(%s) RETURNS %s LANGUAGE plpgsql AS '
            '$s$BEGIN PERFORM public.shadow_record(%L); RETURN %s OPERATOR(pg_catalog.%s) %s; END$s$',
            shadow, concat_ws(', ', left_type, right_type), o.result, o.name,
            CASE WHEN o.oprleft = 0 THEN '' ELSE '$1' END, o.name, CASE WHEN o.oprleft = 0 THEN '$1' ELSE '$2' END);
        EXECUTE format('CREATE OPERATOR public.%s (%s, FUNCTION = public.%I)',
            o.name, concat_ws(', ', 'LEFTARG = ' || left_type, 'RIGHTARG = ' || right_type), shadow);
      EXCEPTION WHEN OTHERS THEN RAISE NOTICE 'no % shadow of operator %(%, %): %', variant, o.name, left_type, right_type, SQLERRM;
      END;
    END LOOP;
  END LOOP;
END
$plant$;
"#;

/// Names of the listed functions and operators that got no shadow in `public`.
const UNSHADOWED: &str = "SELECT string_agg(name, ' ') FROM unnest(@FUNCTIONS@) AS name \
    WHERE NOT EXISTS (SELECT FROM pg_proc WHERE pronamespace = 'public'::regnamespace AND proname = name) \
    UNION ALL SELECT string_agg(name, ' ') FROM unnest(@OPERATORS@) AS name \
    WHERE NOT EXISTS (SELECT FROM pg_operator WHERE oprnamespace = 'public'::regnamespace AND oprname = name)";

fn with_lists(sql: &str) -> String {
    sql.replace("@FUNCTIONS@", &sql_array(PRIVILEGED_SQL_FUNCTIONS))
        .replace("@OPERATORS@", &sql_array(PRIVILEGED_SQL_OPERATORS))
        .replace("@APPLICATION@", APPLICATION)
}

/// The application plants its shadows in `database` and moves `public` ahead of `pg_catalog`.
fn plant(namespace: &str, database: &str) {
    let script = format!(
        "{}{}ALTER DATABASE {database} SET search_path = public, pg_catalog;",
        with_lists(RECORDER),
        with_lists(SHADOWS)
    );
    psql_as(namespace, APPLICATION, database, &script)
        .unwrap_or_else(|error| panic!("planting in {database}: {error}"));
    let missing = psql_as(namespace, APPLICATION, database, &with_lists(UNSHADOWED)).expect("listing the shadows");
    assert!(missing.trim().is_empty(), "no shadow in {database} of: {missing}");
}

/// Calls of a shadow in any owned database by anyone but the application.
fn privileged_calls(namespace: &str) -> String {
    let sql = format!(
        "SELECT string_agg(DISTINCT name || ' as ' || current_role_name || '/' || session_role_name, ', ') \
         FROM public.shadow_calls WHERE current_role_name <> '{APPLICATION}' OR session_role_name <> '{APPLICATION}'"
    );
    OWNED
        .iter()
        .map(|database| psql_as(namespace, "postgres", database, &sql).expect("reading shadow_calls"))
        .map(|calls| calls.trim().to_string())
        .filter(|calls| !calls.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

/// `status.declared` once it is the outcome of the current declarations.
async fn declared_states(databases: &Api<DatabaseService>) -> Option<Vec<(String, ObjectState)>> {
    let database = databases.get(DATABASE).await.ok()?;
    let declared = database.status.clone()?.declared?;
    let current = dbservice_operator::api::declarations::declarations(&database).fingerprint();
    (declared.declarations.as_deref() == Some(current.as_str())).then(|| {
        declared.roles.iter().chain(&declared.databases).map(|object| (object.name.clone(), object.state)).collect()
    })
}

fn all_as_wanted(states: &[(String, ObjectState)], absent: &str) -> bool {
    states.iter().all(|(name, state)| *state == if name == absent { ObjectState::Absent } else { ObjectState::Present })
}

#[tokio::test]
async fn privileged_sql_never_runs_the_applications_shadows() {
    let Some(node) = real_node_or_skip("privileged_sql_never_runs_the_applications_shadows") else { return };
    install_chart(node);
    let client = admin_client().await;
    let namespace = real_namespace(&client, "shadows").await;
    let ns = namespace.name.as_str();
    let databases: Api<DatabaseService> = Api::namespaced(client.clone(), ns);
    let mut database = real_database(node, DATABASE, 1, "Delete");
    database.spec.roles = vec![RoleSpec { name: "probe_old".into(), login: Some(false), ..Default::default() }];
    database.spec.databases = vec![DatabaseSpec { name: OWNED[1].into(), ..Default::default() }];
    // The pooler's auth_query function is kept in each pooled database by the superuser.
    database.spec.pooler =
        Some(serde_json::from_value(serde_json::json!({"instances": 1, "image": node.pgbouncer_image})).unwrap());
    databases.create(&PostParams::default(), &database).await.unwrap();
    wait_running(&client, ns, DATABASE, 1, Duration::from_secs(300)).await;
    eventually("status.declared: every object present", PASS_LIMIT, || async {
        declared_states(&databases).await.filter(|states| all_as_wanted(states, ""))
    })
    .await;

    for database in OWNED {
        plant(ns, database);
    }
    let calls_before = privileged_calls(ns);
    assert!(calls_before.is_empty(), "shadows ran before the change: {calls_before}");

    // A change that makes the agent visit every database as the superuser: a new role, and one
    // removed (its objects handed over and its privileges revoked in each database).
    let change = Patch::Merge(serde_json::json!({"spec": {"roles": [
        {"name": "probe_old", "ensure": "absent"},
        {"name": "probe_new", "login": false},
    ]}}));
    databases.patch(DATABASE, &PatchParams::default(), &change).await.unwrap();
    let states = eventually("the change carried out, or a shadow run by the agent", PASS_LIMIT, || async {
        let calls = privileged_calls(ns);
        if !calls.is_empty() {
            return Some(Err(calls));
        }
        declared_states(&databases).await.filter(|states| all_as_wanted(states, "probe_old")).map(Ok)
    })
    .await;
    let states = states.unwrap_or_else(|calls| panic!("the application's shadows ran privileged: {calls}"));
    assert!(states.iter().any(|(name, _)| name == "probe_new"), "{states:?}");

    let facts = format!(
        "SELECT (SELECT rolsuper FROM pg_roles WHERE rolname = '{APPLICATION}') || ',' \
         || (SELECT count(*) FROM pg_roles WHERE rolname = 'probe_new') || ',' \
         || (SELECT count(*) FROM pg_roles WHERE rolname = 'probe_old')"
    );
    assert_eq!(psql_as(ns, "postgres", "postgres", &facts).expect("facts").trim(), "false,1,0");
    let calls = privileged_calls(ns);
    assert!(calls.is_empty(), "the application's shadows ran privileged: {calls}");
}
