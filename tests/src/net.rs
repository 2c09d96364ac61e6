//! Loopback helpers: a free port, and a peer that never answers.

use anyhow::Result;
use skewgate_control::envoy::Address;

/// A peer that accepts connections and never answers (a hung apiserver). Connections are
/// held until the returned task is dropped or aborted.
pub async fn black_hole() -> Result<(Address, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = Address::parse(&listener.local_addr()?.to_string())?;
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    Ok((address, task))
}

/// A free loopback port (the kernel's choice; closed again before use).
pub fn free_port() -> Result<u16> {
    Ok(free_ports::<1>()?[0])
}

/// `N` distinct free loopback ports: each stays bound until all are chosen, so two calls of
/// [`free_port`] in a row cannot both get the port the first one just closed (seen:
/// `--debug-listen and --health-listen must differ`).
pub fn free_ports<const N: usize>() -> Result<[u16; N]> {
    let listeners = (0..N)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<std::io::Result<Vec<_>>>()?;
    let mut ports = [0; N];
    for (port, listener) in ports.iter_mut().zip(&listeners) {
        *port = listener.local_addr()?.port();
    }
    Ok(ports)
}
