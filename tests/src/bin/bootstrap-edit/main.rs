//! `bootstrap-edit`: edits a bootstrap `skewgate-control` rendered (YAML) as data,
//! for the benchmark's variants (`scripts/bench`).
//!
//! ```text
//! bootstrap-edit without-http-filter NAME FILE   drop the HTTP filter NAME, in place
//! bootstrap-edit health-checks-over-http2 FILE   every HTTP health check in a clusters file
//!                                                (clusters.yaml) over h2c, in place
//! ```

use anyhow::{bail, Context, Result};

/// An edit of a file's bytes.
type Edit = fn(&[u8]) -> Result<Vec<u8>>;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (file, edit): (&String, Edit) = match args.as_slice() {
        [verb, name, file] if verb == "without-http-filter" => {
            let bytes = std::fs::read(file).with_context(|| format!("reading {file}"))?;
            let edited = skewgate_tests::bootstrap::without_http_filter(&bytes, name)
                .with_context(|| format!("editing {file}"))?;
            return replace(file, edited);
        }
        [verb, file] if verb == "health-checks-over-http2" => {
            (file, skewgate_tests::bootstrap::health_checks_over_http2)
        }
        _ => bail!(
            "usage: bootstrap-edit without-http-filter NAME FILE | health-checks-over-http2 FILE"
        ),
    };
    let bytes = std::fs::read(file).with_context(|| format!("reading {file}"))?;
    let edited = edit(&bytes).with_context(|| format!("editing {file}"))?;
    replace(file, edited)
}

fn replace(file: &str, edited: Vec<u8>) -> Result<()> {
    let tmp = format!("{file}.new");
    std::fs::write(&tmp, edited).with_context(|| format!("writing {tmp}"))?;
    std::fs::rename(&tmp, file).with_context(|| format!("replacing {file}"))?;
    Ok(())
}
