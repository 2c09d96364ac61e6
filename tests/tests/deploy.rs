//! The deploy files cannot drift from what is tested: the kubeadm static pods
//! (`deploy/kubeadm/*.yaml`) are exactly what `deploy/render` makes of the flag lists in
//! `deploy/args/`, those flags are accepted by `skewgate-control run` / `bootstrap` (their real
//! clap definitions and validation) and by real Envoy, and the compose suite's nodes
//! (`tests/compose/node`) start Envoy and the control plane with those same lists, never with
//! flags of their own.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};
use clap::{Args, FromArgMatches};
use skewgate_control::run::{cli::render_bootstrap, BootstrapArgs, RunArgs};
use skewgate_tests::{envoy_bin, repo_root};

/// The arguments of `deploy/args/<name>.args`, `$(VAR)` replaced from `vars` as Kubernetes
/// (and `deploy/args/expand`) do; a variable missing from `vars` fails.
fn expand(name: &str, vars: &[(&str, &str)]) -> Result<Vec<String>> {
    let path = repo_root().join("deploy/args").join(format!("{name}.args"));
    let text = std::fs::read_to_string(&path).with_context(|| path.display().to_string())?;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut arg = line.to_string();
        while let Some(start) = arg.find("$(") {
            let Some(len) = arg[start..].find(')') else {
                bail!("{name}.args: unterminated $( in {line}");
            };
            let var = &arg[start + 2..start + len];
            let Some((_, value)) = vars.iter().find(|(k, _)| *k == var) else {
                bail!("{name}.args uses $({var}), which the test does not set");
            };
            arg.replace_range(start..start + len + 1, value);
        }
        out.push(arg);
    }
    Ok(out)
}

/// The `$(VAR)` names an args file uses.
fn variables(name: &str) -> Result<BTreeSet<String>> {
    let path = repo_root().join("deploy/args").join(format!("{name}.args"));
    let text = std::fs::read_to_string(&path)?;
    let mut vars = BTreeSet::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let mut rest = line;
        while let Some(start) = rest.find("$(") {
            let Some(len) = rest[start..].find(')') else {
                break;
            };
            vars.insert(rest[start + 2..start + len].to_string());
            rest = &rest[start + len..];
        }
    }
    Ok(vars)
}

const KUBEADM: &[(&str, &str)] = &[
    ("NODE_IP", "10.0.0.11"),
    ("NODE_NAME", "cp-1"),
    ("PEER_CIDR", "10.0.0.0/24"),
    ("REQUEST_TIMEOUT", "1m0s"),
    ("LEASE_GRACE", "30s"),
    ("ENVOY_CONCURRENCY", "2"),
];

#[test]
fn the_kubeadm_manifests_are_rendered_from_the_args_files() -> Result<()> {
    let out = Command::new("bash")
        .arg(repo_root().join("deploy/render"))
        .arg("--check")
        .output()?;
    if !out.status.success() {
        bail!(
            "deploy/render --check failed (run deploy/render):\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// Kubernetes leaves a `$(VAR)` the container's env does not define as it is: every variable
/// the args use must be in the manifest's env.
#[test]
fn every_variable_of_the_args_is_in_the_static_pods_env() -> Result<()> {
    for (manifest, files) in [
        ("skewgate-envoy.yaml", &["bootstrap", "envoy"][..]),
        ("skewgate-control.yaml", &["run"][..]),
    ] {
        let path = repo_root().join("deploy/kubeadm").join(manifest);
        let text = std::fs::read_to_string(&path)?;
        for file in files {
            for var in variables(file)? {
                if !text.contains(&format!("- {{name: {var}, value: ")) {
                    bail!("{manifest} has no env {var}, which {file}.args uses");
                }
            }
        }
    }
    Ok(())
}

#[test]
fn run_accepts_its_args() -> Result<()> {
    let args = expand("run", KUBEADM)?;
    let matches = RunArgs::augment_args(clap::Command::new("run"))
        .try_get_matches_from(std::iter::once("run".to_string()).chain(args.clone()))
        .with_context(|| format!("run {args:?}"))?;
    let run = RunArgs::from_arg_matches(&matches)?;
    let config = run.validate().context("run's flags do not validate")?;
    assert_eq!(
        config.health_listen.to_string(),
        "127.0.0.1:18001",
        "the static pod probes /readyz on 127.0.0.1:18001"
    );
    assert_eq!(
        config.debug_listen.map(|a| a.to_string()).as_deref(),
        Some("127.0.0.1:18002"),
        "the compose suites and the README read /debug/skew on 127.0.0.1:18002"
    );
    assert_eq!(
        config.wasm,
        Path::new("/usr/lib/skewgate/skewgate_filter.wasm"),
        "deploy/image/build puts the filter there"
    );
    Ok(())
}

#[test]
fn bootstrap_accepts_its_args_and_envoy_its_own() -> Result<()> {
    let args = expand("bootstrap", KUBEADM)?;
    let matches = BootstrapArgs::augment_args(clap::Command::new("bootstrap"))
        .try_get_matches_from(std::iter::once("bootstrap".to_string()).chain(args.clone()))
        .with_context(|| format!("bootstrap {args:?}"))?;
    let bootstrap = BootstrapArgs::from_arg_matches(&matches)?;
    let yaml = render_bootstrap(&bootstrap).context("bootstrap's flags do not render")?;
    for needle in ["10.0.0.11", "6444", "/run/skewgate/xds.sock"] {
        assert!(
            yaml.contains(needle),
            "the bootstrap has no {needle}:\n{yaml}"
        );
    }

    // Envoy's own flags, on real Envoy (validate mode, a minimal configuration).
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("envoy.yaml");
    std::fs::write(&config, "static_resources: {}\n")?;
    let out = Command::new(envoy_bin()?)
        .arg("--mode")
        .arg("validate")
        .arg("-c")
        .arg(&config)
        .args(expand("envoy", KUBEADM)?)
        .output()?;
    if !out.status.success() {
        bail!(
            "envoy refuses deploy/args/envoy.args:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// The compose nodes start Envoy and the control plane only through the args files.
#[test]
fn the_compose_nodes_run_the_args_files() -> Result<()> {
    let node = std::fs::read_to_string(repo_root().join("tests/compose/node"))?;
    let code: Vec<&str> = node
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .collect();
    for expected in [
        "mapfile -t bootstrap_args < <(args bootstrap)",
        "mapfile -t envoy_args < <(args envoy)",
        "mapfile -t run_args < <(args run)",
        r#"skewgate-envoy "${bootstrap_args[@]}" -- "${envoy_args[@]}" 2>"$logs/$NODE-envoy.log" &"#,
        r#"skewgate-control run "${run_args[@]}" >"$logs/$NODE-control.out" 2>"$logs/$NODE-control.log" &"#,
    ] {
        assert!(
            code.contains(&expected),
            "tests/compose/node does not have the line {expected}"
        );
    }
    for line in &code {
        let starts_envoy = line.contains("skewgate-envoy ")
            || line.contains("envoy -c")
            || line.contains("bin/envoy");
        let starts_control = line.contains("skewgate-control ") && !line.contains("cat >");
        if (starts_envoy || starts_control)
            && !line.contains("\"${bootstrap_args[@]}\"")
            && !line.contains("\"${run_args[@]}\"")
        {
            bail!("tests/compose/node starts Envoy or skewgate-control with its own flags: {line}");
        }
    }
    Ok(())
}
