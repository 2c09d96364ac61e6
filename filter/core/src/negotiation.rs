//! Accept negotiation for discovery (`GET /api`, `GET /apis`), the way kube-apiserver does it.
//!
//! Whatever the filter does not answer itself goes to the local apiserver, which negotiates on
//! its own. So this module reproduces upstream's decision, quirks included, rather than an RFC
//! 9110 reading of `Accept`: a client gets the same kind of document whether skewgate answers it
//! or forwards it. Where we differ on purpose, the item says so.
//!
//! # Upstream, step by step
//!
//! Sources read (kubernetes/kubernetes, `staging/src/k8s.io/...`):
//! `apiserver/pkg/endpoints/discovery/aggregated/wrapper.go` (`WrappedHandler.ServeHTTP`),
//! `.../aggregated/negotiation.go` (`DiscoveryEndpointRestrictions`, `IsAggregatedDiscoveryGVK`),
//! `apiserver/pkg/endpoints/handlers/negotiation/negotiate.go` (`NegotiateMediaTypeOptions`,
//! `acceptMediaTypeOptions`), `vendor/github.com/munnerz/goautoneg/autoneg.go` (`ParseAccept`),
//! `apimachinery/pkg/runtime/serializer/codec_factory.go` (served media types),
//! `.../aggregated/etag.go` (`ServeHTTPWithETag`) and
//! `apiserver/pkg/endpoints/handlers/responsewriters/writers.go` (`generateMediaTypeWithGVK`).
//!
//! 1. **Header value.** Go's `Header.Get("Accept")` reads the first `Accept` field, with leading
//!    and trailing whitespace already removed. An empty (or absent) value selects the first
//!    served media type, `application/json`, without conversion: legacy discovery.
//! 2. **Parsing** (`goautoneg.ParseAccept`). It knows nothing of quoting:
//!    - clauses are split at every `,` (also inside quotes) and trimmed of spaces only (not
//!      tabs); the media range is what precedes the first `;`, split at the first `/`. A range
//!      without a subtype is kept only if it is `*` (read as `*/*`); one with a second `/` is
//!      dropped; so are empty clauses.
//!    - parameters are split at every `;`; one without `=`, with nothing after the `=`, or with
//!      a second `=` is dropped. Names and values are trimmed of spaces. **Nothing is
//!      lowercased and quotes are not removed**: `Application/JSON`, `G=...` or
//!      `g="apidiscovery.k8s.io"` do not match. A repeated name keeps its last value (Go map).
//!    - `q` (exactly that name) is parsed with `strconv.ParseFloat(value, 32)` on the
//!      *untrimmed* value; anything unparsable (`q=abc`, `q= 0.5`) becomes 0. Values above 1 or
//!      below 0 are kept as they are. **`q=0` does not remove a clause**: it only sorts last (a
//!      departure from RFC 9110 that we reproduce, see below).
//!    - clauses are sorted with `sort.Sort` and this `Less(i, j)`: `q_i > q_j`; else a concrete
//!      type before a `*` type; else a concrete subtype before a `*` subtype. Note the wildcard
//!      rules apply even when `q_i < q_j`, so the order of wildcard clauses with different q
//!      values depends on their input order. For up to 12 clauses Go's `sort.Sort` is an
//!      insertion sort, which we run with the same `Less`: identical result, stable for equal
//!      preference (client order kept). Above 12 Go switches to pdqsort, which is not stable; we
//!      keep the insertion sort there, so with 13..=[`MAX_CLAUSES`] clauses the order of equal
//!      clauses may differ from Go's. No real client sends that many.
//! 3. **Aggregated or not** (`WrappedHandler`). Clauses are tried in sorted order, each against
//!    the served media types in order `application/json`, `application/yaml`,
//!    `application/vnd.kubernetes.protobuf` (`*/*` and `application/*` therefore mean JSON).
//!    The first (clause, media type) pair accepted by `DiscoveryEndpointRestrictions` wins;
//!    that restriction only accepts a pair whose `g`/`v`/`as` name the aggregated discovery
//!    GVK. A clause without `g`/`v`/`as` (plain `application/json`) is *skipped*, not chosen: so
//!    **any acceptable aggregated clause beats plain `application/json` whatever the q
//!    values**, even an aggregated clause with `q=0` (docs/ARCHITECTURE.md step 3 is what
//!    upstream does). A pair is also refused when it carries a non-empty `sv`, or a non-empty
//!    `stream` other than `watch` (or `stream=watch` on YAML, which has no stream serializer).
//!    Every other parameter (`pretty`, `charset`, unknown names, any `profile` value) is
//!    ignored: **unknown parameters do not make a clause fail**.
//! 4. **Aggregated GVK**: `g=apidiscovery.k8s.io`, `as=APIGroupDiscoveryList`, `v=v2` or
//!    `v=v2beta1`. Servers from 1.33 on have the `AggregatedDiscoveryRemoveBetaType` gate on
//!    (locked in 1.35, code removed later), so they do not accept `v2beta1`; use
//!    [`negotiate_discovery_with`] with [`NegotiationOptions::v2beta1`] `= false` to match them.
//!    Between v2 and v2beta1 the client's order / q values decide, as upstream; there is no
//!    extra preference for v2 (client-go always lists v2 first).
//! 5. **Profile.** With `UnknownVersionInteroperabilityProxy` on, a winning **v2** clause whose
//!    `profile` is exactly `nopeer` is served from the local document; any other `profile`
//!    value (`profile=foo`, `profile="nopeer"`) gets the peer-aggregated one. v2beta1 is never
//!    peer-aggregated upstream. See [`DiscoveryRequest::peer_aggregated`].
//! 6. **Legacy.** Without a winning aggregated pair the unaggregated handler negotiates the same
//!    clauses with the default restrictions, which refuse any pair that carries `g`, `v` or `as`
//!    at all. No acceptable pair: 406 Not Acceptable ([`NegotiationError::NotAcceptable`]).
//!
//! # Where we deviate: encoding only
//!
//! skewgate answers in JSON only. When upstream's winner asks for protobuf (or YAML), we look
//! for the first acceptable JSON pair, in the same order, that selects the same kind of
//! document (aggregated with the same `nopeer`, or legacy). If there is one, the client accepts
//! JSON and [`DiscoveryRequest::json`] is true: we may answer in JSON (with `Vary: Accept`, as
//! upstream). If not, `json` is false and the request must go to the local apiserver.
//!
//! # Errors are "forward it"
//!
//! A [`NegotiationError`] never means "reject": the caller forwards the request to the local
//! apiserver, which answers with its own status (406, or whatever it decides). Nothing here
//! panics on any input, work is linear in the header length, and at most [`MAX_CLAUSES`] clauses
//! are kept and sorted.

use std::fmt;

/// Content-Type of an aggregated discovery v2 answer (what `generateMediaTypeWithGVK` writes:
/// media type, then `g`, `v`, `as`; never the `profile`).
pub const AGGREGATED_V2_CONTENT_TYPE: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";
/// Content-Type of an aggregated discovery v2beta1 answer.
pub const AGGREGATED_V2BETA1_CONTENT_TYPE: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList";
/// Content-Type of a legacy (unaggregated) discovery answer in JSON.
pub const LEGACY_CONTENT_TYPE: &str = "application/json";

/// At most this many clauses are kept from one `Accept` value. One more makes
/// [`negotiate_discovery`] stop parsing and return [`NegotiationError::TooManyClauses`]. Empty
/// and unparsable clauses (`,,,`) are skipped while scanning and do not count.
pub const MAX_CLAUSES: usize = 64;

const APIDISCOVERY_GROUP: &[u8] = b"apidiscovery.k8s.io";
const APIDISCOVERY_KIND: &[u8] = b"APIGroupDiscoveryList";
const NOPEER: &[u8] = b"nopeer";

/// Which discovery document the client gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiscoveryFormat {
    /// `apidiscovery.k8s.io/v2` `APIGroupDiscoveryList`.
    AggregatedV2,
    /// `apidiscovery.k8s.io/v2beta1` `APIGroupDiscoveryList` (servers up to 1.32; same content
    /// as v2 apart from `apiVersion`).
    AggregatedV2Beta1,
    /// Unaggregated discovery (`APIVersions` at `/api`, `APIGroupList` at `/apis`).
    Legacy,
}

/// The outcome of negotiating a discovery request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiscoveryRequest {
    /// The document to answer with. When [`json`](Self::json) is true this is the document of
    /// the JSON clause we would answer; otherwise that of upstream's (non-JSON) winner.
    pub format: DiscoveryFormat,
    /// The chosen aggregated clause carries `profile=nopeer` (exact, case-sensitive value):
    /// only the local apiserver's own document. Always false for [`DiscoveryFormat::Legacy`].
    pub nopeer: bool,
    /// kube-apiserver would answer this request in protobuf: its winning clause is
    /// `application/vnd.kubernetes.protobuf`. Informational when [`json`](Self::json) is true
    /// (the client also accepts JSON, so we may still answer it).
    pub protobuf: bool,
    /// We can answer in JSON: upstream's winner is JSON, or the client accepts a JSON clause
    /// for the same kind of document. False (client wants protobuf or YAML only): forward the
    /// request to the local apiserver.
    pub json: bool,
}

impl DiscoveryRequest {
    /// Upstream serves this request from the peer-aggregated document: aggregated **v2**
    /// without `profile=nopeer` (`WrappedHandler.ServeHTTP` checks `Convert.Version == "v2"`).
    /// Answer it from skewgate's merged document only if [`json`](Self::json) is also true.
    pub fn peer_aggregated(&self) -> bool {
        self.format == DiscoveryFormat::AggregatedV2 && !self.nopeer
    }
}

/// Knobs for matching the version of the apiserver behind us.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NegotiationOptions {
    /// Accept `v=v2beta1` as aggregated discovery. True for servers up to 1.32; servers from
    /// 1.33 on (`AggregatedDiscoveryRemoveBetaType` on by default) treat such a clause as not
    /// aggregated, and so does this module when this is false.
    pub v2beta1: bool,
}

impl Default for NegotiationOptions {
    fn default() -> Self {
        Self { v2beta1: true }
    }
}

/// Why no decision was made. The caller forwards the request to the local apiserver, which
/// answers it (406 or otherwise) exactly as it would without skewgate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NegotiationError {
    /// No clause names a media type kube-apiserver serves with parameters it accepts (also:
    /// nothing parsable at all, such as `;;;,,,`): upstream answers 406 Not Acceptable.
    NotAcceptable,
    /// More than [`MAX_CLAUSES`] clauses: not evaluated.
    TooManyClauses,
}

impl fmt::Display for NegotiationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotAcceptable => f.write_str("no acceptable discovery media type in Accept"),
            Self::TooManyClauses => write!(f, "Accept has more than {MAX_CLAUSES} clauses"),
        }
    }
}

impl std::error::Error for NegotiationError {}

/// Negotiates a discovery request from its first `Accept` value (`None` when absent), the way a
/// kube-apiserver that still serves v2beta1 does. See the module docs for every rule.
pub fn negotiate_discovery(accept: Option<&[u8]>) -> Result<DiscoveryRequest, NegotiationError> {
    negotiate_discovery_with(accept, NegotiationOptions::default())
}

/// [`negotiate_discovery`] with explicit [`NegotiationOptions`].
pub fn negotiate_discovery_with(
    accept: Option<&[u8]>,
    options: NegotiationOptions,
) -> Result<DiscoveryRequest, NegotiationError> {
    let header = trim_ows(accept.unwrap_or_default());
    if header.is_empty() {
        // `NegotiateMediaTypeOptions`: an empty header takes the first served type, JSON.
        return Ok(DiscoveryRequest {
            format: DiscoveryFormat::Legacy,
            nopeer: false,
            protobuf: false,
            json: true,
        });
    }
    let clauses = parse_accept(header)?;
    let aggregated = Restriction::Discovery {
        v2beta1: options.v2beta1,
    };
    if let Some(found) = decide(picks(&clauses, aggregated)) {
        return Ok(found);
    }
    decide(picks(&clauses, Restriction::Legacy)).ok_or(NegotiationError::NotAcceptable)
}

/// The Content-Type of a JSON answer in `format`: the aggregated media type with `g`, `v`, `as`
/// (no `profile` echoed, as upstream), or `application/json` for legacy discovery.
pub fn aggregated_content_type(format: DiscoveryFormat) -> &'static str {
    match format {
        DiscoveryFormat::AggregatedV2 => AGGREGATED_V2_CONTENT_TYPE,
        DiscoveryFormat::AggregatedV2Beta1 => AGGREGATED_V2BETA1_CONTENT_TYPE,
        DiscoveryFormat::Legacy => LEGACY_CONTENT_TYPE,
    }
}

/// Whether the first `If-None-Match` value makes an aggregated discovery request a 304.
///
/// Upstream (`ServeHTTPWithETag`) compares `strconv.Quote(hash)` with the whole header value
/// for byte equality, so only a single, strong, quoted ETag equal to ours matches: not a list
/// (`"a", "b"`), not `*`, not a weak `W/"a"`, not an unquoted or differently-cased value.
/// Leading and trailing spaces/tabs are ignored (Go's header parsing drops them). `etag` may be
/// given quoted (the `ETag` header value) or bare (the hash, which must need no escaping, as
/// our hex hashes do); an empty hash never matches (upstream sends no ETag then).
pub fn etag_matches(if_none_match: Option<&[u8]>, etag: &str) -> bool {
    let Some(value) = if_none_match else {
        return false;
    };
    let value = trim_ows(value);
    let hash = etag
        .strip_prefix('"')
        .and_then(|e| e.strip_suffix('"'))
        .unwrap_or(etag)
        .as_bytes();
    if hash.is_empty() || value.len() != hash.len() + 2 {
        return false;
    }
    value.first() == Some(&b'"')
        && value.last() == Some(&b'"')
        && value.get(1..value.len() - 1) == Some(hash)
}

// ---------------------------------------------------------------------------------------------
// Parsing, as goautoneg does it.

/// One parsed `Accept` clause: borrowed pieces of the header.
#[derive(Debug, Clone, Copy)]
struct Clause<'a> {
    ty: &'a [u8],
    subtype: &'a [u8],
    q: f32,
    /// Everything after the first `;` (parameters, unparsed; may be empty).
    params: &'a [u8],
}

/// goautoneg's `nextSplitElement`: the part before the first `sep` and the rest after it, or
/// the whole input and nothing.
fn next_split(s: &[u8], sep: u8) -> (&[u8], &[u8]) {
    match s.iter().position(|&b| b == sep) {
        Some(i) => (
            s.get(..i).unwrap_or_default(),
            s.get(i + 1..).unwrap_or_default(),
        ),
        None => (s, &[]),
    }
}

fn trim_by(s: &[u8], strip: impl Fn(u8) -> bool) -> &[u8] {
    let start = s.iter().position(|&b| !strip(b)).unwrap_or(s.len());
    let end = s.iter().rposition(|&b| !strip(b)).map_or(start, |i| i + 1);
    s.get(start..end).unwrap_or_default()
}

/// goautoneg trims with `strings.TrimFunc(s, r == ' ')`: spaces only.
fn trim_spaces(s: &[u8]) -> &[u8] {
    trim_by(s, |b| b == b' ')
}

/// What Go's header parsing strips around a field value.
fn trim_ows(s: &[u8]) -> &[u8] {
    trim_by(s, |b| b == b' ' || b == b'\t')
}

/// Iterates `name=value` parameters as goautoneg does, yielding (trimmed name, raw value).
fn params(mut rest: &[u8]) -> impl Iterator<Item = (&[u8], &[u8])> {
    std::iter::from_fn(move || {
        while !rest.is_empty() {
            let (param, after) = next_split(rest, b';');
            rest = after;
            let (name, value_part) = next_split(param, b'=');
            if value_part.is_empty() {
                continue;
            }
            let (value, extra) = next_split(value_part, b'=');
            if !extra.is_empty() {
                continue;
            }
            return Some((trim_spaces(name), value));
        }
        None
    })
}

/// `strconv.ParseFloat(value, 32)` with the error dropped (0 on failure), as goautoneg does.
///
/// Rust's float grammar matches Go's for decimal input, `inf`/`infinity`/`nan` in any case and
/// overflow to ±infinity. Go refuses a sign before `NaN`; handled. Go also accepts hexadecimal
/// floats (`0x1p-1`) and `_` digit separators after a base prefix: those become 0 here.
fn parse_q(raw: &[u8]) -> f32 {
    let Ok(text) = std::str::from_utf8(raw) else {
        return 0.0;
    };
    let unsigned = text.strip_prefix(['+', '-']);
    if unsigned.is_some_and(|u| u.eq_ignore_ascii_case("nan")) {
        return 0.0;
    }
    text.parse::<f32>().unwrap_or(0.0)
}

fn parse_accept(header: &[u8]) -> Result<Vec<Clause<'_>>, NegotiationError> {
    let mut clauses: Vec<Clause<'_>> = Vec::new();
    let mut remaining = header;
    while !remaining.is_empty() {
        let (part, after) = next_split(remaining, b',');
        remaining = after;
        let part = trim_spaces(part);
        let (range, params_part) = next_split(part, b';');
        let (ty, after_slash) = next_split(range, b'/');
        let ty = trim_spaces(ty);
        let subtype: &[u8] = if after_slash.is_empty() {
            if ty != b"*" {
                continue;
            }
            b"*"
        } else {
            let (subtype, extra) = next_split(after_slash, b'/');
            if !extra.is_empty() {
                continue;
            }
            trim_spaces(subtype)
        };
        let mut q = 1.0_f32;
        for (name, value) in params(params_part) {
            if name == b"q" {
                q = parse_q(value);
            }
        }
        if clauses.len() >= MAX_CLAUSES {
            return Err(NegotiationError::TooManyClauses);
        }
        clauses.push(Clause {
            ty,
            subtype,
            q,
            params: params_part,
        });
    }
    sort_like_goautoneg(&mut clauses);
    Ok(clauses)
}

/// goautoneg's `Less`, verbatim (including its disregard of q for the wildcard rules).
fn goautoneg_less(a: &Clause<'_>, b: &Clause<'_>) -> bool {
    if a.q > b.q {
        return true;
    }
    if a.ty != b"*" && b.ty == b"*" {
        return true;
    }
    a.subtype != b"*" && b.subtype == b"*"
}

/// Go's `insertionSort`, which `sort.Sort` runs for up to 12 elements.
fn sort_like_goautoneg(clauses: &mut [Clause<'_>]) {
    for i in 1..clauses.len() {
        let mut j = i;
        while j > 0 {
            let swap = match (clauses.get(j), clauses.get(j - 1)) {
                (Some(cur), Some(prev)) => goautoneg_less(cur, prev),
                _ => false,
            };
            if !swap {
                break;
            }
            clauses.swap(j, j - 1);
            j -= 1;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Matching, as k8s.io/apiserver's negotiation does it.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Encoding {
    Json,
    Yaml,
    Protobuf,
}

/// A media type kube-apiserver serves discovery in.
struct Served {
    ty: &'static [u8],
    subtype: &'static [u8],
    encoding: Encoding,
    /// Has a stream serializer (`stream=watch` is accepted).
    stream: bool,
}

/// `CodecFactory.SupportedMediaTypes()`, in order: JSON, YAML, protobuf. CBOR is served only
/// with the alpha `CBORServingAndStorage` gate (off by default) and is not listed.
const SERVED: [Served; 3] = [
    Served {
        ty: b"application",
        subtype: b"json",
        encoding: Encoding::Json,
        stream: true,
    },
    Served {
        ty: b"application",
        subtype: b"yaml",
        encoding: Encoding::Yaml,
        stream: false,
    },
    Served {
        ty: b"application",
        subtype: b"vnd.kubernetes.protobuf",
        encoding: Encoding::Protobuf,
        stream: true,
    },
];

/// `NegotiateMediaTypeOptions`' match of a clause against a served type.
fn clause_matches(clause: &Clause<'_>, served: &Served) -> bool {
    (clause.ty == served.ty && (clause.subtype == served.subtype || clause.subtype == b"*"))
        || (clause.ty == b"*" && clause.subtype == b"*")
}

/// The parameters `acceptMediaTypeOptions` looks at (last occurrence wins, like a Go map).
#[derive(Debug, Clone, Copy, Default)]
struct ClauseOptions<'a> {
    group: Option<&'a [u8]>,
    version: Option<&'a [u8]>,
    kind: Option<&'a [u8]>,
    stream: &'a [u8],
    server_version: &'a [u8],
    profile: &'a [u8],
}

impl<'a> ClauseOptions<'a> {
    fn read(raw: &'a [u8]) -> Self {
        let mut options = ClauseOptions::default();
        for (name, value) in params(raw) {
            let value = trim_spaces(value);
            match name {
                b"g" => options.group = Some(value),
                b"v" => options.version = Some(value),
                b"as" => options.kind = Some(value),
                b"stream" => options.stream = value,
                b"sv" => options.server_version = value,
                b"profile" => options.profile = value,
                // `q` is goautoneg's; `pretty`, `export` and unknown names change nothing here.
                _ => {}
            }
        }
        options
    }

    /// `options.Convert != nil`: any of `g`, `v`, `as` was given.
    fn converts(&self) -> bool {
        self.group.is_some() || self.version.is_some() || self.kind.is_some()
    }
}

/// Which handler's `EndpointRestrictions` apply.
#[derive(Debug, Clone, Copy)]
enum Restriction {
    /// `aggregated.DiscoveryEndpointRestrictions`: only the aggregated discovery GVK.
    Discovery { v2beta1: bool },
    /// `negotiation.DefaultEndpointRestrictions`: no conversion at all.
    Legacy,
}

/// An acceptable (clause, served type) pair.
#[derive(Debug, Clone, Copy)]
struct Pick {
    format: DiscoveryFormat,
    nopeer: bool,
    encoding: Encoding,
}

/// `acceptMediaTypeOptions` followed by the restriction's `AllowsMediaTypeTransform`.
fn accept_pair(
    options: &ClauseOptions<'_>,
    served: &Served,
    restriction: Restriction,
) -> Option<Pick> {
    // AllowsStreamSchema is `s == "watch"` for both restrictions.
    if !options.stream.is_empty() && (!served.stream || options.stream != b"watch") {
        return None;
    }
    // AllowsServerVersion is false for both restrictions.
    if !options.server_version.is_empty() {
        return None;
    }
    match restriction {
        Restriction::Discovery { v2beta1 } => {
            if !options.converts()
                || options.group.unwrap_or_default() != APIDISCOVERY_GROUP
                || options.kind.unwrap_or_default() != APIDISCOVERY_KIND
            {
                return None;
            }
            let format = match options.version.unwrap_or_default() {
                b"v2" => DiscoveryFormat::AggregatedV2,
                b"v2beta1" if v2beta1 => DiscoveryFormat::AggregatedV2Beta1,
                _ => return None,
            };
            Some(Pick {
                format,
                nopeer: options.profile == NOPEER,
                encoding: served.encoding,
            })
        }
        Restriction::Legacy => (!options.converts()).then_some(Pick {
            format: DiscoveryFormat::Legacy,
            nopeer: false,
            encoding: served.encoding,
        }),
    }
}

/// Every acceptable pair, in the order `NegotiateMediaTypeOptions` tries them.
fn picks<'c>(
    clauses: &'c [Clause<'c>],
    restriction: Restriction,
) -> impl Iterator<Item = Pick> + 'c {
    clauses.iter().flat_map(move |clause| {
        let options = ClauseOptions::read(clause.params);
        SERVED
            .iter()
            .filter(move |served| clause_matches(clause, served))
            .filter_map(move |served| accept_pair(&options, served, restriction))
    })
}

/// Upstream's winner is the first pick; if it is not JSON, the first JSON pick for the same
/// document (same format kind and `nopeer`) lets us answer anyway.
fn decide(mut picks: impl Iterator<Item = Pick>) -> Option<DiscoveryRequest> {
    let first = picks.next()?;
    let protobuf = first.encoding == Encoding::Protobuf;
    let chosen = if first.encoding == Encoding::Json {
        Some(first)
    } else {
        picks.find(|p| p.encoding == Encoding::Json && p.nopeer == first.nopeer)
    };
    Some(match chosen {
        Some(json) => DiscoveryRequest {
            format: json.format,
            nopeer: json.nopeer,
            protobuf,
            json: true,
        },
        None => DiscoveryRequest {
            format: first.format,
            nopeer: first.nopeer,
            protobuf,
            json: false,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::DiscoveryFormat::{AggregatedV2 as V2, AggregatedV2Beta1 as V2B1, Legacy};
    use super::*;

    const AGG_V2: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";
    const AGG_V2B1: &str =
        "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList";
    const AGG_V2_NOPEER: &str =
        "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList;profile=nopeer";
    const PB_V2: &str =
        "application/vnd.kubernetes.protobuf;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";
    const PB_V2B1: &str = "application/vnd.kubernetes.protobuf;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList";

    /// Expected outcome: (format, nopeer, protobuf, json).
    fn ok(
        format: DiscoveryFormat,
        nopeer: bool,
        protobuf: bool,
        json: bool,
    ) -> Result<DiscoveryRequest, NegotiationError> {
        Ok(DiscoveryRequest {
            format,
            nopeer,
            protobuf,
            json,
        })
    }

    fn json(format: DiscoveryFormat) -> Result<DiscoveryRequest, NegotiationError> {
        ok(format, false, false, true)
    }

    const NOT_ACCEPTABLE: Result<DiscoveryRequest, NegotiationError> =
        Err(NegotiationError::NotAcceptable);

    fn check(cases: &[(&str, String, Result<DiscoveryRequest, NegotiationError>)]) {
        for (name, accept, want) in cases {
            let got = negotiate_discovery(Some(accept.as_bytes()));
            assert_eq!(&got, want, "{name}: Accept {accept:?}");
        }
    }

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn real_clients() {
        check(&[
            (
                "client-go 1.30+ (AcceptV2, AcceptV2Beta1, AcceptV1)",
                format!("{AGG_V2},{AGG_V2B1},application/json"),
                json(V2),
            ),
            (
                "kubectl/client-go 1.37 as given in the brief",
                format!("{AGG_V2},{AGG_V2B1},application/json;q=0.9"),
                json(V2),
            ),
            (
                "client-go after v2beta1 removal (AcceptV2, AcceptV1)",
                format!("{AGG_V2},application/json"),
                json(V2),
            ),
            (
                "client-go NoPeerDiscovery / skewgate control plane",
                format!("{AGG_V2_NOPEER},{AGG_V2},{AGG_V2B1},application/json"),
                ok(V2, true, false, true),
            ),
            (
                "protobuf first: upstream answers protobuf, the client also takes JSON v2",
                format!("{PB_V2},{AGG_V2},{PB_V2B1},{AGG_V2B1},application/json;q=0.9"),
                ok(V2, false, true, true),
            ),
            (
                "client-go 1.26-1.29: v2beta1 only",
                format!("{AGG_V2B1},application/json"),
                json(V2B1),
            ),
            (
                "kubectl 1.20",
                "application/json, */*".to_owned(),
                json(Legacy),
            ),
            (
                "client-go legacy-only discovery",
                "application/json".to_owned(),
                json(Legacy),
            ),
        ]);
        assert_eq!(negotiate_discovery(None), json(Legacy), "no Accept header");
        assert_eq!(negotiate_discovery(Some(b"")), json(Legacy), "empty Accept");
        assert_eq!(
            negotiate_discovery(Some(b" \t ")),
            json(Legacy),
            "blank Accept"
        );
    }

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn aggregated_beats_plain_json_whatever_q() {
        check(&[
            (
                "aggregated q=0.001 vs plain json q=1",
                format!("application/json,{AGG_V2};q=0.001"),
                json(V2),
            ),
            (
                "aggregated q=0 still wins (goautoneg keeps q=0 clauses, upstream serves it)",
                format!("application/json;q=1,{AGG_V2};q=0"),
                json(V2),
            ),
            ("q=0 aggregated alone", format!("{AGG_V2};q=0"), json(V2)),
            (
                "higher q picks v2beta1",
                format!("{AGG_V2};q=0.5,{AGG_V2B1};q=0.8"),
                json(V2B1),
            ),
            (
                "equal q keeps the client's order (v2beta1 first)",
                format!("{AGG_V2B1},{AGG_V2}"),
                json(V2B1),
            ),
            (
                "equal q keeps the client's order (v2 first)",
                format!("{AGG_V2};q=0.9,{AGG_V2B1};q=0.9"),
                json(V2),
            ),
            (
                "q above 1 sorts first",
                format!("{AGG_V2},{AGG_V2B1};q=1.5"),
                json(V2B1),
            ),
            (
                "unparsable q is 0",
                format!("{AGG_V2B1};q=abc,{AGG_V2};q=0.1"),
                json(V2),
            ),
            (
                "a space after q= makes it 0",
                format!("{AGG_V2B1};q= 0.9,{AGG_V2};q=0.1"),
                json(V2),
            ),
            (
                "upper-case Q is just an unknown parameter",
                format!("{AGG_V2B1};Q=0.1,{AGG_V2};q=0.9"),
                json(V2B1),
            ),
            (
                "q=NaN compares false both ways: stays in place",
                format!("{AGG_V2B1};q=NaN,{AGG_V2}"),
                json(V2B1),
            ),
            (
                "q=+nan is a Go syntax error: 0",
                format!("{AGG_V2B1};q=+nan,{AGG_V2};q=0.1"),
                json(V2),
            ),
            (
                "q overflow is +Inf",
                format!("{AGG_V2},{AGG_V2B1};q=1e99"),
                json(V2B1),
            ),
        ]);
    }

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn parameters_and_spelling() {
        check(&[
            (
                "reordered parameters",
                "application/json;as=APIGroupDiscoveryList;v=v2;g=apidiscovery.k8s.io".to_owned(),
                json(V2),
            ),
            (
                "spaces around everything",
                "  application/json ; g = apidiscovery.k8s.io ;v=v2 ; as=APIGroupDiscoveryList ,  application/json ".to_owned(),
                json(V2),
            ),
            (
                "tab before a name: unknown name, g missing, refused by both handlers",
                "application/json;\tg=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList".to_owned(),
                NOT_ACCEPTABLE,
            ),
            (
                "upper-case type does not match (406)",
                "Application/JSON;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList".to_owned(),
                NOT_ACCEPTABLE,
            ),
            (
                "upper-case names are unknown parameters: plain JSON",
                "application/json;G=apidiscovery.k8s.io;V=v2;AS=APIGroupDiscoveryList".to_owned(),
                json(Legacy),
            ),
            (
                "upper-case group value: conversion refused by both handlers",
                "application/json;g=APIDISCOVERY.K8S.IO;v=v2;as=APIGroupDiscoveryList".to_owned(),
                NOT_ACCEPTABLE,
            ),
            (
                "quoted values are not unquoted",
                "application/json;g=\"apidiscovery.k8s.io\";v=\"v2\";as=\"APIGroupDiscoveryList\",application/json".to_owned(),
                json(Legacy),
            ),
            (
                "quoted nopeer is not nopeer",
                format!("{AGG_V2};profile=\"nopeer\""),
                json(V2),
            ),
            (
                "a comma inside quotes splits the clause",
                format!("{AGG_V2};profile=\"a,b\""),
                json(V2),
            ),
            (
                "unknown profile is ignored (peer-aggregated)",
                format!("{AGG_V2};profile=foo"),
                json(V2),
            ),
            (
                "NOPEER is not nopeer",
                format!("{AGG_V2};profile=NOPEER"),
                json(V2),
            ),
            (
                "profile before the others",
                "application/json;profile=nopeer;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList".to_owned(),
                ok(V2, true, false, true),
            ),
            (
                "last duplicate wins",
                format!("{AGG_V2};profile=nopeer;profile=x"),
                json(V2),
            ),
            (
                "duplicate v: last wins",
                "application/json;g=apidiscovery.k8s.io;v=v1;as=APIGroupDiscoveryList;v=v2".to_owned(),
                json(V2),
            ),
            (
                "unknown and pretty parameters are ignored",
                format!("{AGG_V2};pretty=1;charset=utf-8;x-foo=bar"),
                json(V2),
            ),
            ("stream=watch is allowed on JSON", format!("{AGG_V2};stream=watch"), json(V2)),
            (
                "other stream values refuse the clause",
                format!("{AGG_V2};stream=foo,{AGG_V2B1}"),
                json(V2B1),
            ),
            (
                "sv refuses the clause",
                format!("{AGG_V2};sv=v1,{AGG_V2B1}"),
                json(V2B1),
            ),
            (
                "missing as: refused by both handlers",
                "application/json;g=apidiscovery.k8s.io;v=v2".to_owned(),
                NOT_ACCEPTABLE,
            ),
            (
                "unknown version",
                "application/json;g=apidiscovery.k8s.io;v=v3;as=APIGroupDiscoveryList,application/json".to_owned(),
                json(Legacy),
            ),
            (
                "a conversion to another kind is refused by legacy too",
                "application/json;as=Table;v=v1;g=meta.k8s.io".to_owned(),
                NOT_ACCEPTABLE,
            ),
            (
                "empty g= is dropped by goautoneg (v, as still convert)",
                "application/json;g=;v=v2;as=APIGroupDiscoveryList,application/json".to_owned(),
                json(Legacy),
            ),
            (
                "a=b=c parameter is dropped",
                "application/json;g=apidiscovery.k8s.io=x;v=v2;as=APIGroupDiscoveryList,application/json".to_owned(),
                json(Legacy),
            ),
        ]);
    }

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn encodings_and_wildcards() {
        check(&[
            ("*/*", "*/*".to_owned(), json(Legacy)),
            ("bare *", "*".to_owned(), json(Legacy)),
            ("application/*", "application/*".to_owned(), json(Legacy)),
            ("yaml", "application/yaml".to_owned(), ok(Legacy, false, false, false)),
            (
                "protobuf only",
                "application/vnd.kubernetes.protobuf".to_owned(),
                ok(Legacy, false, true, false),
            ),
            (
                "protobuf, then JSON",
                "application/vnd.kubernetes.protobuf,application/json".to_owned(),
                ok(Legacy, false, true, true),
            ),
            (
                "protobuf, then anything",
                "application/vnd.kubernetes.protobuf, */*".to_owned(),
                ok(Legacy, false, true, true),
            ),
            ("text/html", "text/html".to_owned(), NOT_ACCEPTABLE),
            ("text/*", "text/*;q=0.5".to_owned(), NOT_ACCEPTABLE),
            (
                "*/* with the aggregated GVK means JSON",
                "*/*;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList".to_owned(),
                json(V2),
            ),
            (
                "application/* with the aggregated GVK means JSON",
                "application/*;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList".to_owned(),
                json(V2B1),
            ),
            (
                "aggregated protobuf only: forward",
                PB_V2.to_owned(),
                ok(V2, false, true, false),
            ),
            (
                "aggregated protobuf, JSON at lower q: JSON acceptable",
                format!("{PB_V2},{AGG_V2};q=0.5"),
                ok(V2, false, true, true),
            ),
            (
                "aggregated protobuf v2, JSON only v2beta1",
                format!("{PB_V2},{AGG_V2B1}"),
                ok(V2B1, false, true, true),
            ),
            (
                "aggregated protobuf, plain JSON does not count",
                format!("{PB_V2},application/json"),
                ok(V2, false, true, false),
            ),
            (
                "protobuf nopeer, JSON without nopeer: different document, forward",
                format!("{PB_V2};profile=nopeer,{AGG_V2}"),
                ok(V2, true, true, false),
            ),
            (
                "protobuf nopeer, JSON nopeer",
                format!("{PB_V2};profile=nopeer,{AGG_V2},{AGG_V2_NOPEER}"),
                ok(V2, true, true, true),
            ),
            (
                "aggregated YAML only",
                "application/yaml;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList".to_owned(),
                ok(V2, false, false, false),
            ),
            (
                "YAML has no stream serializer",
                "application/yaml;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList;stream=watch,application/json".to_owned(),
                json(Legacy),
            ),
            (
                "concrete type sorts before */* at equal q",
                format!("*/*;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,{AGG_V2}"),
                json(V2),
            ),
            (
                "goautoneg quirk: */* first in input moves behind a lower-q concrete clause",
                format!("*/*;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,{AGG_V2};q=0.5"),
                json(V2),
            ),
            (
                "goautoneg quirk: the other input order sorts by q",
                format!("{AGG_V2};q=0.5,*/*;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList"),
                json(V2B1),
            ),
        ]);
    }

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn v2beta1_can_be_turned_off() {
        let newer = NegotiationOptions { v2beta1: false };
        let cases = [
            (format!("{AGG_V2B1},application/json"), json(Legacy)),
            (format!("{AGG_V2B1};q=1,{AGG_V2};q=0.1"), json(V2)),
            (AGG_V2B1.to_owned(), NOT_ACCEPTABLE),
            (format!("{AGG_V2},{AGG_V2B1},application/json"), json(V2)),
        ];
        for (accept, want) in cases {
            assert_eq!(
                negotiate_discovery_with(Some(accept.as_bytes()), newer),
                want,
                "{accept}"
            );
        }
    }

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn garbage_never_panics() {
        let mut huge_list = (0..MAX_CLAUSES)
            .map(|_| "application/json")
            .collect::<Vec<_>>();
        let at_cap = huge_list.join(",");
        huge_list.push("application/json");
        let over_cap = huge_list.join(",");
        check(&[
            (";;;,,,", ";;;,,,".to_owned(), NOT_ACCEPTABLE),
            (
                "q=abc on plain json",
                "application/json;q=abc".to_owned(),
                json(Legacy),
            ),
            ("8 KiB of commas", ",".repeat(8192), NOT_ACCEPTABLE),
            (
                "8 KiB of commas around a clause",
                format!("{}{AGG_V2}{}", ",".repeat(4096), ",".repeat(4096)),
                json(V2),
            ),
            ("slashes", "///,a/b/c,/".to_owned(), NOT_ACCEPTABLE),
            (
                "only parameters",
                ";g=apidiscovery.k8s.io".to_owned(),
                NOT_ACCEPTABLE,
            ),
            (
                "equals signs",
                "application/json;==;=;a==b".to_owned(),
                json(Legacy),
            ),
            ("clauses up to the cap", at_cap, json(Legacy)),
            (
                "one clause too many",
                over_cap,
                Err(NegotiationError::TooManyClauses),
            ),
            (
                "8 KiB of semicolons",
                format!("application/json{}", ";".repeat(8192)),
                json(Legacy),
            ),
        ]);
        let non_utf8: [(&[u8], _); 4] = [
            (b"\xff\xfe/\x80;g=apidiscovery.k8s.io", NOT_ACCEPTABLE),
            (b"application/json;q=\xff", json(Legacy)),
            (
                b"application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList;x=\xff\xfe",
                json(V2),
            ),
            (b"\x00\x01\x02,application/json", json(Legacy)),
        ];
        for (accept, want) in non_utf8 {
            assert_eq!(negotiate_discovery(Some(accept)), want, "{accept:?}");
        }
        // A deterministic stream of noisy headers built from Accept-ish pieces and raw bytes:
        // none may panic, and every answer must be self-consistent.
        let pieces: [&[u8]; 16] = [
            b",",
            b";",
            b"=",
            b"/",
            b"*",
            b" ",
            b"\t",
            b"\"",
            b"q=0.5",
            b"q=0",
            b"application",
            b"json",
            b"g=apidiscovery.k8s.io",
            b"v=v2",
            b"as=APIGroupDiscoveryList",
            b"\xff",
        ];
        let mut state: u64 = 0x2545_f491_4f6c_dd1d;
        for _ in 0..2000 {
            let mut header = Vec::new();
            for _ in 0..(state % 40) {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let index = usize::try_from(state % 16).unwrap();
                header.extend_from_slice(pieces[index]);
            }
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            if let Ok(found) = negotiate_discovery(Some(&header)) {
                if found.format == Legacy {
                    assert!(!found.nopeer, "{header:?}");
                }
                if found.json {
                    let _ = aggregated_content_type(found.format);
                }
            }
        }
    }

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn peer_aggregated_only_for_v2_without_nopeer() {
        let v2 = negotiate_discovery(Some(AGG_V2.as_bytes())).unwrap();
        assert!(v2.peer_aggregated());
        let nopeer = negotiate_discovery(Some(AGG_V2_NOPEER.as_bytes())).unwrap();
        assert!(!nopeer.peer_aggregated());
        let beta = format!("{AGG_V2B1};profile=foo");
        let beta = negotiate_discovery(Some(beta.as_bytes())).unwrap();
        assert!(!beta.peer_aggregated());
        let legacy = negotiate_discovery(None).unwrap();
        assert!(!legacy.peer_aggregated());
    }

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn content_types() {
        assert_eq!(aggregated_content_type(V2), AGG_V2);
        assert_eq!(aggregated_content_type(V2B1), AGG_V2B1);
        assert_eq!(aggregated_content_type(Legacy), "application/json");
        for format in [V2, V2B1] {
            assert!(!aggregated_content_type(format).contains("profile"));
        }
    }

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn if_none_match_is_exact() {
        let etag = "\"0A1B2C\"";
        let cases: [(Option<&[u8]>, &str, bool); 17] = [
            (Some(b"\"0A1B2C\""), etag, true),
            (Some(b"\"0A1B2C\""), "0A1B2C", true),
            (Some(b"  \"0A1B2C\"\t"), etag, true),
            (None, etag, false),
            (Some(b""), etag, false),
            (Some(b"0A1B2C"), etag, false),
            (Some(b"\"0a1b2c\""), etag, false),
            (Some(b"W/\"0A1B2C\""), etag, false),
            (Some(b"\"0A1B2C\", \"FFFF\""), etag, false),
            (Some(b"\"FFFF\", \"0A1B2C\""), etag, false),
            (Some(b"*"), etag, false),
            (Some(b"\"0A1B2C"), etag, false),
            (Some(b"\"\""), "", false),
            (Some(b"\"\""), "\"\"", false),
            (Some(b"\"\xff\""), etag, false),
            (Some(b"\""), "\"", false),
            (Some(b"\"0A1B2C\""), "\"0A1B2C", false),
        ];
        for (header, ours, want) in cases {
            assert_eq!(etag_matches(header, ours), want, "{header:?} vs {ours:?}");
        }
    }
}
