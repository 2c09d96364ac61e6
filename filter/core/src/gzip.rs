//! gzip (RFC 1952) around miniz_oxide's deflate, for large discovery documents.

/// CRC-32 (IEEE), as gzip's trailer needs; a table built at compile time (indexing in a
/// const block is checked by the compiler: out of bounds would not build).
#[allow(clippy::indexing_slicing)]
const CRC_TABLE: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut n = 0;
    while n < 256 {
        let mut c = n as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                0xEDB8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
            k += 1;
        }
        table[n] = c;
        n += 1;
    }
    table
};

pub fn crc32(data: &[u8]) -> u32 {
    let mut c = 0xFFFF_FFFFu32;
    for &b in data {
        let index = ((c ^ u32::from(b)) & 0xFF) as u8;
        c = CRC_TABLE.get(usize::from(index)).copied().unwrap_or(0) ^ (c >> 8);
    }
    c ^ 0xFFFF_FFFF
}

/// Level 6 (zlib's default): a good ratio for JSON at a cost paid once per document.
const LEVEL: u8 = 6;

pub fn compress(data: &[u8]) -> Vec<u8> {
    let deflated = miniz_oxide::deflate::compress_to_vec(data, LEVEL);
    let mut out = Vec::with_capacity(deflated.len() + 18);
    // ID1 ID2 CM=deflate FLG=0 MTIME=0 XFL=0 OS=255 (unknown)
    out.extend_from_slice(&[0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff]);
    out.extend_from_slice(&deflated);
    out.extend_from_slice(&crc32(data).to_le_bytes());
    // ISIZE is the length modulo 2^32 by definition.
    out.extend_from_slice(&(data.len() as u32).to_le_bytes());
    out
}

/// The inverse of [`compress`] (no optional header fields); for tests and tools.
pub fn decompress(gz: &[u8]) -> Option<Vec<u8>> {
    let body = gz.get(10..gz.len().checked_sub(8)?)?;
    if gz.get(..4)? != [0x1f, 0x8b, 8, 0] {
        return None;
    }
    let data = miniz_oxide::inflate::decompress_to_vec(body).ok()?;
    let trailer = gz.get(gz.len() - 8..)?;
    let crc = u32::from_le_bytes(trailer.get(..4)?.try_into().ok()?);
    (crc == crc32(&data)).then_some(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn crc32_matches_known_values() {
        for (data, crc) in [
            (&b""[..], 0),
            (b"a", 0xe8b7_be43),
            (b"123456789", 0xcbf4_3926),
        ] {
            assert_eq!(crc32(data), crc, "{data:?}");
        }
    }

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn round_trips() {
        for data in [&b""[..], b"x", &[b'{'; 100_000]] {
            let gz = compress(data);
            assert_eq!(decompress(&gz).as_deref(), Some(data));
        }
        assert_eq!(decompress(b"garbage"), None);
        let mut corrupted = compress(b"hello hello hello");
        let n = corrupted.len();
        corrupted[n - 6] ^= 1;
        assert_eq!(decompress(&corrupted), None);
    }
}
