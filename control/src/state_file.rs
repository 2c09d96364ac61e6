//! Every file in the state directory (`run --state-dir`) is written here: the retention files
//! (`crate::run::state_dir`) and the last acknowledged configuration
//! (`crate::envoy::fallback::write_acknowledged`).
//!
//! What the directory holds steers the node: `bootstrap` renders the last acknowledged
//! configuration into Envoy (where requests, and their credentials, go), and the retention files
//! decide which APIs answer 503 instead of 404 and which peers keep their place under the cap.
//! So:
//!
//! - **the directory is private** ([`prepare_dir`]): created 0700 when missing; an existing one
//!   that this user owns is tightened to 0700 (an operator's `mkdir` leaves 0755, and a listing
//!   shows the peers' names); one that another user owns is refused, since that user could
//!   replace any file in it (a root-owned directory included when we are not root: we could not
//!   write into it anyway unless it were open to everyone);
//! - **a file is replaced whole and durably** ([`write`]): written to a temporary file of its
//!   own (a unique name, created exclusively with mode 0600, so two processes writing the same
//!   file at once never take each other's temporary file and nobody else can read it), synced,
//!   renamed over the old one, and the directory synced after the rename, so that after a crash
//!   the name holds the old content or the new, never a torn or empty file;
//! - [`check_dir`] is the reader's side (`bootstrap`, which cannot change a read-only mount):
//!   it refuses a directory another user could have written.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The state directory's mode: owner only.
pub const DIR_MODE: u32 = 0o700;
/// A state file's mode: owner read and write.
pub const FILE_MODE: u32 = 0o600;

#[derive(Debug, thiserror::Error)]
pub enum StateFileError {
    #[error("the state directory {path:?} {why}: whoever can write it chooses what Envoy serves without its control plane")]
    UnsafeDirectory { path: PathBuf, why: String },
    #[error("{what} {path:?}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> StateFileError {
    let path = path.to_path_buf();
    move |source| StateFileError::Io { what, path, source }
}

/// What [`prepare_dir`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prepared {
    Created,
    /// Ours, with a looser mode (the old one): now [`DIR_MODE`].
    Tightened {
        from: u32,
    },
    /// Ours and private already.
    Kept,
}

fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// The directory for state files: created [`DIR_MODE`] when missing (its parents as usual),
/// tightened to [`DIR_MODE`] when this user owns it with a looser mode, refused when it is not a
/// directory or another user owns it.
pub fn prepare_dir(dir: &Path) -> Result<Prepared, StateFileError> {
    let created = match std::fs::metadata(dir) {
        Ok(_) => false,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent).map_err(io("creating", parent))?;
            }
            match std::fs::DirBuilder::new().mode(DIR_MODE).create(dir) {
                Ok(()) => true,
                // Another process made it meanwhile: checked below like any existing one.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => false,
                Err(e) => return Err(io("creating the state directory", dir)(e)),
            }
        }
        Err(e) => return Err(io("the state directory", dir)(e)),
    };
    let meta = std::fs::metadata(dir).map_err(io("the state directory", dir))?;
    let refuse = |why: String| StateFileError::UnsafeDirectory {
        path: dir.to_path_buf(),
        why,
    };
    if !meta.is_dir() {
        return Err(refuse("is not a directory".into()));
    }
    let me = euid();
    if meta.uid() != me {
        return Err(refuse(format!(
            "belongs to uid {}, not to this user ({me})",
            meta.uid()
        )));
    }
    let mode = meta.mode() & 0o7777;
    if mode == DIR_MODE {
        return Ok(if created {
            Prepared::Created
        } else {
            Prepared::Kept
        });
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(DIR_MODE))
        .map_err(io("setting the mode of the state directory", dir))?;
    if created {
        // The umask cannot loosen 0700; a mode other than it means someone else was quicker.
        return Ok(Prepared::Created);
    }
    tracing::warn!(dir = %dir.display(), from = format!("{mode:o}"), to = format!("{DIR_MODE:o}"), "the state directory was open to others: tightened");
    Ok(Prepared::Tightened { from: mode })
}

/// The reader's check: `dir` is a directory that only this user (or root) can write, or does
/// not exist (nothing to read). Changes nothing.
pub fn check_dir(dir: &Path) -> Result<(), StateFileError> {
    let meta = match std::fs::metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        other => other.map_err(io("the state directory", dir))?,
    };
    let refuse = |why: String| StateFileError::UnsafeDirectory {
        path: dir.to_path_buf(),
        why,
    };
    if !meta.is_dir() {
        return Err(refuse("is not a directory".into()));
    }
    let me = euid();
    if meta.uid() != me && meta.uid() != 0 {
        return Err(refuse(format!(
            "belongs to uid {}, not to this user ({me}) or root",
            meta.uid()
        )));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(refuse(format!(
            "is writable by group or others (mode {:o})",
            meta.mode() & 0o7777
        )));
    }
    Ok(())
}

/// Replace `dir/name` with `bytes`, whole and durably (see the module doc). `dir` is prepared
/// first ([`prepare_dir`]).
pub fn write(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), StateFileError> {
    prepare_dir(dir)?;
    let path = dir.join(name);
    let prefix = format!(".{name}.");
    let mut tmp = tempfile::Builder::new()
        .prefix(&prefix)
        .suffix(".tmp")
        .permissions(std::fs::Permissions::from_mode(FILE_MODE))
        .tempfile_in(dir)
        .map_err(io("creating a temporary file in", dir))?;
    tmp.write_all(bytes).map_err(io("writing", tmp.path()))?;
    tmp.as_file()
        .sync_all()
        .map_err(io("syncing", tmp.path()))?;
    // On failure the temporary file is removed when `PersistError` drops it.
    tmp.persist(&path)
        .map_err(|e| io("renaming into", &path)(e.error))?;
    sync_dir(dir)
}

/// Remove `dir/name` (already absent is fine). The directory is synced by the caller when it
/// is done ([`sync_dir`]).
pub fn remove(dir: &Path, name: &str) -> Result<(), StateFileError> {
    let path = dir.join(name);
    match std::fs::remove_file(&path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io("removing", &path)(e)),
        _ => Ok(()),
    }
}

/// Make the directory's entries (renames, removals) durable.
pub fn sync_dir(dir: &Path) -> Result<(), StateFileError> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io("syncing the state directory", dir))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::chown;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).expect("metadata").mode() & 0o7777
    }

    #[test]
    fn files_are_0600_in_a_0700_directory_and_replaced_whole() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("var/lib/skewgate");
        write(&dir, "a.json", b"first").expect("write");
        assert_eq!(mode(&dir), DIR_MODE);
        assert_eq!(mode(&dir.join("a.json")), FILE_MODE);
        // A file an older version left readable by others is replaced by a private one.
        std::fs::set_permissions(dir.join("a.json"), std::fs::Permissions::from_mode(0o644))
            .expect("chmod");
        write(&dir, "a.json", b"second").expect("rewrite");
        assert_eq!(std::fs::read(dir.join("a.json")).expect("read"), b"second");
        assert_eq!(mode(&dir.join("a.json")), FILE_MODE);
        let names: Vec<String> = std::fs::read_dir(&dir)
            .expect("list")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["a.json"], "no temporary file left behind");
        remove(&dir, "a.json").expect("remove");
        remove(&dir, "a.json").expect("removing what is gone is fine");
        sync_dir(&dir).expect("sync");
    }

    #[test]
    fn writers_at_once_never_take_each_others_temporary_file() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().to_path_buf();
        let writers: Vec<_> = (0..8u8)
            .map(|w| {
                let dir = dir.clone();
                std::thread::spawn(move || {
                    let body = vec![w; 64 * 1024];
                    for _ in 0..50 {
                        write(&dir, "shared.json", &body)?;
                    }
                    Ok::<(), StateFileError>(())
                })
            })
            .collect();
        for w in writers {
            w.join().expect("joined").expect("every write succeeds");
        }
        let body = std::fs::read(dir.join("shared.json")).expect("read");
        assert_eq!(body.len(), 64 * 1024);
        assert!(
            body.iter().all(|b| *b == body[0]),
            "one writer's file, whole"
        );
        assert_eq!(std::fs::read_dir(&dir).expect("list").count(), 1);
    }

    #[test]
    fn an_existing_directory_is_tightened_when_ours_and_refused_when_not() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("state");
        std::fs::create_dir(&dir).expect("mkdir");
        for loose in [0o755, 0o777, 0o1777, 0o711] {
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(loose)).expect("chmod");
            assert_eq!(
                prepare_dir(&dir).expect("ours"),
                Prepared::Tightened { from: loose }
            );
            assert_eq!(mode(&dir), DIR_MODE);
        }
        assert_eq!(prepare_dir(&dir).expect("ours"), Prepared::Kept);
        check_dir(&dir).expect("private");

        let file = tmp.path().join("file");
        std::fs::write(&file, "").expect("file");
        assert!(matches!(
            prepare_dir(&file),
            Err(StateFileError::UnsafeDirectory { .. })
        ));

        // Another user's directory: refused, and left as it is. Changing the owner needs root
        // (CI and the dev container run tests as root).
        if euid() != 0 {
            eprintln!("not root: the other-owner case is not tested here");
            return;
        }
        let theirs = tmp.path().join("theirs");
        std::fs::create_dir(&theirs).expect("mkdir");
        std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        chown(&theirs, Some(65534), Some(65534)).expect("chown");
        let refused = prepare_dir(&theirs);
        assert!(
            matches!(&refused, Err(StateFileError::UnsafeDirectory { why, .. }) if why.contains("65534")),
            "{refused:?}"
        );
        assert_eq!(mode(&theirs), 0o755, "not touched");
        assert!(write(&theirs, "a.json", b"x").is_err());
        assert!(!theirs.join("a.json").exists());
        assert!(check_dir(&theirs).is_err(), "the reader refuses it too");
        // The reader accepts root's directory (root can write anything anyway), not one open
        // to others.
        chown(&theirs, Some(0), Some(0)).expect("chown");
        check_dir(&theirs).expect("root's, 0755");
        std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o775)).expect("chmod");
        assert!(check_dir(&theirs).is_err());
    }
}
