//! The house plan, enforced: the crate's top-level modules form one-way layers (a module imports
//! only from its own layer or the ones below) and no module imports itself back through others.
//!
//! Imports are read from the code the binary runs: `crate::…` and `super::…` paths outside
//! comments and outside `#[cfg(test)]` sections (unit tests may reach anywhere).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The layers, lowest first. A new top-level module must be placed here.
const LAYERS: &[&[&str]] = &[
    &["quantity", "lsn", "schedule", "lease", "certificates"],
    &["metrics", "client", "postgres_tls", "passfile"],
    &["api"],
    &["store"],
    &["admission"],
    &["operator"],
    &["instance", "pooler", "plugin"],
    &["cli", "telemetry", "run"],
];

/// Module path (`operator::database::build`) → file, for every file under `src/` but the roots.
fn modules() -> BTreeMap<String, String> {
    fn walk(directory: &Path, prefix: &[String], out: &mut BTreeMap<String, String>) {
        for entry in std::fs::read_dir(directory).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_stem().unwrap().to_str().unwrap().to_string();
            if path.is_dir() {
                let mut inner = prefix.to_vec();
                inner.push(name);
                walk(&path, &inner, out);
            } else if path.extension().is_some_and(|extension| extension == "rs") {
                let mut module = prefix.to_vec();
                if name != "mod" {
                    module.push(name);
                }
                if !module.is_empty() && !(prefix.is_empty() && (module[0] == "lib" || module[0] == "main")) {
                    out.insert(module.join("::"), path.to_str().unwrap().to_string());
                }
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), &[], &mut out);
    out
}

/// The code of a file that the binary runs: no comments, no string or character literals, and no
/// item marked `#[cfg(test)]` (the module, function or `use` that follows the attribute, through
/// its balanced braces or its `;`). What follows such an item is code again.
fn running_code(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::new();
    let mut index = 0;
    // Depth of braces inside a skipped test item, and whether its body began.
    let mut skipping: Option<(usize, bool)> = None;
    while index < chars.len() {
        let rest: String = chars[index..chars.len().min(index + 12)].iter().collect();
        if skipping.is_none() && rest.starts_with("#[cfg(test)]") {
            skipping = Some((0, false));
            index += "#[cfg(test)]".len();
            continue;
        }
        let skipped = lexeme_length(&chars, index);
        if skipped > 0 {
            // A comment or a literal: never an import, and its braces do not count.
            out.push(' ');
            index += skipped;
            continue;
        }
        let c = chars[index];
        index += 1;
        match (&mut skipping, c) {
            (Some((depth, begun)), '{') => {
                *depth += 1;
                *begun = true;
            }
            (Some((depth, true)), '}') => {
                *depth -= 1;
                if *depth == 0 {
                    skipping = None;
                }
            }
            (Some((0, false)), ';') => skipping = None,
            (Some(_), _) => {}
            (None, c) => out.push(c),
        }
    }
    out
}

/// The length of the comment, string or character literal starting at `index` (0 if none). A `//`
/// comment ends before its newline; a lifetime (`'a`) is not a literal.
fn lexeme_length(chars: &[char], index: usize) -> usize {
    let at = |offset: usize| chars.get(index + offset).copied();
    let until = |from: usize, end: &str| {
        let end: Vec<char> = end.chars().collect();
        (index + from..chars.len())
            .find(|start| chars[*start..].starts_with(&end))
            .map_or(chars.len() - index, |start| start + end.len() - index)
    };
    match (at(0), at(1), at(2)) {
        (Some('/'), Some('/'), _) => until(2, "\n").saturating_sub(1).max(2),
        (Some('/'), Some('*'), _) => until(2, "*/"),
        (Some('r'), Some('"'), _) => until(2, "\""),
        (Some('r'), Some('#'), _) => {
            let hashes = chars[index + 1..].iter().take_while(|c| **c == '#').count();
            let close = format!("\"{}", "#".repeat(hashes));
            until(1 + hashes + 1, &close)
        }
        (Some('"'), _, _) => {
            let mut offset = 1;
            while let Some(c) = at(offset) {
                offset += if c == '\\' { 2 } else { 1 };
                if c == '"' {
                    return offset;
                }
            }
            offset
        }
        (Some('\''), Some('\\'), _) => until(3, "'"),
        (Some('\''), Some(_), Some('\'')) => 3,
        _ => 0,
    }
}

/// The longest known module that `segments` starts with.
fn resolve(segments: &[&str], known: &BTreeMap<String, String>) -> Option<String> {
    (1..=segments.len()).rev().map(|length| segments[..length].join("::")).find(|module| known.contains_key(module))
}

/// File-level imports: module → modules it names.
fn imports(known: &BTreeMap<String, String>) -> BTreeMap<String, BTreeSet<String>> {
    let mut graph = BTreeMap::new();
    for (module, file) in known {
        let code = running_code(&std::fs::read_to_string(file).unwrap());
        let own: Vec<&str> = module.split("::").collect();
        let mut used = BTreeSet::new();
        let bytes = code.as_bytes();
        let mut index = 0;
        while index < code.len() {
            let rest = &code[index..];
            let preceded_by_word = index > 0
                && (bytes[index - 1].is_ascii_alphanumeric() || bytes[index - 1] == b'_' || bytes[index - 1] == b':');
            let base: Option<(Vec<&str>, usize)> = if preceded_by_word {
                None
            } else if rest.starts_with("crate::") {
                Some((Vec::new(), "crate::".len()))
            } else if rest.starts_with("super::") {
                // `super` is the parent module, for a file module and for a directory's mod.rs alike.
                let mut count = 0;
                let mut length = 0;
                while rest[length..].starts_with("super::") {
                    count += 1;
                    length += "super::".len();
                }
                Some((own[..own.len().saturating_sub(count)].to_vec(), length))
            } else {
                None
            };
            let Some((prefix, skip)) = base else {
                index += rest.chars().next().map_or(1, char::len_utf8);
                continue;
            };
            let path: String =
                rest[skip..].chars().take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':').collect();
            let mut segments = prefix.clone();
            segments.extend(path.split("::").filter(|segment| !segment.is_empty()));
            if let Some(target) = resolve(&segments, known) {
                // A module naming its own items or its own submodules is not an import.
                if target != *module && !target.starts_with(&format!("{module}::")) {
                    used.insert(target);
                }
            }
            index += skip + path.len();
        }
        graph.insert(module.clone(), used);
    }
    graph
}

fn layer_of(module: &str) -> Option<usize> {
    let top = module.split("::").next().unwrap();
    LAYERS.iter().position(|layer| layer.contains(&top))
}

/// Imports that go from a lower layer to a higher one: (importer, imported).
fn upward_imports(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for (module, used) in graph {
        for target in used {
            if layer_of(target) > layer_of(module) {
                found.push((module.clone(), target.clone()));
            }
        }
    }
    found
}

fn find_circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(start) = path.iter().position(|visited| visited == node) {
            let mut circle = path[start..].to_vec();
            circle.push(node.to_string());
            return Some(circle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(circle) = visit(next, graph, path, done) {
                return Some(circle);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph.keys().find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

#[test]
fn every_top_level_module_has_a_layer() {
    let known = modules();
    let unplaced: BTreeSet<&str> =
        known.keys().map(|module| module.split("::").next().unwrap()).filter(|top| layer_of(top).is_none()).collect();
    assert!(unplaced.is_empty(), "top-level modules missing from LAYERS in tests/module_graph.rs: {unplaced:?}");
    assert!(known.len() > 100, "found the crate's modules: {}", known.len());
}

#[test]
fn no_module_imports_from_a_higher_layer() {
    let graph = imports(&modules());
    let upward = upward_imports(&graph);
    assert!(
        upward.is_empty(),
        "imports from a lower layer into a higher one (see LAYERS):\n{}",
        upward.iter().map(|(from, to)| format!("  {from} -> {to}")).collect::<Vec<_>>().join("\n")
    );
}

#[test]
fn modules_import_each_other_without_circles() {
    let graph = imports(&modules());
    assert!(graph.values().map(BTreeSet::len).sum::<usize>() > 200, "read the imports");
    if let Some(circle) = find_circle(&graph) {
        panic!("import circle: {}", circle.join(" -> "));
    }
}

fn graph_of(edges: &[(&str, &str)]) -> BTreeMap<String, BTreeSet<String>> {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, to) in edges {
        graph.entry(from.to_string()).or_default().insert(to.to_string());
        graph.entry(to.to_string()).or_default();
    }
    graph
}

#[test]
fn a_circle_is_found_when_there_is_one() {
    let graph = graph_of(&[("a", "b"), ("b", "c"), ("c", "a")]);
    assert_eq!(find_circle(&graph), Some(vec!["a".into(), "b".into(), "c".into(), "a".into()]));
    assert_eq!(find_circle(&graph_of(&[("a", "b"), ("b", "c")])), None);
}

#[test]
fn an_upward_import_is_found_and_a_downward_one_is_not() {
    let graph = graph_of(&[("api::names", "operator::caches"), ("operator::caches", "api::names")]);
    assert_eq!(upward_imports(&graph), [("api::names".to_string(), "operator::caches".to_string())]);
}

/// Issue 39: the scan read nothing after a file's first `#[cfg(test)]`, so the code after a test
/// module (or a test-only function) was never checked.
#[test]
fn code_after_a_test_item_is_read_and_literals_hide_no_braces() {
    let code = running_code(
        "#[cfg(test)]\nmod tests { fn f() { let s = \"}\"; let c = '{'; } }\nuse crate::operator::caches;\n\
         #[cfg(test)]\nuse crate::api::hidden;\nfn g<'a>(x: &'a str) { crate::store::base::go(r#\"}\"#) }",
    );
    assert!(code.contains("crate::operator::caches"), "{code}");
    assert!(code.contains("crate::store::base::go"), "{code}");
    assert!(!code.contains("hidden") && !code.contains("fn f"), "{code}");
}

#[test]
fn imports_are_read_from_paths_outside_comments_and_tests() {
    let known: BTreeMap<String, String> =
        ["api", "api::names", "operator", "operator::caches"].iter().map(|m| (m.to_string(), String::new())).collect();
    let code = running_code(
        "use crate::api::names::labels; // crate::operator::caches\n/// [`crate::operator`]\nfn f() {}\n#[cfg(test)]\nuse crate::operator::caches;",
    );
    assert!(code.contains("crate::api::names") && !code.contains("operator"));
    assert_eq!(resolve(&["api", "names", "labels"], &known).as_deref(), Some("api::names"));
}
