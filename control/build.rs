//! The descriptors of Envoy's configuration API, for writing the configuration as YAML
//! (`envoy::yaml`): proto3's JSON mapping needs every message's field names and, for each
//! `Any`, the packed type's. They are compiled here (protox, no `protoc`) from the very
//! `.proto` files the `envoy-types` crate was generated from, which it ships, so the
//! descriptors and the Rust types cannot disagree.

use std::path::{Path, PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    git_commit();
    let proto = envoy_types_protos()?;
    let includes: Vec<PathBuf> = [
        "data-plane-api",
        "xds",
        "protoc-gen-validate",
        "googleapis",
        "opentelemetry-proto",
        "client_model",
        "cel-spec/proto",
        "ratelimit",
    ]
    .iter()
    .map(|dir| proto.join(dir))
    .collect();
    // Every package whose messages skewgate renders, directly or packed in an `Any`; the
    // files they import come along. Not every file of the API: protox resolves a relative
    // type name against every package it knows, and two unrelated packages of Envoy's API
    // (`...clusters.common` and `...clusters.dynamic_forward_proxy`) then collide.
    let mut files = Vec::new();
    for package in PACKAGES {
        collect_protos(&proto.join("data-plane-api").join(package), &mut files)?;
    }
    files.sort();
    let relative: Vec<PathBuf> = files
        .iter()
        .filter_map(|f| f.strip_prefix(proto.join("data-plane-api")).ok())
        .map(Path::to_path_buf)
        .collect();
    let descriptors = protox::compile(&relative, &includes)?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?).join("envoy-descriptors.bin");
    std::fs::write(out, prost::Message::encode_to_vec(&descriptors))?;
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed={}", proto.display());
    Ok(())
}

/// `SKEWGATE_GIT_COMMIT` for `--version`: the commit the checkout is at, or `unknown` outside
/// a git checkout (a source archive) or without git. Built again when HEAD moves: a commit, a
/// checkout, a branch's ref written loose or packed.
fn git_commit() {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .map(|s| s.trim().to_string())
    };
    let commit = git(&["rev-parse", "--verify", "HEAD"])
        .filter(|c| c.len() == 40 && c.bytes().all(|b| b.is_ascii_hexdigit()))
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=SKEWGATE_GIT_COMMIT={commit}");
    let head_ref = git(&["symbolic-ref", "-q", "HEAD"]);
    // HEAD's reflog moves with every commit and checkout, also when the branch's ref is only
    // in packed-refs and the commit writes it loose.
    for path in ["HEAD", "logs/HEAD", "packed-refs"]
        .into_iter()
        .map(str::to_string)
        .chain(head_ref)
    {
        // Only files that exist: Cargo runs a build script every time for one that does not.
        if let Some(file) = git(&["rev-parse", "--path-format=absolute", "--git-path", &path])
            .filter(|f| Path::new(f).exists())
        {
            println!("cargo:rerun-if-changed={file}");
        }
    }
}

/// The packages of [`main`], as folders of Envoy's API.
const PACKAGES: &[&str] = &[
    "envoy/config/bootstrap/v3",
    "envoy/config/cluster/v3",
    "envoy/config/common/mutation_rules/v3",
    "envoy/config/core/v3",
    "envoy/config/endpoint/v3",
    "envoy/config/listener/v3",
    "envoy/config/metrics/v3",
    "envoy/config/overload/v3",
    "envoy/config/rbac/v3",
    "envoy/config/route/v3",
    "envoy/extensions/clusters/aggregate/v3",
    "envoy/extensions/dynamic_modules/v3",
    "envoy/extensions/filters/http/dynamic_modules/v3",
    "envoy/extensions/filters/http/header_mutation/v3",
    "envoy/extensions/filters/http/health_check/v3",
    "envoy/extensions/filters/http/router/v3",
    "envoy/extensions/filters/http/upstream_codec/v3",
    "envoy/extensions/filters/http/wasm/v3",
    "envoy/extensions/filters/network/http_connection_manager/v3",
    "envoy/extensions/filters/network/rbac/v3",
    "envoy/extensions/filters/network/tcp_proxy/v3",
    "envoy/extensions/resource_monitors/injected_resource/v3",
    "envoy/extensions/retry/host/previous_hosts/v3",
    "envoy/extensions/retry/priority/previous_priorities/v3",
    "envoy/extensions/transport_sockets/tls/v3",
    "envoy/extensions/upstreams/http/v3",
    "envoy/extensions/wasm/v3",
    "envoy/service/discovery/v3",
];

/// `proto/` of the `envoy-types` package this build resolved, found through `cargo metadata`.
fn envoy_types_protos() -> Result<PathBuf, Box<dyn std::error::Error>> {
    let cargo = std::env::var("CARGO")?;
    let manifest = Path::new(&std::env::var("CARGO_MANIFEST_DIR")?).join("Cargo.toml");
    let output = std::process::Command::new(cargo)
        // This platform's packages only: they are all downloaded already (the build needs them).
        .args([
            "metadata",
            "--format-version=1",
            "--offline",
            "--filter-platform",
        ])
        .arg(std::env::var("TARGET")?)
        .arg("--manifest-path")
        .arg(&manifest)
        .output()?;
    if !output.status.success() {
        return Err(format!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&output.stderr)
        )
        .into());
    }
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout)?;
    let manifest_path = metadata["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == "envoy-types")
        .and_then(|p| p["manifest_path"].as_str())
        .ok_or("envoy-types is not among this build's packages")?;
    Ok(Path::new(manifest_path)
        .parent()
        .ok_or("envoy-types' manifest has no folder")?
        .join("proto"))
}

fn collect_protos(dir: &Path, files: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            collect_protos(&path, files)?;
        } else if path.extension().is_some_and(|e| e == "proto") {
            files.push(path);
        }
    }
    Ok(())
}
