//! Files Envoy reads and watches: the static mode's resources (which the bootstrap names and
//! `crate::xds::files` writes), the SDS files and the GOAWAY chance's switch. Each is replaced
//! whole by a rename, so Envoy's file watcher never reads half a file.

use std::io;
use std::path::Path;

/// The clusters (CDS), in the static mode's directory.
pub const CLUSTERS_FILE: &str = "clusters.yaml";
/// The filter configuration (ECDS), in the static mode's directory.
pub const FILTER_FILE: &str = "filter.yaml";

/// Replace `dir/name` with `bytes` by a rename. Readable as the process's umask allows: Envoy
/// may run as another user (unlike the control plane's own state, `crate::state_file`).
pub(crate) fn replace(dir: &Path, name: &str, bytes: &[u8]) -> io::Result<()> {
    // A temporary name of this process's and this call's own: `bootstrap` and `run` write the
    // same SDS files at start, and with one shared temporary name one's rename took the file
    // from under the other's (ENOENT, seen in the compose suite).
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!(".{name}.{}.{n}.tmp", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, dir.join(name))
}
