//! The manual (docs/manual, mdBook) and the README hold together: every page is in the table of
//! contents, every relative link reaches a file of the repository, every `#anchor` a heading of
//! the page it names, and the README stays a short front door.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

const MANUAL: &str = "docs/manual/src";
/// The README is the front door; the manual holds the rest.
const README_MAX_LINES: usize = 250;

fn repository() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn pages() -> Vec<PathBuf> {
    fn walk(directory: &Path, found: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(directory).expect("the manual's sources") {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, found);
            } else if path.extension().is_some_and(|extension| extension == "md") {
                found.push(path);
            }
        }
    }
    let mut found = Vec::new();
    walk(&repository().join(MANUAL), &mut found);
    found.sort();
    found
}

/// The text outside fenced code blocks (links and headings in code are examples).
fn prose(text: &str) -> Vec<&str> {
    let mut fenced = false;
    text.lines()
        .filter(|line| {
            if line.trim_start().starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced
        })
        .collect()
}

/// mdBook's and GitHub's id of a heading: lowercase, letters, digits, `_` and `-` kept, spaces
/// to `-`, the rest dropped.
fn anchor_of(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            c if c.is_alphanumeric() || c == '_' || c == '-' => Some(c),
            c if c.is_whitespace() => Some('-'),
            _ => None,
        })
        .collect()
}

fn anchors(path: &Path) -> BTreeSet<String> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    prose(&text)
        .into_iter()
        .filter_map(|line| line.strip_prefix('#'))
        .map(|line| anchor_of(line.trim_start_matches('#')))
        .collect()
}

/// The targets of `[text](target)` links on a line.
fn links(line: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = line;
    while let Some(start) = rest.find("](") {
        let after = &rest[start + 2..];
        let Some(end) = after.find(')') else { break };
        found.push(after[..end].to_string());
        rest = &after[end..];
    }
    found
}

/// Broken relative links and anchors of `page`, as messages.
fn broken_links(page: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(page).unwrap();
    let mut broken = Vec::new();
    for line in prose(&text) {
        for target in links(line) {
            if target.starts_with("http://") || target.starts_with("https://") || target.starts_with("mailto:") {
                continue;
            }
            let (file, anchor) = target.split_once('#').unwrap_or((target.as_str(), ""));
            let file = if file.is_empty() { page.to_path_buf() } else { page.parent().unwrap().join(file) };
            if !file.exists() {
                broken.push(format!("{}: {target}: no such file", page.display()));
            } else if !anchor.is_empty()
                && file.extension().is_some_and(|extension| extension == "md")
                && !anchors(&file).contains(anchor)
            {
                broken.push(format!("{}: {target}: no heading #{anchor}", page.display()));
            }
        }
    }
    broken
}

#[test]
fn every_page_is_in_the_table_of_contents_and_every_entry_is_a_page() {
    let root = repository().join(MANUAL);
    let summary = std::fs::read_to_string(root.join("SUMMARY.md")).unwrap();
    let listed: BTreeSet<PathBuf> =
        prose(&summary).into_iter().flat_map(links).map(|target| root.join(target)).collect();
    let present: BTreeSet<PathBuf> = pages().into_iter().filter(|page| !page.ends_with("SUMMARY.md")).collect();
    let missing: Vec<_> = present.difference(&listed).collect();
    assert!(missing.is_empty(), "pages missing from SUMMARY.md: {missing:?}");
    let dangling: Vec<_> = listed.difference(&present).collect();
    assert!(dangling.is_empty(), "SUMMARY.md entries without a page: {dangling:?}");
}

#[test]
fn every_relative_link_of_the_manual_and_the_readme_reaches_its_file_and_heading() {
    let mut broken: Vec<String> = pages().iter().flat_map(|page| broken_links(page)).collect();
    broken.extend(broken_links(&repository().join("README.md")));
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_readme_is_a_short_front_door_into_the_manual() {
    let readme = std::fs::read_to_string(repository().join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(lines < README_MAX_LINES, "README.md has {lines} lines; move detail into the manual (docs/manual)");
    for command in ["make demo", "make test"] {
        assert!(readme.contains(command), "the README names `{command}`");
    }
    assert!(readme.contains("docs/manual/src/introduction.md"), "the README links into the manual");
}

#[test]
fn the_link_checker_finds_a_missing_file_and_a_missing_heading() {
    let work = tempfile::tempdir().unwrap();
    let page = work.path().join("page.md");
    std::fs::write(&page, "# Title\n\n[ok](#title) [gone](other.md) [no](#nowhere)\n```\n[in code](skipped.md)\n```\n")
        .unwrap();
    let broken = broken_links(&page);
    assert_eq!(broken.len(), 2, "{broken:?}");
    assert!(broken[0].ends_with("other.md: no such file") && broken[1].ends_with("no heading #nowhere"), "{broken:?}");
    assert_eq!(anchor_of(" Failover, switchover and fencing"), "failover-switchover-and-fencing");
}

/// The contents of the fenced blocks of `text` whose language is one of `languages`.
fn fenced_blocks(text: &str, languages: &[&str]) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut open: Option<(bool, String)> = None;
    for line in text.lines() {
        let trimmed = line.trim_start();
        match (&mut open, trimmed.strip_prefix("```")) {
            (None, Some(language)) => open = Some((languages.contains(&language.trim()), String::new())),
            (Some((wanted, block)), Some(_)) => {
                if *wanted {
                    blocks.push(std::mem::take(block));
                }
                open = None;
            }
            (Some((_, block)), None) => {
                block.push_str(line);
                block.push('\n');
            }
            (None, None) => {}
        }
    }
    blocks
}

/// The `dbservice-operator VERB [--flag]…` command lines of the manual's and the README's shell
/// blocks (`sh` and unlabelled), placeholders and all: (page, verb, flags).
fn command_lines() -> Vec<(String, String, Vec<String>)> {
    let root = repository();
    let mut files = pages();
    files.push(root.join("README.md"));
    let flag = regex::Regex::new(r"(^|\s|\[)(--[a-z][a-z-]*)").unwrap();
    let mut lines = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let page = file.strip_prefix(&root).unwrap_or(&file).display().to_string();
        for block in fenced_blocks(&text, &["sh", "bash", ""]) {
            for line in block.lines() {
                let command = line.split('#').next().unwrap_or_default().trim();
                let Some(rest) = command.strip_prefix("dbservice-operator ") else { continue };
                // `a | b NAME` in a synopsis names two verbs.
                let mut tokens = rest.split_whitespace();
                let mut verbs: Vec<String> = tokens.next().into_iter().map(String::from).collect();
                while tokens.next() == Some("|") {
                    verbs.extend(tokens.next().map(String::from));
                }
                let flags: Vec<String> = flag.captures_iter(rest).map(|found| found[2].to_string()).collect();
                lines.extend(verbs.into_iter().map(|verb| (page.clone(), verb, flags.clone())));
            }
        }
    }
    lines
}

#[test]
fn every_command_line_of_the_manual_names_a_verb_and_flags_the_binary_has() {
    let lines = command_lines();
    assert!(lines.len() >= 15, "only {} command lines found: the extraction broke", lines.len());
    let mut wrong = Vec::new();
    for (page, verb, flags) in lines {
        {
            let output = std::process::Command::new(env!("CARGO_BIN_EXE_dbservice-operator"))
                .args([verb.as_str(), "--help"])
                .output()
                .expect("the binary runs");
            let help = String::from_utf8_lossy(&output.stdout);
            if !output.status.success() {
                wrong.push(format!("{page}: no verb {verb}"));
                continue;
            }
            for flag in flags.iter().filter(|flag| !help.contains(flag.as_str())) {
                wrong.push(format!("{page}: {verb} has no {flag}"));
            }
        }
    }
    assert!(wrong.is_empty(), "the manual names what the binary lacks:\n{}", wrong.join("\n"));
}
