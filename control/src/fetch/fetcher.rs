//! One apiserver's discovery over HTTP: `/apis` and `/api`, aggregated when the server can,
//! legacy otherwise, with a timeout and a size limit on every request.

use skewgate_core::group_version::GroupVersion;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{StreamExt, TryStreamExt};
use http::{header, Request, StatusCode};
use serde::Deserialize;

use crate::discovery::documents::DiscoveryDocuments;
use crate::discovery::{
    parse_aggregated, parse_group_list, parse_resource_list, parse_versions, APIGroupDiscoveryList,
    APIResourceList, ServedApis, DEFAULT_MAX_DISCOVERY_BYTES,
};

use super::body::{error_chain, read_body, Budget, LimitedBuffer, ReadError};
use super::client::ClientTemplate;
use super::content_type::{classify_content_type, DocumentFormat, DISCOVERY_ACCEPT, LEGACY_ACCEPT};
use super::error::{FetchError, SetupError};
use crate::discovery::legacy::{self, VersionOutcome};
use crate::discovery::openapi::OpenApiRoot;

/// The OpenAPI v3 root (docs/ARCHITECTURE.md "OpenAPI v3").
const OPENAPI_ROOT: &str = skewgate_core::openapi::ROOT_PATH;

/// Limits of one fetcher.
#[derive(Debug, Clone)]
pub struct FetchConfig {
    /// Per request: connect, headers and the whole body.
    pub timeout: Duration,
    /// Per document.
    pub max_bytes: usize,
    /// All documents of one legacy `/apis` together (one per group-version).
    pub max_legacy_total_bytes: usize,
    /// Legacy group-version requests in flight at once.
    pub legacy_concurrency: usize,
}

impl Default for FetchConfig {
    fn default() -> Self {
        FetchConfig {
            timeout: Duration::from_secs(10),
            max_bytes: DEFAULT_MAX_DISCOVERY_BYTES,
            max_legacy_total_bytes: 2 * DEFAULT_MAX_DISCOVERY_BYTES,
            legacy_concurrency: 4,
        }
    }
}

/// The ETags of the last good `/apis` and `/api` (as the server sent them, quotes included).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Etags {
    pub apis: Option<String>,
    pub api: Option<String>,
}

/// A document as fetched.
#[derive(Debug, Clone, PartialEq)]
pub struct Document {
    pub list: APIGroupDiscoveryList,
    /// Kept for the next conditional request. Never set for documents assembled from legacy
    /// discovery (their group list's ETag does not cover the resources).
    pub etag: Option<String>,
    pub format: DocumentFormat,
    /// Legacy group-versions that answered with an HTTP error (kept as `Stale`).
    pub stale: Vec<String>,
}

/// The answer for one document.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// 304 to our `If-None-Match`: the last document stands (nothing was parsed).
    NotModified,
    Fresh(Document),
}

impl Answer {
    fn etag<'a>(&'a self, previous: Option<&'a String>) -> Option<String> {
        match self {
            Answer::NotModified => previous.cloned(),
            Answer::Fresh(d) => d.etag.clone(),
        }
    }

    fn into_list(self, last: Option<&APIGroupDiscoveryList>) -> Option<APIGroupDiscoveryList> {
        match self {
            Answer::NotModified => last.cloned(),
            Answer::Fresh(d) => Some(d.list),
        }
    }

    fn stale(&self) -> &[String] {
        match self {
            Answer::NotModified => &[],
            Answer::Fresh(d) => &d.stale,
        }
    }
}

/// The result of a successful fetch.
#[derive(Debug, Clone, PartialEq)]
pub struct Fetched {
    pub apis: Answer,
    pub api: Answer,
    /// `/openapi/v3`; `None` when it could not be fetched or used (the last one is kept).
    pub openapi: Option<OpenApiRoot>,
}

impl Fetched {
    /// Both documents 304.
    pub fn not_modified(&self) -> bool {
        matches!(
            (&self.apis, &self.api),
            (Answer::NotModified, Answer::NotModified)
        )
    }

    /// The ETags to send next time (a 304 keeps the previous one).
    pub fn etags(&self, previous: Option<&Etags>) -> Etags {
        Etags {
            apis: self.apis.etag(previous.and_then(|p| p.apis.as_ref())),
            api: self.api.etag(previous.and_then(|p| p.api.as_ref())),
        }
    }

    /// The documents, a 304 taking the one of `last`. `None` only for a 304 without `last`
    /// (which does not happen when ETags and documents are kept together).
    pub fn into_documents(self, last: Option<&DiscoveryDocuments>) -> Option<DiscoveryDocuments> {
        let openapi = self
            .openapi
            .or_else(|| last.and_then(|l| l.openapi.clone()));
        Some(DiscoveryDocuments {
            apis: self.apis.into_list(last.map(|l| &l.apis))?,
            api: self.api.into_list(last.map(|l| &l.api))?,
            openapi,
        })
    }

    /// Paths of legacy group-versions kept as `Stale`.
    pub fn stale(&self) -> Vec<String> {
        let mut out = self.apis.stale().to_vec();
        out.extend_from_slice(self.api.stale());
        out
    }
}

/// A raw answer: 200 with its body, or 304.
struct Raw {
    status: StatusCode,
    content_type: Option<String>,
    etag: Option<String>,
    body: Vec<u8>,
}

/// Fetches one apiserver's discovery. Cheap to share (`Arc` it); the client pools connections.
#[derive(Clone)]
pub struct DiscoveryFetcher {
    inner: Arc<Inner>,
}

struct Inner {
    id: String,
    url: String,
    client: std::sync::Mutex<CurrentClient>,
    config: FetchConfig,
}

/// The client in use, and the template it was built from (to rebuild it when the peer CA
/// file changes; `None` for a client given ready-made).
struct CurrentClient {
    client: kube::Client,
    template: Option<ClientTemplate>,
    /// The last reload error, logged once rather than on every fetch.
    reload_error: Option<String>,
}

impl std::fmt::Debug for DiscoveryFetcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiscoveryFetcher")
            .field("id", &self.inner.id)
            .field("url", &self.inner.url)
            .field("config", &self.inner.config)
            .finish()
    }
}

impl DiscoveryFetcher {
    /// A fetcher for apiserver `id` at `url` (`https://host:port`, or `http://` in tests).
    /// Needs a Tokio runtime.
    pub fn new(
        id: impl Into<String>,
        url: &str,
        template: &ClientTemplate,
        config: FetchConfig,
    ) -> Result<Self, SetupError> {
        let client = template.client_for(url, config.timeout)?;
        let fetcher = Self::with_client(id, url, client, config);
        fetcher.current().template = Some(template.clone());
        Ok(fetcher)
    }

    /// A fetcher over a ready client (its `cluster_url` must be `url`).
    pub fn with_client(
        id: impl Into<String>,
        url: &str,
        client: kube::Client,
        config: FetchConfig,
    ) -> Self {
        DiscoveryFetcher {
            inner: Arc::new(Inner {
                id: id.into(),
                url: url.trim_end_matches('/').to_string(),
                client: std::sync::Mutex::new(CurrentClient {
                    client,
                    template: None,
                    reload_error: None,
                }),
                config,
            }),
        }
    }

    pub fn id(&self) -> &str {
        &self.inner.id
    }

    pub fn url(&self) -> &str {
        &self.inner.url
    }

    pub fn config(&self) -> &FetchConfig {
        &self.inner.config
    }

    fn current(&self) -> std::sync::MutexGuard<'_, CurrentClient> {
        // Nothing panics while holding the lock; a poisoned one still holds a usable client.
        self.inner
            .client
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn client(&self) -> kube::Client {
        self.current().client.clone()
    }

    /// A renewed peer CA (its file changed) takes effect here: a new client with it (connections
    /// of the old one close as it is dropped). A file that cannot be used keeps the client.
    fn follow_peer_ca(&self) {
        let Some(template) = self.current().template.clone() else {
            return;
        };
        let rebuilt = template.reload_peer_ca().and_then(|renewed| {
            renewed
                .map(|t| {
                    Ok::<_, SetupError>((
                        t.client_for(&self.inner.url, self.inner.config.timeout)?,
                        t,
                    ))
                })
                .transpose()
        });
        let mut current = self.current();
        match rebuilt {
            Ok(None) => current.reload_error = None,
            Ok(Some((client, template))) => {
                tracing::info!(apiserver = %self.inner.id, "the peer CA file changed: verifying with the new one");
                *current = CurrentClient {
                    client,
                    template: Some(template),
                    reload_error: None,
                };
            }
            Err(e) => {
                let message = e.to_string();
                if current.reload_error.as_ref() != Some(&message) {
                    tracing::warn!(apiserver = %self.inner.id, error = %message, "the peer CA file cannot be used; keeping the previous one");
                    current.reload_error = Some(message);
                }
            }
        }
    }

    /// Fetch `/apis` and `/api` (concurrently). With `conditional`, each carries
    /// `If-None-Match` with its last ETag and may come back [`Answer::NotModified`]. Either both
    /// documents are good or the fetch fails: a caller never mixes a new `/apis` with nothing.
    /// A renewed peer CA file is picked up first.
    pub async fn fetch(&self, conditional: Option<&Etags>) -> Result<Fetched, FetchError> {
        self.follow_peer_ca();
        let (discovery, openapi) = tokio::join!(
            async {
                tokio::try_join!(
                    self.fetch_root("/apis", conditional.and_then(|e| e.apis.as_deref())),
                    self.fetch_root("/api", conditional.and_then(|e| e.api.as_deref())),
                )
            },
            self.fetch_openapi(),
        );
        let (apis, api) = discovery?;
        Ok(Fetched { apis, api, openapi })
    }

    /// `/openapi/v3`, with discovery's timeout and size limit. Optional: an apiserver that
    /// does not answer it (or answers garbage) keeps its discovery, and its group-versions
    /// only the local apiserver's OpenAPI (docs/ARCHITECTURE.md "OpenAPI v3").
    async fn fetch_openapi(&self) -> Option<OpenApiRoot> {
        let url = self.full_url(OPENAPI_ROOT);
        // Its own, smaller cap: kube's root is a few hundred bytes per group-version.
        let budget = Budget::new(crate::discovery::openapi::MAX_ROOT_BYTES);
        let raw = match self
            .get(OPENAPI_ROOT, "application/json", None, Some(&budget))
            .await
        {
            Ok(raw) => raw,
            Err(e) => {
                tracing::debug!(apiserver = %self.inner.id, error = %e, "no /openapi/v3");
                return None;
            }
        };
        match OpenApiRoot::parse(&raw.body, crate::discovery::openapi::MAX_ROOT_BYTES) {
            Ok((root, refused)) => {
                if !refused.is_empty() {
                    tracing::warn!(apiserver = %self.inner.id, %url, ?refused, "/openapi/v3 entries left out");
                }
                Some(root)
            }
            Err(e) => {
                tracing::warn!(apiserver = %self.inner.id, %url, error = %e, "/openapi/v3 unusable");
                None
            }
        }
    }

    /// Fetch both documents unconditionally.
    pub async fn fetch_documents(&self) -> Result<DiscoveryDocuments, FetchError> {
        let fetched = self.fetch(None).await?;
        Ok(fetched
            .into_documents(None)
            .expect("an unconditional fetch has no 304"))
    }

    async fn fetch_root(&self, path: &str, etag: Option<&str>) -> Result<Answer, FetchError> {
        let url = self.full_url(path);
        let raw = self.get(path, DISCOVERY_ACCEPT, etag, None).await?;
        if raw.status == StatusCode::NOT_MODIFIED {
            return Ok(Answer::NotModified);
        }
        let format = classify_content_type(raw.content_type.as_deref())
            .map_err(|e| FetchError::garbage(&url, e))?;
        let max = self.inner.config.max_bytes;
        let core = path == "/api";
        let (list, etag, stale) = if format.is_aggregated() {
            let list =
                parse_aggregated(&raw.body, max).map_err(|e| FetchError::garbage(&url, e))?;
            (list, raw.etag, Vec::new())
        } else if core {
            let versions =
                parse_versions(&raw.body, max).map_err(|e| FetchError::garbage(&url, e))?;
            drop(raw);
            (self.legacy_core(&url, &versions).await?, None, Vec::new())
        } else {
            let groups =
                parse_group_list(&raw.body, max).map_err(|e| FetchError::garbage(&url, e))?;
            drop(raw);
            let list = self.legacy_groups(&url, &groups).await?;
            let stale = legacy::stale_paths(&list);
            (list, None, stale)
        };
        check_document(&url, &list, core)?;
        Ok(Answer::Fresh(Document {
            list,
            etag,
            format,
            stale,
        }))
    }

    async fn legacy_core(
        &self,
        url: &str,
        versions: &crate::discovery::APIVersions,
    ) -> Result<APIGroupDiscoveryList, FetchError> {
        let plan = legacy::plan_core_versions(versions).map_err(|e| FetchError::invalid(url, e))?;
        let budget = Budget::new(self.inner.config.max_legacy_total_bytes);
        let mut lists = Vec::new();
        for v in plan {
            let path = GroupVersion::new("", v.as_str()).api_path();
            // Core must answer: any error fails the fetch.
            let list = self.resource_list(&path, "", &v, &budget).await?;
            lists.push((v, list));
        }
        Ok(legacy::assemble_core(&lists))
    }

    async fn legacy_groups(
        &self,
        url: &str,
        groups: &crate::discovery::APIGroupList,
    ) -> Result<APIGroupDiscoveryList, FetchError> {
        let plan = legacy::plan_group_list(groups).map_err(|e| FetchError::invalid(url, e))?;
        let budget = Budget::new(self.inner.config.max_legacy_total_bytes);
        let budget = &budget;
        let requests: Vec<(usize, String, String)> = plan
            .iter()
            .enumerate()
            .flat_map(|(i, (g, vs))| vs.iter().map(move |v| (i, g.clone(), v.clone())))
            .collect();
        let outcomes: Vec<(usize, String, VersionOutcome)> = futures_util::stream::iter(requests)
            .map(|(i, g, v)| async move {
                let path = GroupVersion::new(g.as_str(), v.as_str()).api_path();
                let outcome = match self.resource_list(&path, &g, &v, budget).await {
                    Ok(list) => VersionOutcome::Served(list),
                    Err(FetchError::Status { status: 404, .. }) => VersionOutcome::Gone,
                    Err(e @ FetchError::Status { .. }) => {
                        tracing::debug!(apiserver = %self.inner.id, error = %e, "legacy group-version unavailable; kept as Stale");
                        VersionOutcome::Unavailable
                    }
                    Err(e) => return Err(e),
                };
                Ok::<_, FetchError>((i, v, outcome))
            })
            .buffered(self.inner.config.legacy_concurrency.max(1))
            .try_collect()
            .await?;
        let mut assembled: Vec<(String, Vec<(String, VersionOutcome)>)> =
            plan.iter().map(|(g, _)| (g.clone(), Vec::new())).collect();
        for (i, v, outcome) in outcomes {
            assembled[i].1.push((v, outcome));
        }
        Ok(legacy::assemble_apis(&assembled))
    }

    /// A legacy `APIResourceList` (an HTTP error status is a `FetchError::Status`, which the
    /// caller may tolerate).
    async fn resource_list(
        &self,
        path: &str,
        group: &str,
        version: &str,
        budget: &Budget,
    ) -> Result<APIResourceList, FetchError> {
        let url = self.full_url(path);
        let raw = self.get(path, LEGACY_ACCEPT, None, Some(budget)).await?;
        let format = classify_content_type(raw.content_type.as_deref())
            .map_err(|e| FetchError::garbage(&url, e))?;
        if format != DocumentFormat::Legacy {
            return Err(FetchError::invalid(
                &url,
                format!("{} answer to a legacy request", format.label()),
            ));
        }
        let list = parse_resource_list(&raw.body, self.inner.config.max_bytes)
            .map_err(|e| FetchError::garbage(&url, e))?;
        legacy::check_resource_list(&list, group, version)
            .map_err(|e| FetchError::invalid(&url, e))?;
        Ok(list)
    }

    fn full_url(&self, path: &str) -> String {
        format!("{}{path}", self.inner.url)
    }

    /// One GET with the timeout and the size limit. 200 and (for a conditional request) 304
    /// come back; any other status is an error.
    async fn get(
        &self,
        path: &str,
        accept: &str,
        if_none_match: Option<&str>,
        budget: Option<&Budget>,
    ) -> Result<Raw, FetchError> {
        let url = self.full_url(path);
        let timeout = self.inner.config.timeout;
        match tokio::time::timeout(
            timeout,
            self.get_inner(&url, path, accept, if_none_match, budget),
        )
        .await
        {
            Ok(result) => result,
            Err(_) => Err(FetchError::Timeout {
                url,
                after: timeout,
            }),
        }
    }

    async fn get_inner(
        &self,
        url: &str,
        path: &str,
        accept: &str,
        if_none_match: Option<&str>,
        budget: Option<&Budget>,
    ) -> Result<Raw, FetchError> {
        let mut request = Request::get(path).header(header::ACCEPT, accept);
        if let Some(etag) = if_none_match {
            request = request.header(header::IF_NONE_MATCH, etag);
        }
        let request = request
            .body(kube::client::Body::empty())
            .map_err(|e| FetchError::invalid(url, format!("building the request: {e}")))?;
        let response = self
            .client()
            .send(request)
            .await
            .map_err(|e| send_error(url, self.inner.config.timeout, &e))?;
        let (parts, body) = response.into_parts();
        let header_str = |name: header::HeaderName| {
            parts
                .headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let status = parts.status;
        let etag = header_str(header::ETAG);
        if status == StatusCode::NOT_MODIFIED && if_none_match.is_some() {
            return Ok(Raw {
                status,
                content_type: None,
                etag,
                body: Vec::new(),
            });
        }
        if status != StatusCode::OK {
            // A little of the body, for a `metav1.Status` message.
            let message = match LimitedBuffer::new(64 * 1024, None, None) {
                Ok(buf) => read_body(body, buf)
                    .await
                    .ok()
                    .and_then(|b| status_message(&b)),
                Err(_) => None,
            };
            return Err(FetchError::Status {
                url: url.to_string(),
                status: status.as_u16(),
                message,
            });
        }
        let declared =
            header_str(header::CONTENT_LENGTH).and_then(|v| v.trim().parse::<u64>().ok());
        let max = self.inner.config.max_bytes;
        let too_large = |limit, total| FetchError::TooLarge {
            url: url.to_string(),
            limit,
            total,
        };
        let buf =
            LimitedBuffer::new(max, declared, budget).map_err(|o| too_large(o.limit, o.total))?;
        let body = read_body(body, buf).await.map_err(|e| match e {
            ReadError::OverLimit(o) => too_large(o.limit, o.total),
            ReadError::Transport(message) => FetchError::Connect {
                url: url.to_string(),
                message: format!("reading the body: {message}"),
            },
        })?;
        Ok(Raw {
            status,
            content_type: header_str(header::CONTENT_TYPE),
            etag,
            body,
        })
    }
}

/// A transport error of kube's client: a timeout if any cause says so, else a connect error.
fn send_error(url: &str, timeout: Duration, error: &kube::Error) -> FetchError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = source {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::TimedOut {
                return FetchError::Timeout {
                    url: url.to_string(),
                    after: timeout,
                };
            }
        }
        source = e.source();
    }
    FetchError::Connect {
        url: url.to_string(),
        message: error_chain(error),
    }
}

/// The `message` of a `metav1.Status` body.
fn status_message(body: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct Status {
        kind: Option<String>,
        message: Option<String>,
    }
    let s: Status = serde_json::from_slice(body).ok()?;
    if s.kind.as_deref() != Some("Status") {
        return None;
    }
    s.message.map(|m| m.chars().take(300).collect())
}

/// A document we would merge must also pass the model's validation (names routing and the
/// filter use), and hold the right groups: `/api` only the core group, `/apis` only named ones.
fn check_document(url: &str, list: &APIGroupDiscoveryList, core: bool) -> Result<(), FetchError> {
    ServedApis::from_aggregated(list).map_err(|e| FetchError::garbage(url, e))?;
    if let Some(g) = list
        .items
        .iter()
        .find(|g| g.metadata.name.is_empty() != core)
    {
        return Err(FetchError::invalid(
            url,
            if core {
                format!("/api lists the named group {:?}", g.metadata.name)
            } else {
                "/apis lists the core group".to_string()
            },
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(list: APIGroupDiscoveryList, etag: &str) -> Answer {
        Answer::Fresh(Document {
            list,
            etag: Some(etag.to_string()),
            format: DocumentFormat::AggregatedV2,
            stale: vec![],
        })
    }

    #[test]
    fn answers_combine_with_the_last_view() {
        let mut apis = crate::discovery::documents::empty_list();
        apis.items.push(Default::default());
        apis.items[0].metadata.name = "apps".into();
        let last = DiscoveryDocuments {
            apis: apis.clone(),
            api: crate::discovery::documents::empty_list(),
            openapi: None,
        };
        let previous = Etags {
            apis: Some("\"a1\"".into()),
            api: Some("\"c1\"".into()),
        };
        let both = Fetched {
            apis: Answer::NotModified,
            api: Answer::NotModified,
            openapi: None,
        };
        assert!(both.not_modified());
        assert_eq!(both.etags(Some(&previous)), previous);
        assert_eq!(both.clone().into_documents(Some(&last)), Some(last.clone()));
        assert_eq!(both.into_documents(None), None);

        let mixed = Fetched {
            apis: Answer::NotModified,
            api: doc(crate::discovery::documents::empty_list(), "\"c2\""),
            openapi: None,
        };
        assert!(!mixed.not_modified());
        assert_eq!(
            mixed.etags(Some(&previous)),
            Etags {
                apis: Some("\"a1\"".into()),
                api: Some("\"c2\"".into())
            }
        );
        assert_eq!(mixed.into_documents(Some(&last)).unwrap().apis, apis);
    }

    #[test]
    fn documents_must_hold_the_right_groups() {
        let mut list = crate::discovery::documents::empty_list();
        assert!(check_document("u", &list, true).is_ok());
        list.items.push(Default::default());
        assert!(check_document("u", &list, true).is_ok(), "core in /api");
        assert!(check_document("u", &list, false).is_err(), "core in /apis");
        list.items[0].metadata.name = "apps".into();
        assert!(check_document("u", &list, true).is_err());
        assert!(check_document("u", &list, false).is_ok());
    }

    /// The kubeconfig's credentials go to every apiserver, through kube's auth layer.
    #[tokio::test]
    async fn credentials_and_accept_are_sent() {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let server = std::thread::spawn(move || {
            let mut heads = Vec::new();
            // `/apis`, `/api` and `/openapi/v3`.
            for _ in 0..3 {
                let (mut socket, _) = listener.accept().unwrap();
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    let n = socket.read(&mut buf).unwrap();
                    assert!(n > 0);
                    head.extend_from_slice(&buf[..n]);
                }
                let body = br#"{"kind":"Status","message":"nope"}"#;
                let _ = write!(
                    socket,
                    "HTTP/1.1 403 Forbidden\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = socket.write_all(body);
                heads.push(String::from_utf8_lossy(&head).to_lowercase());
            }
            heads
        });
        let mut base = kube::Config::new(http::Uri::from_static("https://elsewhere:6443"));
        base.auth_info.token = Some("secret-token".to_string().into());
        let template = ClientTemplate::new(base);
        let f = DiscoveryFetcher::new("a", &url, &template, FetchConfig::default()).unwrap();
        match f.fetch(None).await {
            Err(FetchError::Status {
                status: 403,
                message: Some(m),
                ..
            }) => assert_eq!(m, "nope"),
            other => panic!("{other:?}"),
        }
        let heads = tokio::task::spawn_blocking(move || server.join().unwrap())
            .await
            .unwrap();
        let mut openapi = 0;
        for head in heads {
            assert!(
                head.contains("authorization: bearer secret-token"),
                "{head}"
            );
            let accept = if head.starts_with("get /openapi/v3 ") {
                openapi += 1;
                "application/json".to_string()
            } else {
                DISCOVERY_ACCEPT.to_lowercase()
            };
            assert!(head.contains(&format!("accept: {accept}")), "{head}");
            assert!(!head.contains("if-none-match"), "{head}");
        }
        assert_eq!(openapi, 1);
    }

    #[test]
    fn status_messages() {
        assert_eq!(
            status_message(br#"{"kind":"Status","message":"forbidden: no"}"#).as_deref(),
            Some("forbidden: no")
        );
        assert_eq!(status_message(b"<html>"), None);
        assert_eq!(status_message(br#"{"kind":"APIGroupList"}"#), None);
    }
}
