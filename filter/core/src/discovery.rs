//! Serving peer-aggregated discovery from the configuration (docs/ARCHITECTURE.md step 3).
//!
//! `GET /apis` and `GET /api` with an aggregated-discovery Accept clause are answered from the
//! merged documents the control plane put in the configuration, so every client sees the union
//! of what the live apiservers serve. `profile=nopeer` and anything we cannot answer in JSON go
//! to the local apiserver. Beyond upstream, which merges only `/apis` v2:
//! - `/api` is merged too (core/v1 grows by subresources such as `pods/resize`);
//! - clients that accept only v2beta1 (client-go 1.26-1.29) get the merged document as v2beta1;
//! - legacy discovery (`/apis` `APIGroupList`, `/apis/<g>`, `/apis/<g>/<v>`, `/api/v1`) is
//!   answered from the legacy documents the control plane sent for every path where the union
//!   differs from the local apiserver's answer; other paths go to the local apiserver;
//! - the legacy group-version path of a retained group-version (no live apiserver serves it now,
//!   one that did is gone or not re-read yet) is [`unavailable`](MergedDiscovery::unavailable):
//!   the filter answers it 503, so legacy clients mark the group failed instead of believing it
//!   empty or gone.

use std::collections::HashMap;
use std::sync::OnceLock;

use crate::config::DiscoveryConfig;
use crate::group_version::GroupVersion;
use crate::gzip;
use crate::negotiation::{self, DiscoveryFormat};

/// kube-apiserver gzips responses of at least this size for clients that accept it
/// (`defaultGzipThresholdBytes`); we do the same for the documents we serve.
pub const GZIP_THRESHOLD_BYTES: usize = 128 * 1024;

/// What the filter does with a request, as far as discovery is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DiscoveryAnswer<'a> {
    /// Not something we answer: route it like any other request.
    Pass,
    /// Answer it here.
    Respond(Response<'a>),
}

/// Why a discovery request was passed on (for the counters).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PassReason {
    NotDiscovery,
    /// `profile=nopeer`: the local apiserver's own document, by request.
    NoPeer,
    /// A discovery request we cannot answer here (protobuf only, unparsable Accept, a legacy
    /// path that the local apiserver answers fully, or no merged documents configured).
    Local,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response<'a> {
    /// 200, or 304 for a matching `If-None-Match`.
    pub status: u16,
    pub content_type: &'static str,
    /// Quoted; only aggregated documents carry one (legacy discovery has none upstream).
    pub etag: Option<&'a str>,
    /// Empty for 304 and HEAD, and when the document is in shared data (`stored`).
    pub body: &'a [u8],
    pub gzip: bool,
    /// The document is kept once per Envoy process in proxy-wasm shared data
    /// ([`crate::shared_discovery`]): fetch it (gzipped when `gzip`) with
    /// [`shared_discovery::body`](crate::shared_discovery::body).
    pub stored: Option<&'a str>,
}

/// The outcome of negotiating one discovery request against the merged documents: which
/// document, in which form. Small and `Copy`, so the filter negotiates once, when the request
/// headers arrive, and keeps only this until the local apiserver's answer comes back; then
/// [`MergedDiscovery::respond`] is a lookup, not a second negotiation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiscoveryChoice {
    document: Document,
    /// `If-None-Match` matched the document's ETag: answer 304.
    not_modified: bool,
    /// `HEAD`: headers only.
    head: bool,
    /// The client accepts gzip (the document is compressed only past the threshold).
    accepts_gzip: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Document {
    Apis(AggregatedVersion),
    Api(AggregatedVersion),
    /// Index into [`MergedDiscovery::legacy_documents`].
    Legacy(usize),
}

/// `Document::Apis` or `Document::Api`.
type MakeDocument = fn(AggregatedVersion) -> Document;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AggregatedVersion {
    V2,
    V2Beta1,
}

/// The request headers discovery looks at.
#[derive(Debug, Clone, Copy, Default)]
pub struct DiscoveryHeaders<'a> {
    pub accept: Option<&'a [u8]>,
    pub if_none_match: Option<&'a [u8]>,
    pub accept_encoding: Option<&'a [u8]>,
}

/// One merged aggregated document in both encodings clients ask for.
#[derive(Debug)]
pub(crate) struct AggregatedDocument {
    pub(crate) v2: Encoded,
    /// The same document with `apiVersion: apidiscovery.k8s.io/v2beta1` (the two versions have
    /// the same schema); `None` if the document did not have the expected `apiVersion`.
    pub(crate) v2beta1: Option<Encoded>,
}

#[derive(Debug)]
pub(crate) struct Encoded {
    pub(crate) body: Body,
    pub(crate) etag: String,
    /// Compressed on first use: most documents are never large enough to need it. A lock, not
    /// a cell: the native filter shares one compiled configuration among Envoy's workers.
    gzipped: OnceLock<Option<Vec<u8>>>,
}

/// Where a document's bytes are.
#[derive(Debug)]
pub(crate) enum Body {
    /// In this VM.
    Inline(String),
    /// In proxy-wasm shared data under `key`, `len` bytes (uncompressed).
    Stored { key: String, len: usize },
}

impl Encoded {
    fn new(body: String, etag: String) -> Self {
        Encoded {
            body: Body::Inline(body),
            etag,
            gzipped: OnceLock::new(),
        }
    }

    pub(crate) fn stored(key: String, len: usize, etag: String) -> Self {
        Encoded {
            body: Body::Stored { key, len },
            etag,
            gzipped: OnceLock::new(),
        }
    }

    pub(crate) fn len(&self) -> usize {
        match &self.body {
            Body::Inline(body) => body.len(),
            Body::Stored { len, .. } => *len,
        }
    }

    /// Whether a client that accepts gzip gets it gzipped (as kube-apiserver: from 128 KiB).
    fn gzips(&self) -> bool {
        self.len() >= GZIP_THRESHOLD_BYTES
    }

    /// The gzipped form of an inline document (a stored one is gzipped in shared data).
    fn gzipped(&self) -> Option<&[u8]> {
        let Body::Inline(body) = &self.body else {
            return None;
        };
        self.gzipped
            .get_or_init(|| self.gzips().then(|| gzip::compress(body.as_bytes())))
            .as_deref()
    }
}

const V2_API_VERSION: &str = "\"apiVersion\":\"apidiscovery.k8s.io/v2\"";
const V2BETA1_API_VERSION: &str = "\"apiVersion\":\"apidiscovery.k8s.io/v2beta1\"";

impl AggregatedDocument {
    fn encoded(&self, version: AggregatedVersion) -> Option<(&Encoded, DiscoveryFormat)> {
        match version {
            AggregatedVersion::V2 => Some((&self.v2, DiscoveryFormat::AggregatedV2)),
            AggregatedVersion::V2Beta1 => self
                .v2beta1
                .as_ref()
                .map(|e| (e, DiscoveryFormat::AggregatedV2Beta1)),
        }
    }

    fn new(body: &str, etag: &str) -> Self {
        let v2beta1 = body
            .contains(V2_API_VERSION)
            .then(|| body.replacen(V2_API_VERSION, V2BETA1_API_VERSION, 1))
            .map(|b| Encoded::new(b, format!("\"{etag}-v2beta1\"")));
        AggregatedDocument {
            v2: Encoded::new(body.to_string(), format!("\"{etag}\"")),
            v2beta1,
        }
    }
}

/// The request-time form of [`DiscoveryConfig`].
#[derive(Debug)]
pub struct MergedDiscovery {
    pub(crate) apis: AggregatedDocument,
    pub(crate) api: AggregatedDocument,
    /// Legacy documents by path: an index into `legacy_documents`.
    pub(crate) legacy: HashMap<String, usize>,
    pub(crate) legacy_documents: Vec<Encoded>,
    /// [`DiscoveryConfig::unavailable`]: legacy group-version paths answered 503, with the
    /// group-version each names.
    pub(crate) unavailable: HashMap<String, GroupVersion>,
}

impl MergedDiscovery {
    pub fn compile(config: &DiscoveryConfig) -> Self {
        let mut legacy = HashMap::with_capacity(config.legacy.len());
        let mut legacy_documents = Vec::with_capacity(config.legacy.len());
        for (path, doc) in &config.legacy {
            legacy.insert(path.clone(), legacy_documents.len());
            legacy_documents.push(Encoded::new(doc.get().to_string(), String::new()));
        }
        let unavailable = unavailable_paths(&config.unavailable);
        MergedDiscovery {
            apis: AggregatedDocument::new(config.apis.get(), &config.apis_etag),
            api: AggregatedDocument::new(config.api.get(), &config.api_etag),
            legacy,
            legacy_documents,
            unavailable,
        }
    }

    /// A `GET` or `HEAD` of exactly a retained group-version's legacy discovery path (the
    /// query aside): the group-version it names, which no live apiserver serves now. The
    /// filter answers it 503 itself.
    pub fn unavailable(&self, method: &str, path_and_query: &str) -> Option<&GroupVersion> {
        if self.unavailable.is_empty() || !matches!(method, "GET" | "HEAD") {
            return None;
        }
        let path = path_and_query
            .split_once('?')
            .map_or(path_and_query, |(p, _)| p);
        self.unavailable.get(path)
    }

    /// Decide for one request. `path_and_query` is Envoy's `:path`. The same as
    /// [`negotiate`](Self::negotiate) followed by [`respond`](Self::respond).
    pub fn answer<'a>(
        &'a self,
        method: &str,
        path_and_query: &str,
        headers: DiscoveryHeaders<'_>,
    ) -> (DiscoveryAnswer<'a>, PassReason) {
        match self.negotiate(method, path_and_query, headers) {
            (Some(choice), reason) => match self.respond(choice) {
                Some(response) => (DiscoveryAnswer::Respond(response), reason),
                None => (DiscoveryAnswer::Pass, PassReason::Local),
            },
            (None, reason) => (DiscoveryAnswer::Pass, reason),
        }
    }

    /// Negotiate one request: `Some` when we answer it from the merged documents (the reason
    /// is then [`PassReason::NotDiscovery`]), `None` with the reason it passes otherwise.
    pub fn negotiate(
        &self,
        method: &str,
        path_and_query: &str,
        headers: DiscoveryHeaders<'_>,
    ) -> (Option<DiscoveryChoice>, PassReason) {
        let head = match method {
            "GET" => false,
            "HEAD" => true,
            _ => return (None, PassReason::NotDiscovery),
        };
        let path = path_and_query
            .split_once('?')
            .map_or(path_and_query, |(p, _)| p);
        // Every request passes here, nearly all of them for resources: they leave after one
        // walk over at most four segments, without hashing the path (every legacy path is a
        // discovery path, `FilterConfig::validate`).
        if !is_discovery_path(path) {
            return (None, PassReason::NotDiscovery);
        }
        let aggregated: Option<(&AggregatedDocument, MakeDocument)> = match path {
            "/apis" => Some((&self.apis, Document::Apis)),
            "/api" => Some((&self.api, Document::Api)),
            _ => None,
        };
        let legacy = self.legacy.get(path).copied();
        if aggregated.is_none() && legacy.is_none() {
            return (None, PassReason::Local);
        }
        let Ok(negotiated) = negotiation::negotiate_discovery(headers.accept) else {
            return (None, PassReason::Local);
        };
        if negotiated.nopeer {
            return (None, PassReason::NoPeer);
        }
        if !negotiated.json {
            return (None, PassReason::Local);
        }
        let document = match (negotiated.format, aggregated, legacy) {
            (DiscoveryFormat::AggregatedV2, Some((_, document)), _) => {
                document(AggregatedVersion::V2)
            }
            (DiscoveryFormat::AggregatedV2Beta1, Some((doc, document)), _)
                if doc.v2beta1.is_some() =>
            {
                document(AggregatedVersion::V2Beta1)
            }
            (DiscoveryFormat::Legacy, _, Some(index)) => Document::Legacy(index),
            _ => return (None, PassReason::Local),
        };
        let Some((encoded, _, etag)) = self.document(document) else {
            return (None, PassReason::Local);
        };
        let choice = DiscoveryChoice {
            document,
            not_modified: etag
                .is_some_and(|_| negotiation::etag_matches(headers.if_none_match, &encoded.etag)),
            head,
            accepts_gzip: accepts_gzip(headers.accept_encoding),
        };
        (Some(choice), PassReason::NotDiscovery)
    }

    /// The answer for a request negotiated by [`negotiate`](Self::negotiate) on this same
    /// compiled configuration (`None` only for a choice made on another one).
    pub fn respond(&self, choice: DiscoveryChoice) -> Option<Response<'_>> {
        let (encoded, content_type, etag) = self.document(choice.document)?;
        if choice.not_modified {
            return Some(Response {
                status: 304,
                content_type,
                etag,
                body: &[],
                gzip: false,
                stored: None,
            });
        }
        let (body, gzip, stored) = match &encoded.body {
            Body::Inline(plain) => match choice.accepts_gzip.then(|| encoded.gzipped()).flatten() {
                Some(bytes) => (bytes, true, None),
                None => (plain.as_bytes(), false, None),
            },
            Body::Stored { key, .. } => (
                &[][..],
                choice.accepts_gzip && encoded.gzips(),
                (!choice.head).then_some(key.as_str()),
            ),
        };
        Some(Response {
            status: 200,
            content_type,
            etag,
            body: if choice.head { &[] } else { body },
            gzip,
            stored,
        })
    }

    /// A document, its Content-Type, and its ETag (aggregated documents only: legacy
    /// discovery has none upstream).
    fn document(&self, document: Document) -> Option<(&Encoded, &'static str, Option<&str>)> {
        let (encoded, format) = match document {
            Document::Apis(version) => self.apis.encoded(version)?,
            Document::Api(version) => self.api.encoded(version)?,
            Document::Legacy(index) => {
                let encoded = self.legacy_documents.get(index)?;
                return Some((encoded, negotiated_type(DiscoveryFormat::Legacy), None));
            }
        };
        Some((
            encoded,
            negotiated_type(format),
            Some(encoded.etag.as_str()),
        ))
    }
}

fn negotiated_type(format: DiscoveryFormat) -> &'static str {
    negotiation::aggregated_content_type(format)
}

/// [`DiscoveryConfig::unavailable`] with the group-version each path names.
pub(crate) fn unavailable_paths<'a>(
    paths: impl IntoIterator<Item = &'a String>,
) -> HashMap<String, GroupVersion> {
    paths
        .into_iter()
        .filter_map(|path| Some((path.clone(), legacy_group_version(path)?)))
        .collect()
}

/// The group-version of a legacy group-version path (`/apis/<g>/<v>`, `/api/<v>`), as
/// [`DiscoveryConfig::validate`] admits them.
fn legacy_group_version(path: &str) -> Option<GroupVersion> {
    let segments: Vec<&str> = path.split('/').skip(1).collect();
    match segments.as_slice() {
        ["apis", group, version] => Some(GroupVersion::new(*group, *version)),
        ["api", version] => Some(GroupVersion::new("", *version)),
        _ => None,
    }
}

/// Discovery paths the local apiserver answers when we have nothing better.
fn is_discovery_path(path: &str) -> bool {
    // `/api`, `/api/<v>`, `/apis`, `/apis/<g>`, `/apis/<g>/<v>`: the first segment, then the
    // slashes after it (empty segments count, as in a split on `/`), counted only up to one
    // too many: a resource path leaves after a few bytes, without a split.
    let trimmed = path.trim_matches('/');
    let first = trimmed.split_once('/').map_or(trimmed, |(first, _)| first);
    let most_slashes = match first {
        "api" => 1,
        "apis" => 2,
        _ => return false,
    };
    trimmed
        .bytes()
        .filter(|&b| b == b'/')
        .nth(most_slashes)
        .is_none()
}

/// `Accept-Encoding` lists `gzip` with a non-zero q (Go's `strings.Contains` check upstream is
/// laxer; a q of 0 is an explicit refusal we honour).
fn accepts_gzip(accept_encoding: Option<&[u8]>) -> bool {
    let Some(value) = accept_encoding.and_then(|v| std::str::from_utf8(v).ok()) else {
        return false;
    };
    value.split(',').any(|clause| {
        let mut params = clause.split(';').map(str::trim);
        let coding = params.next().unwrap_or_default();
        let refused = params.any(|p| {
            p.strip_prefix("q=")
                .and_then(|q| q.parse::<f32>().ok())
                .is_some_and(|q| q <= 0.0)
        });
        (coding.eq_ignore_ascii_case("gzip") || coding == "*") && !refused
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Which paths are discovery documents' (the query is gone by then): a table, with the
    /// edges of the slash count and of the first segment.
    #[test]
    fn discovery_paths() {
        for (path, want) in [
            ("/api", true),
            ("/api/", true),
            ("/api/v1", true),
            ("/api/v1/", true),
            ("/apis", true),
            ("/apis/apps", true),
            ("/apis/apps/v1", true),
            ("//apis//", true),
            ("/apis//", true),
            // Empty segments count.
            ("/apis//v1", true),
            ("/apis/a//v1", false),
            ("/api/v1/pods", false),
            ("/api//v1", false),
            ("/apis/apps/v1/deployments", false),
            ("/apis/apps/v1/namespaces/default/deployments/web", false),
            ("/", false),
            ("", false),
            ("/apisx", false),
            ("/ap", false),
            ("/API", false),
            ("/healthz", false),
            ("/openapi/v3/apis/apps/v1", false),
            ("/x/apis", false),
            ("/apis\u{e9}/x", false),
        ] {
            assert_eq!(is_discovery_path(path), want, "{path:?}");
        }
    }
    use crate::config::JsonDocument;
    use std::collections::BTreeMap;

    const V2: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";
    const V2BETA1: &str =
        "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList";
    const APIS: &str = r#"{"kind":"APIGroupDiscoveryList","apiVersion":"apidiscovery.k8s.io/v2","metadata":{},"items":[{"metadata":{"name":"apps"}}]}"#;
    const API: &str = r#"{"kind":"APIGroupDiscoveryList","apiVersion":"apidiscovery.k8s.io/v2","metadata":{},"items":[{"metadata":{"name":""}}]}"#;
    const GROUPS: &str = r#"{"kind":"APIGroupList","apiVersion":"v1","groups":[]}"#;
    /// What a legacy client (kubectl 1.20) asks discovery for.
    const GROUPS_ACCEPT: &str = "application/json, */*";

    fn merged() -> MergedDiscovery {
        MergedDiscovery::compile(&DiscoveryConfig {
            version: String::new(),
            unavailable: Default::default(),
            apis: JsonDocument::from_str(APIS).unwrap(),
            apis_etag: "aaa".into(),
            api: JsonDocument::from_str(API).unwrap(),
            api_etag: "bbb".into(),
            legacy: BTreeMap::from([
                ("/apis".to_string(), JsonDocument::from_str(GROUPS).unwrap()),
                (
                    "/apis/resource.k8s.io/v1beta2".to_string(),
                    JsonDocument::from_str("{}").unwrap(),
                ),
            ]),
        })
    }

    /// Which requests are discovery requests at all: the shapes kube-apiserver serves
    /// discovery at, however the path is written; everything else leaves at once.
    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn only_discovery_shaped_paths_are_discovery_requests() {
        let d = merged();
        let cases = [
            // (path, answered from the merged documents, the reason it passes otherwise)
            ("/apis", true, PassReason::NotDiscovery),
            ("/apis?timeout=32s", true, PassReason::NotDiscovery),
            (
                "/apis/resource.k8s.io/v1beta2",
                true,
                PassReason::NotDiscovery,
            ),
            ("/apis/", false, PassReason::Local),
            ("/api/v1", false, PassReason::Local),
            ("/apis/apps", false, PassReason::Local),
            ("/apis/apps/v1", false, PassReason::Local),
            ("/apis/apps/v1/", false, PassReason::Local),
            ("/apis//v1", false, PassReason::Local),
            ("/apis/apps/v1/deployments", false, PassReason::NotDiscovery),
            (
                "/apis/apps/v1/namespaces/default/deployments/web",
                false,
                PassReason::NotDiscovery,
            ),
            ("/api/v1/pods", false, PassReason::NotDiscovery),
            (
                "/api/v1/namespaces/default/pods?watch=true",
                false,
                PassReason::NotDiscovery,
            ),
            ("/healthz", false, PassReason::NotDiscovery),
            ("/", false, PassReason::NotDiscovery),
            ("", false, PassReason::NotDiscovery),
            ("/apisx", false, PassReason::NotDiscovery),
            ("/openapi/v3/apis/apps/v1", false, PassReason::NotDiscovery),
        ];
        for (path, answered, reason) in cases {
            let (choice, why) = d.negotiate("GET", path, headers(GROUPS_ACCEPT, None));
            assert_eq!(choice.is_some(), answered, "{path:?}");
            if !answered {
                assert_eq!(why, reason, "{path:?}");
            }
        }
    }

    fn headers<'a>(accept: &'a str, inm: Option<&'a str>) -> DiscoveryHeaders<'a> {
        DiscoveryHeaders {
            accept: Some(accept.as_bytes()),
            if_none_match: inm.map(str::as_bytes),
            accept_encoding: None,
        }
    }

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn answers_like_design_md() {
        let m = merged();
        let kubectl = format!("{V2},{V2BETA1},application/json");
        let nopeer = format!("{V2};profile=nopeer,{V2},application/json");
        let json_first = format!("application/json,{V2};q=0.1");
        let proto_only = "application/vnd.kubernetes.protobuf;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";
        // (method, path, accept, if-none-match, expected: None = pass / Some((status, type, etag, body)))
        type Want = Option<(u16, &'static str, Option<&'static str>, &'static str)>;
        type Case<'a> = (&'a str, &'a str, &'a str, Option<&'a str>, Want, PassReason);
        let cases: Vec<Case> = vec![
            (
                "GET",
                "/apis",
                &kubectl,
                None,
                Some((200, V2, Some("\"aaa\""), APIS)),
                PassReason::NotDiscovery,
            ),
            (
                "GET",
                "/apis?timeout=32s",
                &kubectl,
                None,
                Some((200, V2, Some("\"aaa\""), APIS)),
                PassReason::NotDiscovery,
            ),
            (
                "GET",
                "/api",
                &kubectl,
                None,
                Some((200, V2, Some("\"bbb\""), API)),
                PassReason::NotDiscovery,
            ),
            (
                "HEAD",
                "/apis",
                &kubectl,
                None,
                Some((200, V2, Some("\"aaa\""), "")),
                PassReason::NotDiscovery,
            ),
            (
                "GET",
                "/apis",
                &kubectl,
                Some("\"aaa\""),
                Some((304, V2, Some("\"aaa\""), "")),
                PassReason::NotDiscovery,
            ),
            (
                "GET",
                "/apis",
                &kubectl,
                Some("\"zzz\""),
                Some((200, V2, Some("\"aaa\""), APIS)),
                PassReason::NotDiscovery,
            ),
            (
                "GET",
                "/apis",
                &kubectl,
                Some("W/\"aaa\""),
                Some((200, V2, Some("\"aaa\""), APIS)),
                PassReason::NotDiscovery,
            ),
            // Any aggregated clause beats plain JSON, whatever the q values.
            (
                "GET",
                "/apis",
                &json_first,
                None,
                Some((200, V2, Some("\"aaa\""), APIS)),
                PassReason::NotDiscovery,
            ),
            // nopeer and protobuf-only go to the local apiserver.
            ("GET", "/apis", &nopeer, None, None, PassReason::NoPeer),
            ("GET", "/apis", proto_only, None, None, PassReason::Local),
            // Legacy clients: merged group list, merged lists where they differ, local otherwise.
            (
                "GET",
                "/apis",
                "application/json, */*",
                None,
                Some((200, "application/json", None, GROUPS)),
                PassReason::NotDiscovery,
            ),
            (
                "GET",
                "/apis/resource.k8s.io/v1beta2",
                "application/json, */*",
                None,
                Some((200, "application/json", None, "{}")),
                PassReason::NotDiscovery,
            ),
            (
                "GET",
                "/apis/apps/v1",
                "application/json, */*",
                None,
                None,
                PassReason::Local,
            ),
            (
                "GET",
                "/api",
                "application/json, */*",
                None,
                None,
                PassReason::Local,
            ),
            // Not discovery at all.
            (
                "GET",
                "/apis/apps/v1/deployments",
                &kubectl,
                None,
                None,
                PassReason::NotDiscovery,
            ),
            (
                "POST",
                "/apis",
                &kubectl,
                None,
                None,
                PassReason::NotDiscovery,
            ),
            (
                "GET",
                "/healthz",
                &kubectl,
                None,
                None,
                PassReason::NotDiscovery,
            ),
            // Garbage Accept: the local apiserver says what is wrong with it.
            ("GET", "/apis", ";;;,,,", None, None, PassReason::Local),
        ];
        for (method, path, accept, inm, want, reason) in cases {
            let (answer, why) = m.answer(method, path, headers(accept, inm));
            let got = match answer {
                DiscoveryAnswer::Pass => None,
                DiscoveryAnswer::Respond(r) => Some((
                    r.status,
                    r.content_type,
                    r.etag.map(str::to_string),
                    String::from_utf8(r.body.to_vec()).unwrap(),
                )),
            };
            let want = want.map(|(s, t, e, b)| (s, t, e.map(str::to_string), b.to_string()));
            assert_eq!(got, want, "{method} {path} accept={accept} inm={inm:?}");
            assert_eq!(why, reason, "{method} {path} accept={accept}");
        }
    }

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn retained_legacy_group_version_paths_are_unavailable() {
        let config = DiscoveryConfig {
            version: String::new(),
            unavailable: ["/apis/resource.k8s.io/v1beta3", "/api/v2"]
                .into_iter()
                .map(String::from)
                .collect(),
            apis: JsonDocument::from_str(APIS).unwrap(),
            apis_etag: "aaa".into(),
            api: JsonDocument::from_str(API).unwrap(),
            api_etag: "bbb".into(),
            legacy: BTreeMap::new(),
        };
        config.validate().unwrap();
        let retained = MergedDiscovery::compile(&config);
        let claims = GroupVersion::new("resource.k8s.io", "v1beta3");
        let core = GroupVersion::new("", "v2");
        // (method, path, unavailable group-version)
        let cases: Vec<(&str, &str, Option<&GroupVersion>)> = vec![
            ("GET", "/apis/resource.k8s.io/v1beta3", Some(&claims)),
            ("HEAD", "/apis/resource.k8s.io/v1beta3", Some(&claims)),
            (
                "GET",
                "/apis/resource.k8s.io/v1beta3?timeout=32s",
                Some(&claims),
            ),
            ("GET", "/api/v2", Some(&core)),
            // Other methods, paths and group-versions are not ours to answer.
            ("POST", "/apis/resource.k8s.io/v1beta3", None),
            ("GET", "/apis/resource.k8s.io/v1beta3/", None),
            ("GET", "/apis/resource.k8s.io/v1beta3/resourceclaims", None),
            ("GET", "/apis/resource.k8s.io", None),
            ("GET", "/apis/resource.k8s.io/v1beta2", None),
            ("GET", "/apis", None),
            ("GET", "/api/v1", None),
        ];
        for (method, path, want) in cases {
            assert_eq!(retained.unavailable(method, path), want, "{method} {path}");
        }
        assert_eq!(
            merged().unavailable("GET", "/apis/resource.k8s.io/v1beta3"),
            None
        );
    }

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn v2beta1_only_clients_get_the_merged_document_as_v2beta1() {
        let m = merged();
        let (answer, _) = m.answer("GET", "/apis", headers(V2BETA1, None));
        let DiscoveryAnswer::Respond(r) = answer else {
            panic!("not answered")
        };
        assert_eq!(r.content_type, V2BETA1);
        assert_eq!(r.etag, Some("\"aaa-v2beta1\""));
        let body = std::str::from_utf8(r.body).unwrap();
        assert_eq!(
            body,
            APIS.replace("apidiscovery.k8s.io/v2", "apidiscovery.k8s.io/v2beta1")
        );
    }

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn large_documents_are_gzipped_for_clients_that_accept_it() {
        let items: Vec<String> = (0..4000)
            .map(|i| format!(r#"{{"metadata":{{"name":"group-{i}.example.com"}},"versions":[{{"version":"v1","resources":[]}}]}}"#))
            .collect();
        let big = format!(
            r#"{{"kind":"APIGroupDiscoveryList","apiVersion":"apidiscovery.k8s.io/v2","metadata":{{}},"items":[{}]}}"#,
            items.join(",")
        );
        assert!(big.len() > GZIP_THRESHOLD_BYTES);
        let m = MergedDiscovery::compile(&DiscoveryConfig {
            version: String::new(),
            unavailable: Default::default(),
            apis: JsonDocument::from_str(&big).unwrap(),
            apis_etag: "e".into(),
            api: JsonDocument::from_str(API).unwrap(),
            api_etag: "f".into(),
            legacy: BTreeMap::new(),
        });
        for (encoding, want_gzip) in [
            (Some("gzip"), true),
            (Some("deflate, gzip;q=0.5"), true),
            (Some("gzip;q=0"), false),
            (Some("br"), false),
            (None, false),
        ] {
            let h = DiscoveryHeaders {
                accept: Some(V2.as_bytes()),
                if_none_match: None,
                accept_encoding: encoding.map(str::as_bytes),
            };
            let (DiscoveryAnswer::Respond(r), _) = m.answer("GET", "/apis", h) else {
                panic!("not answered")
            };
            assert_eq!(r.gzip, want_gzip, "{encoding:?}");
            if want_gzip {
                assert!(
                    r.body.len() < big.len() / 5,
                    "compressed to {}",
                    r.body.len()
                );
                assert_eq!(gzip::decompress(r.body).unwrap(), big.as_bytes());
            } else {
                assert_eq!(r.body, big.as_bytes());
            }
        }
        // Small documents are never compressed.
        let h = DiscoveryHeaders {
            accept: Some(V2.as_bytes()),
            if_none_match: None,
            accept_encoding: Some(b"gzip"),
        };
        let (DiscoveryAnswer::Respond(r), _) = m.answer("GET", "/api", h) else {
            panic!("not answered")
        };
        assert!(!r.gzip);
    }
}
