//! Just enough of kube's protobuf encoding to accept typed clients' request bodies whose
//! content does not matter (client-go sends `SelfSubjectReview` as
//! `application/vnd.kubernetes.protobuf`): the `k8s\0` envelope around a `runtime.Unknown`
//! whose `typeMeta` names the type; and the discovery lists a protobuf-only client asks for
//! (`APIGroupList` of `/apis`, `APIVersions` of `/api`). Other answers are JSON.

pub const CONTENT_TYPE: &str = "application/vnd.kubernetes.protobuf";

const MAGIC: &[u8] = b"k8s\x00";

fn varint(buf: &mut &[u8]) -> Result<u64, String> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let (&b, rest) = buf.split_first().ok_or("truncated varint")?;
        *buf = rest;
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err("varint too long".into())
}

/// Fields of one message: (field number, length-delimited bytes); other wire types skipped.
fn fields(mut buf: &[u8]) -> Result<Vec<(u64, &[u8])>, String> {
    let mut out = Vec::new();
    while !buf.is_empty() {
        let key = varint(&mut buf)?;
        match key & 7 {
            0 => {
                varint(&mut buf)?;
            }
            1 | 5 => {
                let n = if key & 7 == 1 { 8 } else { 4 };
                buf = buf.get(n..).ok_or("truncated fixed field")?;
            }
            2 => {
                let len = usize::try_from(varint(&mut buf)?).map_err(|e| e.to_string())?;
                let (value, rest) = (
                    buf.get(..len).ok_or("truncated field")?,
                    buf.get(len..).unwrap_or_default(),
                );
                out.push((key >> 3, value));
                buf = rest;
            }
            w => return Err(format!("unsupported wire type {w}")),
        }
    }
    Ok(out)
}

/// `(apiVersion, kind)` of a protobuf-encoded object.
pub fn type_meta(body: &[u8]) -> Result<(String, String), String> {
    let unknown = body
        .strip_prefix(MAGIC)
        .ok_or("provided object is not a protobuf-encoded object (missing the k8s prefix)")?;
    let mut api_version = String::new();
    let mut kind = String::new();
    for (n, value) in fields(unknown)? {
        if n != 1 {
            continue;
        }
        for (m, v) in fields(value)? {
            let s = String::from_utf8(v.to_vec()).map_err(|e| e.to_string())?;
            match m {
                1 => api_version = s,
                2 => kind = s,
                _ => {}
            }
        }
    }
    Ok((api_version, kind))
}

pub fn is_protobuf(content_type: &str) -> bool {
    content_type
        .split(';')
        .next()
        .is_some_and(|t| t.trim().eq_ignore_ascii_case(CONTENT_TYPE))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelope_type_meta() {
        // What kubectl 1.37 sends for `auth whoami`: typeMeta, raw (an empty review), and the
        // empty contentEncoding/contentType.
        let mut body = b"k8s\x00".to_vec();
        let api = b"authentication.k8s.io/v1";
        let kind = b"SelfSubjectReview";
        let mut tm = vec![0x0a, api.len() as u8];
        tm.extend_from_slice(api);
        tm.extend_from_slice(&[0x12, kind.len() as u8]);
        tm.extend_from_slice(kind);
        body.extend_from_slice(&[0x0a, tm.len() as u8]);
        body.extend_from_slice(&tm);
        body.extend_from_slice(&[0x12, 0x04, 0x0a, 0x00, 0x12, 0x00, 0x1a, 0x00, 0x22, 0x00]);
        assert_eq!(
            type_meta(&body).unwrap(),
            (
                "authentication.k8s.io/v1".into(),
                "SelfSubjectReview".into()
            )
        );
        assert!(type_meta(b"{}").is_err());
        assert!(type_meta(b"k8s\x00\x0a\x05ab").is_err());
        assert!(is_protobuf("application/vnd.kubernetes.protobuf; x=y"));
        assert!(!is_protobuf("application/json"));
    }
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A length-delimited field.
fn put(out: &mut Vec<u8>, field: u64, bytes: &[u8]) {
    put_varint(out, (field << 3) | 2);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// `runtime.Unknown` in kube's envelope, around a message of `kind` (`v1` meta types).
fn envelope(kind: &str, raw: &[u8]) -> Vec<u8> {
    let mut type_meta = Vec::new();
    put(&mut type_meta, 1, b"v1");
    put(&mut type_meta, 2, kind.as_bytes());
    let mut unknown = Vec::new();
    put(&mut unknown, 1, &type_meta);
    put(&mut unknown, 2, raw);
    put(&mut unknown, 3, b"");
    put(&mut unknown, 4, b"");
    let mut out = MAGIC.to_vec();
    out.extend(unknown);
    out
}

fn server_addresses(out: &mut Vec<u8>, field: u64, list: &serde_json::Value) {
    for a in list.as_array().into_iter().flatten() {
        let mut m = Vec::new();
        put(&mut m, 1, a["clientCIDR"].as_str().unwrap_or("").as_bytes());
        put(
            &mut m,
            2,
            a["serverAddress"].as_str().unwrap_or("").as_bytes(),
        );
        put(out, field, &m);
    }
}

fn group_version(gv: &serde_json::Value) -> Vec<u8> {
    let mut m = Vec::new();
    put(
        &mut m,
        1,
        gv["groupVersion"].as_str().unwrap_or("").as_bytes(),
    );
    put(&mut m, 2, gv["version"].as_str().unwrap_or("").as_bytes());
    m
}

/// `/apis` (`metav1.APIGroupList`, JSON as kube serves it) in protobuf.
pub fn group_list(list: &serde_json::Value) -> Vec<u8> {
    let mut groups = Vec::new();
    for g in list["groups"].as_array().into_iter().flatten() {
        let mut group = Vec::new();
        put(&mut group, 1, g["name"].as_str().unwrap_or("").as_bytes());
        for v in g["versions"].as_array().into_iter().flatten() {
            put(&mut group, 2, &group_version(v));
        }
        put(&mut group, 3, &group_version(&g["preferredVersion"]));
        server_addresses(&mut group, 4, &g["serverAddressByClientCIDRs"]);
        put(&mut groups, 1, &group);
    }
    envelope("APIGroupList", &groups)
}

/// `/api` (`metav1.APIVersions`) in protobuf.
pub fn versions(list: &serde_json::Value) -> Vec<u8> {
    let mut m = Vec::new();
    for v in list["versions"].as_array().into_iter().flatten() {
        put(&mut m, 1, v.as_str().unwrap_or("").as_bytes());
    }
    server_addresses(&mut m, 2, &list["serverAddressByClientCIDRs"]);
    envelope("APIVersions", &m)
}

#[cfg(test)]
mod encoding_tests {
    use super::*;

    #[test]
    fn a_group_list_reads_back() {
        let list = serde_json::json!({"kind": "APIGroupList", "groups": [{"name": "apps",
            "versions": [{"groupVersion": "apps/v1", "version": "v1"}],
            "preferredVersion": {"groupVersion": "apps/v1", "version": "v1"}}]});
        let body = group_list(&list);
        assert_eq!(
            type_meta(&body).unwrap(),
            ("v1".to_string(), "APIGroupList".to_string())
        );
    }
}
