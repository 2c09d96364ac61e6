//! Who can reach Envoy's admin interface and the xDS server in the live mode (the harness:
//! `skewgate_tests::live`).

use std::time::Duration;

use anyhow::{bail, Context, Result};
use skewgate_control::local_channels::{ADMIN_SOCKET, XDS_SOCKET};
use skewgate_tests::live::*;
use skewgate_tests::{local_get, Etcd, SimApiserver};
use tokio::process::Command;

// ---------------------------------------------------------------------------------------------
// Who can reach Envoy's admin interface and the xDS server.

/// `socket-probe` run as `uid`/`gid` (std clears the supplementary groups when it changes the
/// uid): `connected`, or `refused: <kind> (os error N)`.
async fn probe_as(uid: u32, args: &[&str]) -> Result<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_socket-probe"))
        .args(args)
        .uid(uid)
        .gid(uid)
        .output()
        .await
        .context("running socket-probe")?;
    if !out.status.success() {
        bail!(
            "socket-probe {args:?} as {uid}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8(out.stdout)?.trim().to_string())
}

/// Envoy's admin interface and the xDS stream are Unix sockets of mode 0600: Envoy and the
/// control plane (this user) reach each other and the owner reaches admin, but a process of
/// another user (nobody, 65534) gets EACCES on both, even in a directory it may traverse. Its
/// TCP connections work (the health port), so the refusal is the sockets' own. A second
/// control plane on the same socket directory is refused instead of taking the live socket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_other_user_can_reach_envoys_admin_or_xds() -> Result<()> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    const NOBODY: u32 = 65534;
    let _serial = SERIAL.lock().await;
    let etcd = Etcd::start().await?;
    let dir = tempfile::tempdir()?;
    let a = SimApiserver::start_with(shared("apiserver-a", "k8s-1.30", &etcd)).await?;
    // A socket directory others may traverse (the operator's choice; a missing one is created
    // 0700), so that only the sockets' mode stands in the way. The probe binary is in the
    // build directory, which others may read.
    let traversable = std::fs::Permissions::from_mode(0o755);
    std::fs::set_permissions(dir.path(), traversable.clone())?;
    let mut control = Control::new(&a, dir.path(), &[])?;
    std::fs::create_dir(&control.socket_dir)?;
    std::fs::set_permissions(&control.socket_dir, traversable)?;
    control.start().await?;
    let envoy = live_envoy(&control, None, None).await?;
    routed(
        &envoy,
        &control,
        DEPLOYMENTS,
        (200, "apiserver-a"),
        Duration::from_secs(30),
    )
    .await?;

    let admin = control.socket_dir.join(ADMIN_SOCKET);
    let xds = control.socket_dir.join(XDS_SOCKET);
    let me = std::fs::metadata(dir.path())?.uid();
    for socket in [&admin, &xds] {
        let meta = std::fs::metadata(socket).with_context(|| format!("{}", socket.display()))?;
        assert_eq!(meta.mode() & 0o7777, 0o600, "{}", socket.display());
        assert_eq!(meta.uid(), me, "{}", socket.display());
    }
    // The owner: Envoy reached xDS (it routes), and admin answers.
    assert_eq!(
        local_get(&envoy.admin, "/ready").await?,
        (200, "LIVE\n".to_string())
    );
    assert_eq!(
        envoy.admin,
        skewgate_control::local_channels::LocalChannel::Unix(admin.clone())
    );
    let health = format!("{}:{}", control.health.host, control.health.port);
    assert_eq!(
        probe_as(me, &["unix", &xds.to_string_lossy()]).await?,
        "connected"
    );
    assert_eq!(probe_as(NOBODY, &["tcp", &health]).await?, "connected");
    for socket in [&admin, &xds] {
        assert_eq!(
            probe_as(NOBODY, &["unix", &socket.to_string_lossy()]).await?,
            "refused: PermissionDenied (os error 13)",
            "{} as uid {NOBODY}",
            socket.display()
        );
    }

    // A second control plane with the same socket directory leaves the live socket alone.
    let other = tempfile::tempdir()?;
    let socket_dir = format!("--socket-dir={}", control.socket_dir.display());
    let mut second = Control::new(&a, other.path(), &[&socket_dir])?;
    let refused = second
        .start()
        .await
        .err()
        .context("a second control plane started")?;
    assert!(format!("{refused:#}").contains("is in use"), "{refused:#}");
    assert_eq!(get(&envoy, DEPLOYMENTS).await?, (200, "apiserver-a".into()));
    assert_eq!(
        probe_as(me, &["unix", &xds.to_string_lossy()]).await?,
        "connected"
    );
    Ok(())
}
