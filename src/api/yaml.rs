//! Block-style YAML for the CRDs the `crd` command prints. Written here rather than taken from a
//! YAML library: the operator only ever writes YAML, and a library's parser and serializer were
//! about 0.9 MB of the binary's code, all of it mapped into the running operator's memory.
//!
//! Keys and strings are written plain only when they are simple identifiers YAML cannot misread as
//! a number, a boolean or null; otherwise double-quoted with JSON's escapes (valid YAML).

use serde::Serialize;
use serde_json::Value;
use std::fmt::Write;

/// `value` as a YAML document.
pub fn to_string(value: &impl Serialize) -> Result<String, serde_json::Error> {
    let value = serde_json::to_value(value)?;
    let mut out = String::new();
    match &value {
        Value::Object(map) if !map.is_empty() => write_map(&mut out, map, 0),
        Value::Array(items) if !items.is_empty() => write_list(&mut out, items, 0),
        scalar => {
            out.push_str(&inline(scalar));
            out.push('\n');
        }
    }
    Ok(out)
}

fn write_map(out: &mut String, map: &serde_json::Map<String, Value>, indent: usize) {
    for (index, (key, value)) in map.iter().enumerate() {
        // The first key of a list item follows its "- " on the same line.
        if index > 0 || !out.ends_with("- ") {
            push_indent(out, indent);
        }
        out.push_str(&plain_or_quoted(key));
        out.push(':');
        write_value(out, value, indent + 2);
    }
}

fn write_list(out: &mut String, items: &[Value], indent: usize) {
    for item in items {
        push_indent(out, indent);
        out.push_str("- ");
        match item {
            Value::Object(map) if !map.is_empty() => write_map(out, map, indent + 2),
            Value::Array(nested) if !nested.is_empty() => {
                out.pop();
                out.push('\n');
                write_list(out, nested, indent + 2);
            }
            scalar => {
                out.push_str(&inline(scalar));
                out.push('\n');
            }
        }
    }
}

/// What follows "key:": a scalar on the same line, or a nested block on the next lines.
fn write_value(out: &mut String, value: &Value, indent: usize) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            out.push('\n');
            write_map(out, map, indent);
        }
        Value::Array(items) if !items.is_empty() => {
            out.push('\n');
            write_list(out, items, indent);
        }
        scalar => {
            out.push(' ');
            out.push_str(&inline(scalar));
            out.push('\n');
        }
    }
}

fn push_indent(out: &mut String, indent: usize) {
    let _ = write!(out, "{:indent$}", "");
}

/// A scalar, or an empty map or list, in flow style.
fn inline(value: &Value) -> String {
    match value {
        Value::Object(_) => "{}".into(),
        Value::Array(_) => "[]".into(),
        Value::String(text) => plain_or_quoted(text),
        // Null, booleans and numbers print the same in JSON and YAML.
        other => other.to_string(),
    }
}

/// A key or string value: plain when it is a simple identifier YAML cannot misread, else JSON-quoted.
fn plain_or_quoted(key: &str) -> String {
    const WORDS: [&str; 11] = ["true", "false", "null", "yes", "no", "on", "off", "y", "n", "~", ""];
    let simple = key.chars().next().is_some_and(|first| first.is_ascii_alphabetic() || first == '$')
        && key.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/' | '$'))
        && !WORDS.contains(&key.to_ascii_lowercase().as_str());
    if simple {
        key.to_string()
    } else {
        Value::String(key.to_string()).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn nested_maps_and_lists_print_in_block_style() {
        let value = json!({"names": {"kind": "DatabaseService", "shortNames": ["dbs", "dbsvc"]},
                           "versions": [{"name": "v1", "served": true}, {"name": "v2", "served": false}],
                           "empty": {}, "none": [], "count": 3});
        let expected = r#"count: 3
empty: {}
names:
  kind: DatabaseService
  shortNames:
    - dbs
    - dbsvc
none: []
versions:
  - name: v1
    served: true
  - name: v2
    served: false
"#;
        assert_eq!(to_string(&value).unwrap(), expected);
        assert_eq!(to_string(&json!([[1, 2], "x"])).unwrap(), "-\n  - 1\n  - 2\n- x\n");
    }

    #[test]
    fn keys_and_strings_that_yaml_would_misread_are_quoted() {
        let value = json!({"on": "yes", "x-kubernetes-int-or-string": "1.0", "with space": "a\nb \"q\"", "3d": null});
        let text = to_string(&value).unwrap();
        assert!(text.contains("\"on\": \"yes\"\n"), "{text}");
        assert!(text.contains("x-kubernetes-int-or-string: \"1.0\"\n"), "{text}");
        assert!(text.contains("\"with space\": \"a\\nb \\\"q\\\"\"\n"), "{text}");
        assert!(text.contains("\"3d\": null\n"), "{text}");
    }
}
