//! Polling a condition until it holds.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};

/// Poll `done` until it holds or `timeout` passes.
pub async fn wait_until(
    what: &str,
    timeout: Duration,
    mut done: impl FnMut() -> bool,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    while !done() {
        if Instant::now() > deadline {
            bail!("{what}: not within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}
