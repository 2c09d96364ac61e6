//! `/debug/skew` for a browser: the skew matrix as one small self-contained HTML page (inline
//! CSS, no script, no external asset), rendered server-side from the very JSON document
//! `/debug/skew` serves (one source: the page can show nothing the JSON does not say).
//!
//! Every name on it comes from a peer's discovery document or a Lease somebody wrote, so all
//! of it is hostile text: maud escapes everything interpolated, and the page is served with a
//! `Content-Security-Policy` that allows no script at all.
//!
//! [`wants_html`] is the content negotiation: HTML only for a client that prefers it (a
//! browser); everything else (curl, scripts, `Accept: */*`, no Accept) gets the JSON as before.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use maud::{html, Markup, PreEscaped, DOCTYPE};
use serde::Deserialize;

/// The `Content-Security-Policy` of the page: its own inline style, nothing else.
pub const CONTENT_SECURITY_POLICY: &str =
    "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'";

/// Whether a request with this `Accept` header gets the page rather than the JSON: only when
/// it weighs `text/html` strictly above `application/json` (RFC 9110: each by its most specific
/// matching range). A browser sends `text/html,...,*/*;q=0.8`; curl sends `*/*` (a tie: JSON).
pub fn wants_html(accept: Option<&str>) -> bool {
    let Some(accept) = accept else {
        return false;
    };
    quality(accept, "text", "html") > quality(accept, "application", "json")
}

/// The weight `accept` gives `kind/subtype`: that of the most specific range matching it
/// (exact over `kind/*` over `*/*`), 0 when none does. A malformed `q` counts as 0.
fn quality(accept: &str, kind: &str, subtype: &str) -> f32 {
    let mut best: Option<(u8, f32)> = None;
    for range in accept.split(',') {
        let mut parts = range.split(';');
        let media = parts.next().unwrap_or_default().trim();
        let Some((k, s)) = media.split_once('/') else {
            continue;
        };
        let (k, s) = (k.trim(), s.trim());
        let specificity = if k.eq_ignore_ascii_case(kind) && s.eq_ignore_ascii_case(subtype) {
            2
        } else if k.eq_ignore_ascii_case(kind) && s == "*" {
            1
        } else if k == "*" && s == "*" {
            0
        } else {
            continue;
        };
        let q = parts
            .filter_map(|p| p.split_once('='))
            .find(|(name, _)| name.trim().eq_ignore_ascii_case("q"))
            .map_or(1.0, |(_, v)| {
                v.trim()
                    .parse::<f32>()
                    .ok()
                    .filter(|q| (0.0..=1.0).contains(q))
                    .unwrap_or(0.0)
            });
        if best.is_none_or(|(b, _)| specificity > b) {
            best = Some((specificity, q));
        }
    }
    best.map_or(0.0, |(_, q)| q)
}

// ---------------------------------------------------------------------------------------------
// What the page reads of the `/debug/skew` document (`run::status::Status::skew_json`). Every
// field defaults: a document without it shows less, never an error.

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Document {
    ready: bool,
    waiting_for: Vec<String>,
    snapshot_version: Option<String>,
    published_unix_seconds: Option<u64>,
    merged_discovery: Option<String>,
    apiservers: Vec<Apiserver>,
    unrouted_peers: Vec<Reasoned>,
    pending_peers: Vec<String>,
    retained: Vec<Retained>,
    excluded_leases: Vec<Reasoned>,
    shared_storage: Vec<String>,
    matrix: Option<Matrix>,
    envoy_streams: Vec<EnvoyStream>,
    error: Option<String>,
}

/// An ADS stream: the Envoy behind it, what its filter reads, how it gets its configuration,
/// the clusters it keeps after they left (`crate::xds::metrics::EnvoyStream`).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct EnvoyStream {
    stream: u64,
    node: String,
    advertised: String,
    schemas: Vec<u32>,
    features: Vec<String>,
    delivery: String,
    withheld: bool,
    cluster_linger_seconds: f64,
    lingering_clusters: usize,
    clusters_removed_early: u64,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Apiserver {
    id: String,
    hostname: Option<String>,
    local: bool,
    url: String,
    routed: bool,
    discovery_attempts: u64,
    consecutive_failures: u32,
    last_error: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Reasoned {
    id: String,
    reason: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Retained {
    id: String,
    left_unix_seconds: u64,
    expires_unix_seconds: u64,
    resources: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Matrix {
    local: String,
    apiservers: Vec<String>,
    complete: bool,
    group_versions: Vec<MatrixGroupVersion>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct MatrixGroupVersion {
    group: String,
    version: String,
    shared_storage: bool,
    resources: Vec<MatrixResource>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct MatrixResource {
    resource: String,
    served_by: Vec<String>,
    route: String,
}

// ---------------------------------------------------------------------------------------------
// The page.

const STYLE: &str = "
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #1d1d1f; background: #fff; }
h1 { font-size: 1.4em; margin: 0 0 .2em; }
h2 { font-size: 1.1em; margin: 1.6em 0 .4em; }
p.meta { color: #555; margin: 0 0 1em; }
table { border-collapse: collapse; margin: .3em 0; }
th, td { border: 1px solid #ccc; padding: .3em .6em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
tr.gv th { background: #e8eef8; font-weight: 600; }
td.yes { background: #d8f0d8; text-align: center; }
td.no { background: #f7f7f7; color: #aaa; text-align: center; }
td.peer { background: #fff3cd; }
td.stale { background: #f8d7da; }
td.route, td.stale { white-space: nowrap; }
code, .id, .cluster { font-family: ui-monospace, monospace; font-size: .9em; }
.id { color: #666; display: block; }
.cluster { color: #666; margin-left: .6em; }
.badge { display: inline-block; padding: 0 .4em; border-radius: .3em; font-size: .85em; background: #ddd; }
.ok { background: #d8f0d8; }
.bad { background: #f8d7da; }
.warn { background: #fff3cd; }
";

/// The page for the `/debug/skew` document `doc`, as of `now` (for "expires in").
pub fn render(doc: &serde_json::Value, now: SystemTime) -> String {
    let doc = Document::deserialize(doc).unwrap_or_else(|e| Document {
        error: Some(format!("unreadable status document: {e}")),
        ..Document::default()
    });
    page(&doc, now).into_string()
}

fn page(doc: &Document, now: SystemTime) -> Markup {
    let names = Names::of(&doc.apiservers);
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                // An upgrade is watched: the page follows it.
                meta http-equiv="refresh" content="5";
                title { "skewgate: skew matrix" }
                style { (PreEscaped(STYLE)) }
            }
            body {
                h1 { "skewgate: skew matrix" }
                p.meta { (summary(doc)) }
                @if let Some(e) = &doc.error {
                    p { span.badge.bad { "error" } " " (e) }
                }
                @if !doc.ready && !doc.waiting_for.is_empty() {
                    h2 { "Not ready: waiting for" }
                    ul { @for w in &doc.waiting_for { li { (w) } } }
                }
                @if let Some(m) = &doc.matrix {
                    (matrix(m, &names))
                }
                @if !doc.retained.is_empty() {
                    (retained(&doc.retained, &names, now))
                }
                (apiservers(&doc.apiservers))
                @if !doc.envoy_streams.is_empty() {
                    (envoy_streams(&doc.envoy_streams))
                }
                @if !doc.pending_peers.is_empty() {
                    h2 { "Peers whose discovery is not known yet" }
                    p { "Requests for what no known apiserver serves get 503 until it is." }
                    ul { @for p in &doc.pending_peers { li { (names.name(p)) span.id { (p) } } } }
                }
                @if !doc.unrouted_peers.is_empty() {
                    h2 { "Live peers not routed to" }
                    (reasons(&doc.unrouted_peers, &names))
                }
                @if !doc.excluded_leases.is_empty() {
                    h2 { "Leases that are not peers" }
                    (reasons(&doc.excluded_leases, &names))
                }
                @if !doc.shared_storage.is_empty() {
                    h2 { "Shared storage (CRDs, service-backed APIServices): always local" }
                    p { @for (i, gv) in doc.shared_storage.iter().enumerate() {
                        @if i > 0 { ", " } code { (gv) }
                    } }
                }
            }
        }
    }
}

/// Each Envoy on an ADS stream and the filter configuration it gets: one whose filter cannot
/// read it (more than a release apart) is sent none and keeps what it holds. And the clusters
/// it keeps after they left the snapshot, for requests routed there before that may retry.
fn envoy_streams(streams: &[EnvoyStream]) -> Markup {
    let list = |items: Vec<String>| items.join(", ");
    html! {
        h2 { "Envoys and their filter's configuration dialect" }
        table #envoy-streams {
            thead { tr { th { "Envoy (ADS stream)" } th { "its filter reads" } th { "filter configuration" } th { "removed clusters" } } }
            tbody {
                @for s in streams {
                    tr {
                        td { code { (s.node) } span.id { "stream " (s.stream) } }
                        td {
                            "schemas " (list(s.schemas.iter().map(u32::to_string).collect()))
                            @if !s.features.is_empty() { "; features " (list(s.features.clone())) }
                            span.id { "advertised: " (s.advertised) }
                        }
                        @if s.withheld {
                            td { span.badge.bad { "withheld" } " " (s.delivery) }
                        } @else {
                            td { (s.delivery) }
                        }
                        td {
                            "linger " (seconds(s.cluster_linger_seconds)) "; "
                            (s.lingering_clusters) " lingering"
                            @if s.clusters_removed_early > 0 {
                                " " span.badge.bad { (s.clusters_removed_early) " removed early" }
                            }
                        }
                    }
                }
            }
        }
    }
}

fn summary(doc: &Document) -> Markup {
    html! {
        @if doc.ready { span.badge.ok { "ready" } } @else { span.badge.bad { "not ready" } }
        @if let Some(v) = &doc.snapshot_version {
            " snapshot " code { (v) }
        }
        @if let Some(t) = doc.published_unix_seconds {
            " published " (date(t))
        }
        @if let Some(m) = &doc.merged_discovery {
            " · merged discovery: " (m)
        }
        " · " a href="?all=true" { "everything" } " · " a href="?" { "only differences" }
        " · the same as JSON for any client that does not prefer HTML (curl)"
    }
}

/// Rows: group-versions and their resources; columns: the apiservers (local first), then
/// where a request for the resource goes from here.
fn matrix(m: &Matrix, names: &Names) -> Markup {
    let columns = m.apiservers.len() + 2;
    html! {
        h2 {
            "Which apiserver serves what, and where requests go"
            @if !m.complete { " (only what not every apiserver serves)" }
        }
        table #matrix {
            thead {
                tr {
                    th { "group/version · resource" }
                    @for id in &m.apiservers {
                        th title=(id) {
                            (names.name(id))
                            @if *id == m.local { " " span.badge { "local" } }
                            span.id { (short(id)) }
                        }
                    }
                    th { "requests go to" }
                }
            }
            tbody {
                @if m.group_versions.is_empty() {
                    tr { td colspan=(columns) { "Every live apiserver serves the same resources." } }
                }
                @for gv in &m.group_versions {
                    tr.gv {
                        th colspan=(columns) {
                            (gv_name(&gv.group, &gv.version))
                            @if gv.shared_storage { " " span.badge { "shared storage: always local" } }
                        }
                    }
                    @for r in &gv.resources {
                        tr {
                            td { code { (r.resource) } }
                            @for id in &m.apiservers {
                                @if r.served_by.contains(id) {
                                    td.yes title=(format!("{} serves it", names.name(id))) { "✓" }
                                } @else {
                                    td.no { "–" }
                                }
                            }
                            (route(r, &m.local, names))
                        }
                    }
                }
            }
        }
    }
}

/// `local`, or the peer cluster and the peers in it (exactly those serving the resource).
fn route(r: &MatrixResource, local: &str, names: &Names) -> Markup {
    if r.route == "local" {
        return html! { td.route { "local (" (names.name(local)) ")" } };
    }
    let peers: Vec<&str> = r
        .served_by
        .iter()
        .filter(|id| id.as_str() != local)
        .map(|id| names.name(id))
        .collect();
    html! {
        td.peer.route {
            "peers: " (peers.join(", "))
            span.cluster { (r.route) }
        }
    }
}

fn retained(list: &[Retained], names: &Names, now: SystemTime) -> Markup {
    html! {
        h2 { "Retained from apiservers that left (Stale in discovery)" }
        p { "No live apiserver serves these: requests for them get 503 with Retry-After, never the local 404, until the apiserver returns or its retention ends." }
        table #retained {
            thead { tr { th { "group/version, resource" } th { "requests go to" } } }
            tbody {
                @for r in list {
                    tr.gv {
                        th colspan="2" {
                            "from " (who(&r.id, names)) " · left " (date(r.left_unix_seconds))
                            " · retention ends " (date(r.expires_unix_seconds)) " "
                            (remaining(r.expires_unix_seconds, now))
                        }
                    }
                    @for resource in &r.resources {
                        tr {
                            td { code { (resource) } }
                            td.stale { "nowhere: 503 with Retry-After" }
                        }
                    }
                }
            }
        }
    }
}

fn apiservers(list: &[Apiserver]) -> Markup {
    html! {
        h2 { "Apiservers" }
        table #apiservers {
            thead { tr {
                th { "apiserver" } th { "role" } th { "URL" } th { "routed to" }
                th { "discovery fetches" } th { "failures in a row" } th { "last error" }
            } }
            tbody {
                @for a in list {
                    tr {
                        td { (a.hostname.as_deref().unwrap_or(&a.id)) span.id { (a.id) } }
                        td { @if a.local { "local" } @else { "peer" } }
                        td { code { (a.url) } }
                        td { @if a.routed { span.badge.ok { "yes" } } @else { span.badge.warn { "no" } } }
                        td { (a.discovery_attempts) }
                        td { (a.consecutive_failures) }
                        td { (a.last_error.as_deref().unwrap_or("")) }
                    }
                }
            }
        }
    }
}

fn reasons(list: &[Reasoned], names: &Names) -> Markup {
    html! {
        table { tbody { @for r in list {
            tr { td { (names.name(&r.id)) span.id { (r.id) } } td { (r.reason) } }
        } } }
    }
}

/// Lease ids → the hostnames their Leases name (ids are opaque hashes in kube).
struct Names<'a>(BTreeMap<&'a str, &'a str>);

impl<'a> Names<'a> {
    fn of(apiservers: &'a [Apiserver]) -> Self {
        Names(
            apiservers
                .iter()
                .filter_map(|a| Some((a.id.as_str(), a.hostname.as_deref()?)))
                .collect(),
        )
    }

    fn name<'b>(&'b self, id: &'b str) -> &'b str {
        self.0.get(id).copied().unwrap_or(id)
    }
}

/// An apiserver by the hostname its Lease names and its lease id, or by the id alone.
fn who(id: &str, names: &Names) -> Markup {
    let name = names.name(id);
    html! {
        @if name == id { code { (id) } } @else { (name) " (" code { (id) } ")" }
    }
}

/// A lease id shortened for a column header (the full one is in its title).
fn short(id: &str) -> String {
    if id.chars().count() <= 24 {
        id.to_string()
    } else {
        let head: String = id.chars().take(20).collect();
        format!("{head}…")
    }
}

fn gv_name(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("core/{version}")
    } else {
        format!("{group}/{version}")
    }
}

fn date(unix_seconds: u64) -> String {
    httpdate::fmt_http_date(UNIX_EPOCH + Duration::from_secs(unix_seconds))
}

fn remaining(unix_seconds: u64, now: SystemTime) -> String {
    let now = now
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    match unix_seconds.checked_sub(now) {
        Some(s) if s > 0 => format!("(in {})", minutes(s)),
        _ => "(now)".to_string(),
    }
}

/// A whole number of seconds as minutes and seconds: `5m 10s`.
fn minutes(seconds: u64) -> String {
    format!("{}m {:02}s", seconds / 60, seconds % 60)
}

/// A duration the document gives in seconds (a number from our own JSON, still checked):
/// whole seconds, `?` for anything that is not a duration.
fn seconds(value: f64) -> String {
    if value.is_finite() && value >= 0.0 {
        // Saturating: `as` clamps a float too large for u64.
        minutes(value as u64)
    } else {
        "?".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_a_client_preferring_html_gets_the_page() {
        let chromium = "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,image/apng,*/*;q=0.8,application/signed-exchange;v=b3;q=0.7";
        let firefox = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8";
        for (accept, html) in [
            (Some(chromium), true),
            (Some(firefox), true),
            (Some("text/html"), true),
            (Some("TEXT/HTML; charset=utf-8"), true),
            (Some("application/json;q=0.5, text/html"), true),
            (None, false),
            (Some(""), false),
            (Some("*/*"), false),                         // curl
            (Some("application/json"), false),            // a script
            (Some("text/html, application/json"), false), // a tie: as before
            (Some("text/html;q=0.4, */*;q=0.5"), false),
            (Some("text/*, application/*"), false),
            (Some("text/html;q=0, */*"), false),
            (Some("text/html;q=bogus"), false),
            (Some("text/html;q=2"), false),
            (Some("garbage"), false),
        ] {
            assert_eq!(wants_html(accept), html, "{accept:?}");
        }
    }

    fn document(hostile: &str) -> serde_json::Value {
        json!({
            "ready": true,
            "snapshot_version": "7",
            "published_unix_seconds": 1_800_000_000u64,
            "merged_discovery": hostile,
            "apiservers": [
                {"id": "apiserver-aaaa", "hostname": "node-a", "local": true, "url": "https://10.0.0.1:6443",
                 "routed": true, "discovery_attempts": 3, "consecutive_failures": 0},
                {"id": "apiserver-bbbb", "hostname": hostile, "local": false, "url": hostile,
                 "routed": true, "discovery_attempts": 2, "consecutive_failures": 1, "last_error": hostile},
            ],
            "unrouted_peers": [{"id": hostile, "reason": hostile}],
            "pending_peers": [hostile],
            "retained": [{"id": "apiserver-cccc", "left_unix_seconds": 1_800_000_000u64,
                          "expires_unix_seconds": 1_800_000_900u64,
                          "resources": [format!("{hostile}/v1, Resource=things"), "x/v1, Resource=ys"]}],
            "excluded_leases": [{"id": hostile, "reason": hostile}],
            "shared_storage": [hostile],
            "matrix": {
                "local": "apiserver-aaaa",
                "apiservers": ["apiserver-aaaa", "apiserver-bbbb"],
                "complete": false,
                "group_versions": [
                    {"group": "resource.k8s.io", "version": "v1beta2", "shared_storage": false,
                     "served_by": ["apiserver-bbbb"],
                     "resources": [{"resource": "resourceclaims", "served_by": ["apiserver-bbbb"],
                                    "route": "skewgate-peers-0123456789ab"}]},
                    {"group": hostile, "version": hostile, "shared_storage": true,
                     "served_by": ["apiserver-aaaa"],
                     "resources": [{"resource": hostile, "served_by": ["apiserver-aaaa"], "route": "local"}]},
                ],
            },
            "envoy_streams": [
                {"stream": 3, "node": "envoy-a", "advertised": "advertised", "schemas": [1],
                 "features": [], "delivery": "as rendered", "withheld": false,
                 "cluster_linger_seconds": 90.0, "lingering_clusters": 2,
                 "clusters_removed_early": 0},
                {"stream": 4, "node": hostile, "advertised": hostile, "schemas": [2, 3],
                 "features": [hostile], "delivery": "withheld: the filter reads configuration schemas {2, 3}, this configuration can be written in {1} only",
                 "withheld": true, "cluster_linger_seconds": 310.5, "lingering_clusters": 300,
                 "clusters_removed_early": 7},
            ],
        })
    }

    #[test]
    fn the_page_shows_the_matrix_and_where_requests_go() {
        let now = UNIX_EPOCH + Duration::from_secs(1_800_000_100);
        let page = render(&document("plain"), now);
        assert!(page.starts_with("<!DOCTYPE html>"), "{page}");
        // Columns by hostname, the local one marked; the peer-only resource goes to the peers.
        assert!(
            page.contains("node-a <span class=\"badge\">local</span>"),
            "{page}"
        );
        assert!(page.contains("resource.k8s.io/v1beta2"), "{page}");
        assert!(
            page.contains("<code>resourceclaims</code></td><td class=\"no\">"),
            "{page}"
        );
        assert!(
            page.contains("peers: plain<span class=\"cluster\">skewgate-peers-0123456789ab</span>"),
            "{page}"
        );
        assert!(page.contains("local (node-a)"), "{page}");
        // Retained: every resource, who it came from, when the retention ends, 503.
        assert!(page.contains("x/v1, Resource=ys"), "{page}");
        assert!(page.contains("apiserver-cccc"), "{page}");
        assert!(page.contains("(in 13m 20s)"), "{page}");
        assert!(page.contains("nowhere: 503 with Retry-After"), "{page}");
        // Each Envoy's filter dialect, and one whose filter configuration is withheld.
        assert!(
            page.contains("<code>envoy-a</code><span class=\"id\">stream 3</span>"),
            "{page}"
        );
        assert!(page.contains("schemas 2, 3"), "{page}");
        assert!(
            page.contains("<span class=\"badge bad\">withheld</span> withheld: the filter reads configuration schemas {2, 3}"),
            "{page}"
        );
        // How long each Envoy's removed clusters linger, and early removals marked.
        assert!(page.contains("linger 1m 30s; 2 lingering</td>"), "{page}");
        assert!(
            page.contains(
                "linger 5m 10s; 300 lingering <span class=\"badge bad\">7 removed early</span>"
            ),
            "{page}"
        );
        // Self-contained: no script, no external asset.
        for needle in ["<script", "src=", "<link", "http://", "@import"] {
            assert!(!page.contains(needle), "{needle} in {page}");
        }
    }

    #[test]
    fn hostile_names_are_escaped_everywhere() {
        let hostile = "<script>alert(\"x\")</script><img src=x onerror=alert(1)>'&";
        let page = render(&document(hostile), SystemTime::now());
        assert!(!page.contains("<script"), "{page}");
        assert!(!page.contains("<img"), "{page}");
        assert!(
            page.contains("&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;"),
            "{page}"
        );
        // Every field that carried it shows it, escaped (matrix, apiservers, retained, lists).
        let shown = page.matches("&lt;script&gt;").count();
        assert!(shown >= 12, "{shown} escaped copies: {page}");
    }

    #[test]
    fn a_document_before_the_first_sync_or_unreadable_still_renders() {
        let page = render(
            &json!({"ready": false, "waiting_for": ["the identity leases are not listed yet"],
                    "apiservers": [], "excluded_leases": []}),
            SystemTime::now(),
        );
        assert!(page.contains("not ready"), "{page}");
        assert!(
            page.contains("the identity leases are not listed yet"),
            "{page}"
        );
        let page = render(&json!({"apiservers": "nope"}), SystemTime::now());
        assert!(page.contains("unreadable status document"), "{page}");
    }
}
