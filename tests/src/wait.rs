//! Polling a condition until it holds.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use std::future::Future;

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

/// Poll `check` every 10 ms until it gives `Some`, for at most `timeout`; returns the value and
/// how long it took. The error names `what` and the last error or "not yet".
pub async fn eventually<T, F, Fut>(
    what: &str,
    timeout: Duration,
    mut check: F,
) -> Result<(T, Duration)>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>>>,
{
    let start = Instant::now();
    loop {
        let last = match check().await {
            Ok(Some(v)) => return Ok((v, start.elapsed())),
            Ok(None) => "not yet".to_string(),
            Err(e) => format!("{e:#}"),
        };
        if start.elapsed() > timeout {
            bail!("{what}: not within {timeout:?} (last: {last})");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
