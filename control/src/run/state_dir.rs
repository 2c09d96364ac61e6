//! The state directory (`--state-dir`): what [`Retention`] holds, one file per peer apiserver,
//! so that the retention survives a control-plane restart.
//!
//! `<dir>/retention/<id>.json` holds the peer's last good discovery (`/apis` and `/api`, as
//! aggregated documents) and when it left (`null` while it was live). Files are written to a
//! temporary name and renamed, so a crash never leaves half a file; a file that does not parse
//! is logged and ignored (the peer is then simply not retained), never fatal.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::retention::{Changes, Entry, Retention};
use crate::discovery::{APIGroupDiscoveryList, DiscoveryDocuments};

/// One file.
#[derive(Serialize, Deserialize)]
struct Stored {
    id: String,
    /// Seconds since the Unix epoch.
    left_at: Option<u64>,
    apis: APIGroupDiscoveryList,
    api: APIGroupDiscoveryList,
}

#[derive(Debug, thiserror::Error)]
pub enum StateDirError {
    #[error("state directory {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The retention files in one directory.
#[derive(Debug, Clone)]
pub struct StateDir {
    dir: PathBuf,
}

/// A peer id is a Lease name (a DNS subdomain), but it names a file: refuse anything else.
fn file_name(id: &str) -> Option<String> {
    let ok = !id.is_empty()
        && id.len() <= 253
        && !id.starts_with('.')
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'));
    ok.then(|| format!("{id}.json"))
}

impl StateDir {
    /// Creates `<dir>/retention` if needed.
    pub fn open(dir: &Path) -> Result<Self, StateDirError> {
        let dir = dir.join("retention");
        std::fs::create_dir_all(&dir).map_err(|source| StateDirError::Io {
            path: dir.clone(),
            source,
        })?;
        Ok(StateDir { dir })
    }

    /// Every readable entry; unreadable files are reported and skipped.
    pub fn load(&self) -> (BTreeMap<String, Entry>, Vec<String>) {
        let mut entries = BTreeMap::new();
        let mut problems = Vec::new();
        let read_dir = match std::fs::read_dir(&self.dir) {
            Ok(r) => r,
            Err(e) => {
                problems.push(format!("{}: {e}", self.dir.display()));
                return (entries, problems);
            }
        };
        for item in read_dir.flatten() {
            let path = item.path();
            if path.extension().and_then(|e| e.to_str()) != Some("json") {
                continue;
            }
            let parsed = std::fs::read(&path)
                .map_err(|e| e.to_string())
                .and_then(|bytes| {
                    serde_json::from_slice::<Stored>(&bytes).map_err(|e| e.to_string())
                });
            match parsed {
                Ok(stored) if file_name(&stored.id).is_some() => {
                    let left_at = stored
                        .left_at
                        .map(|secs| UNIX_EPOCH + Duration::from_secs(secs));
                    entries.insert(
                        stored.id,
                        Entry {
                            documents: Arc::new(DiscoveryDocuments {
                                apis: stored.apis,
                                api: stored.api,
                                openapi: None,
                            }),
                            left_at,
                        },
                    );
                }
                Ok(stored) => problems.push(format!(
                    "{}: invalid apiserver id {:?}",
                    path.display(),
                    stored.id
                )),
                Err(e) => problems.push(format!("{}: {e}", path.display())),
            }
        }
        (entries, problems)
    }

    /// Write what changed.
    pub fn apply(&self, retention: &Retention, changes: &Changes) -> Result<(), StateDirError> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| StateDirError::Io { path, source }
        };
        for id in &changes.remove {
            let Some(name) = file_name(id) else { continue };
            let path = self.dir.join(name);
            match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(&path)(e)),
                _ => {}
            }
        }
        for id in &changes.write {
            let (Some(name), Some(entry)) = (file_name(id), retention.entries().get(id)) else {
                continue;
            };
            let stored = Stored {
                id: id.clone(),
                left_at: entry
                    .left_at
                    .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                    .map(|d| d.as_secs()),
                apis: entry.documents.apis.clone(),
                api: entry.documents.api.clone(),
            };
            let bytes =
                serde_json::to_vec(&stored).map_err(|e| io(&self.dir)(std::io::Error::other(e)))?;
            let path = self.dir.join(&name);
            let tmp = self.dir.join(format!(".{name}.tmp"));
            std::fs::write(&tmp, bytes).map_err(io(&tmp))?;
            std::fs::rename(&tmp, &path).map_err(io(&path))?;
        }
        Ok(())
    }
}

/// When it left, rounded down to the second as the files store it.
pub fn stored_time(t: SystemTime) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_fixtures::documents;

    #[test]
    fn retention_survives_a_restart_through_the_directory() {
        let tmp = std::env::temp_dir().join(format!("skewgate-state-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        let state = StateDir::open(&tmp).expect("open");
        let window = Duration::from_secs(900);
        let mut r = Retention::new(window);
        let mut c = Changes::default();
        let docs = Arc::new(documents("k8s-1.33"));
        let left = stored_time(SystemTime::now());
        r.seen("apiserver-b", &docs, &mut c);
        r.seen("apiserver-c", &Arc::new(documents("k8s-1.30")), &mut c);
        r.left("apiserver-b", left, &mut c);
        state.apply(&r, &c).expect("write");
        // Garbage beside it is reported, not fatal.
        std::fs::write(tmp.join("retention/broken.json"), b"{").expect("write");

        let (entries, problems) = StateDir::open(&tmp).expect("reopen").load();
        assert_eq!(problems.len(), 1, "{problems:?}");
        let back = Retention::restore(window, entries);
        assert_eq!(back.entries()["apiserver-b"].documents, docs);
        assert_eq!(back.entries()["apiserver-b"].left_at, Some(left));
        assert_eq!(back.entries()["apiserver-c"].left_at, None);
        assert_eq!(back.retained().len(), 1);

        // Expired entries are deleted.
        let mut r = back;
        let mut c = Changes::default();
        r.expire(left + window, &mut c);
        state.apply(&r, &c).expect("apply");
        assert!(!tmp.join("retention/apiserver-b.json").exists());
        assert!(tmp.join("retention/apiserver-c.json").exists());
        std::fs::remove_dir_all(&tmp).expect("cleanup");
    }

    #[test]
    fn ids_that_are_not_file_names_are_refused() {
        for bad in ["", "../x", ".hidden", "a/b", "a b"] {
            assert!(file_name(bad).is_none(), "{bad:?}");
        }
        assert_eq!(
            file_name("apiserver-abc.x_y").as_deref(),
            Some("apiserver-abc.x_y.json")
        );
    }
}
