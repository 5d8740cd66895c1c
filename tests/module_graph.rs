//! The controller's modules import one another without circles: a module names what it uses with
//! `super::x` or `crate::controller::x`, and following those names never leads back to itself.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

fn imports() -> BTreeMap<String, BTreeSet<String>> {
    let directory = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/controller");
    let modules: BTreeSet<String> = std::fs::read_dir(&directory)
        .unwrap()
        .filter_map(|entry| entry.ok()?.path().file_stem()?.to_str().map(String::from))
        .filter(|name| name != "mod" && name != "scripts")
        .collect();
    let mut graph = BTreeMap::new();
    for module in &modules {
        let text = std::fs::read_to_string(directory.join(format!("{module}.rs"))).unwrap();
        // Unit tests may reach anywhere; only the code the binary runs counts.
        let code = text.split("#[cfg(test)]").next().unwrap();
        let mut used = BTreeSet::new();
        for prefix in ["super::", "crate::controller::"] {
            for (index, _) in code.match_indices(prefix) {
                let rest = &code[index + prefix.len()..];
                let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                if modules.contains(&name) && &name != module {
                    used.insert(name);
                }
            }
        }
        graph.insert(module.clone(), used);
    }
    graph
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
        for next in &graph[node] {
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
fn controller_modules_import_each_other_without_circles() {
    let graph = imports();
    assert!(graph.len() > 10, "found the controller modules: {:?}", graph.keys());
    if let Some(circle) = find_circle(&graph) {
        panic!("import circle in src/controller: {}", circle.join(" -> "));
    }
}

#[test]
fn a_circle_is_found_when_there_is_one() {
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a".to_string(), BTreeSet::from(["b".to_string()])),
        ("b".to_string(), BTreeSet::from(["c".to_string()])),
        ("c".to_string(), BTreeSet::from(["a".to_string()])),
    ]
    .into();
    assert_eq!(find_circle(&graph), Some(vec!["a".into(), "b".into(), "c".into(), "a".into()]));
}
