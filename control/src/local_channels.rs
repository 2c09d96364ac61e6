//! The two channels between Envoy and the control plane beside it: Envoy's admin interface and
//! the xDS stream (delta ADS). Whoever reaches them steers Envoy: admin can stop it
//! (`POST /quitquitquit`), raise its logging until bearer tokens are logged, and dump its
//! configuration; whoever serves xDS chooses where requests, and their tokens, go. On loopback
//! TCP any process of the node reaches them (a hostNetwork pod, an unprivileged user), and one
//! that binds the xDS port while the control plane restarts serves Envoy its own clusters.
//!
//! So by default both are Unix domain sockets of mode 0600 in one directory (`--socket-dir`),
//! which only the user Envoy and the control plane run as (and root) can open:
//! [`ADMIN_SOCKET`] (Envoy binds it, with the mode in its bootstrap) and [`XDS_SOCKET`]
//! ([`bind_unix`]). Loopback TCP only with `--insecure-tcp-local-channels`.

use std::fmt;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// `--socket-dir`'s default.
pub const DEFAULT_SOCKET_DIR: &str = "/run/skewgate";
/// Envoy's admin interface, in the socket directory.
pub const ADMIN_SOCKET: &str = "envoy-admin.sock";
/// The control plane's xDS server, in the socket directory.
pub const XDS_SOCKET: &str = "xds.sock";
/// Owner read and write: connecting to a Unix socket needs write permission on it.
pub const SOCKET_MODE: u32 = 0o600;
/// With `--insecure-tcp-local-channels`: Envoy's admin port on 127.0.0.1.
pub const DEFAULT_ADMIN_PORT: u16 = 9901;
/// With `--insecure-tcp-local-channels`: where the xDS server listens.
pub const DEFAULT_XDS_ADDRESS: SocketAddr =
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 18000));
/// `sun_path` holds 108 bytes, the terminating NUL included.
const MAX_SOCKET_PATH: usize = 107;

/// Why a local channel cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum LocalChannelError {
    #[error("the socket directory {0:?} is not absolute (Envoy resolves relative paths against its own working directory)")]
    Relative(PathBuf),
    #[error("the socket path {0:?} is longer than a Unix socket address holds ({MAX_SOCKET_PATH} bytes): choose a shorter --socket-dir")]
    TooLong(PathBuf),
    #[error("the {kind} {path:?} {why}: {}", kind.risk())]
    UnsafeDirectory {
        kind: PrivateDir,
        path: PathBuf,
        why: String,
    },
    #[error("{0:?} is not a socket: remove it, or choose another --socket-dir")]
    NotASocket(PathBuf),
    #[error("{0:?} is in use: a live process accepts connections on it (another skewgate-control with the same --socket-dir?)")]
    InUse(PathBuf),
    #[error("{what} {path:?}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> LocalChannelError {
    let path = path.to_path_buf();
    move |source| LocalChannelError::Io { what, path, source }
}

/// A directory only this user (and root) may write to, and what it holds: whoever can write
/// to it steers Envoy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrivateDir {
    /// `--socket-dir`: the admin and xDS sockets.
    Sockets,
    /// `--sds-dir`: the SDS files, which name the certificate Envoy serves, the CA client
    /// certificates are verified against (so, every identity Envoy vouches for), and the CA
    /// and client certificate of its upstream connections.
    SdsFiles,
}

impl PrivateDir {
    fn risk(self) -> &'static str {
        match self {
            PrivateDir::Sockets => "another user could replace the sockets and steer Envoy",
            PrivateDir::SdsFiles => "another user could replace the SDS files and choose the client CA (every identity Envoy vouches for) and the certificates Envoy serves and trusts",
        }
    }
}

impl fmt::Display for PrivateDir {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PrivateDir::Sockets => "socket directory (--socket-dir)",
            PrivateDir::SdsFiles => "SDS directory (--sds-dir)",
        })
    }
}

/// Where one channel is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LocalChannel {
    /// A Unix domain socket (the default).
    Unix(PathBuf),
    /// Loopback TCP (`--insecure-tcp-local-channels`; admin port 0: the kernel chooses).
    Tcp(SocketAddr),
}

impl fmt::Display for LocalChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LocalChannel::Unix(path) => write!(f, "unix:{}", path.display()),
            LocalChannel::Tcp(address) => write!(f, "{address}"),
        }
    }
}

/// Envoy's admin interface and the xDS server, as `run` and `bootstrap` agree on them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalChannels {
    admin: LocalChannel,
    xds: LocalChannel,
    /// The socket directory (`None` on TCP).
    socket_dir: Option<PathBuf>,
}

impl LocalChannels {
    /// [`ADMIN_SOCKET`] and [`XDS_SOCKET`] in `dir`.
    pub fn unix(dir: &Path) -> Result<Self, LocalChannelError> {
        if !dir.is_absolute() {
            return Err(LocalChannelError::Relative(dir.to_path_buf()));
        }
        let socket = |name: &str| {
            let path = dir.join(name);
            if path.as_os_str().len() > MAX_SOCKET_PATH {
                return Err(LocalChannelError::TooLong(path));
            }
            Ok(LocalChannel::Unix(path))
        };
        Ok(LocalChannels {
            admin: socket(ADMIN_SOCKET)?,
            xds: socket(XDS_SOCKET)?,
            socket_dir: Some(dir.to_path_buf()),
        })
    }

    /// Loopback TCP: admin on 127.0.0.1:`admin_port`, xDS at `xds`.
    pub fn tcp(admin_port: u16, xds: SocketAddr) -> Self {
        LocalChannels {
            admin: LocalChannel::Tcp(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::LOCALHOST,
                admin_port,
            ))),
            xds: LocalChannel::Tcp(xds),
            socket_dir: None,
        }
    }

    /// Envoy's admin interface as the control plane reaches it (for the filter's counters):
    /// `None` on TCP port 0, which the kernel chose and nobody told us.
    pub fn envoy_admin(&self) -> Option<&LocalChannel> {
        match &self.admin {
            LocalChannel::Tcp(address) if address.port() == 0 => None,
            channel => Some(channel),
        }
    }

    /// Envoy's admin interface.
    pub fn admin(&self) -> &LocalChannel {
        &self.admin
    }

    /// The control plane's xDS server.
    pub fn xds(&self) -> &LocalChannel {
        &self.xds
    }

    pub fn socket_dir(&self) -> Option<&Path> {
        self.socket_dir.as_deref()
    }

    /// Create the socket directory if missing, or check the one the operator made
    /// ([`prepare_private_dir`]); nothing on TCP.
    pub fn prepare(&self) -> Result<(), LocalChannelError> {
        match &self.socket_dir {
            Some(dir) => prepare_private_dir(dir, PrivateDir::Sockets),
            None => Ok(()),
        }
    }
}

/// A missing directory is created with mode 0700 (so nobody else can even reach a socket in
/// the instant between its bind and its chmod). An existing one is kept as the operator made
/// it, but refused when a user other than this one (or root) owns it or when group or others
/// may write to it: they could replace a socket, or an SDS file, with their own.
pub fn prepare_private_dir(dir: &Path, kind: PrivateDir) -> Result<(), LocalChannelError> {
    let what = match kind {
        PrivateDir::Sockets => "the socket directory",
        PrivateDir::SdsFiles => "the SDS directory",
    };
    match std::fs::metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(io(what, dir))?,
        Err(e) => return Err(io(what, dir)(e)),
        Ok(_) => {}
    }
    let meta = std::fs::metadata(dir).map_err(io(what, dir))?;
    let unsafe_dir = |why: String| LocalChannelError::UnsafeDirectory {
        kind,
        path: dir.to_path_buf(),
        why,
    };
    if !meta.is_dir() {
        return Err(unsafe_dir("is not a directory".into()));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(unsafe_dir(format!(
            "is writable by group or others (mode {:o})",
            meta.mode() & 0o7777
        )));
    }
    let me = rustix::process::geteuid().as_raw();
    if meta.uid() != me && meta.uid() != 0 {
        return Err(unsafe_dir(format!(
            "belongs to uid {}, not to this user ({me}) or root",
            meta.uid()
        )));
    }
    Ok(())
}

/// Listen on the Unix socket `path` with mode [`SOCKET_MODE`]. A socket file left by a process
/// that died is removed first; one a live process accepts on is refused, never taken over.
/// Needs a tokio runtime.
pub fn bind_unix(path: &Path) -> Result<tokio::net::UnixListener, LocalChannelError> {
    remove_stale(path)?;
    // The socket is created with the mode already: the umask covers the instant before the
    // chmod below, whatever the directory's mode. The umask is the process's; only tightened.
    let previous = rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o177));
    let bound = tokio::net::UnixListener::bind(path);
    rustix::process::umask(previous);
    let listener = bound.map_err(io("binding", path))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(SOCKET_MODE))
        .map_err(io("setting the mode of", path))?;
    Ok(listener)
}

fn remove_stale(path: &Path) -> Result<(), LocalChannelError> {
    let meta = match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io("the socket", path)(e)),
        Ok(meta) => meta,
    };
    if !meta.file_type().is_socket() {
        return Err(LocalChannelError::NotASocket(path.to_path_buf()));
    }
    match std::os::unix::net::UnixStream::connect(path) {
        Ok(_) => Err(LocalChannelError::InUse(path.to_path_buf())),
        // Nobody accepts on it: the process that bound it is gone.
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            std::fs::remove_file(path).map_err(io("removing the stale socket", path))
        }
        Err(e) => Err(io("probing the existing socket", path)(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_control_plane_reads_envoy_admin_where_it_is_known() {
        let unix = LocalChannels::unix(Path::new("/run/skewgate")).expect("unix");
        assert_eq!(
            unix.envoy_admin(),
            Some(&LocalChannel::Unix("/run/skewgate/envoy-admin.sock".into()))
        );
        let tcp = LocalChannels::tcp(9901, DEFAULT_XDS_ADDRESS);
        assert_eq!(tcp.envoy_admin(), Some(tcp.admin()));
        // Port 0: the kernel chose Envoy's port, the control plane cannot know it.
        assert_eq!(
            LocalChannels::tcp(0, DEFAULT_XDS_ADDRESS).envoy_admin(),
            None
        );
    }

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).expect("metadata").mode() & 0o7777
    }

    #[test]
    fn socket_paths() {
        let c = LocalChannels::unix(Path::new("/run/skewgate")).expect("valid");
        assert_eq!(
            c.admin(),
            &LocalChannel::Unix("/run/skewgate/envoy-admin.sock".into())
        );
        assert_eq!(
            c.xds(),
            &LocalChannel::Unix("/run/skewgate/xds.sock".into())
        );
        assert!(matches!(
            LocalChannels::unix(Path::new("run/skewgate")),
            Err(LocalChannelError::Relative(_))
        ));
        let long = format!("/{}", "d".repeat(100));
        assert!(matches!(
            LocalChannels::unix(Path::new(&long)),
            Err(LocalChannelError::TooLong(_))
        ));
        let tcp = LocalChannels::tcp(0, DEFAULT_XDS_ADDRESS);
        assert_eq!(tcp.admin().to_string(), "127.0.0.1:0");
        assert_eq!(tcp.xds().to_string(), "127.0.0.1:18000");
        assert!(tcp.socket_dir().is_none());
    }

    #[test]
    fn the_socket_directory_is_private() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("a/sockets");
        prepare_private_dir(&dir, PrivateDir::Sockets).expect("created");
        assert_eq!(mode(&dir), 0o700);
        // The operator's own directory is kept as it is, if nobody else can write to it.
        let shared = tmp.path().join("shared");
        std::fs::create_dir(&shared).expect("mkdir");
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        prepare_private_dir(&shared, PrivateDir::Sockets).expect("accepted");
        assert_eq!(mode(&shared), 0o755);
        for refused in [0o775, 0o757, 0o1777] {
            std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(refused))
                .expect("chmod");
            assert!(
                matches!(
                    prepare_private_dir(&shared, PrivateDir::Sockets),
                    Err(LocalChannelError::UnsafeDirectory { .. })
                ),
                "{refused:o}"
            );
        }
        let file = tmp.path().join("file");
        std::fs::write(&file, "").expect("file");
        assert!(prepare_private_dir(&file, PrivateDir::Sockets).is_err());
    }

    #[tokio::test]
    async fn stale_sockets_are_replaced_live_ones_refused() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join(XDS_SOCKET);
        let listener = bind_unix(&path).expect("bound");
        assert_eq!(mode(&path), SOCKET_MODE);
        assert!(matches!(bind_unix(&path), Err(LocalChannelError::InUse(_))));
        // A dead server leaves its socket file behind: the next one takes the path.
        drop(listener);
        assert!(path.exists());
        let _listener = bind_unix(&path).expect("stale socket replaced");
        tokio::net::UnixStream::connect(&path)
            .await
            .expect("the new server accepts");
        // Anything else at the path is left alone.
        let other = tmp.path().join("not-a-socket");
        std::fs::write(&other, "data").expect("file");
        assert!(matches!(
            bind_unix(&other),
            Err(LocalChannelError::NotASocket(_))
        ));
        assert_eq!(std::fs::read_to_string(&other).expect("kept"), "data");
    }
}
