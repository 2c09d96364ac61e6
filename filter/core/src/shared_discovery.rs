//! One copy of the merged discovery documents per Envoy process, in proxy-wasm shared data
//! (docs/ARCHITECTURE.md, "Merged discovery", "One copy per Envoy").
//!
//! Envoy runs one VM per worker, plus one on the main thread and a short-lived canary per push,
//! and every VM used to keep its own copy of the documents (wasm memory never shrinks). Shared
//! data is process-wide (per `vm_id`), so the documents go there once, under their content
//! version ([`DiscoveryConfig::version`](crate::config::DiscoveryConfig::version)):
//!
//! - the first VM to load a configuration whose version has no [`Manifest`] yet *publishes* it:
//!   every body under `skewgate.discovery/<version>/<document>`, then the version in the index
//!   (compare-and-swap), then the manifest (what every VM needs to negotiate: ETags, lengths,
//!   legacy paths, retained paths), last, so a manifest means a complete set;
//! - every other VM reads only the manifest, and reads the configuration's routing part
//!   without the documents ([`FilterConfig::routing_from_reader`](crate::config::FilterConfig::routing_from_reader));
//! - a request answered from them copies its one document into the VM for as long as the
//!   answer takes ([`body`]). A gzipped form is made by the first VM that needs it and
//!   shared too.
//!
//! **Consistency.** Keys carry the content version of the configuration the VM's routing table
//! came from, so a VM can only ever read the documents of its own configuration. Proxy-wasm
//! cannot delete a key; the index keeps the newest [`KEEP_VERSIONS`] versions and older ones
//! are *evicted* by writing empty values, which read as absent. A VM still holding an evicted
//! version (it would take that many newer configurations while it lags) finds nothing and
//! answers a retryable 503, never another version's document.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::discovery::{unavailable_paths, AggregatedDocument, Body, Encoded, MergedDiscovery};
use crate::gzip;

/// A value and its compare-and-swap token.
pub type Versioned = (Vec<u8>, Option<u32>);

/// Process-wide key-value store (proxy-wasm shared data), behind a trait so the logic here is
/// tested natively.
pub trait SharedData {
    /// The value and its compare-and-swap token. `None` when absent; an empty value (an
    /// evicted one) reads as absent too.
    fn get(&self, key: &str) -> Result<Option<Versioned>, StoreError>;
    /// Writes `value`; with `cas`, only if nobody wrote the key since that token was read.
    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError>;
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreError {
    /// Another VM wrote the key since we read it.
    CasMismatch,
    /// The host refused the call (its status, for the log).
    Host(String),
    /// A manifest that does not parse (only a filter of another build could write one).
    Manifest(String),
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::CasMismatch => write!(f, "shared data changed concurrently"),
            StoreError::Host(status) => write!(f, "shared data call failed: {status}"),
            StoreError::Manifest(e) => write!(f, "shared discovery manifest unreadable: {e}"),
        }
    }
}

impl std::error::Error for StoreError {}

const PREFIX: &str = "skewgate.discovery/";
/// The published versions, newest last, one per line.
const INDEX_KEY: &str = "skewgate.discovery/versions";
/// Versions kept in shared data: the newest and the ones before it, for VMs that have not
/// switched to the newest configuration yet (Envoy switches every worker within milliseconds;
/// the control plane sends the next one only after Envoy acknowledged this one).
pub const KEEP_VERSIONS: usize = 4;
/// Compare-and-swap attempts on the index before giving up (each loses only to another VM
/// publishing at the same moment).
const CAS_ATTEMPTS: usize = 32;

fn manifest_key(version: &str) -> String {
    format!("{PREFIX}{version}/manifest")
}

fn body_key(version: &str, document: &str) -> String {
    format!("{PREFIX}{version}/{document}")
}

fn gzip_key(key: &str) -> String {
    format!("{key}.gz")
}

/// What a VM needs of a published version to negotiate without the bodies.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub version: String,
    pub apis: AggregatedMeta,
    pub api: AggregatedMeta,
    /// Legacy document paths and their lengths.
    pub legacy: BTreeMap<String, usize>,
    pub unavailable: BTreeSet<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AggregatedMeta {
    /// Quoted, as served.
    pub etag: String,
    pub len: usize,
    /// The v2beta1 form: its quoted ETag and length, if the document has one.
    pub v2beta1: Option<(String, usize)>,
}

/// The documents of a compiled (inline) discovery, by their name under the version.
fn documents(merged: &MergedDiscovery) -> Vec<(String, &Encoded)> {
    let mut out = Vec::new();
    for (name, doc) in [("apis", &merged.apis), ("api", &merged.api)] {
        out.push((format!("{name}/v2"), &doc.v2));
        if let Some(v2beta1) = &doc.v2beta1 {
            out.push((format!("{name}/v2beta1"), v2beta1));
        }
    }
    let mut legacy: Vec<(&String, &usize)> = merged.legacy.iter().collect();
    legacy.sort();
    for (path, index) in legacy {
        if let Some(doc) = merged.legacy_documents.get(*index) {
            out.push((format!("legacy{path}"), doc));
        }
    }
    out
}

fn aggregated_meta(doc: &AggregatedDocument) -> AggregatedMeta {
    AggregatedMeta {
        etag: doc.v2.etag.clone(),
        len: doc.v2.len(),
        v2beta1: doc.v2beta1.as_ref().map(|d| (d.etag.clone(), d.len())),
    }
}

fn manifest(version: &str, merged: &MergedDiscovery) -> Manifest {
    Manifest {
        version: version.to_string(),
        apis: aggregated_meta(&merged.apis),
        api: aggregated_meta(&merged.api),
        legacy: merged
            .legacy
            .iter()
            .filter_map(|(path, index)| {
                Some((path.clone(), merged.legacy_documents.get(*index)?.len()))
            })
            .collect(),
        unavailable: merged.unavailable.keys().cloned().collect(),
    }
}

/// The request-time form of a published version: the manifest, the bodies by key.
fn from_manifest(m: &Manifest) -> MergedDiscovery {
    let aggregated = |name: &str, meta: &AggregatedMeta| AggregatedDocument {
        v2: Encoded::stored(
            body_key(&m.version, &format!("{name}/v2")),
            meta.len,
            meta.etag.clone(),
        ),
        v2beta1: meta.v2beta1.as_ref().map(|(etag, len)| {
            Encoded::stored(
                body_key(&m.version, &format!("{name}/v2beta1")),
                *len,
                etag.clone(),
            )
        }),
    };
    let mut legacy = std::collections::HashMap::with_capacity(m.legacy.len());
    let mut legacy_documents = Vec::with_capacity(m.legacy.len());
    for (path, len) in &m.legacy {
        legacy.insert(path.clone(), legacy_documents.len());
        legacy_documents.push(Encoded::stored(
            body_key(&m.version, &format!("legacy{path}")),
            *len,
            String::new(),
        ));
    }
    MergedDiscovery {
        apis: aggregated("apis", &m.apis),
        api: aggregated("api", &m.api),
        legacy,
        legacy_documents,
        unavailable: unavailable_paths(&m.unavailable),
    }
}

fn read(store: &(impl SharedData + ?Sized), key: &str) -> Result<Option<Vec<u8>>, StoreError> {
    Ok(store
        .get(key)?
        .map(|(value, _)| value)
        .filter(|value| !value.is_empty()))
}

/// The published documents of `version`, if a VM published them (and they were not evicted).
pub fn load(
    store: &(impl SharedData + ?Sized),
    version: &str,
) -> Result<Option<MergedDiscovery>, StoreError> {
    let Some(bytes) = read(store, &manifest_key(version))? else {
        return Ok(None);
    };
    let m: Manifest =
        serde_json::from_slice(&bytes).map_err(|e| StoreError::Manifest(e.to_string()))?;
    if m.version != version {
        return Err(StoreError::Manifest(format!(
            "manifest of {version} names version {}",
            m.version
        )));
    }
    Ok(Some(from_manifest(&m)))
}

/// Publish the documents of `merged` (compiled from the configuration of `version`) and
/// return their stored form. Evicts versions older than the newest [`KEEP_VERSIONS`].
pub fn publish(
    store: &(impl SharedData + ?Sized),
    version: &str,
    merged: &MergedDiscovery,
) -> Result<MergedDiscovery, StoreError> {
    for (name, doc) in documents(merged) {
        if let Body::Inline(body) = &doc.body {
            store.set(&body_key(version, &name), body.as_bytes(), None)?;
        }
    }
    let evicted = add_to_index(store, version)?;
    let m = manifest(version, merged);
    let json = serde_json::to_vec(&m).map_err(|e| StoreError::Manifest(e.to_string()))?;
    store.set(&manifest_key(version), &json, None)?;
    for old in evicted {
        evict(store, &old)?;
    }
    Ok(from_manifest(&m))
}

/// Adds `version` as the newest (moving it there if listed); the versions that fall out.
fn add_to_index(
    store: &(impl SharedData + ?Sized),
    version: &str,
) -> Result<Vec<String>, StoreError> {
    for _ in 0..CAS_ATTEMPTS {
        let (current, cas) = match store.get(INDEX_KEY)? {
            Some((bytes, cas)) => (String::from_utf8_lossy(&bytes).into_owned(), cas),
            None => (String::new(), None),
        };
        let mut versions: Vec<&str> = current
            .lines()
            .filter(|v| !v.is_empty() && *v != version)
            .collect();
        versions.push(version);
        let cut = versions.len().saturating_sub(KEEP_VERSIONS);
        let evicted: Vec<String> = versions.drain(..cut).map(str::to_string).collect();
        match store.set(INDEX_KEY, versions.join("\n").as_bytes(), cas) {
            Ok(()) => return Ok(evicted),
            Err(StoreError::CasMismatch) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(StoreError::CasMismatch)
}

/// Empties every key of `version` (proxy-wasm has no delete; an empty value reads as absent
/// and holds no memory). The manifest first: from then on no VM loads the version. Each
/// document's plain key is emptied before its gzipped copy: [`body`] relies on that order.
fn evict(store: &(impl SharedData + ?Sized), version: &str) -> Result<(), StoreError> {
    let Some(bytes) = read(store, &manifest_key(version))? else {
        return Ok(());
    };
    store.set(&manifest_key(version), &[], None)?;
    let Ok(m) = serde_json::from_slice::<Manifest>(&bytes) else {
        return Ok(());
    };
    let stored = from_manifest(&m);
    for (_, doc) in documents(&stored) {
        if let Body::Stored { key, .. } = &doc.body {
            store.set(key, &[], None)?;
            store.set(&gzip_key(key), &[], None)?;
        }
    }
    Ok(())
}

/// The bytes of a stored document ([`Response::stored`](crate::discovery::Response::stored)),
/// gzipped when `gzip`: made from the plain form by the first VM that needs it, then shared.
/// `None` when the version was evicted.
///
/// A VM may compress while another VM evicts the version (it publishes newer ones meanwhile):
/// a gzipped copy written after the eviction would never be emptied, its version never read
/// again (a leak of up to the 12 MiB discovery cap per lost race). So after writing it, the VM
/// reads the version's manifest (small, unlike the document): [`evict`] empties it before any
/// document, so if it is gone now, the eviction may have passed the gzipped key already, and
/// the VM empties its own copy. The request is still answered with it: it is its own
/// version's document.
pub fn body(
    store: &(impl SharedData + ?Sized),
    key: &str,
    gzip: bool,
) -> Result<Option<Vec<u8>>, StoreError> {
    if !gzip {
        return read(store, key);
    }
    let gz_key = gzip_key(key);
    if let Some(gz) = read(store, &gz_key)? {
        return Ok(Some(gz));
    }
    let Some(plain) = read(store, key)? else {
        return Ok(None);
    };
    let gz = gzip::compress(&plain);
    drop(plain);
    // A key of another form has no manifest to check: the copy is not shared.
    let Some(manifest) = manifest_key_of(key) else {
        return Ok(Some(gz));
    };
    store.set(&gz_key, &gz, None)?;
    if read(store, &manifest)?.is_none() {
        store.set(&gz_key, &[], None)?;
    }
    Ok(Some(gz))
}

/// The manifest key of the version a document key ([`body_key`]) is under.
fn manifest_key_of(key: &str) -> Option<String> {
    let (version, _) = key.strip_prefix(PREFIX)?.split_once('/')?;
    Some(manifest_key(version))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{DiscoveryConfig, JsonDocument};
    use crate::discovery::{DiscoveryAnswer, DiscoveryHeaders, PassReason};
    use std::cell::{Cell, RefCell};
    use std::collections::HashMap;

    /// Shared data as Envoy keeps it: a CAS token per key that changes on every write.
    #[derive(Default)]
    struct Memory {
        values: RefCell<HashMap<String, (Vec<u8>, u32)>>,
        next_cas: Cell<u32>,
        /// Writes to the index to refuse with CasMismatch (another VM won the race).
        lose_index_races: Cell<usize>,
        /// Run once, just before the next gzipped copy is written: what other VMs do while
        /// this one compresses.
        before_gzip_write: RefCell<Option<Meanwhile>>,
    }

    type Meanwhile = Box<dyn FnOnce(&Memory)>;

    impl SharedData for Memory {
        fn get(&self, key: &str) -> Result<Option<Versioned>, StoreError> {
            Ok(self
                .values
                .borrow()
                .get(key)
                .map(|(v, cas)| (v.clone(), Some(*cas))))
        }

        fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError> {
            if key.ends_with(".gz") && !value.is_empty() {
                let meanwhile = self.before_gzip_write.borrow_mut().take();
                if let Some(meanwhile) = meanwhile {
                    meanwhile(self);
                }
            }
            let mut values = self.values.borrow_mut();
            if key == INDEX_KEY && self.lose_index_races.get() > 0 {
                self.lose_index_races.set(self.lose_index_races.get() - 1);
                return Err(StoreError::CasMismatch);
            }
            if let (Some(cas), Some((_, current))) = (cas, values.get(key)) {
                if cas != *current {
                    return Err(StoreError::CasMismatch);
                }
            }
            self.next_cas.set(self.next_cas.get() + 1);
            values.insert(key.to_string(), (value.to_vec(), self.next_cas.get()));
            Ok(())
        }
    }

    impl Memory {
        /// Bytes held, empty (evicted) values aside.
        fn held(&self) -> usize {
            self.values.borrow().values().map(|(v, _)| v.len()).sum()
        }

        /// Bytes held under the keys of `version`.
        fn held_by(&self, version: &str) -> usize {
            let prefix = format!("{PREFIX}{version}/");
            self.values
                .borrow()
                .iter()
                .filter(|(k, _)| k.starts_with(&prefix))
                .map(|(_, (v, _))| v.len())
                .sum()
        }
    }

    const V2: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";
    const V2BETA1: &str =
        "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList";

    fn config(generation: usize, padding: usize) -> (String, DiscoveryConfig) {
        let apis = format!(
            r#"{{"kind":"APIGroupDiscoveryList","apiVersion":"apidiscovery.k8s.io/v2","metadata":{{}},"items":[{{"metadata":{{"name":"g{generation}"}},"pad":"{}"}}]}}"#,
            "x".repeat(padding)
        );
        let api = r#"{"kind":"APIGroupDiscoveryList","apiVersion":"apidiscovery.k8s.io/v2","metadata":{},"items":[]}"#;
        let version = format!("v{generation}");
        let config = DiscoveryConfig {
            version: version.clone(),
            apis: JsonDocument::from_str(&apis).unwrap(),
            apis_etag: format!("apis{generation}"),
            api: JsonDocument::from_str(api).unwrap(),
            api_etag: "api".into(),
            legacy: [(
                "/apis".to_string(),
                JsonDocument::from_str(&format!(r#"{{"kind":"APIGroupList","g":{generation}}}"#))
                    .unwrap(),
            )]
            .into(),
            unavailable: ["/apis/gone.example.com/v1".to_string()].into(),
        };
        (version, config)
    }

    /// The body a client gets for (path, accept, gzip), resolving a stored document.
    fn served(
        store: &Memory,
        merged: &MergedDiscovery,
        path: &str,
        accept: &str,
        gzip: bool,
    ) -> Option<(Vec<u8>, bool, Option<String>)> {
        let headers = DiscoveryHeaders {
            accept: Some(accept.as_bytes()),
            if_none_match: None,
            accept_encoding: gzip.then_some(&b"gzip"[..]),
        };
        let (DiscoveryAnswer::Respond(r), PassReason::NotDiscovery) =
            merged.answer("GET", path, headers)
        else {
            return None;
        };
        let bytes = match r.stored {
            Some(key) => body(store, key, r.gzip).unwrap()?,
            None => r.body.to_vec(),
        };
        let bytes = if r.gzip {
            gzip::decompress(&bytes).unwrap()
        } else {
            bytes
        };
        Some((bytes, r.gzip, r.etag.map(str::to_string)))
    }

    #[test]
    fn a_published_version_answers_like_the_inline_documents() {
        let store = Memory::default();
        let (version, config) = config(1, 200 * 1024);
        let inline = MergedDiscovery::compile(&config);
        let stored = publish(&store, &version, &inline).unwrap();
        let loaded = load(&store, &version).unwrap().unwrap();
        let cases = [
            ("/apis", V2, false),
            ("/apis", V2, true),
            ("/apis", V2BETA1, false),
            ("/apis", V2BETA1, true),
            ("/api", V2, false),
            ("/apis", "application/json", false),
        ];
        for (path, accept, gzip) in cases {
            let want = served(&store, &inline, path, accept, gzip);
            assert!(want.is_some(), "{path} {accept} {gzip}");
            for (what, merged) in [("published", &stored), ("loaded", &loaded)] {
                assert_eq!(
                    served(&store, merged, path, accept, gzip),
                    want,
                    "{what}: {path} {accept} gzip={gzip}"
                );
            }
        }
        assert_eq!(
            loaded
                .unavailable("GET", "/apis/gone.example.com/v1")
                .map(ToString::to_string),
            Some("gone.example.com/v1".to_string())
        );
        // HEAD reads nothing from shared data.
        let headers = DiscoveryHeaders {
            accept: Some(V2.as_bytes()),
            ..Default::default()
        };
        let (DiscoveryAnswer::Respond(r), _) = loaded.answer("HEAD", "/apis", headers) else {
            panic!("HEAD /apis is answered");
        };
        assert_eq!((r.body, r.stored), (&[][..], None));
    }

    #[test]
    fn nothing_is_loaded_before_publication_and_each_version_reads_only_its_own_documents() {
        let store = Memory::default();
        let (v1, c1) = config(1, 10);
        let (v2, c2) = config(2, 10);
        assert!(load(&store, &v1).unwrap().is_none());
        publish(&store, &v1, &MergedDiscovery::compile(&c1)).unwrap();
        assert!(load(&store, &v2).unwrap().is_none());
        publish(&store, &v2, &MergedDiscovery::compile(&c2)).unwrap();
        for (version, config) in [(&v1, &c1), (&v2, &c2)] {
            let loaded = load(&store, version).unwrap().unwrap();
            let (body, _, etag) = served(&store, &loaded, "/apis", V2, false).unwrap();
            assert_eq!(body, config.apis.get().as_bytes(), "{version}");
            assert_eq!(etag, Some(format!("\"{}\"", config.apis_etag)));
        }
    }

    /// Large enough to be gzipped for a client that accepts it.
    const GZIPPED: usize = 200 * 1024;

    #[test]
    fn old_versions_are_evicted_and_then_absent_never_another_versions_document() {
        let store = Memory::default();
        let mut held = Vec::new();
        for generation in 0..KEEP_VERSIONS + 3 {
            let (version, config) = config(generation, GZIPPED);
            let merged = publish(&store, &version, &MergedDiscovery::compile(&config)).unwrap();
            // A VM answered a gzip client, making the shared gzipped form.
            let (_, gzip, _) = served(&store, &merged, "/apis", V2, true).unwrap();
            assert!(gzip, "{version}");
            assert!(store.held_by(&version) > GZIPPED, "{version}");
            held.push((version, merged));
        }
        let index = String::from_utf8(store.get(INDEX_KEY).unwrap().unwrap().0).unwrap();
        let newest: Vec<String> = (3..KEEP_VERSIONS + 3).map(|g| format!("v{g}")).collect();
        assert_eq!(index, newest.join("\n"));
        for (generation, (version, merged)) in held.iter().enumerate() {
            let kept = generation >= 3;
            assert_eq!(load(&store, version).unwrap().is_some(), kept, "{version}");
            // Every key of an evicted version is empty, its gzipped copies included.
            if !kept {
                assert_eq!(store.held_by(version), 0, "{version}");
            }
            // A VM still holding an evicted version finds nothing to serve.
            assert_eq!(
                served(&store, merged, "/apis", V2, false).is_some(),
                kept,
                "{version}"
            );
        }
        // What stays is the kept versions' documents only.
        let kept: usize = (3..KEEP_VERSIONS + 3)
            .map(|g| {
                let (_, c) = config(g, GZIPPED);
                let m = MergedDiscovery::compile(&c);
                documents(&m).iter().map(|(_, d)| d.len()).sum::<usize>()
            })
            .sum();
        assert!(store.held() > kept, "{} <= {kept}", store.held());
        assert!(store.held() < kept * 2, "{} >= 2 * {kept}", store.held());
    }

    #[test]
    fn a_gzip_copy_made_while_its_version_is_evicted_is_not_left_behind() {
        let store = Memory::default();
        let (v0, c0) = config(0, GZIPPED);
        let merged = publish(&store, &v0, &MergedDiscovery::compile(&c0)).unwrap();
        // While this VM compresses v0's /apis, another VM publishes newer configurations,
        // evicting v0 (its gzipped key is emptied before this VM writes it).
        *store.before_gzip_write.borrow_mut() = Some(Box::new(|store: &Memory| {
            for generation in 1..=KEEP_VERSIONS {
                let (version, config) = config(generation, 10);
                publish(store, &version, &MergedDiscovery::compile(&config)).unwrap();
            }
            assert!(load(store, "v0").unwrap().is_none(), "v0 evicted");
        }));
        let (body, gzip, _) = served(&store, &merged, "/apis", V2, true).unwrap();
        assert!(
            store.before_gzip_write.borrow().is_none(),
            "the race was run"
        );
        // The request still gets its own version's document...
        assert!(gzip);
        assert_eq!(body, c0.apis.get().as_bytes());
        // ...and nothing of the evicted version stays in shared data.
        assert_eq!(store.held_by(&v0), 0);

        // Without the race the copy is shared: the next request reads it.
        let (v5, c5) = config(5, GZIPPED);
        let merged = publish(&store, &v5, &MergedDiscovery::compile(&c5)).unwrap();
        served(&store, &merged, "/apis", V2, true).unwrap();
        let gz_keys = store
            .values
            .borrow()
            .iter()
            .filter(|(k, (v, _))| {
                k.starts_with(&format!("{PREFIX}{v5}/")) && k.ends_with(".gz") && !v.is_empty()
            })
            .count();
        assert_eq!(gz_keys, 1);
    }

    #[test]
    fn republishing_a_version_and_losing_index_races_keep_one_entry() {
        let store = Memory::default();
        let (v1, c1) = config(1, 10);
        let (v2, c2) = config(2, 10);
        publish(&store, &v1, &MergedDiscovery::compile(&c1)).unwrap();
        store.lose_index_races.set(3);
        publish(&store, &v2, &MergedDiscovery::compile(&c2)).unwrap();
        publish(&store, &v1, &MergedDiscovery::compile(&c1)).unwrap();
        let index = String::from_utf8(store.get(INDEX_KEY).unwrap().unwrap().0).unwrap();
        assert_eq!(index, "v2\nv1");
        store.lose_index_races.set(CAS_ATTEMPTS);
        let (v3, c3) = config(3, 10);
        assert_eq!(
            publish(&store, &v3, &MergedDiscovery::compile(&c3)).err(),
            Some(StoreError::CasMismatch)
        );
        // Without a manifest the version is not loaded: bodies alone are never used.
        assert!(load(&store, &v3).unwrap().is_none());
    }

    #[test]
    fn a_replacement_fetches_its_stored_document_or_becomes_a_retryable_503() {
        use crate::config::{FilterConfig, SCHEMA_VERSION};
        use crate::plan::{CompiledConfig, HeaderOp, ReplaceCause, Replacement, ReplacementBody};
        let store = Memory::default();
        let routing = FilterConfig {
            departed_clusters: Default::default(),
            schema: SCHEMA_VERSION,
            local_apiserver: "apiserver-a".into(),
            peer_clusters: BTreeMap::new(),
            group_versions: Vec::new(),
            discovery: None,
            pending_peers: Vec::new(),
            openapi_v3: Default::default(),
            failover_clusters: Default::default(),
            failover_all: None,
            fallback: None,
        };
        let replacement = |compiled: &CompiledConfig| {
            let headers = DiscoveryHeaders {
                accept: Some(V2.as_bytes()),
                ..Default::default()
            };
            let merged = compiled.discovery.as_ref().unwrap();
            let (Some(choice), _) = merged.negotiate("GET", "/apis", headers) else {
                panic!("/apis is answered");
            };
            Replacement {
                cause: ReplaceCause::MergedDiscovery,
                status: 200,
                headers: Vec::new(),
                body: ReplacementBody::Discovery(choice),
                counter: None,
            }
        };
        // Inline documents: nothing to fetch.
        let (v0, c0) = config(0, 10);
        let inline = CompiledConfig::with_discovery(&routing, Some(MergedDiscovery::compile(&c0)));
        let r = replacement(&inline);
        assert_eq!(r.clone().fetch_stored(&inline, &store), Ok(r));
        // Stored: copied in.
        let stored = CompiledConfig::with_discovery(
            &routing,
            Some(publish(&store, &v0, &MergedDiscovery::compile(&c0)).unwrap()),
        );
        let fetched = replacement(&stored).fetch_stored(&stored, &store).unwrap();
        assert_eq!(
            fetched.body,
            ReplacementBody::Fetched(c0.apis.get().as_bytes().to_vec())
        );
        assert_eq!(fetched.body.bytes(&stored), c0.apis.get().as_bytes());
        // Evicted (this VM lagged KEEP_VERSIONS configurations behind): a retryable 503.
        for generation in 1..=KEEP_VERSIONS {
            let (v, c) = config(generation, 10);
            publish(&store, &v, &MergedDiscovery::compile(&c)).unwrap();
        }
        let gone = replacement(&stored).fetch_stored(&stored, &store).unwrap();
        assert_eq!(gone.status, 503);
        assert!(gone.headers.contains(&HeaderOp::Set(
            "retry-after",
            std::borrow::Cow::Borrowed(crate::status::RETRY_AFTER)
        )));
        assert!(
            matches!(gone.body, ReplacementBody::Status(ref b) if b.contains("ServiceUnavailable"))
        );
    }

    #[test]
    fn a_manifest_of_another_version_is_refused() {
        let store = Memory::default();
        let (v1, c1) = config(1, 10);
        publish(&store, &v1, &MergedDiscovery::compile(&c1)).unwrap();
        let manifest = store.get(&manifest_key(&v1)).unwrap().unwrap().0;
        store.set(&manifest_key("v9"), &manifest, None).unwrap();
        assert!(matches!(load(&store, "v9"), Err(StoreError::Manifest(_))));
        store.set(&manifest_key("v8"), b"{", None).unwrap();
        assert!(matches!(load(&store, "v8"), Err(StoreError::Manifest(_))));
    }
}
