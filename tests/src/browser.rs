//! A real browser: Debian's `chromium` (installed by `scripts/setup`), headless, for pages the
//! control plane serves. Each run gets a profile directory of its own, so runs never share
//! state or a profile lock; a run that takes more than a minute fails.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use tokio::process::Command;

use crate::paths::repo_root;

/// Debian's chromium. Missing is a failure, not a skip: `scripts/setup` installs it.
pub fn chromium_bin() -> Result<PathBuf> {
    let path = PathBuf::from(
        std::env::var("SKEWGATE_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into()),
    );
    if path.exists() {
        Ok(path)
    } else {
        bail!(
            "{} not found: run scripts/setup (Debian's chromium)",
            path.display()
        )
    }
}

/// Where tests keep what a person should be able to look at afterwards (screenshots):
/// `target/test-artefacts/`, created if needed.
pub fn test_artefacts_dir() -> Result<PathBuf> {
    let dir = repo_root().join("target/test-artefacts");
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// Headless chromium with `args` and `url`, its profile in `profile`; its stdout.
async fn chromium(profile: &Path, args: &[String], url: &str) -> Result<String> {
    let mut cmd = Command::new(chromium_bin()?);
    cmd.args(["--headless", "--no-sandbox", "--disable-gpu"])
        .arg(format!("--user-data-dir={}", profile.display()))
        // Nothing but the page: no first-run, sync, component or crash reporting traffic.
        .args([
            "--no-first-run",
            "--disable-sync",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-breakpad",
            "--hide-scrollbars",
        ])
        .args(args)
        .arg(url)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .context("chromium ran for more than 60 s")?
        .context("starting chromium")?;
    if !out.status.success() {
        bail!(
            "chromium exited with {}:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The DOM of `url` once loaded, serialized (`--dump-dom`).
pub async fn dump_dom(url: &str) -> Result<String> {
    let profile = tempfile::tempdir()?;
    chromium(profile.path(), &["--dump-dom".into()], url).await
}

/// A PNG of `url` at `width` x `height` written to `path` (`--screenshot`).
pub async fn screenshot(url: &str, path: &Path, width: u32, height: u32) -> Result<()> {
    let profile = tempfile::tempdir()?;
    let _ = std::fs::remove_file(path);
    chromium(
        profile.path(),
        &[
            format!("--screenshot={}", path.display()),
            format!("--window-size={width},{height}"),
        ],
        url,
    )
    .await?;
    let size = std::fs::metadata(path)
        .with_context(|| format!("chromium wrote no screenshot at {}", path.display()))?
        .len();
    if size == 0 {
        bail!("chromium wrote an empty screenshot at {}", path.display());
    }
    Ok(())
}
