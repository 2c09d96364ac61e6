//! The deploy files cannot drift from what is tested: the kubeadm static pods
//! (`deploy/kubeadm/*.yaml`) are exactly what `deploy/render` makes of the flag lists in
//! `deploy/args/`, those flags are accepted by `skewgate-control run` / `bootstrap` (their real
//! clap definitions and validation) and by real Envoy, and the compose suite's nodes
//! (`tests/compose/node`) start Envoy and the control plane with those same lists, never with
//! flags of their own. The static pods run unprivileged and see no CA key
//! ([`the_static_pods_run_unprivileged_and_see_no_ca_key`]), the host files of `deploy/host/`
//! make what they need ([`the_host_files_make_what_the_pods_need`]), and the live-mode
//! commands are these lists ([`the_readme_live_mode_commands_are_the_args_files`]).

use std::collections::BTreeSet;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, ensure, Context, Result};
use clap::{Args, FromArgMatches};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use skewgate_control::run::{cli::render_bootstrap, BootstrapArgs, RunArgs};
use skewgate_tests::{envoy_bin, python_bin, repo_root};

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

/// The example node of the README and the manifests' comments.
const KUBEADM: &[(&str, &str)] = &[
    ("NODE_IP", "10.0.0.11"),
    ("NODE_NAME", "cp-1"),
    ("PEER_CIDR", "10.0.0.0/24"),
    ("REQUEST_TIMEOUT", "1m0s"),
    ("LEASE_GRACE", "30s"),
    ("ENVOY_CONCURRENCY", "2"),
    ("DATA_PLANE", "wasm"),
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
        Path::new(config.filter_code.path()),
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
    let rendered = render_bootstrap(&bootstrap).context("bootstrap's flags do not render")?;
    let rendered = skewgate_tests::bootstrap::decode(rendered.as_bytes())?;
    assert_eq!(
        skewgate_tests::bootstrap::listener_addresses(&rendered),
        [
            ("apiserver".to_string(), "10.0.0.11:6443".to_string()),
            ("peer".to_string(), "10.0.0.11:6444".to_string()),
        ]
    );
    assert!(skewgate_tests::bootstrap::cluster_names(&rendered)
        .contains(&"skewgate-control".to_string()));

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

/// Envoy's stop: the entrypoint turns SIGTERM into `skewgate-control drain-envoy` instead of
/// letting Envoy exit at once (`tests/tests/drain.rs` runs it), Envoy's flags make the drain
/// reach every HTTP/2 connection at once, and the drain's defaults are the only source of the
/// static pod's grace period and of the README's numbers.
#[test]
fn the_envoy_pod_drains_within_its_grace_period() -> Result<()> {
    use skewgate_control::envoy::drain::{
        DEFAULT_DRAIN_SECONDS, DEFAULT_FINISH_SECONDS, STOP_MARGIN_SECONDS,
        TERMINATION_GRACE_PERIOD_SECONDS,
    };
    let spec = pod("skewgate-envoy.yaml")?.spec.context("spec")?;
    ensure!(
        spec.termination_grace_period_seconds == Some(TERMINATION_GRACE_PERIOD_SECONDS as i64),
        "skewgate-envoy.yaml: terminationGracePeriodSeconds {:?}, the drain needs {TERMINATION_GRACE_PERIOD_SECONDS}",
        spec.termination_grace_period_seconds
    );
    let entrypoint = std::fs::read_to_string(repo_root().join("deploy/image/skewgate-envoy"))?;
    let code: Vec<&str> = entrypoint
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .collect();
    ensure!(
        code.iter().any(|l| l.starts_with("trap stop TERM"))
            && code
                .iter()
                .any(|l| l.contains(r#"skewgate-control drain-envoy --bootstrap "$config""#))
            && !code.iter().any(|l| l.starts_with("exec envoy")),
        "deploy/image/skewgate-envoy must keep Envoy as its child and drain it on SIGTERM"
    );
    let envoy = expand("envoy", KUBEADM)?;
    ensure!(
        envoy
            .windows(2)
            .any(|w| w == ["--drain-strategy", "immediate"]),
        "deploy/args/envoy.args: --drain-strategy immediate"
    );
    let readme = std::fs::read_to_string(repo_root().join("docs/install.md"))?;
    let readme = readme.split_whitespace().collect::<Vec<_>>().join(" ");
    for said in [
        format!("After {DEFAULT_DRAIN_SECONDS} s the ports close"),
        format!("at most {DEFAULT_FINISH_SECONDS} s later"),
        format!(
            "{} s after the SIGTERM",
            DEFAULT_DRAIN_SECONDS + DEFAULT_FINISH_SECONDS
        ),
        format!("`terminationGracePeriodSeconds: {TERMINATION_GRACE_PERIOD_SECONDS}`"),
        format!("with {STOP_MARGIN_SECONDS} s to spare"),
    ] {
        ensure!(
            readme.contains(&said),
            "docs/install.md, \"Stopping Envoy\", does not say {said:?}"
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
        r#"skewgate-envoy "${bootstrap_args[@]}" -- "${envoy_args[@]}" 2>>"$logs/$NODE-envoy.log" &"#,
        r#"skewgate-control run "${run_args[@]}" >>"$logs/$NODE-control.out" 2>>"$logs/$NODE-control.log" &"#,
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

/// The flags deploy/kubeadm/kube-apiserver.md tells an operator to add to kube-apiserver (its
/// first YAML block, kubeadm's `apiServer.extraArgs`) are the ones the real-apiserver suites run
/// kube-apiserver with beside kubeadm's (tests/compose/real/kube-apiserver.skewgate.args).
#[test]
fn the_real_suites_run_kube_apiserver_with_the_documented_change() -> Result<()> {
    let doc = std::fs::read_to_string(repo_root().join("deploy/kubeadm/kube-apiserver.md"))?;
    let block = doc
        .split("```yaml\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .context("deploy/kubeadm/kube-apiserver.md: no yaml block")?;
    let out = Command::new(python_bin()?)
        .arg("-c")
        .arg("import json, sys, yaml; print(json.dumps(yaml.safe_load(sys.stdin)))")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            child
                .stdin
                .take()
                .context("stdin")
                .map_err(std::io::Error::other)?
                .write_all(block.as_bytes())?;
            child.wait_with_output()
        })?;
    ensure!(out.status.success(), "the block is not YAML: {block}");
    let config: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let documented: Vec<String> = config["apiServer"]["extraArgs"]
        .as_array()
        .context("apiServer.extraArgs")?
        .iter()
        .map(|a| {
            format!(
                "--{}={}",
                a["name"].as_str().unwrap_or(""),
                a["value"].as_str().unwrap_or("")
            )
        })
        .collect();
    let run = std::fs::read_to_string(
        repo_root().join("tests/compose/real/kube-apiserver.skewgate.args"),
    )?;
    let ran: Vec<String> = run
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect();
    ensure!(
        documented == ran,
        "deploy/kubeadm/kube-apiserver.md says {documented:?}, the real suites run {ran:?}"
    );
    Ok(())
}

/// A static pod as the kubelet reads it: YAML (PyYAML, `.tools/venv`) into the typed `Pod`.
fn pod(manifest: &str) -> Result<Pod> {
    let path = repo_root().join("deploy/kubeadm").join(manifest);
    let out = Command::new(python_bin()?)
        .arg("-c")
        .arg("import json, sys, yaml; print(json.dumps(yaml.safe_load(open(sys.argv[1]))))")
        .arg(&path)
        .output()?;
    ensure!(
        out.status.success(),
        "{manifest} is not YAML: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).with_context(|| format!("{manifest} is not a Pod"))
}

/// The uid and gid `deploy/host/sysusers.conf` gives the user `skewgate`.
fn skewgate_ids() -> Result<(i64, i64)> {
    let text = std::fs::read_to_string(repo_root().join("deploy/host/sysusers.conf"))?;
    let mut uid = None;
    let mut gid = None;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["u", "skewgate", ids, ..] => {
                uid = Some(ids.split(':').next().unwrap_or_default().parse()?)
            }
            ["g", "skewgate", id, ..] => gid = Some(id.parse()?),
            _ => {}
        }
    }
    match (uid, gid) {
        (Some(u), Some(g)) => Ok((u, g)),
        _ => bail!("deploy/host/sysusers.conf has no u and g line for skewgate"),
    }
}

fn mebibytes(q: &Quantity) -> Result<u64> {
    let Some(n) = q.0.strip_suffix("Mi") else {
        bail!("memory {:?}: give it in Mi", q.0);
    };
    Ok(n.parse()?)
}

/// The kubeadm files no skewgate pod may see: the CA keys, the service-account key, etcd's.
const FORBIDDEN: &[&str] = &[
    "/etc/kubernetes/pki/ca.key",
    "/etc/kubernetes/pki/sa.key",
    "/etc/kubernetes/pki/front-proxy-ca.key",
    "/etc/kubernetes/pki/etcd/ca.key",
    "/etc/kubernetes/pki/etcd/server.key",
    "/etc/kubernetes/pki/etcd/peer.key",
    "/etc/kubernetes/pki/apiserver-etcd-client.key",
    "/etc/kubernetes/admin.conf",
    "/etc/kubernetes/super-admin.conf",
];

/// Where the pods may write on the host: the sockets and SDS files, the state.
const WRITABLE_HOST_DIRS: &[&str] = &["/run/skewgate", "/var/lib/skewgate"];

/// Least privilege, from the rendered manifests: a dedicated non-root user (the one
/// deploy/host creates), no capabilities, no privilege escalation, a read-only root filesystem,
/// seccomp RuntimeDefault, memory requested and limited; host directories mounted exist already
/// (never made by the kubelet as root's), none holds a CA key, sa.key or etcd's keys, and only
/// the socket and state directories are writable; every certificate the args name is inside a
/// mounted directory; Envoy's entrypoint writes its bootstrap where an emptyDir is.
#[test]
fn the_static_pods_run_unprivileged_and_see_no_ca_key() -> Result<()> {
    let (uid, gid) = skewgate_ids()?;
    ensure!(uid != 0 && gid != 0, "skewgate's ids must not be root's");
    let entrypoint = std::fs::read_to_string(repo_root().join("deploy/image/skewgate-envoy"))?;
    for (manifest, args_files) in [
        ("skewgate-envoy.yaml", &["bootstrap"][..]),
        ("skewgate-control.yaml", &["run"][..]),
    ] {
        let pod = pod(manifest)?;
        let spec = pod.spec.context("spec")?;
        let pod_security = spec.security_context.clone().unwrap_or_default();
        ensure!(
            pod_security.run_as_non_root == Some(true),
            "{manifest}: runAsNonRoot"
        );
        ensure!(
            pod_security.run_as_user == Some(uid),
            "{manifest}: runAsUser {uid}"
        );
        ensure!(
            pod_security.run_as_group == Some(gid),
            "{manifest}: runAsGroup {gid}"
        );
        ensure!(
            pod_security
                .seccomp_profile
                .as_ref()
                .map(|p| p.type_.as_str())
                == Some("RuntimeDefault"),
            "{manifest}: seccomp RuntimeDefault"
        );
        let volumes = spec.volumes.clone().unwrap_or_default();
        for volume in &volumes {
            if let Some(host) = &volume.host_path {
                let kind = host.type_.as_deref().unwrap_or_default();
                ensure!(
                    kind == "Directory" || kind == "File",
                    "{manifest}: hostPath {} is {kind:?}: it must exist (deploy/host), never be created by the kubelet",
                    host.path
                );
                for forbidden in FORBIDDEN {
                    ensure!(
                        !Path::new(forbidden).starts_with(&host.path),
                        "{manifest}: hostPath {} holds {forbidden}",
                        host.path
                    );
                }
            }
        }
        ensure!(spec.containers.len() == 1, "{manifest}: one container");
        let container = &spec.containers[0];
        ensure!(
            spec.init_containers.is_none() && spec.ephemeral_containers.is_none(),
            "{manifest}: only the one container"
        );
        let security = container.security_context.clone().unwrap_or_default();
        ensure!(
            security.allow_privilege_escalation == Some(false),
            "{manifest}: allowPrivilegeEscalation: false"
        );
        ensure!(
            security.read_only_root_filesystem == Some(true),
            "{manifest}: readOnlyRootFilesystem"
        );
        ensure!(
            security.privileged != Some(true),
            "{manifest}: not privileged"
        );
        ensure!(
            security.run_as_user.is_none() && security.run_as_non_root != Some(false),
            "{manifest}: the container keeps the pod's user"
        );
        let caps = security.capabilities.clone().unwrap_or_default();
        ensure!(
            caps.drop == Some(vec!["ALL".to_string()]) && caps.add.unwrap_or_default().is_empty(),
            "{manifest}: capabilities drop ALL, add none"
        );
        let resources = container.resources.clone().unwrap_or_default();
        let request = resources.requests.unwrap_or_default();
        let limit = resources.limits.unwrap_or_default();
        let (Some(request), Some(limit)) = (request.get("memory"), limit.get("memory")) else {
            bail!("{manifest}: memory request and limit");
        };
        ensure!(
            mebibytes(request)? <= mebibytes(limit)?,
            "{manifest}: memory request above the limit"
        );

        // Where each mount comes from, and whether it is written.
        let mut mounted: Vec<(PathBuf, Option<String>, bool)> = Vec::new();
        for mount in container.volume_mounts.clone().unwrap_or_default() {
            let volume = volumes
                .iter()
                .find(|v| v.name == mount.name)
                .with_context(|| format!("{manifest}: no volume {}", mount.name))?;
            let host = volume.host_path.as_ref().map(|h| h.path.clone());
            let writable = mount.read_only != Some(true);
            if let (Some(host), true) = (&host, writable) {
                ensure!(
                    WRITABLE_HOST_DIRS.contains(&host.as_str()),
                    "{manifest}: {host} is mounted writable"
                );
            }
            mounted.push((PathBuf::from(&mount.mount_path), host, writable));
        }
        let visible = |path: &Path| mounted.iter().any(|(m, _, _)| path.starts_with(m));
        for file in args_files {
            for arg in expand(file, KUBEADM)? {
                let Some((flag, value)) = arg.split_once('=') else {
                    continue;
                };
                if flag.ends_with("-file") {
                    ensure!(
                        visible(Path::new(value)),
                        "{manifest}: {flag} {value} is in no mounted directory"
                    );
                }
                if matches!(flag, "--socket-dir" | "--sds-dir" | "--state-dir") {
                    ensure!(
                        visible(Path::new(value)),
                        "{manifest}: {flag} {value} is not mounted"
                    );
                }
            }
        }
        if manifest == "skewgate-envoy.yaml" {
            // deploy/image/skewgate-envoy writes the bootstrap into its default directory.
            let default = entrypoint
                .lines()
                .find_map(|l| l.strip_prefix("config=${SKEWGATE_ENVOY_CONFIG:-"))
                .and_then(|l| l.strip_suffix('}'))
                .context("skewgate-envoy's default bootstrap path")?;
            let dir = Path::new(default).parent().context("a directory")?;
            ensure!(
                mounted
                    .iter()
                    .any(|(m, host, writable)| m == dir && host.is_none() && *writable),
                "{manifest}: no emptyDir at {} for the bootstrap",
                dir.display()
            );
        }
    }
    Ok(())
}

/// `deploy/host/`, run for real against a scratch root and a kubeadm-like PKI: systemd-sysusers
/// makes the user the pods run as, systemd-tmpfiles the socket and state directories (theirs,
/// 0700), and skewgate-pki-sync copies exactly the files the args name (group-readable by that
/// user only, never a CA key), replaces one by a rename when kubeadm rewrites it in place,
/// and leaves it alone when nothing changed.
#[test]
fn the_host_files_make_what_the_pods_need() -> Result<()> {
    ensure!(
        is_root(),
        "needs root (chown, as the install step runs): run the tests as root"
    );
    let (uid, gid) = skewgate_ids()?;
    let host = repo_root().join("deploy/host");
    let root = tempfile::tempdir()?;
    std::fs::create_dir_all(root.path().join("etc"))?;
    let run = |cmd: &mut Command| -> Result<String> {
        let out = cmd.output()?;
        ensure!(
            out.status.success(),
            "{cmd:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let root_flag = format!("--root={}", root.path().display());
    run(Command::new("systemd-sysusers")
        .arg(&root_flag)
        .arg(host.join("sysusers.conf")))?;
    let passwd = std::fs::read_to_string(root.path().join("etc/passwd"))?;
    ensure!(
        passwd.contains(&format!("skewgate:x:{uid}:{gid}:")),
        "no user skewgate {uid}:{gid} in {passwd}"
    );
    // What an older, root-run skewgate left behind (the test runs as root): its SDS directory
    // and file, and an xDS socket nobody removed.
    let old_run = root.path().join("run/skewgate");
    std::fs::create_dir_all(old_run.join("sds"))?;
    std::fs::set_permissions(old_run.join("sds"), std::fs::Permissions::from_mode(0o700))?;
    std::fs::write(old_run.join("sds/serving.yaml"), "old\n")?;
    std::fs::set_permissions(
        old_run.join("sds/serving.yaml"),
        std::fs::Permissions::from_mode(0o600),
    )?;
    drop(std::os::unix::net::UnixListener::bind(
        old_run.join("xds.sock"),
    )?);
    run(Command::new("systemd-tmpfiles")
        .arg(&root_flag)
        .arg("--create")
        .arg(host.join("tmpfiles.conf")))?;
    // ...is the pods' user's now, modes kept: it can write the SDS files again and probe and
    // replace the stale socket.
    for (left, mode) in [("sds", 0o700), ("sds/serving.yaml", 0o600), ("xds.sock", 0)] {
        let meta = std::fs::symlink_metadata(old_run.join(left))?;
        ensure!(
            i64::from(meta.uid()) == uid
                && i64::from(meta.gid()) == gid
                && (mode == 0 || meta.mode() & 0o7777 == mode),
            "/run/skewgate/{left}: {}:{} {:o}",
            meta.uid(),
            meta.gid(),
            meta.mode() & 0o7777
        );
    }
    for dir in WRITABLE_HOST_DIRS {
        let meta = std::fs::metadata(root.path().join(dir.trim_start_matches('/')))?;
        ensure!(
            meta.is_dir()
                && i64::from(meta.uid()) == uid
                && i64::from(meta.gid()) == gid
                && meta.mode() & 0o7777 == 0o700,
            "{dir}: {}:{} {:o}",
            meta.uid(),
            meta.gid(),
            meta.mode() & 0o7777
        );
    }

    // kubeadm's PKI, every file root's and 0600 as kubeadm writes them.
    let pki = root.path().join("etc/kubernetes/pki");
    std::fs::create_dir_all(pki.join("etcd"))?;
    let kubeadm_files = [
        "ca.crt",
        "ca.key",
        "sa.key",
        "sa.pub",
        "apiserver.crt",
        "apiserver.key",
        "apiserver-kubelet-client.crt",
        "apiserver-kubelet-client.key",
        "apiserver-etcd-client.key",
        "front-proxy-ca.crt",
        "front-proxy-ca.key",
        "front-proxy-client.crt",
        "front-proxy-client.key",
        "etcd/ca.key",
        "etcd/server.key",
    ];
    for name in kubeadm_files {
        std::fs::write(pki.join(name), format!("{name} v1\n"))?;
    }
    let dest = root.path().join("etc/kubernetes/skewgate/pki");
    let sync = || -> Result<String> {
        run(Command::new(host.join("skewgate-pki-sync"))
            .env("SKEWGATE_PKI_SOURCE", &pki)
            .env("SKEWGATE_PKI_DEST", &dest)
            .env("SKEWGATE_GROUP", gid.to_string()))
    };
    sync()?;
    // Exactly the files the args name, under the path the pods mount.
    let mut named = BTreeSet::new();
    for file in ["bootstrap", "run"] {
        for arg in expand(file, KUBEADM)? {
            if let Some((flag, value)) = arg.split_once('=') {
                if flag.ends_with("-file") && value.starts_with("/etc/kubernetes/") {
                    named.insert(PathBuf::from(value));
                }
            }
        }
    }
    let mut copied = BTreeSet::new();
    for dir in std::fs::read_dir(&dest)? {
        let dir = dir?.path();
        let meta = std::fs::metadata(&dir)?;
        ensure!(
            meta.uid() == 0 && i64::from(meta.gid()) == gid && meta.mode() & 0o7777 == 0o750,
            "{}: {}:{} {:o}",
            dir.display(),
            meta.uid(),
            meta.gid(),
            meta.mode() & 0o7777
        );
        for file in std::fs::read_dir(&dir)? {
            let file = file?.path();
            let meta = std::fs::metadata(&file)?;
            ensure!(
                meta.uid() == 0 && i64::from(meta.gid()) == gid && meta.mode() & 0o7777 == 0o640,
                "{}: {}:{} {:o}",
                file.display(),
                meta.uid(),
                meta.gid(),
                meta.mode() & 0o7777
            );
            let on_node = Path::new("/").join(file.strip_prefix(root.path())?);
            copied.insert(on_node);
        }
    }
    ensure!(
        copied == named,
        "copied {copied:?}, the args name {named:?}"
    );
    for path in &copied {
        let text = std::fs::read_to_string(root.path().join(path.strip_prefix("/")?))?;
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        ensure!(text == format!("{name} v1\n"), "{}: {text}", path.display());
        ensure!(
            !name.ends_with("ca.key") && name != "sa.key",
            "{name} copied"
        );
    }

    // Nothing changed: nothing replaced (Envoy sees no event).
    let key = dest.join("serving/apiserver.key");
    let inode = std::fs::metadata(&key)?.ino();
    ensure!(sync()?.is_empty(), "a second sync changed something");
    ensure!(
        std::fs::metadata(&key)?.ino() == inode,
        "replaced though unchanged"
    );
    // `kubeadm certs renew` rewrites in place: the copy is replaced by a rename (a new inode
    // in the watched directory), with the new content and the same mode.
    std::fs::write(pki.join("apiserver.key"), "apiserver.key v2\n")?;
    let out = sync()?;
    ensure!(out.contains("serving/apiserver.key updated"), "{out}");
    ensure!(
        std::fs::metadata(&key)?.ino() != inode,
        "not replaced by a rename"
    );
    ensure!(std::fs::read_to_string(&key)? == "apiserver.key v2\n");
    ensure!(std::fs::metadata(&key)?.mode() & 0o7777 == 0o640);
    // A file kubeadm's PKI lacks: an error, never a partial copy passed over in silence.
    std::fs::remove_file(pki.join("front-proxy-client.crt"))?;
    ensure!(sync().is_err(), "a missing source file went unnoticed");
    Ok(())
}

fn is_root() -> bool {
    std::fs::metadata("/proc/self")
        .map(|m| m.uid() == 0)
        .unwrap_or(false)
}

/// The shell words of a README command (no quoting: the commands there have none), the
/// continuation lines joined, the comments and an output redirection left out.
fn readme_command(block: &str, start: &str) -> Result<Vec<String>> {
    let joined = block.replace("\\\n", " ");
    let line = joined
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with(start))
        .with_context(|| format!("the README's live mode shows no `{start}`"))?;
    let line = line.split(" #").next().unwrap_or(line);
    let line = line.split(" >").next().unwrap_or(line);
    ensure!(
        !line.contains(['"', '\'', '$', '`']),
        "`{line}`: no quoting or expansion in the README's commands"
    );
    Ok(line.split_whitespace().map(str::to_string).collect())
}

/// docs/install.md's "Running it in front of an apiserver (live mode)" shows the commands the static
/// pods run: `skewgate-control bootstrap` and `run` parse to exactly what `deploy/args/` parses
/// to (the values of its example node: cp-1, 10.0.0.11, 10.0.0.0/24), they validate as they
/// are written, and Envoy's command line is `envoy.args`.
#[test]
fn the_readme_live_mode_commands_are_the_args_files() -> Result<()> {
    let readme = std::fs::read_to_string(repo_root().join("docs/install.md"))?;
    let section = readme
        .split("\n## ")
        .find(|s| s.starts_with("Running it in front of an apiserver (live mode)"))
        .context("docs/install.md: no live mode section")?;
    let block = section
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .context("docs/install.md live mode: no sh block")?;

    let parse_bootstrap = |args: Vec<String>| -> Result<BootstrapArgs> {
        let m = BootstrapArgs::augment_args(clap::Command::new("bootstrap"))
            .try_get_matches_from(std::iter::once("bootstrap".to_string()).chain(args))?;
        Ok(BootstrapArgs::from_arg_matches(&m)?)
    };
    let parse_run = |args: Vec<String>| -> Result<RunArgs> {
        let m = RunArgs::augment_args(clap::Command::new("run"))
            .try_get_matches_from(std::iter::once("run".to_string()).chain(args))?;
        Ok(RunArgs::from_arg_matches(&m)?)
    };

    let shown = readme_command(block, "skewgate-control bootstrap ")?;
    let readme_bootstrap = parse_bootstrap(shown[2..].to_vec()).context("README bootstrap")?;
    render_bootstrap(&readme_bootstrap).context("the README's bootstrap fails as written")?;
    let deployed = parse_bootstrap(expand("bootstrap", KUBEADM)?)?;
    ensure!(
        format!("{readme_bootstrap:?}") == format!("{deployed:?}"),
        "the README's bootstrap is not deploy/args/bootstrap.args:\n{readme_bootstrap:#?}\n{deployed:#?}"
    );

    let shown = readme_command(block, "skewgate-control run ")?;
    let readme_run = parse_run(shown[2..].to_vec()).context("README run")?;
    readme_run
        .validate()
        .context("the README's run fails as written")?;
    let deployed = parse_run(expand("run", KUBEADM)?)?;
    ensure!(
        format!("{readme_run:?}") == format!("{deployed:?}"),
        "the README's run is not deploy/args/run.args:\n{readme_run:#?}\n{deployed:#?}"
    );

    let shown = readme_command(block, "envoy -c ")?;
    ensure!(
        shown[3..] == expand("envoy", KUBEADM)?[..],
        "the README's Envoy command line is not deploy/args/envoy.args: {shown:?}"
    );
    Ok(())
}
