//! Serving discovery: `/apis`, `/apis/<g>`, `/apis/<g>/<v>`, `/api`, `/api/v1`, `/version`
//! and the health endpoints. Aggregated documents carry kube's caching headers (`ETag`,
//! `Vary: Accept`, `Cache-Control: public`) and honour `If-None-Match`.

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use crate::discovery;
use crate::fixture::Fixture;
use crate::negotiate::{self, DiscoveryVersion};
use crate::protobuf;
use crate::respond;
use crate::status;

/// One aggregated document, serialised once, with its ETag.
struct Doc {
    body: Vec<u8>,
    etag: String,
}

impl Doc {
    fn new(body: Vec<u8>) -> Doc {
        let etag = discovery::etag(&body);
        Doc { body, etag }
    }
}

/// Everything discovery serves, precomputed at start-up.
pub struct Discovery {
    aggregated: Value,
    apis_v2: Doc,
    apis_v2beta1: Doc,
    api_v2: Doc,
    api_v2beta1: Doc,
    legacy_apis: Vec<u8>,
    api_raw: Vec<u8>,
    core_v1_raw: Vec<u8>,
    version: Value,
    /// kube-apiserver served aggregated discovery v2beta1 until 1.33.
    v2beta1: bool,
}

impl Discovery {
    pub fn new(f: &Fixture, git_version: &str) -> Discovery {
        let core = |v: DiscoveryVersion| {
            Doc::new(
                discovery::aggregated_core(&f.core_v1, v.api_version())
                    .to_string()
                    .into_bytes(),
            )
        };
        Discovery {
            aggregated: f.aggregated.clone(),
            apis_v2: Doc::new(f.aggregated_raw.clone()),
            apis_v2beta1: Doc::new(discovery::rewrite_api_version(
                &f.aggregated_raw,
                DiscoveryVersion::V2Beta1.api_version(),
            )),
            api_v2: core(DiscoveryVersion::V2),
            api_v2beta1: core(DiscoveryVersion::V2Beta1),
            legacy_apis: discovery::legacy_group_list(&f.aggregated)
                .to_string()
                .into_bytes(),
            api_raw: f.api_raw.clone(),
            core_v1_raw: f.core_v1_raw.clone(),
            version: version_info(git_version),
            v2beta1: !at_least(git_version, 1, 33),
        }
    }

    fn aggregated(doc: &Doc, v: DiscoveryVersion, headers: &HeaderMap) -> Response {
        let not_modified = headers
            .get(header::IF_NONE_MATCH)
            .and_then(|h| h.to_str().ok())
            .is_some_and(|h| h.split(',').any(|t| t.trim() == doc.etag));
        // A 304 carries no Content-Type (like kube): HTTP caches merge its headers into
        // the cached response, and any type here would replace the aggregated one.
        let mut r = if not_modified {
            Response::builder()
                .status(StatusCode::NOT_MODIFIED)
                .body(Body::empty())
                .expect("static response")
        } else {
            (StatusCode::OK, doc.body.clone()).into_response()
        };
        let h = r.headers_mut();
        if !not_modified {
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static(v.content_type()),
            );
        }
        if let Ok(etag) = HeaderValue::from_str(&doc.etag) {
            h.insert(header::ETAG, etag);
        }
        h.insert(header::VARY, HeaderValue::from_static("Accept"));
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("public"));
        r
    }

    fn accept(headers: &HeaderMap) -> &str {
        headers
            .get(header::ACCEPT)
            .and_then(|h| h.to_str().ok())
            .unwrap_or("")
    }

    /// `GET /apis`
    pub fn apis(&self, headers: &HeaderMap) -> Response {
        let accept = Self::accept(headers);
        match negotiate::aggregated_discovery_of(accept, self.v2beta1) {
            Some(v @ DiscoveryVersion::V2) => Self::aggregated(&self.apis_v2, v, headers),
            Some(v @ DiscoveryVersion::V2Beta1) => Self::aggregated(&self.apis_v2beta1, v, headers),
            None => Self::plain(accept, &self.legacy_apis, protobuf::group_list),
        }
    }

    /// `GET /api`
    pub fn api(&self, headers: &HeaderMap) -> Response {
        let accept = Self::accept(headers);
        match negotiate::aggregated_discovery_of(accept, self.v2beta1) {
            Some(v @ DiscoveryVersion::V2) => Self::aggregated(&self.api_v2, v, headers),
            Some(v @ DiscoveryVersion::V2Beta1) => Self::aggregated(&self.api_v2beta1, v, headers),
            None => Self::plain(accept, &self.api_raw, protobuf::versions),
        }
    }

    /// A legacy list as the Accept header asks: its JSON, the same in protobuf, or kube's 406.
    fn plain(accept: &str, json: &[u8], encode: fn(&Value) -> Vec<u8>) -> Response {
        match negotiate::plain(accept) {
            negotiate::Plain::Json => respond::raw_json(StatusCode::OK, json.to_vec()),
            negotiate::Plain::Protobuf => {
                let list: Value = serde_json::from_slice(json).unwrap_or(Value::Null);
                (
                    StatusCode::OK,
                    [(header::CONTENT_TYPE, protobuf::CONTENT_TYPE)],
                    encode(&list),
                )
                    .into_response()
            }
            negotiate::Plain::NotAcceptable => status::respond(status::failure(
                406,
                "NotAcceptable",
                "only the following media types are accepted: application/json, application/yaml, application/vnd.kubernetes.protobuf",
                None,
            )),
        }
    }

    /// `GET /apis/<group>`
    pub fn group(&self, group: &str) -> Response {
        match discovery::legacy_group(&self.aggregated, group) {
            Some(g) => respond::json(StatusCode::OK, &g),
            None => status::page_not_found(),
        }
    }

    /// `GET /api/<version>` or `GET /apis/<group>/<version>`
    pub fn group_version(&self, group: &str, version: &str) -> Response {
        if group.is_empty() {
            return if version == "v1" {
                respond::raw_json(StatusCode::OK, self.core_v1_raw.clone())
            } else {
                status::page_not_found()
            };
        }
        match discovery::legacy_resource_list(&self.aggregated, group, version) {
            Some(l) => respond::json(StatusCode::OK, &l),
            None => status::page_not_found(),
        }
    }

    /// `GET /version`
    pub fn version(&self) -> Response {
        respond::json(StatusCode::OK, &self.version)
    }
}

/// Whether a git version like `v1.33.0` is at least `major.minor`.
pub fn at_least(git_version: &str, major: u32, minor: u32) -> bool {
    let mut parts = git_version.trim_start_matches('v').split('.');
    let number = |p: Option<&str>| {
        p.map(|s| {
            s.chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
        })
        .and_then(|s| s.parse::<u32>().ok())
    };
    match (number(parts.next()), number(parts.next())) {
        (Some(a), Some(b)) => (a, b) >= (major, minor),
        _ => false,
    }
}

/// `version.Info` for a git version like `v1.30.0` (minor keeps kube's `+` for pre-releases).
pub fn version_info(git_version: &str) -> Value {
    let trimmed = git_version.trim_start_matches('v');
    let mut parts = trimmed.split('.');
    let major = parts.next().unwrap_or("").to_string();
    let minor_raw = parts.next().unwrap_or("");
    let digits: String = minor_raw.chars().take_while(char::is_ascii_digit).collect();
    let minor = if trimmed.contains('-') || trimmed.contains('+') {
        format!("{digits}+")
    } else {
        digits
    };
    json!({
        "major": major,
        "minor": minor,
        "gitVersion": git_version,
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2024-01-01T00:00:00Z",
        "goVersion": "go1.22.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

/// `/healthz`, `/readyz`, `/livez`
pub fn health() -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        "ok",
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_from_git_version() {
        let v = version_info("v1.30.0");
        assert_eq!(
            (v["major"].as_str(), v["minor"].as_str()),
            (Some("1"), Some("30"))
        );
        assert_eq!(v["gitVersion"], "v1.30.0");
        assert_eq!(v["platform"], "linux/amd64");
        assert_eq!(version_info("v1.33.0-alpha.1")["minor"], "33+");
    }
}
