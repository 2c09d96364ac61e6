//! The documentation names files that exist: every repository path in a code span of the
//! README, docs/ARCHITECTURE.md, BENCHMARKS.md and envoy/README.md (a file with a known
//! extension or a folder ending in `/`, with `{a,b}` alternatives expanded and a `::item`
//! suffix naming something the file contains). A path may be written from the repository root
//! or, as the docs do in running text, from a crate's source folder (`run/state.rs` for
//! `control/src/run/state.rs`). Build outputs (`target/`, `logs/`) are not checked.

use std::path::Path;

use skewgate_tests::repo_root;

const DOCS: [&str; 4] = [
    "README.md",
    "docs/ARCHITECTURE.md",
    "BENCHMARKS.md",
    "envoy/README.md",
];
/// Where a path written in the docs may start from.
const BASES: [&str; 7] = [
    "",
    "control/src/",
    "filter/",
    "filter/core/src/",
    "filter/src/",
    "tests/src/",
    "tests/",
];
const EXTENSIONS: [&str; 12] = [
    ".rs", ".md", ".yaml", ".yml", ".toml", ".sh", ".py", ".json", ".args", ".cfg", ".patch",
    ".proto",
];
const OUTPUTS: [&str; 3] = ["target/", "logs/", ".tools/"];

/// The text of every inline code span outside fenced blocks, with its line number.
fn code_spans(text: &str) -> Vec<(usize, &str)> {
    let mut spans = Vec::new();
    let mut fenced = false;
    for (n, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        spans.extend(line.split('`').skip(1).step_by(2).map(|s| (n + 1, s)));
    }
    spans
}

/// `a/{b,c}/d` → `a/b/d`, `a/c/d`.
fn expand(path: &str) -> Vec<String> {
    let (Some(open), Some(close)) = (path.find('{'), path.find('}')) else {
        return vec![path.to_string()];
    };
    if close < open {
        return vec![path.to_string()];
    }
    let (head, rest) = path.split_at(open);
    let (alternatives, tail) = rest.split_at(close - open);
    alternatives
        .trim_start_matches('{')
        .split(',')
        .flat_map(|alt| expand(&format!("{head}{alt}{}", &tail[1..])))
        .collect()
}

/// A token of a code span that names a repository path, and the item after `::`, if any.
fn as_path(token: &str) -> Option<(&str, Option<&str>)> {
    let token = token
        .trim_start_matches('(')
        .trim_end_matches(['.', ',', ';', ':', ')']);
    let (path, item) = match token.split_once("::") {
        Some((path, item)) => (path, Some(item)),
        None => (token, None),
    };
    let plausible = path.contains('/')
        && !path.contains("://")
        && !path.starts_with(['/', '-', '.', '~'])
        && path
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_.{},/-".contains(c))
        && (EXTENSIONS.iter().any(|e| path.ends_with(e)) || path.ends_with('/'))
        && !OUTPUTS.iter().any(|o| path.starts_with(o));
    plausible.then_some((path, item))
}

#[test]
fn every_path_the_docs_name_exists() {
    let root = repo_root();
    let mut checked = 0;
    let mut missing = Vec::new();
    for doc in DOCS {
        let text = std::fs::read_to_string(root.join(doc)).expect("the doc exists");
        for (line, span) in code_spans(&text) {
            for (path, item) in span.split_whitespace().filter_map(as_path) {
                for path in expand(path) {
                    checked += 1;
                    let found = BASES
                        .iter()
                        .map(|base| root.join(base).join(&path))
                        .find(|p| p.exists());
                    let ok = match (&found, item) {
                        (None, _) => false,
                        (Some(_), None) => true,
                        (Some(file), Some(item)) => contains_item(file, item),
                    };
                    if !ok {
                        missing.push(format!(
                            "{doc}:{line}: `{path}{}`",
                            item.map(|i| format!("::{i}")).unwrap_or_default()
                        ));
                    }
                }
            }
        }
    }
    assert!(
        checked > 200,
        "only {checked} paths found: the scan is broken"
    );
    assert!(
        missing.is_empty(),
        "{} of {checked} paths the docs name do not exist:\n{}",
        missing.len(),
        missing.join("\n")
    );
}

/// The file holds `item` as a word (a function, type or constant name).
fn contains_item(file: &Path, item: &str) -> bool {
    let Ok(text) = std::fs::read_to_string(file) else {
        return false;
    };
    text.match_indices(item).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + item.len()..].chars().next();
        let word = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
        !word(before) && !word(after)
    })
}

#[test]
fn the_scan_reads_spans_paths_and_alternatives() {
    assert_eq!(
        code_spans("a `x/y.rs` b `z`\n```\n`fenced/f.rs`\n```\n`c/d/`"),
        [(1, "x/y.rs"), (1, "z"), (5, "c/d/")]
    );
    assert_eq!(
        expand("fetch/{backoff,content_type}.rs"),
        ["fetch/backoff.rs", "fetch/content_type.rs"]
    );
    assert_eq!(
        as_path("(control/src/plan.rs::plan),"),
        Some(("control/src/plan.rs", Some("plan")))
    );
    for not_a_path in [
        "https://example.com/a.rs",
        "/etc/kubernetes/pki/ca.crt",
        "--state-dir",
        "target/debug/x.rs",
        "apps/v1",
        "<dir>/x.rs",
    ] {
        assert_eq!(as_path(not_a_path), None, "{not_a_path}");
    }
}
