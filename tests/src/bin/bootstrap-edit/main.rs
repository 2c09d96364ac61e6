//! `bootstrap-edit`: edits a bootstrap `skewgate-control` rendered (binary protobuf) as data,
//! for the benchmark's variants (`scripts/bench`).
//!
//! ```text
//! bootstrap-edit without-http-filter NAME FILE   drop the HTTP filter NAME, in place
//! ```

use anyhow::{bail, Context, Result};

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [verb, name, file] = args.as_slice() else {
        bail!("usage: bootstrap-edit without-http-filter NAME FILE");
    };
    if verb != "without-http-filter" {
        bail!("unknown edit {verb:?} (want without-http-filter)");
    }
    let bytes = std::fs::read(file).with_context(|| format!("reading {file}"))?;
    let edited = skewgate_tests::bootstrap::without_http_filter(&bytes, name)
        .with_context(|| format!("editing {file}"))?;
    let tmp = format!("{file}.new");
    std::fs::write(&tmp, edited).with_context(|| format!("writing {tmp}"))?;
    std::fs::rename(&tmp, file).with_context(|| format!("replacing {file}"))?;
    Ok(())
}
