//! Real kubectl (or a given kubectl binary), run against a kubeconfig.

use std::path::Path;
use std::process::Stdio;

use anyhow::{Context, Result};
use tokio::process::Command;

use crate::paths::kubectl_bin;

/// Run real kubectl against `kubeconfig`; returns (success, stdout, stderr).
pub async fn kubectl(kubeconfig: &Path, args: &[&str]) -> Result<(bool, String, String)> {
    kubectl_with(&kubectl_bin()?, kubeconfig, args).await
}

/// Run a given kubectl binary against `kubeconfig`.
pub async fn kubectl_with(
    kubectl: &Path,
    kubeconfig: &Path,
    args: &[&str],
) -> Result<(bool, String, String)> {
    let out = Command::new(kubectl)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .env("KUBECACHEDIR", kubeconfig.with_extension("cache"))
        .stdin(Stdio::piped())
        .output()
        .await
        .context("running kubectl")?;
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}
