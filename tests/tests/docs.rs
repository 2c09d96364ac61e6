//! The documentation says what the code does:
//!
//! - every repository path in a code span of the docs ([`docs`]: the README, docs/, the
//!   CHANGELOG, BENCHMARKS.md and the folders' READMEs) exists (a file with a known extension
//!   or a folder ending in `/`, with `{a,b}` alternatives expanded and a `::item` suffix naming
//!   something the file contains). A path may be written from the repository root or, as the
//!   docs do in running text, from a crate's source folder (`run/state.rs` for
//!   `control/src/run/state.rs`). Build outputs (`target/`, `logs/`) are not checked;
//! - every command of a shell block runs as written as far as it can be checked without
//!   running it: a script of the repository exists and is executable, and a
//!   `skewgate-control` command line parses with the very clap definitions of the binary;
//! - every section the code and scripts cite by title (`docs/ARCHITECTURE.md, "Merged
//!   discovery"`) is a heading or a bold label of that document;
//! - the configuration reference (docs/configuration.md) lists every flag of every subcommand
//!   as those definitions say: its flags section is generated from them
//!   (`SKEWGATE_BLESS=1 cargo test -p skewgate-tests --test docs` writes it again).

use std::path::{Path, PathBuf};

use clap::{CommandFactory, Parser};
use skewgate_control::cli::Cli;
use skewgate_tests::repo_root;

/// One document: its path from the repository root (for messages), its folder, its text.
struct Doc {
    name: String,
    folder: PathBuf,
    text: String,
}

/// Every document the checks read: the README, CHANGELOG and BENCHMARKS, every `.md` in
/// docs/, and the READMEs of the folders.
fn docs() -> Vec<Doc> {
    let root = repo_root();
    doc_paths()
        .into_iter()
        .map(|path| Doc {
            name: path
                .strip_prefix(&root)
                .unwrap_or(&path)
                .display()
                .to_string(),
            folder: path.parent().unwrap_or(&root).to_path_buf(),
            text: std::fs::read_to_string(&path).expect("the doc exists"),
        })
        .collect()
}

fn doc_paths() -> Vec<PathBuf> {
    let root = repo_root();
    let mut docs: Vec<PathBuf> = ["README.md", "CHANGELOG.md", "BENCHMARKS.md"]
        .iter()
        .map(|d| root.join(d))
        .collect();
    let mut in_docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/ exists")
        .map(|e| e.expect("docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    in_docs.sort();
    docs.extend(in_docs);
    for folder in ["envoy", "fuzz", "deploy", "tests", "filter", "control"] {
        let readme = root.join(folder).join("README.md");
        if readme.exists() {
            docs.push(readme);
        }
    }
    docs
}

/// Where a path written in the docs may start from.
const BASES: [&str; 8] = [
    "fuzz/",
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
    for Doc {
        name: doc, text, ..
    } in docs()
    {
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
    // Relative links between the docs: `[text](target)`, the target from the document's folder.
    for Doc { name, folder, text } in docs() {
        for (n, line) in text.lines().enumerate() {
            for target in line.split("](").skip(1).filter_map(|t| t.split(')').next()) {
                let file = target.split('#').next().unwrap_or("");
                if file.is_empty() || file.contains("://") || file.starts_with("mailto:") {
                    continue;
                }
                checked += 1;
                if !folder.join(file).exists() {
                    missing.push(format!("{name}:{}: link to `{target}`", n + 1));
                }
            }
        }
    }
    assert_scanned(checked, 200, "paths the docs name do not exist", &missing);
}

/// A scan found at least `minimum` things to check (fewer: the scan itself is broken), and no
/// `problems`, which are `what`.
fn assert_scanned(checked: usize, minimum: usize, what: &str, problems: &[String]) {
    assert!(
        checked > minimum,
        "only {checked} found where more than {minimum} were expected ({what}): the scan is broken"
    );
    assert!(
        problems.is_empty(),
        "{} of {checked} {what}:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// What `git args` prints in the repository (the tests run in a checkout).
fn git(args: &[&str]) -> String {
    let out = std::process::Command::new("git")
        .args(args)
        .current_dir(repo_root())
        .output()
        .expect("git runs");
    assert!(out.status.success(), "git {args:?} failed");
    String::from_utf8_lossy(&out.stdout).into_owned()
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

/// The shell commands of the fenced `sh` blocks of `text`: continuation lines joined, comments
/// and prompts left out, each with its line number.
fn shell_commands(text: &str) -> Vec<(usize, String)> {
    let mut commands = Vec::new();
    let mut in_sh = false;
    let mut pending: Option<(usize, String)> = None;
    for (n, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if let Some(info) = trimmed.strip_prefix("```") {
            in_sh = !in_sh && matches!(info.trim(), "sh" | "bash" | "shell" | "console");
            continue;
        }
        if !in_sh {
            continue;
        }
        let code = trimmed.split(" #").next().unwrap_or("").trim_end();
        if code.starts_with('#') || (code.is_empty() && pending.is_none()) {
            continue;
        }
        let (start, mut command) = pending.take().unwrap_or((n + 1, String::new()));
        match code.strip_suffix('\\') {
            Some(head) => {
                command.push_str(head);
                command.push(' ');
                pending = Some((start, command));
            }
            None => {
                command.push_str(code);
                commands.push((start, command));
            }
        }
    }
    commands
}

/// The words of one simple command: up to the first redirection, pipe, `&&`, `;` or `&`.
fn simple_command(command: &str) -> Vec<&str> {
    command
        .split_whitespace()
        .take_while(|w| !matches!(*w, "|" | "||" | "&&" | ";" | "&") && !w.starts_with(['>', '<']))
        .collect()
}

/// The names of the workspace's packages (and the fuzz targets' own workspace's).
fn workspace_packages() -> Vec<String> {
    let root = repo_root();
    [
        "control",
        "filter",
        "filter/core",
        "filter/native",
        "tests",
        "fuzz",
    ]
    .iter()
    .filter_map(|dir| std::fs::read_to_string(root.join(dir).join("Cargo.toml")).ok())
    .filter_map(|manifest| {
        manifest
            .lines()
            .find_map(|l| {
                l.strip_prefix("name = \"")
                    .and_then(|n| n.strip_suffix('"'))
            })
            .map(str::to_string)
    })
    .collect()
}

/// The sections `scripts/bench` takes, from its usage line (`usage: scripts/bench [all|core|...]`).
fn bench_sections() -> Vec<String> {
    let script = std::fs::read_to_string(repo_root().join("scripts/bench")).expect("scripts/bench");
    let usage = script
        .lines()
        .find_map(|l| l.split("usage: scripts/bench [").nth(1))
        .and_then(|rest| rest.split(']').next())
        .expect("scripts/bench prints a usage line");
    usage.split('|').map(str::to_string).collect()
}

#[test]
fn every_command_the_docs_show_runs_as_written() {
    let root = repo_root();
    let mut checked = 0;
    let mut wrong = Vec::new();
    let packages = workspace_packages();
    let bench_sections = bench_sections();
    for Doc {
        name: doc, text, ..
    } in docs()
    {
        for (line, command) in shell_commands(&text) {
            let command = command
                .trim_start_matches("sudo ")
                .trim_start_matches("(umask 027 && ");
            let words = simple_command(command);
            let Some(first) = words.first() else { continue };
            // A script of this repository.
            if first.contains('/') && !first.starts_with(['/', '$', '.', '~']) {
                checked += 1;
                let path = root.join(first);
                let executable = std::fs::metadata(&path)
                    .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o111 != 0)
                    .unwrap_or(false);
                if !executable {
                    wrong.push(format!(
                        "{doc}:{line}: `{first}` is not an executable of the repository"
                    ));
                }
            }
            // scripts/bench: the section it names is one its usage line lists.
            if first == &"scripts/bench" {
                if let Some(section) = words.get(1).filter(|w| !w.starts_with('#')) {
                    checked += 1;
                    if !bench_sections.iter().any(|s| s == section) {
                        wrong.push(format!(
                            "{doc}:{line}: `scripts/bench {section}`: not one of {bench_sections:?}"
                        ));
                    }
                }
            }
            // cargo: the packages it names are the workspace's.
            if first == &"cargo" {
                for package in words.windows(2).filter(|w| w[0] == "-p").map(|w| w[1]) {
                    checked += 1;
                    if !packages.iter().any(|p| p == package) {
                        wrong.push(format!(
                            "{doc}:{line}: no package `{package}` in the workspace"
                        ));
                    }
                }
            }
            // skewgate-control, as the binary parses it (a `$VAR` or `<placeholder>` value is
            // only known on the node: there the flag must exist, its value is not checked).
            let at = words
                .iter()
                .position(|w| !w.contains('=') || w.starts_with('-'))
                .filter(|&at| words[at].rsplit('/').next() == Some("skewgate-control"));
            if let Some(at) = at {
                checked += 1;
                let args = words[at..].iter().map(|w| w.trim_matches(['\'', '"']));
                if let Err(e) = Cli::try_parse_from(args) {
                    use clap::error::ErrorKind::*;
                    let placeholder = command.contains('$') || command.contains('<');
                    let fine = matches!(e.kind(), DisplayHelp | DisplayVersion)
                        || (placeholder && matches!(e.kind(), ValueValidation | InvalidValue));
                    if !fine {
                        wrong.push(format!("{doc}:{line}: `{command}`: {e}"));
                    }
                }
            }
        }
    }
    assert_scanned(
        checked,
        20,
        "commands the docs show do not run as written",
        &wrong,
    );
}

#[test]
fn the_command_scan_joins_lines_and_stops_at_redirections() {
    let text = "```sh\n# a comment\na --b \\\n  c  # why\nd > e | f\n```\n```\nnot sh\n```";
    assert_eq!(
        shell_commands(text),
        [(3, "a --b  c".to_string()), (5, "d > e | f".to_string())]
    );
    assert_eq!(simple_command("d --x > e | f"), ["d", "--x"]);
}

/// Markdown for one table cell: one line; pipes escaped, and angle brackets outside code
/// spans (`apiserver-<hash>` is not an HTML tag).
fn cell(text: &str) -> String {
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    line.split('`')
        .enumerate()
        .map(|(i, part)| match i % 2 {
            0 => part.replace('<', "\\<").replace('>', "\\>"),
            _ => part.to_string(),
        })
        .collect::<Vec<_>>()
        .join("`")
        .replace('|', "\\|")
}

/// The flags section of docs/configuration.md, from the binary's clap definitions.
fn flags_reference() -> String {
    let mut out = String::new();
    let mut cli = Cli::command();
    // Built, so that every argument's number of values is settled.
    cli.build();
    for sub in cli.get_subcommands() {
        let name = sub.get_name();
        out.push_str(&format!("### `skewgate-control {name}`\n\n"));
        if let Some(about) = sub.get_long_about().or(sub.get_about()) {
            out.push_str(&format!("{}\n\n", cell(&about.to_string())));
        }
        out.push_str("| flag | default | what |\n| --- | --- | --- |\n");
        for arg in sub.get_arguments() {
            let id = arg.get_id().as_str();
            if matches!(id, "help" | "version") {
                continue;
            }
            let Some(long) = arg.get_long() else { continue };
            let takes_value = arg.get_num_args().is_some_and(|n| n.takes_values());
            let value = arg
                .get_value_names()
                .map(|v| v.iter().map(|n| format!(" <{n}>")).collect::<String>())
                .filter(|_| takes_value)
                .unwrap_or_default();
            let possible: Vec<String> = arg
                .get_possible_values()
                .iter()
                .filter(|v| !v.is_hide_set())
                .map(|v| format!("`{}`", v.get_name()))
                .collect();
            let default: Vec<String> = arg
                .get_default_values()
                .iter()
                .map(|v| format!("`{}`", v.to_string_lossy()))
                .collect();
            let mut what = arg
                .get_long_help()
                .or(arg.get_help())
                .map(|h| cell(&h.to_string()))
                .unwrap_or_default();
            if arg.is_required_set() {
                what = format!("**Required.** {what}");
            }
            if takes_value && !possible.is_empty() && possible.len() < 8 {
                what = format!("{what} One of {}.", possible.join(", "));
            }
            if let Some(env) = arg.get_env() {
                what = format!("{what} Environment: `{}`.", env.to_string_lossy());
            }
            out.push_str(&format!(
                "| `--{long}{value}` | {} | {} |\n",
                default.join(", "),
                what.trim()
            ));
        }
        out.push('\n');
    }
    out
}

const FLAGS_BEGIN: &str =
    "<!-- flags: generated from the clap definitions by tests/tests/docs.rs -->\n";
const FLAGS_END: &str = "<!-- end of flags -->\n";

#[test]
fn the_configuration_reference_lists_every_flag_as_the_binary_defines_it() {
    let path = repo_root().join("docs/configuration.md");
    let text = std::fs::read_to_string(&path).expect("docs/configuration.md");
    let (Some(begin), Some(end)) = (text.find(FLAGS_BEGIN), text.find(FLAGS_END)) else {
        panic!("docs/configuration.md has no {FLAGS_BEGIN:?} ... {FLAGS_END:?} section");
    };
    let mut cli = Cli::command();
    cli.build();
    let unexplained: Vec<String> = cli
        .get_subcommands()
        .flat_map(|sub| {
            sub.get_arguments()
                .filter(|a| a.get_long().is_some() && a.get_help().is_none())
                .map(move |a| format!("{} --{}", sub.get_name(), a.get_long().unwrap_or_default()))
        })
        .collect();
    assert!(
        unexplained.is_empty(),
        "flags without a help text: {unexplained:?}"
    );
    let generated = flags_reference();
    let shown = &text[begin + FLAGS_BEGIN.len()..end];
    if shown == generated {
        return;
    }
    if std::env::var_os("SKEWGATE_BLESS").is_some() {
        let written = format!("{}{FLAGS_BEGIN}{generated}{}", &text[..begin], &text[end..]);
        std::fs::write(&path, written).expect("write docs/configuration.md");
        return;
    }
    panic!(
        "docs/configuration.md's flags are not the binary's: write them again with \
         SKEWGATE_BLESS=1 cargo test -p skewgate-tests --test docs"
    );
}

/// `skewgate-control --version` names the release and the commit the binary was built from:
/// the checkout's HEAD, since the build script runs again whenever HEAD moves.
#[test]
fn the_version_names_the_commit_it_was_built_from() {
    let bin = skewgate_tests::control_bin().expect("skewgate-control is built");
    let out = std::process::Command::new(bin)
        .arg("--version")
        .output()
        .expect("skewgate-control --version runs");
    assert!(out.status.success());
    let version = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let head = git(&["rev-parse", "HEAD"]).trim().to_string();
    assert_eq!(head.len(), 40, "this test runs in a git checkout");
    assert_eq!(
        version,
        format!(
            "skewgate-control {} (git {head})",
            env!("CARGO_PKG_VERSION")
        )
    );
}

/// The files of the repository that are not documents, as git tracks them.
fn tracked_source_files() -> Vec<PathBuf> {
    let root = repo_root();
    git(&["ls-files", "-z"])
        .split('\0')
        .filter(|f| !f.is_empty() && !f.ends_with(".md"))
        .map(|f| root.join(f))
        .collect()
}

/// `text` as one line: each line's comment markers and indentation removed, so a citation
/// wrapped over two comment lines reads as written.
fn unwrapped(text: &str) -> String {
    text.lines()
        .map(|l| {
            l.trim_start()
                .trim_start_matches(['/', '!', '#', '*'])
                .trim()
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The section citations of `text`: a document (`docs/ARCHITECTURE.md`, `BENCHMARKS.md`) named
/// and, after an optional comma and a space, a title in double quotes.
fn citations(text: &str) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for (at, _) in text.match_indices(".md") {
        let before = &text[..at];
        let start = before
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || "/_-".contains(c)))
            .map_or(0, |i| i + 1);
        let doc = format!("{}.md", &before[start..]);
        let rest = &text[at + 3..];
        let rest = rest.strip_prefix(',').unwrap_or(rest);
        let Some(quoted) = rest
            .strip_prefix(' ')
            .map(str::trim_start)
            .and_then(|r| r.strip_prefix('"'))
        else {
            continue;
        };
        if let Some(title) = quoted.split('"').next() {
            found.push((doc, title.to_string()));
        }
    }
    found
}

/// Every section the code and scripts cite by title ("docs/ARCHITECTURE.md, \"Merged
/// discovery\"") is a heading or a bold label of that document that starts with that title.
#[test]
fn every_section_the_code_cites_exists() {
    let root = repo_root();
    let mut checked = 0;
    let mut missing = Vec::new();
    for file in tracked_source_files() {
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        let name = file
            .strip_prefix(&root)
            .unwrap_or(&file)
            .display()
            .to_string();
        for (doc, title) in citations(&unwrapped(&text)) {
            let path = [root.join(&doc), root.join("docs").join(&doc)]
                .into_iter()
                .find(|p| p.exists());
            let Some(path) = path else {
                missing.push(format!(
                    "{name}: {doc} does not exist (cited for {title:?})"
                ));
                continue;
            };
            checked += 1;
            let target = std::fs::read_to_string(&path).expect("the doc reads");
            let found = target.lines().any(|l| {
                // A numbered heading ("## 6. Per-request cost") is cited without its number.
                let heading = l.trim_start_matches('#').trim_start();
                let heading = heading
                    .split_once(". ")
                    .filter(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
                    .map_or(heading, |(_, rest)| rest);
                (l.starts_with('#') && heading.starts_with(&title))
                    || l.contains(&format!("**{title}"))
            });
            if !found {
                missing.push(format!("{name}: {doc} has no section {title:?}"));
            }
        }
    }
    assert_scanned(checked, 30, "cited sections do not exist", &missing);
}

#[test]
fn a_citation_reads_across_comment_lines() {
    let text = "/// the local apiserver (docs/ARCHITECTURE.md, \"Failover from the local\n/// apiserver\"). And `join(\"docs/x.md\")`.";
    assert_eq!(
        citations(&unwrapped(text)),
        [(
            "docs/ARCHITECTURE.md".to_string(),
            "Failover from the local apiserver".to_string()
        )]
    );
}
