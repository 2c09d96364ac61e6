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
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}
