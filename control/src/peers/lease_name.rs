//! The name kube-apiserver gives its own identity Lease, from its host name: how the local
//! apiserver's Lease is told from an impostor claiming its hostname label ([`super::model`]),
//! and how an operator's host-name mapping is checked against a Lease ([`super::address`]).

/// The name kube-apiserver gives its own identity lease: `apiserver-` and the lower-case,
/// unpadded base32 of the first 16 bytes of the SHA-256 of the host name and
/// `kube-apiserver`, each prefixed with its length as a big-endian `u16` (Go's
/// `cryptobyte.AddUint16LengthPrefixed`), as in kube's `controlplane/apiserver` options.
pub fn identity_lease_name(hostname: &str) -> String {
    use sha2::{Digest, Sha256};
    let mut data = Vec::new();
    for part in [hostname.as_bytes(), b"kube-apiserver".as_slice()] {
        let len = u16::try_from(part.len()).unwrap_or(u16::MAX);
        data.extend_from_slice(&len.to_be_bytes());
        data.extend(part.iter().take(usize::from(len)));
    }
    let hash = Sha256::digest(&data);
    const ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";
    let mut out = String::from("apiserver-");
    let (mut buffer, mut bits) = (0u32, 0u32);
    for byte in hash.iter().take(16) {
        buffer = (buffer << 8) | u32::from(*byte);
        bits += 8;
        while bits >= 5 {
            bits -= 5;
            out.push(char::from(ALPHABET[((buffer >> bits) & 31) as usize]));
        }
    }
    if bits > 0 {
        out.push(char::from(ALPHABET[((buffer << (5 - bits)) & 31) as usize]));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubes_identity_lease_name() {
        // sha256(\x00\x0bapiserver-a \x00\x0ekube-apiserver), first 16 bytes, base32, lower
        // case: the value the test harness computes independently.
        assert_eq!(
            identity_lease_name("apiserver-a"),
            "apiserver-g24gd6l4nm7gx56pradztv5ogy"
        );
        assert_ne!(identity_lease_name("cp-1"), identity_lease_name("cp-2"));
    }
}
