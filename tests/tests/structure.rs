//! The control plane's core knows nothing of its host: the code of what each apiserver serves,
//! where each request goes, what is retained, the plan, the peer model and the checked flags
//! names no async runtime, Kubernetes client, gRPC or HTTP stack, so it stays testable (and
//! fuzzable) without them. The modules that decide also read no clock: time is passed in. (The
//! check reads each file's own code, tests left out; the shared types it imports, such as
//! `local_channels`' addresses, live beside the host code that uses them.)
//!
//! This is the line a separate core crate would draw (linkerd's policy controller keeps its core
//! apart that way); inside one crate it is kept by this test. Why not a crate: the fuzz targets
//! that need the control plane include the bootstrap (Envoy's types pull in tonic) and the Lease
//! parser, so they would build everything anyway (docs/ARCHITECTURE.md, "Control loop").

use std::path::Path;

use skewgate_tests::repo_root;

/// The core, from `control/src/` (a folder: every `.rs` in it).
const CORE: &[&str] = &[
    "discovery/",
    "routing.rs",
    "retained.rs",
    "plan.rs",
    "peers/model.rs",
    "peers/address.rs",
    "run/state.rs",
    "run/retention.rs",
    "run/config.rs",
    "run/bootstrap_config.rs",
    "static_config/cli.rs",
    "envoy/bootstrap.rs",
    "envoy/resources.rs",
    "envoy/fallback.rs",
    "envoy/dialect.rs",
    "xds/snapshot.rs",
];
/// The modules that decide: besides the host crates, no clock.
const NO_CLOCK: &[&str] = &["routing.rs", "retained.rs", "plan.rs", "run/retention.rs"];
/// The host: crates (as paths, `use` or `crate::`-less) the core must not name.
const HOST_CRATES: &[&str] = &[
    "tokio",
    "kube",
    "tonic",
    "hyper",
    "hyper_util",
    "reqwest",
    "axum",
    "tower",
    "k8s_openapi",
];

/// The code lines of every file of `part`: comment lines and the test module (from its
/// `#[cfg(test)]` on) left out.
fn code(part: &str) -> Vec<(String, usize, String)> {
    let root = repo_root().join("control/src");
    let path = root.join(part);
    let files: Vec<std::path::PathBuf> = if part.ends_with('/') {
        let mut files: Vec<_> = std::fs::read_dir(&path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "rs"))
            .collect();
        files.sort();
        files
    } else {
        vec![path]
    };
    assert!(!files.is_empty(), "{part}: no files");
    let mut lines = Vec::new();
    for file in files {
        let text =
            std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let name = file
            .strip_prefix(&root)
            .unwrap_or(Path::new(part))
            .display()
            .to_string();
        for (n, line) in text.lines().enumerate() {
            let code = line.trim_start();
            if code == "#[cfg(test)]" {
                break;
            }
            if !code.is_empty() && !code.starts_with("//") {
                lines.push((name.clone(), n + 1, line.to_string()));
            }
        }
    }
    lines
}

fn names_crate(line: &str, krate: &str) -> bool {
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    // Where `krate` starts a path: not inside another name, not after `crate::`/`super::`
    // (`::tokio::x`, an absolute path, is the crate).
    let starts_path = |before: &str| {
        let before = before.strip_suffix("::").map_or(before, |b| {
            if b.chars().next_back().is_some_and(ident) {
                "x" // `crate::tokio`, `a::tokio`: a module of ours or of another crate
            } else {
                b
            }
        });
        before
            .chars()
            .next_back()
            .is_none_or(|c| !(ident(c) || c == ':'))
    };
    let path = format!("{krate}::");
    let used_as_path = line
        .match_indices(&path)
        .any(|(i, _)| starts_path(&line[..i]));
    // `use tokio;`, `use tokio as rt;`, `extern crate tokio;`, `use tokio::{..}` (above).
    let whole = line.trim_start();
    let used_whole = ["use ", "pub use ", "extern crate "].iter().any(|lead| {
        whole.strip_prefix(lead).is_some_and(|rest| {
            rest.strip_prefix(krate)
                .is_some_and(|after| after.chars().next().is_none_or(|c| !ident(c) && c != ':'))
        })
    });
    used_as_path || used_whole
}

#[test]
fn the_core_names_no_host_crate() {
    let mut found = Vec::new();
    for part in CORE {
        for (file, n, line) in code(part) {
            for krate in HOST_CRATES {
                if names_crate(&line, krate) {
                    found.push(format!("control/src/{file}:{n}: {}", line.trim()));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "the core uses its host:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_deciding_modules_read_no_clock() {
    let mut found = Vec::new();
    for part in NO_CLOCK {
        for (file, n, line) in code(part) {
            if line.contains("::now()") || line.contains("::now)") || line.contains(".elapsed()") {
                found.push(format!("control/src/{file}:{n}: {}", line.trim()));
            }
        }
    }
    assert!(found.is_empty(), "a clock read:\n{}", found.join("\n"));
}

#[test]
fn the_check_finds_what_it_looks_for() {
    assert!(names_crate("use tokio::sync::watch;", "tokio"));
    assert!(names_crate("    let x = kube::Api::all(c);", "kube"));
    assert!(names_crate("fn f() -> tonic::Status {", "tonic"));
    assert!(names_crate(
        "let r = ::tokio::runtime::Handle::current();",
        "tokio"
    ));
    assert!(names_crate("use tokio as rt;", "tokio"));
    assert!(names_crate("extern crate tokio;", "tokio"));
    assert!(!names_crate("use crate::my_tokio::x;", "tokio"));
    assert!(!names_crate("use crate::tokio::x;", "tokio"));
    assert!(!names_crate("use skewgate_kube::x;", "kube"));
    assert!(!names_crate("use tokio_stream::x;", "tokio"));
    assert!(!names_crate("let url = \"https://kube.example/\";", "kube"));
}

/// The native filter's `unsafe` lives in its FFI modules alone (`filter/native/src/ffi.rs`, the
/// host's side, with its fake Envoy `ffi/fake.rs`, and `filter/native/src/hooks.rs`, the
/// module's side), and every `unsafe` block there says why it holds.
#[test]
fn unsafe_is_in_the_native_filters_ffi_module_only_with_its_invariant() {
    let src = repo_root().join("filter/native/src");
    let mut outside = Vec::new();
    let mut undocumented = Vec::new();
    let mut blocks = 0;
    let mut files = vec![src.clone()];
    while let Some(path) = files.pop() {
        if path.is_dir() {
            for entry in std::fs::read_dir(&path).expect("a directory") {
                files.push(entry.expect("an entry").path());
            }
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("a source file");
        let relative = path.strip_prefix(&src).expect("under src").to_path_buf();
        let ffi = relative == Path::new("ffi.rs")
            || relative.starts_with("ffi")
            || relative == Path::new("hooks.rs");
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            if !code.contains("unsafe") {
                continue;
            }
            // The one allowance: on the FFI modules' declarations.
            let allows_ffi = code.contains("#[allow(unsafe_code)]")
                && lines
                    .get(i + 1)
                    .is_some_and(|next| ["pub mod ffi;", "pub mod hooks;"].contains(&next.trim()));
            if !ffi && !allows_ffi {
                outside.push(format!("{}:{}", relative.display(), i + 1));
            }
            // An `unsafe {` block: a `// SAFETY:` comment above it (within a few lines).
            if code.contains("unsafe {") {
                blocks += 1;
                let from = i.saturating_sub(6);
                if !lines[from..=i].iter().any(|l| l.contains("SAFETY:")) {
                    undocumented.push(format!("{}:{}", relative.display(), i + 1));
                }
            }
        }
    }
    assert!(
        blocks > 20,
        "only {blocks} unsafe blocks found: the scan is broken"
    );
    assert!(
        outside.is_empty(),
        "unsafe outside the FFI module: {outside:?}"
    );
    assert!(
        undocumented.is_empty(),
        "unsafe blocks without a SAFETY comment: {undocumented:?}"
    );
}
