//! The state directory (`--state-dir`): what [`Retention`] holds, one file per peer apiserver,
//! so that the retention and the peers' seniority under the cap survive a control-plane restart.
//!
//! `<dir>/retention/<id>.json` holds the peer's last good discovery (`/apis` and `/api`, as
//! aggregated documents), when it left (`null` while it was live) and when it was first seen
//! ([`FirstSeen`], nanoseconds since the Unix epoch). Files are written by
//! [`crate::state_file`] (0600 in a 0700 directory, a unique temporary name, synced, renamed),
//! so a crash never leaves half a file. What is read back is checked like anything else from
//! outside: a file that does not parse, is larger than [`MAX_FILE_BYTES`] or is not named after
//! the id it holds is logged and ignored (the peer is then simply not retained), never fatal;
//! and at most [`max_entries`] files are kept, the most senior, the others deleted, whatever
//! the directory held (an older version kept one per lease ever seen).

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::retention::{max_entries, Changes, Entry, Retention};
use crate::discovery::{APIGroupDiscoveryList, DiscoveryDocuments};
use crate::peers::FirstSeen;
use crate::state_file::{self, StateFileError};

/// The largest retention file read: both documents at the fetch limit of a legacy walk (32 MiB
/// each), with room for the JSON around them.
pub const MAX_FILE_BYTES: u64 = 2 * 32 * 1024 * 1024 + 1024 * 1024;

/// One file.
#[derive(Serialize, Deserialize)]
struct Stored {
    id: String,
    /// Seconds since the Unix epoch.
    left_at: Option<u64>,
    /// [`FirstSeen`]: nanoseconds since the Unix epoch (absent in files of older versions).
    #[serde(default)]
    first_seen_unix_nanos: Option<u64>,
    apis: APIGroupDiscoveryList,
    api: APIGroupDiscoveryList,
}

#[derive(Debug, thiserror::Error)]
pub enum StateDirError {
    #[error(transparent)]
    File(#[from] StateFileError),
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

/// What [`StateDir::load`] found.
#[derive(Debug, Default)]
pub struct Loaded {
    pub entries: BTreeMap<String, Entry>,
    /// Files ignored, and why.
    pub problems: Vec<String>,
    /// Entries beyond [`max_entries`], the least senior: deleted.
    pub dropped: Vec<String>,
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

/// Read one file, bounded.
fn read(path: &Path) -> Result<Stored, String> {
    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| e.to_string())?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(format!("larger than {MAX_FILE_BYTES} bytes"));
    }
    serde_json::from_slice(&bytes).map_err(|e| e.to_string())
}

impl StateDir {
    /// Prepares `<dir>` and `<dir>/retention` ([`state_file::prepare_dir`]: created 0700,
    /// tightened when ours, refused when another user's).
    pub fn open(dir: &Path) -> Result<Self, StateDirError> {
        state_file::prepare_dir(dir)?;
        let dir = dir.join("retention");
        state_file::prepare_dir(&dir)?;
        Ok(StateDir { dir })
    }

    /// The readable entries, at most [`max_entries`]`(max_peers)` of them (the most senior:
    /// the others are deleted); unreadable files are reported and skipped.
    pub fn load(&self, max_peers: usize) -> Loaded {
        let mut loaded = Loaded::default();
        let read_dir = match std::fs::read_dir(&self.dir) {
            Ok(r) => r,
            Err(e) => {
                loaded.problems.push(format!("{}: {e}", self.dir.display()));
                return loaded;
            }
        };
        let limit = max_entries(max_peers);
        for item in read_dir.flatten() {
            let path = item.path();
            let name = item.file_name();
            let Some(name) = name.to_str() else { continue };
            // Temporary files (dot-prefixed) and anything else are not entries.
            if name.starts_with('.') || !name.ends_with(".json") {
                continue;
            }
            let stored = match read(&path) {
                Ok(stored) if file_name(&stored.id).as_deref() == Some(name) => stored,
                Ok(stored) => {
                    loaded.problems.push(format!(
                        "{}: holds apiserver id {:?}, not the one it is named after",
                        path.display(),
                        stored.id
                    ));
                    continue;
                }
                Err(e) => {
                    loaded.problems.push(format!("{}: {e}", path.display()));
                    continue;
                }
            };
            // A time no clock can hold (a file written by hand, or damaged) is not one: the
            // entry is kept as not departed, and a departure found now starts its window.
            let left_at = stored
                .left_at
                .and_then(|secs| UNIX_EPOCH.checked_add(Duration::from_secs(secs)));
            if stored.left_at.is_some() && left_at.is_none() {
                loaded.problems.push(format!(
                    "{}: left_at {:?} is no time; taken as not departed",
                    path.display(),
                    stored.left_at
                ));
            }
            let entry = Entry {
                documents: Arc::new(DiscoveryDocuments {
                    apis: stored.apis,
                    api: stored.api,
                    openapi: None,
                }),
                left_at,
                first_seen: stored.first_seen_unix_nanos.map(FirstSeen),
                address: None,
            };
            loaded.entries.insert(stored.id, entry);
            // Bounded while reading, not after: at most `limit + 1` copies in memory.
            if loaded.entries.len() > limit {
                if let Some(junior) = least_senior(&loaded.entries) {
                    loaded.entries.remove(&junior);
                    loaded.dropped.push(junior);
                }
            }
        }
        for id in &loaded.dropped {
            if let Some(name) = file_name(id) {
                if let Err(e) = state_file::remove(&self.dir, &name) {
                    loaded.problems.push(e.to_string());
                }
            }
        }
        if !loaded.dropped.is_empty() {
            if let Err(e) = state_file::sync_dir(&self.dir) {
                loaded.problems.push(e.to_string());
            }
        }
        loaded
    }

    /// Write what changed.
    pub fn apply(&self, retention: &Retention, changes: &Changes) -> Result<(), StateDirError> {
        for id in &changes.remove {
            let Some(name) = file_name(id) else { continue };
            state_file::remove(&self.dir, &name)?;
        }
        if !changes.remove.is_empty() {
            state_file::sync_dir(&self.dir)?;
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
                first_seen_unix_nanos: entry.first_seen.map(|f| f.0),
                apis: entry.documents.apis.clone(),
                api: entry.documents.api.clone(),
            };
            let bytes = serde_json::to_vec(&stored).map_err(|e| StateDirError::Io {
                path: self.dir.join(&name),
                source: std::io::Error::other(e),
            })?;
            state_file::write(&self.dir, &name, &bytes)?;
        }
        Ok(())
    }
}

/// The entry [`Retention::bound`] would drop first: the one first seen most recently (unknown
/// seniority last of all), departed or not: before the first lease list nobody is known to be
/// live.
fn least_senior(entries: &BTreeMap<String, Entry>) -> Option<String> {
    entries
        .iter()
        .max_by_key(|(id, e)| (e.first_seen.unwrap_or(FirstSeen(u64::MAX)), id.as_str()))
        .map(|(id, _)| id.clone())
}

/// When it left, rounded down to the second as the files store it.
pub fn stored_time(t: SystemTime) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_fixtures::documents;
    use std::collections::BTreeSet;
    use std::os::unix::fs::PermissionsExt;

    fn mode(path: &Path) -> u32 {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(path).expect("metadata").mode() & 0o7777
    }

    #[test]
    fn retention_and_seniority_survive_a_restart_through_the_directory() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path().join("state");
        let state = StateDir::open(&root).expect("open");
        let window = Duration::from_secs(900);
        let mut r = Retention::new(window, 16);
        let mut c = Changes::default();
        let docs = Arc::new(documents("k8s-1.33"));
        let left = stored_time(SystemTime::now());
        let first = FirstSeen(1_700_000_000_123_456_789);
        r.seen("apiserver-b", &docs, first, &mut c);
        r.seen(
            "apiserver-c",
            &Arc::new(documents("k8s-1.30")),
            FirstSeen(first.0 + 1),
            &mut c,
        );
        r.left("apiserver-b", left, &mut c);
        state.apply(&r, &c).expect("write");
        // Private: 0700 directories, 0600 files.
        assert_eq!(mode(&root), 0o700);
        assert_eq!(mode(&root.join("retention")), 0o700);
        assert_eq!(mode(&root.join("retention/apiserver-b.json")), 0o600);
        // Garbage beside it is reported, not fatal; so is a file named after another id.
        std::fs::write(root.join("retention/broken.json"), b"{").expect("write");
        std::fs::copy(
            root.join("retention/apiserver-c.json"),
            root.join("retention/apiserver-x.json"),
        )
        .expect("copy");

        let loaded = StateDir::open(&root).expect("reopen").load(16);
        assert_eq!(loaded.problems.len(), 2, "{:?}", loaded.problems);
        assert!(loaded.dropped.is_empty());
        let back = Retention::restore(window, 16, loaded.entries);
        assert_eq!(back.entries().len(), 2);
        assert_eq!(back.entries()["apiserver-b"].documents, docs);
        assert_eq!(back.entries()["apiserver-b"].left_at, Some(left));
        assert_eq!(back.entries()["apiserver-c"].left_at, None);
        assert_eq!(
            back.first_seen(),
            [
                ("apiserver-b".to_string(), first),
                ("apiserver-c".to_string(), FirstSeen(first.0 + 1))
            ],
            "to the nanosecond"
        );
        assert_eq!(back.retained().len(), 1);

        // Expired entries are deleted.
        let mut r = back;
        let mut c = Changes::default();
        r.expire(left + window, &mut c);
        state.apply(&r, &c).expect("apply");
        assert!(!root.join("retention/apiserver-b.json").exists());
        assert!(root.join("retention/apiserver-c.json").exists());
    }

    #[test]
    fn a_directory_of_an_older_version_is_loaded_bounded_the_least_senior_deleted() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path().join("state");
        // An operator's directory, open to others: tightened when opened.
        std::fs::create_dir_all(root.join("retention")).expect("mkdir");
        for d in [&root, &root.join("retention")] {
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        }
        let state = StateDir::open(&root).expect("open");
        assert_eq!(mode(&root), 0o700);
        assert_eq!(mode(&root.join("retention")), 0o700);
        // 46 copies, as the flood of issue 18 left: the known peer has the oldest first-seen
        // time; the flood's names sort first, and some files carry no seniority at all.
        let docs = Arc::new(documents("k8s-1.30"));
        let mut r = Retention::new(Duration::from_secs(900), 100);
        let mut c = Changes::default();
        r.seen("apiserver-real", &docs, FirstSeen(10), &mut c);
        for i in 0..45u64 {
            r.seen(
                &format!("apiserver-0{i:02}"),
                &docs,
                FirstSeen(100 + i),
                &mut c,
            );
        }
        r.left_unless(&BTreeSet::new(), SystemTime::now(), &mut c);
        state.apply(&r, &c).expect("write");
        let unknown = root.join("retention/apiserver-000.json");
        let mut stored: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&unknown).expect("read")).expect("json");
        stored
            .as_object_mut()
            .expect("object")
            .remove("first_seen_unix_nanos");
        std::fs::write(&unknown, serde_json::to_vec(&stored).expect("json")).expect("write");

        let loaded = state.load(4);
        assert!(loaded.problems.is_empty(), "{:?}", loaded.problems);
        assert_eq!(loaded.entries.len(), max_entries(4));
        assert!(loaded.entries.contains_key("apiserver-real"));
        assert!(
            !loaded.entries.contains_key("apiserver-000"),
            "no seniority: last"
        );
        let kept: Vec<&str> = loaded.entries.keys().map(String::as_str).collect();
        assert_eq!(
            kept,
            [
                "apiserver-001",
                "apiserver-002",
                "apiserver-003",
                "apiserver-004",
                "apiserver-005",
                "apiserver-006",
                "apiserver-007",
                "apiserver-real"
            ]
        );
        assert_eq!(loaded.dropped.len(), 46 - max_entries(4));
        let files = std::fs::read_dir(root.join("retention"))
            .expect("list")
            .count();
        assert_eq!(files, max_entries(4), "the others deleted");
    }

    /// A `left_at` no clock can hold (here u64::MAX seconds) panicked while the directory was
    /// read, so the control plane could not start; now the entry is kept, as not departed.
    #[test]
    fn a_departure_time_out_of_any_clock_is_reported_and_the_entry_kept() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path().join("state");
        let state = StateDir::open(&root).expect("open");
        let mut r = Retention::new(Duration::from_secs(900), 16);
        let mut c = Changes::default();
        let docs = Arc::new(documents("k8s-1.33"));
        r.seen("apiserver-b", &docs, FirstSeen(1), &mut c);
        r.left("apiserver-b", stored_time(SystemTime::now()), &mut c);
        state.apply(&r, &c).expect("write");
        let file = root.join("retention/apiserver-b.json");
        let mut json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&file).expect("read")).expect("json");
        json["left_at"] = serde_json::json!(u64::MAX);
        std::fs::write(&file, serde_json::to_vec(&json).expect("to_vec")).expect("write");

        let loaded = StateDir::open(&root).expect("reopen").load(16);
        assert_eq!(loaded.problems.len(), 1, "{:?}", loaded.problems);
        assert!(
            loaded.problems[0].contains("is no time; taken as not departed"),
            "{:?}",
            loaded.problems
        );
        let entry = &loaded.entries["apiserver-b"];
        assert_eq!((entry.left_at, &entry.documents), (None, &docs));
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
