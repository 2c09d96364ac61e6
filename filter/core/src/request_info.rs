//! Request parsing identical to kube-apiserver's `RequestInfoFactory.NewRequestInfo`
//! (`k8s.io/apiserver/pkg/endpoints/request/requestinfo.go`) with `APIPrefixes = {api, apis}` and
//! `GrouplessAPIPrefixes = {api}`, as served by the 1.30-1.33 apiservers.
//!
//! Upstream reads three things Envoy hands us in one `:path`:
//!
//! * `req.URL.Path`, the **percent-decoded** path (Go's `url.ParseRequestURI`): `%2F` becomes a
//!   `/` before the path is split, `+` stays `+`, a `%` not followed by two hex digits makes Go's
//!   HTTP server answer 400 ([`RequestInfoError::InvalidEscape`]). `..` is not cleaned, `#` is an
//!   ordinary character, `//` yields empty segments.
//! * `req.Method`, case-sensitively (`get` is not `GET`).
//! * `req.URL.Query()`, only for a nameless `get`, to tell `list` from `watch` and to take the name
//!   from a `fieldSelector=metadata.name=...`. Upstream decodes the whole `metav1.ListOptions`;
//!   when anything in it fails to decode (an unparseable `labelSelector` or `fieldSelector`, a
//!   `limit` or `timeoutSeconds` that is not an int64) it falls back to reading `watch` alone and
//!   takes no name. Both paths are reproduced here, including their slightly different tests for
//!   "false" (`strings.EqualFold` vs `strings.ToLower`).
//!
//! Known, deliberate divergences (none reachable through Envoy, which only forwards origin-form
//! targets and `*`):
//!
//! * An absolute-form target (`http://host/path`) is parsed by Go; here it is
//!   [`RequestInfoError::InvalidRequestTarget`], so the filter hands it to the local apiserver.
//! * Go releases carrying the `urlmaxqueryparams` limit (a recent security fix, default 10000
//!   parameters, on only for main modules declaring go >= 1.24) drop a longer query entirely;
//!   this parser has no such limit, like the Go that builds 1.30-1.32.
//! * `OPTIONS *` never reaches kube's handlers (Go's server answers it); here it is the
//!   non-resource request `NewRequestInfo` would make of it.
//! * Decoded bytes that are not UTF-8 are kept lossily (U+FFFD); such a name matches nothing.

use std::borrow::Cow;
use std::fmt;

/// What kube-apiserver's RequestInfo says about a request. Field names follow upstream.
///
/// Borrowed from the request target: a path without escapes (every path a client sends in
/// practice) is parsed without one allocation per field; a path with escapes is decoded into
/// an owned copy, and so are its fields ([`RequestInfo::into_owned`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RequestInfo<'a> {
    pub is_resource_request: bool,
    /// The percent-decoded path, as Go's `URL.Path`.
    pub path: Cow<'a, str>,
    /// Nearly always one of the verbs kube-apiserver names, which need no allocation.
    pub verb: Cow<'static, str>,
    /// `api` or `apis` (or empty).
    pub api_prefix: &'static str,
    pub api_group: Cow<'a, str>,
    pub api_version: Cow<'a, str>,
    pub namespace: Cow<'a, str>,
    pub resource: Cow<'a, str>,
    pub subresource: Cow<'a, str>,
    /// From the path, or decoded from a `fieldSelector` in the query.
    pub name: Cow<'a, str>,
    pub parts: Vec<Cow<'a, str>>,
}

impl RequestInfo<'_> {
    /// The same, owning every string: for a path that had to be decoded first.
    pub fn into_owned(self) -> RequestInfo<'static> {
        let own = |s: Cow<'_, str>| Cow::Owned(s.into_owned());
        RequestInfo {
            is_resource_request: self.is_resource_request,
            path: own(self.path),
            verb: self.verb,
            api_prefix: self.api_prefix,
            api_group: own(self.api_group),
            api_version: own(self.api_version),
            namespace: own(self.namespace),
            resource: own(self.resource),
            subresource: own(self.subresource),
            name: own(self.name),
            parts: self.parts.into_iter().map(own).collect(),
        }
    }

    /// kube-apiserver's long-running check (`BasicLongRunningRequestCheck` with the verbs
    /// `watch`, `proxy` and the subresources `attach`, `exec`, `proxy`, `log`, `portforward`,
    /// and the profiler's `/debug/pprof/` paths, whose `?seconds=` may ask for minutes): these
    /// run for as long as they last and get no request timeout; everything else is bounded by
    /// the apiserver's `--request-timeout`, and so by ours.
    pub fn is_long_running(&self) -> bool {
        matches!(&*self.verb, "watch" | "proxy")
            || (self.is_resource_request
                && matches!(
                    &*self.subresource,
                    "attach" | "exec" | "proxy" | "log" | "portforward"
                ))
            || (!self.is_resource_request && self.path.starts_with("/debug/pprof/"))
    }
}

/// Why a request could not be parsed. kube-apiserver answers these itself (400 from Go's HTTP
/// server for a bad escape, 500 "failed to create RequestInfo" for the rest), so the filter
/// sends them to the local apiserver and lets it say so.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestInfoError {
    /// `%` not followed by two hex digits in the path.
    InvalidEscape,
    /// `/api/v1/watch` or `/apis/g/v/proxy` with nothing after the verb.
    MissingResourceAfterVerb,
    /// A request-target Go's HTTP server refuses (400) before any handler runs: empty, containing
    /// a control byte (< 0x20 or 0x7f), or neither starting with `/` nor exactly `*`.
    InvalidRequestTarget,
}

impl fmt::Display for RequestInfoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RequestInfoError::InvalidEscape => "invalid URL escape in the request path",
            RequestInfoError::MissingResourceAfterVerb => {
                "unable to determine kind and namespace from url"
            }
            RequestInfoError::InvalidRequestTarget => "invalid request target",
        })
    }
}

impl std::error::Error for RequestInfoError {}

/// `RequestInfoFactory.APIPrefixes`.
const API_PREFIXES: [&str; 2] = ["api", "apis"];
/// `RequestInfoFactory.GrouplessAPIPrefixes`.
const GROUPLESS_API_PREFIXES: [&str; 1] = ["api"];
/// `specialVerbs`.
const SPECIAL_VERBS: [&str; 2] = ["proxy", "watch"];
/// `specialVerbsNoSubresources`.
const SPECIAL_VERBS_NO_SUBRESOURCES: [&str; 1] = ["proxy"];
/// `namespaceSubresources`.
const NAMESPACE_SUBRESOURCES: [&str; 2] = ["status", "finalize"];

/// `method` is the HTTP method, `path_and_query` Envoy's `:path`.
pub fn parse<'a>(
    method: &str,
    path_and_query: &'a str,
) -> Result<RequestInfo<'a>, RequestInfoError> {
    let (raw_path, raw_query) = split_request_target(path_and_query)?;
    match percent_decode(raw_path, false).ok_or(RequestInfoError::InvalidEscape)? {
        Cow::Borrowed(path) => parse_decoded(method, path, raw_query),
        Cow::Owned(path) => {
            let info = parse_decoded(method, &path, raw_query)?;
            // The decoded copy becomes the path; only the fields are copied out of it.
            let mut owned = RequestInfo {
                path: Cow::Borrowed(""),
                ..info
            }
            .into_owned();
            owned.path = Cow::Owned(path);
            Ok(owned)
        }
    }
}

/// `NewRequestInfo` on the decoded path, borrowing from it.
fn parse_decoded<'a>(
    method: &str,
    path: &'a str,
    raw_query: &str,
) -> Result<RequestInfo<'a>, RequestInfoError> {
    let mut info = RequestInfo {
        path: Cow::Borrowed(path),
        ..RequestInfo::default()
    };
    fill(&mut info, method, path, raw_query)?;
    Ok(info)
}

/// `NewRequestInfo` minus `Path`, which the caller set.
fn fill<'a>(
    info: &mut RequestInfo<'a>,
    method: &str,
    path: &'a str,
    raw_query: &str,
) -> Result<(), RequestInfoError> {
    // Start with a non-resource request until proven otherwise.
    info.verb = lower_method(method);

    let segments = split_path(path);
    let mut current: &[&str] = &segments;
    if current.len() < 3 {
        return Ok(());
    }
    let Some((&prefix, rest)) = current.split_first() else {
        return Ok(());
    };
    let Some(&prefix) = API_PREFIXES.iter().find(|&&p| p == prefix) else {
        return Ok(());
    };
    info.api_prefix = prefix;
    current = rest;

    if !GROUPLESS_API_PREFIXES.contains(&prefix) {
        // One part (the prefix) is consumed already: "do we have four parts?"
        if current.len() < 3 {
            return Ok(());
        }
        let Some((&group, rest)) = current.split_first() else {
            return Ok(());
        };
        info.api_group = Cow::Borrowed(group);
        current = rest;
    }

    info.is_resource_request = true;
    let Some((&version, rest)) = current.split_first() else {
        return Ok(());
    };
    info.api_version = Cow::Borrowed(version);
    current = rest;

    // Input of the form /{specialVerb}/*
    let special = current
        .split_first()
        .and_then(|(&verb, rest)| Some((*SPECIAL_VERBS.iter().find(|&&v| v == verb)?, rest)));
    match special {
        Some((verb, rest)) => {
            if rest.is_empty() {
                return Err(RequestInfoError::MissingResourceAfterVerb);
            }
            info.verb = Cow::Borrowed(verb);
            current = rest;
        }
        None => info.verb = Cow::Borrowed(verb_for_method(method)),
    }

    // URL forms: /namespaces/{namespace}/{kind}/*, where parts are adjusted to be relative to kind.
    if current.first() == Some(&"namespaces") {
        if let Some(&namespace) = current.get(1) {
            info.namespace = Cow::Borrowed(namespace);
            // Another step after the namespace name that is not a namespace subresource is a
            // resource in its own right.
            if let Some(next) = current.get(2) {
                if !NAMESPACE_SUBRESOURCES.contains(next) {
                    current = current.get(2..).unwrap_or_default();
                }
            }
        }
    } else {
        info.namespace = Cow::Borrowed("");
    }

    info.parts = current.iter().map(|&part| Cow::Borrowed(part)).collect();

    // Parts look like: resource/resourceName/subresource/other/stuff/we/don't/interpret
    if !SPECIAL_VERBS_NO_SUBRESOURCES.contains(&&*info.verb) {
        if let Some(&subresource) = current.get(2) {
            info.subresource = Cow::Borrowed(subresource);
        }
    }
    if let Some(&name) = current.get(1) {
        info.name = Cow::Borrowed(name);
    }
    if let Some(&resource) = current.first() {
        info.resource = Cow::Borrowed(resource);
    }

    // No name on a get: the actual verb is list or watch.
    if info.name.is_empty() && info.verb == "get" {
        let (watch, name) = ListQuery::parse(raw_query).watch_and_name();
        info.verb = Cow::Borrowed(if watch { "watch" } else { "list" });
        if let Some(name) = name {
            info.name = Cow::Owned(name);
        }
    }
    // No name on a delete: the actual verb is deletecollection.
    if info.name.is_empty() && info.verb == "delete" {
        info.verb = Cow::Borrowed("deletecollection");
    }
    Ok(())
}

/// The `switch req.Method` of upstream: exact, case-sensitive.
fn verb_for_method(method: &str) -> &'static str {
    match method {
        "POST" => "create",
        "GET" | "HEAD" => "get",
        "PUT" => "update",
        "PATCH" => "patch",
        "DELETE" => "delete",
        _ => "",
    }
}

/// The verb of a non-resource request: the method in lower case, without an allocation for the
/// methods clients send.
fn lower_method(method: &str) -> Cow<'static, str> {
    Cow::Borrowed(match method {
        "GET" => "get",
        "HEAD" => "head",
        "POST" => "post",
        "PUT" => "put",
        "PATCH" => "patch",
        "DELETE" => "delete",
        "OPTIONS" => "options",
        _ => return Cow::Owned(go_to_lower(method)),
    })
}

/// Go's `strings.ToLower` (simple, per-rune lowercase mapping).
fn go_to_lower(s: &str) -> String {
    if s.is_ascii() {
        return s.to_ascii_lowercase();
    }
    s.chars()
        .map(|c| {
            if c == '\u{130}' {
                // Go's unicode.ToLower('İ') is 'i'; Rust's full mapping adds a combining dot.
                return 'i';
            }
            let mut lower = c.to_lowercase();
            match (lower.next(), lower.next()) {
                (Some(l), None) => l,
                _ => c,
            }
        })
        .collect()
}

/// The part of Go's `url.ParseRequestURI` that applies to an origin-form target: reject what it
/// rejects, split off the raw query at the first `?`.
fn split_request_target(target: &str) -> Result<(&str, &str), RequestInfoError> {
    // stringContainsCTLByte, then the "empty url" check.
    if target.is_empty() || target.bytes().any(|b| b < b' ' || b == 0x7f) {
        return Err(RequestInfoError::InvalidRequestTarget);
    }
    // `OPTIONS *`: Go sets Path to "*" and stops.
    if target == "*" {
        return Ok(("*", ""));
    }
    // No scheme (a leading '/' is never one) and no leading '/': "invalid URI for request".
    // With a scheme Go would parse an absolute-form target; see the module docs.
    if !target.starts_with('/') {
        return Err(RequestInfoError::InvalidRequestTarget);
    }
    Ok(target.split_once('?').unwrap_or((target, "")))
}

/// Upstream `splitPath`: `strings.Trim(path, "/")`, then `strings.Split(path, "/")`.
fn split_path(path: &str) -> Vec<&str> {
    let trimmed = path.trim_matches('/');
    if trimmed.is_empty() {
        return Vec::new();
    }
    // One pass over the bytes, the vector sized from a first count: collecting a split would
    // search for each slash apart and grow the vector by doubling.
    let mut segments = Vec::with_capacity(trimmed.bytes().filter(|&b| b == b'/').count() + 1);
    let mut start = 0;
    for (at, byte) in trimmed.bytes().enumerate() {
        if byte == b'/' {
            // On char boundaries: `/` is ASCII, never inside a multi-byte character.
            segments.push(trimmed.get(start..at).unwrap_or_default());
            start = at + 1;
        }
    }
    segments.push(trimmed.get(start..).unwrap_or_default());
    segments
}

fn unhex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Go's `url.unescape` in `encodePath` mode (`query == false`: `+` stays `+`) or in
/// `encodeQueryComponent` mode (`query == true`: `+` is a space). `None` on a bad escape.
/// Bytes that do not form UTF-8 are replaced by U+FFFD.
fn percent_decode(s: &str, query: bool) -> Option<Cow<'_, str>> {
    let bytes = s.as_bytes();
    if !bytes.iter().any(|&b| b == b'%' || (query && b == b'+')) {
        return Some(Cow::Borrowed(s));
    }
    let mut out = Vec::with_capacity(bytes.len());
    let mut it = bytes.iter().copied();
    while let Some(b) = it.next() {
        match b {
            b'%' => {
                let hi = it.next().and_then(unhex)?;
                let lo = it.next().and_then(unhex)?;
                out.push((hi << 4) | lo);
            }
            b'+' if query => out.push(b' '),
            _ => out.push(b),
        }
    }
    Some(Cow::Owned(match String::from_utf8(out) {
        Ok(decoded) => decoded,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    }))
}

/// The first value of each query parameter `metav1.ListOptions` decoding can trip on, as
/// `url.ParseQuery` yields them (pairs with a bad escape or a `;` are dropped, `+` is a space).
#[derive(Debug, Default)]
struct ListQuery<'a> {
    watch: Option<Cow<'a, str>>,
    field_selector: Option<Cow<'a, str>>,
    label_selector: Option<Cow<'a, str>>,
    timeout_seconds: Option<Cow<'a, str>>,
    limit: Option<Cow<'a, str>>,
}

impl<'a> ListQuery<'a> {
    fn parse(raw_query: &'a str) -> Self {
        let mut q = ListQuery::default();
        for pair in raw_query.split('&') {
            // Go >= 1.17: a pair holding ';' is an error and skipped; empty pairs are skipped.
            if pair.is_empty() || pair.contains(';') {
                continue;
            }
            let (raw_key, raw_value) = pair.split_once('=').unwrap_or((pair, ""));
            let Some(key) = percent_decode(raw_key, true) else {
                continue;
            };
            let slot = match key.as_ref() {
                "watch" => &mut q.watch,
                "fieldSelector" => &mut q.field_selector,
                "labelSelector" => &mut q.label_selector,
                "timeoutSeconds" => &mut q.timeout_seconds,
                "limit" => &mut q.limit,
                _ => continue,
            };
            let Some(value) = percent_decode(raw_value, true) else {
                continue;
            };
            if slot.is_none() {
                *slot = Some(value);
            }
        }
        q
    }

    /// `opts.Watch` and the name from `opts.FieldSelector`, after
    /// `ParameterCodec.DecodeParameters(query, metav1.SchemeGroupVersion, &opts)` and upstream's
    /// fallback when that fails.
    fn watch_and_name(&self) -> (bool, Option<String>) {
        let field_name = match self.field_selector.as_deref() {
            Some(selector) => field_selector::exact_match(selector, "metadata.name"),
            None => Ok(None),
        };
        let decoded = field_name.is_ok()
            && self.timeout_seconds.as_deref().is_none_or(parses_as_i64)
            && self.limit.as_deref().is_none_or(parses_as_i64)
            && self
                .label_selector
                .as_deref()
                .is_none_or(label_selector::is_valid);
        let watch = self.watch.as_deref();
        if !decoded {
            // Upstream resets opts and reads only `watch`: strings.ToLower(v) in {"false", "0"}.
            let watch = watch.is_some_and(|v| !(v == "0" || v.eq_ignore_ascii_case("false")));
            return (watch, None);
        }
        // runtime.Convert_Slice_string_To_bool: v == "0" || strings.EqualFold(v, "false").
        let watch = watch.is_some_and(|v| !(v == "0" || go_equal_fold_false(v)));
        let name = field_name
            .ok()
            .flatten()
            .filter(|name| is_valid_path_segment_name(name));
        (watch, name)
    }
}

/// `strconv.ParseInt(s, 10, 64) == nil` (optional sign, decimal digits, int64 range).
fn parses_as_i64(s: &str) -> bool {
    s.parse::<i64>().is_ok()
}

/// `strings.EqualFold(v, "false")`: Unicode simple folding, under which only U+017F (long s)
/// joins an ASCII letter of "false".
fn go_equal_fold_false(v: &str) -> bool {
    let mut chars = v.chars();
    for want in ['f', 'a', 'l', 's', 'e'] {
        match chars.next() {
            Some(c) if c.to_ascii_lowercase() == want => {}
            Some('\u{17F}') if want == 's' => {}
            _ => return false,
        }
    }
    chars.next().is_none()
}

/// `len(path.IsValidPathSegmentName(name)) == 0`.
fn is_valid_path_segment_name(name: &str) -> bool {
    name != "." && name != ".." && !name.contains('/') && !name.contains('%')
}

/// `fields.ParseSelector` and `Selector.RequiresExactMatch` (apimachinery 1.30-1.33).
mod field_selector {
    use std::borrow::Cow;

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Op {
        NotEqual,
        DoubleEqual,
        Equal,
    }

    /// `termOperators`, in the order they are tried at each position.
    const TERM_OPERATORS: [(&str, Op); 3] = [
        ("!=", Op::NotEqual),
        ("==", Op::DoubleEqual),
        ("=", Op::Equal),
    ];

    /// `Err(())` if the selector does not parse; otherwise the value the selector requires
    /// `field` to equal, if any (the first such term once the terms are sorted, as upstream).
    pub(super) fn exact_match(selector: &str, field: &str) -> Result<Option<String>, ()> {
        let mut terms = split_terms(selector);
        terms.sort_unstable();
        let mut found = None;
        for term in terms {
            if term.is_empty() {
                continue;
            }
            let (lhs, op, rhs) = split_term(term).ok_or(())?;
            let value = unescape_value(rhs)?;
            if found.is_none() && op != Op::NotEqual && lhs == field {
                found = Some(value.into_owned());
            }
        }
        Ok(found)
    }

    /// `splitTerms`: split on commas not escaped by a backslash (the backslash stays).
    fn split_terms(selector: &str) -> Vec<&str> {
        let mut terms = Vec::new();
        if selector.is_empty() {
            return terms;
        }
        let mut start = 0;
        let mut in_slash = false;
        for (i, c) in selector.char_indices() {
            if in_slash {
                in_slash = false;
            } else if c == '\\' {
                in_slash = true;
            } else if c == ',' {
                terms.push(selector.get(start..i).unwrap_or_default());
                start = i + 1;
            }
        }
        terms.push(selector.get(start..).unwrap_or_default());
        terms
    }

    /// `splitTerm`: the first position where any operator starts.
    fn split_term(term: &str) -> Option<(&str, Op, &str)> {
        for (i, _) in term.char_indices() {
            let remaining = term.get(i..)?;
            for (text, op) in TERM_OPERATORS {
                if let Some(rhs) = remaining.strip_prefix(text) {
                    return Some((term.get(..i)?, op, rhs));
                }
            }
        }
        None
    }

    /// `UnescapeValue`: `\\`, `\,`, `\=` are escapes; any other escape, a trailing `\`, or an
    /// unescaped `,` or `=` is an error.
    fn unescape_value(s: &str) -> Result<Cow<'_, str>, ()> {
        if !s.contains(['\\', ',', '=']) {
            return Ok(Cow::Borrowed(s));
        }
        let mut out = String::with_capacity(s.len());
        let mut in_slash = false;
        for c in s.chars() {
            if in_slash {
                match c {
                    '\\' | ',' | '=' => out.push(c),
                    _ => return Err(()),
                }
                in_slash = false;
                continue;
            }
            match c {
                '\\' => in_slash = true,
                ',' | '=' => return Err(()),
                _ => out.push(c),
            }
        }
        if in_slash {
            return Err(());
        }
        Ok(Cow::Owned(out))
    }

    #[cfg(test)]
    pub(super) fn exact_name(selector: &str) -> Result<Option<String>, ()> {
        exact_match(selector, "metadata.name")
    }
}

/// Whether `labels.Parse` accepts a selector (apimachinery 1.30-1.33): a port of its byte-wise
/// lexer (including the quirk that a NUL byte reads as end of input), its parser, and the
/// validation `NewRequirement` applies to keys and values.
mod label_selector {
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Token {
        Error,
        EndOfString,
        ClosedPar,
        Comma,
        DoesNotExist,
        DoubleEquals,
        Equals,
        GreaterThan,
        Identifier,
        In,
        LessThan,
        NotEquals,
        NotIn,
        OpenPar,
    }

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Op {
        In,
        NotIn,
        Equals,
        DoubleEquals,
        NotEquals,
        GreaterThan,
        LessThan,
        Exists,
        DoesNotExist,
    }

    /// `ParserContext`: in `Values`, the keywords `in` and `notin` are identifiers.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Context {
        KeyAndOperator,
        Values,
    }

    type Item<'a> = (Token, &'a [u8]);

    pub(super) fn is_valid(selector: &str) -> bool {
        let mut parser = Parser {
            items: Lexer {
                s: selector.as_bytes(),
                pos: 0,
            }
            .scan(),
            position: 0,
        };
        parser.parse().is_some()
    }

    fn is_whitespace(ch: u8) -> bool {
        matches!(ch, b' ' | b'\t' | b'\r' | b'\n')
    }

    fn is_special_symbol(ch: u8) -> bool {
        matches!(ch, b'=' | b'!' | b'(' | b')' | b',' | b'>' | b'<')
    }

    /// `string2token`.
    fn literal_token(s: &[u8]) -> Option<Token> {
        Some(match s {
            b")" => Token::ClosedPar,
            b"," => Token::Comma,
            b"!" => Token::DoesNotExist,
            b"==" => Token::DoubleEquals,
            b"=" => Token::Equals,
            b">" => Token::GreaterThan,
            b"in" => Token::In,
            b"<" => Token::LessThan,
            b"!=" => Token::NotEquals,
            b"notin" => Token::NotIn,
            b"(" => Token::OpenPar,
            _ => return None,
        })
    }

    struct Lexer<'a> {
        s: &'a [u8],
        pos: usize,
    }

    impl<'a> Lexer<'a> {
        /// The byte at `pos` (advancing), or 0 at the end. A NUL byte is also 0.
        fn read(&mut self) -> u8 {
            match self.s.get(self.pos) {
                Some(&b) => {
                    self.pos += 1;
                    b
                }
                None => 0,
            }
        }

        fn unread(&mut self) {
            self.pos = self.pos.saturating_sub(1);
        }

        fn slice(&self, start: usize, end: usize) -> &'a [u8] {
            self.s.get(start..end).unwrap_or_default()
        }

        fn scan_id_or_keyword(&mut self) -> Item<'a> {
            let start = self.pos;
            let mut end = start;
            loop {
                let ch = self.read();
                if ch == 0 {
                    break;
                }
                if is_special_symbol(ch) || is_whitespace(ch) {
                    self.unread();
                    break;
                }
                end = self.pos;
            }
            let lit = self.slice(start, end);
            match literal_token(lit) {
                Some(tok) => (tok, lit),
                None => (Token::Identifier, lit),
            }
        }

        fn scan_special_symbol(&mut self) -> Item<'a> {
            let start = self.pos;
            let mut len = 0;
            let mut last: Option<(Token, usize)> = None;
            loop {
                let ch = self.read();
                if ch == 0 {
                    break;
                }
                if !is_special_symbol(ch) {
                    self.unread();
                    break;
                }
                len += 1;
                if let Some(tok) = literal_token(self.slice(start, start + len)) {
                    last = Some((tok, len));
                } else if last.is_some() {
                    self.unread();
                    break;
                }
            }
            match last {
                Some((tok, len)) => (tok, self.slice(start, start + len)),
                None => (Token::Error, self.slice(start, start + len)),
            }
        }

        fn lex(&mut self) -> Item<'a> {
            let mut ch = self.read();
            while is_whitespace(ch) {
                ch = self.read();
            }
            if ch == 0 {
                return (Token::EndOfString, b"");
            }
            self.unread();
            if is_special_symbol(ch) {
                self.scan_special_symbol()
            } else {
                self.scan_id_or_keyword()
            }
        }

        fn scan(mut self) -> Vec<Item<'a>> {
            let mut items = Vec::new();
            loop {
                let item = self.lex();
                items.push(item);
                if item.0 == Token::EndOfString {
                    return items;
                }
            }
        }
    }

    struct Parser<'a> {
        items: Vec<Item<'a>>,
        position: usize,
    }

    impl<'a> Parser<'a> {
        fn lookahead(&self, context: Context) -> Item<'a> {
            let (tok, lit) = self
                .items
                .get(self.position)
                .copied()
                .unwrap_or((Token::EndOfString, b""));
            match (context, tok) {
                (Context::Values, Token::In | Token::NotIn) => (Token::Identifier, lit),
                _ => (tok, lit),
            }
        }

        fn consume(&mut self, context: Context) -> Item<'a> {
            let item = self.lookahead(context);
            self.position += 1;
            item
        }

        fn parse(&mut self) -> Option<()> {
            loop {
                match self.lookahead(Context::Values).0 {
                    Token::Identifier | Token::DoesNotExist => {
                        self.parse_requirement()?;
                        match self.consume(Context::Values).0 {
                            Token::EndOfString => return Some(()),
                            Token::Comma => {
                                let next = self.lookahead(Context::Values).0;
                                if next != Token::Identifier && next != Token::DoesNotExist {
                                    return None;
                                }
                            }
                            _ => return None,
                        }
                    }
                    Token::EndOfString => return Some(()),
                    _ => return None,
                }
            }
        }

        fn parse_requirement(&mut self) -> Option<()> {
            let (key, inferred) = self.parse_key_and_infer_operator()?;
            if let Some(op @ (Op::Exists | Op::DoesNotExist)) = inferred {
                return new_requirement(key, op, &[]);
            }
            let op = self.parse_operator()?;
            let mut values = Vec::new();
            match op {
                Op::In | Op::NotIn => self.parse_values(&mut values)?,
                _ => self.parse_exact_value(&mut values)?,
            }
            new_requirement(key, op, &values)
        }

        fn parse_key_and_infer_operator(&mut self) -> Option<(&'a [u8], Option<Op>)> {
            let mut op = None;
            let (mut tok, mut lit) = self.consume(Context::Values);
            if tok == Token::DoesNotExist {
                op = Some(Op::DoesNotExist);
                (tok, lit) = self.consume(Context::Values);
            }
            if tok != Token::Identifier || !is_label_key(lit) {
                return None;
            }
            let next = self.lookahead(Context::Values).0;
            if (next == Token::EndOfString || next == Token::Comma) && op != Some(Op::DoesNotExist)
            {
                op = Some(Op::Exists);
            }
            Some((lit, op))
        }

        fn parse_operator(&mut self) -> Option<Op> {
            Some(match self.consume(Context::KeyAndOperator).0 {
                Token::In => Op::In,
                Token::Equals => Op::Equals,
                Token::DoubleEquals => Op::DoubleEquals,
                Token::GreaterThan => Op::GreaterThan,
                Token::LessThan => Op::LessThan,
                Token::NotIn => Op::NotIn,
                Token::NotEquals => Op::NotEquals,
                _ => return None,
            })
        }

        fn parse_values(&mut self, values: &mut Vec<&'a [u8]>) -> Option<()> {
            if self.consume(Context::Values).0 != Token::OpenPar {
                return None;
            }
            match self.lookahead(Context::Values).0 {
                Token::Identifier | Token::Comma => {
                    self.parse_identifiers_list(values)?;
                    (self.consume(Context::Values).0 == Token::ClosedPar).then_some(())
                }
                Token::ClosedPar => {
                    self.consume(Context::Values);
                    values.push(b"");
                    Some(())
                }
                _ => None,
            }
        }

        fn parse_identifiers_list(&mut self, values: &mut Vec<&'a [u8]>) -> Option<()> {
            loop {
                let (tok, lit) = self.consume(Context::Values);
                match tok {
                    Token::Identifier => {
                        values.push(lit);
                        match self.lookahead(Context::Values).0 {
                            Token::Comma => continue,
                            Token::ClosedPar => return Some(()),
                            _ => return None,
                        }
                    }
                    Token::Comma => {
                        if values.is_empty() {
                            values.push(b""); // "(,"
                        }
                        match self.lookahead(Context::Values).0 {
                            Token::ClosedPar => {
                                values.push(b""); // ",)"
                                return Some(());
                            }
                            Token::Comma => values.push(b""), // ",,"
                            _ => {}
                        }
                    }
                    _ => return None,
                }
            }
        }

        fn parse_exact_value(&mut self, values: &mut Vec<&'a [u8]>) -> Option<()> {
            let next = self.lookahead(Context::Values).0;
            if next == Token::EndOfString || next == Token::Comma {
                values.push(b"");
                return Some(());
            }
            let (tok, lit) = self.consume(Context::Values);
            if tok != Token::Identifier {
                return None;
            }
            values.push(lit);
            Some(())
        }
    }

    /// The checks of `NewRequirement` (values may repeat here; upstream's set would dedupe them,
    /// which changes no outcome).
    fn new_requirement(key: &[u8], op: Op, values: &[&[u8]]) -> Option<()> {
        if !is_label_key(key) {
            return None;
        }
        let counts_ok = match op {
            Op::In | Op::NotIn => !values.is_empty(),
            Op::Equals | Op::DoubleEquals | Op::NotEquals => values.len() == 1,
            Op::Exists | Op::DoesNotExist => values.is_empty(),
            Op::GreaterThan | Op::LessThan => {
                values.len() == 1
                    && values
                        .iter()
                        .all(|v| std::str::from_utf8(v).is_ok_and(|v| v.parse::<i64>().is_ok()))
            }
        };
        (counts_ok && values.iter().all(|v| is_label_value(v))).then_some(())
    }

    /// `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`
    fn is_qualified_name_part(s: &[u8]) -> bool {
        match (s.first(), s.last()) {
            (Some(first), Some(last)) => {
                first.is_ascii_alphanumeric()
                    && last.is_ascii_alphanumeric()
                    && s.iter()
                        .all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            }
            _ => false,
        }
    }

    /// `IsLabelKey` / `IsQualifiedName`: `[prefix/]name`, prefix a DNS-1123 subdomain, name at
    /// most 63 characters.
    fn is_label_key(key: &[u8]) -> bool {
        let mut parts = key.split(|&b| b == b'/');
        let first = parts.next().unwrap_or_default();
        let (prefix, name) = match (parts.next(), parts.next()) {
            (None, _) => (None, first),
            (Some(name), None) => (Some(first), name),
            _ => return false,
        };
        if let Some(prefix) = prefix {
            if prefix.is_empty() || !is_dns1123_subdomain(prefix) {
                return false;
            }
        }
        name.len() <= 63 && is_qualified_name_part(name)
    }

    /// `IsValidLabelValue`: empty, or a qualified name part of at most 63 characters.
    fn is_label_value(value: &[u8]) -> bool {
        value.is_empty() || (value.len() <= 63 && is_qualified_name_part(value))
    }

    /// `IsDNS1123Subdomain`: at most 253 characters of dot-separated
    /// `[a-z0-9]([-a-z0-9]*[a-z0-9])?` labels.
    fn is_dns1123_subdomain(s: &[u8]) -> bool {
        let lower_alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
        s.len() <= 253
            && s.split(|&b| b == b'.')
                .all(|label| match (label.first(), label.last()) {
                    (Some(first), Some(last)) => {
                        lower_alnum(first)
                            && lower_alnum(last)
                            && label.iter().all(|b| lower_alnum(b) || *b == b'-')
                    }
                    _ => false,
                })
    }
}

#[cfg(test)]
mod tests {
    use super::RequestInfoError::{InvalidEscape, InvalidRequestTarget, MissingResourceAfterVerb};
    use super::*;

    /// An expected value: owned, so that it outlives the test's strings.
    fn own(s: &str) -> Cow<'static, str> {
        Cow::Owned(s.to_string())
    }

    fn non(path: &str, verb: &str) -> RequestInfo<'static> {
        RequestInfo {
            path: own(path),
            verb: Cow::Owned(verb.into()),
            ..Default::default()
        }
    }

    fn res(
        path: &str,
        verb: &str,
        prefix: &str,
        group: &str,
        version: &str,
    ) -> RequestInfo<'static> {
        RequestInfo {
            is_resource_request: true,
            path: own(path),
            verb: Cow::Owned(verb.into()),
            api_prefix: static_prefix(prefix),
            api_group: own(group),
            api_version: own(version),
            ..Default::default()
        }
    }

    /// The constant a test's prefix names (a test names only real ones).
    fn static_prefix(prefix: &str) -> &'static str {
        API_PREFIXES
            .into_iter()
            .find(|&p| p == prefix)
            .unwrap_or_else(|| panic!("not an API prefix: {prefix}"))
    }

    /// Core v1 shorthand.
    fn core(path: &str, verb: &str) -> RequestInfo<'static> {
        res(path, verb, "api", "", "v1")
    }

    trait With: Sized {
        fn prefix(self, v: &str) -> Self;
        fn ns(self, v: &str) -> Self;
        fn resource(self, v: &str) -> Self;
        fn name(self, v: &str) -> Self;
        fn parts(self, v: &[&str]) -> Self;
        /// resource, name, subresource and parts from the parts alone.
        fn rest(self, v: &[&str]) -> Self;
    }

    impl With for RequestInfo<'static> {
        fn prefix(mut self, v: &str) -> Self {
            self.api_prefix = static_prefix(v);
            self
        }
        fn ns(mut self, v: &str) -> Self {
            self.namespace = own(v);
            self
        }
        fn resource(mut self, v: &str) -> Self {
            self.resource = own(v);
            self
        }
        fn name(mut self, v: &str) -> Self {
            self.name = own(v);
            self
        }
        fn parts(mut self, v: &[&str]) -> Self {
            self.parts = v.iter().map(|s| own(s)).collect();
            self
        }
        fn rest(self, v: &[&str]) -> Self {
            let mut out = self.parts(v);
            out.resource = own(v.first().copied().unwrap_or_default());
            out.name = own(v.get(1).copied().unwrap_or_default());
            out.subresource = own(v.get(2).copied().unwrap_or_default());
            out
        }
    }

    struct Case {
        method: &'static str,
        target: String,
        want: Result<RequestInfo<'static>, RequestInfoError>,
    }

    fn case(
        method: &'static str,
        target: &str,
        want: Result<RequestInfo<'static>, RequestInfoError>,
    ) -> Case {
        Case {
            method,
            target: target.to_string(),
            want,
        }
    }

    fn cases() -> Vec<Case> {
        const PODS: &str = "/api/v1/namespaces/ns/pods";
        let pods_list = |verb: &str| Ok(core(PODS, verb).ns("ns").rest(&["pods"]));
        let long_name = "a".repeat(8192);
        let long_path = format!("/api/v1/namespaces/ns/pods/{long_name}");
        let many_segments = "/x".repeat(4096);
        vec![
            // Non-resource requests.
            case("GET", "/", Ok(non("/", "get"))),
            case("GET", "/?", Ok(non("/", "get"))),
            case("GET", "/api", Ok(non("/api", "get"))),
            case("GET", "/api/", Ok(non("/api/", "get"))),
            case("GET", "/api/v1", Ok(non("/api/v1", "get"))),
            case("GET", "/apis", Ok(non("/apis", "get"))),
            case("GET", "/apis/apps", Ok(non("/apis/apps", "get"))),
            // Upstream sets APIPrefix before it finds "/apis/{group}/{version}" too short.
            case("GET", "/apis/apps/v1", Ok(non("/apis/apps/v1", "get").prefix("apis"))),
            case("POST", "/apis/apps/v1/", Ok(non("/apis/apps/v1/", "post").prefix("apis"))),
            case("GET", "/healthz", Ok(non("/healthz", "get"))),
            case("GET", "/healthz/etcd", Ok(non("/healthz/etcd", "get"))),
            case("GET", "/livez?verbose", Ok(non("/livez", "get"))),
            case("GET", "/version", Ok(non("/version", "get"))),
            case("GET", "/openapi/v2", Ok(non("/openapi/v2", "get"))),
            case("GET", "/openapi/v3/apis/apps/v1", Ok(non("/openapi/v3/apis/apps/v1", "get"))),
            case("GET", "/metrics", Ok(non("/metrics", "get"))),
            case("OPTIONS", "/healthz", Ok(non("/healthz", "options"))),
            case("OPTIONS", "*", Ok(non("*", "options"))),
            case("GET", "*", Ok(non("*", "get"))),
            case("get", "/version", Ok(non("/version", "get"))),
            case("PURGE", "/", Ok(non("/", "purge"))),
            case("POST", "/api/v1?watch=1", Ok(non("/api/v1", "post"))),
            // Core resources.
            case("GET", "/api/v1/pods", Ok(core("/api/v1/pods", "list").rest(&["pods"]))),
            case("GET", "/api/v1/namespaces", Ok(core("/api/v1/namespaces", "list").rest(&["namespaces"]))),
            case(
                "GET",
                "/api/v1/namespaces/ns",
                Ok(core("/api/v1/namespaces/ns", "get").ns("ns").rest(&["namespaces", "ns"])),
            ),
            case(
                "DELETE",
                "/api/v1/namespaces/ns",
                Ok(core("/api/v1/namespaces/ns", "delete").ns("ns").rest(&["namespaces", "ns"])),
            ),
            case(
                "GET",
                "/api/v1/namespaces/ns/status",
                Ok(core("/api/v1/namespaces/ns/status", "get")
                    .ns("ns")
                    .rest(&["namespaces", "ns", "status"])),
            ),
            case(
                "PUT",
                "/api/v1/namespaces/ns/finalize",
                Ok(core("/api/v1/namespaces/ns/finalize", "update")
                    .ns("ns")
                    .rest(&["namespaces", "ns", "finalize"])),
            ),
            case(
                "PUT",
                "/api/v1/namespaces/ns/finalize/x",
                Ok(core("/api/v1/namespaces/ns/finalize/x", "update")
                    .ns("ns")
                    .rest(&["namespaces", "ns", "finalize", "x"])),
            ),
            case("GET", PODS, pods_list("list")),
            case("POST", PODS, pods_list("create")),
            case("DELETE", PODS, pods_list("deletecollection")),
            case("HEAD", "/api/v1/pods", Ok(core("/api/v1/pods", "list").rest(&["pods"]))),
            case("OPTIONS", "/api/v1/pods", Ok(core("/api/v1/pods", "").rest(&["pods"]))),
            case("get", "/api/v1/pods", Ok(core("/api/v1/pods", "").rest(&["pods"]))),
            case("PURGE", "/api/v1/pods", Ok(core("/api/v1/pods", "").rest(&["pods"]))),
            case(
                "GET",
                "/api/v1/namespaces/ns/pods/p",
                Ok(core("/api/v1/namespaces/ns/pods/p", "get").ns("ns").rest(&["pods", "p"])),
            ),
            case(
                "HEAD",
                "/api/v1/namespaces/ns/pods/p",
                Ok(core("/api/v1/namespaces/ns/pods/p", "get").ns("ns").rest(&["pods", "p"])),
            ),
            case(
                "PUT",
                "/api/v1/namespaces/ns/pods/p",
                Ok(core("/api/v1/namespaces/ns/pods/p", "update").ns("ns").rest(&["pods", "p"])),
            ),
            case(
                "DELETE",
                "/api/v1/namespaces/ns/pods/p",
                Ok(core("/api/v1/namespaces/ns/pods/p", "delete").ns("ns").rest(&["pods", "p"])),
            ),
            case(
                "GET",
                "/api/v1/namespaces/ns/pods/p/log",
                Ok(core("/api/v1/namespaces/ns/pods/p/log", "get")
                    .ns("ns")
                    .rest(&["pods", "p", "log"])),
            ),
            case(
                "POST",
                "/api/v1/namespaces/ns/pods/p/exec?command=ls&stdout=true",
                Ok(core("/api/v1/namespaces/ns/pods/p/exec", "create")
                    .ns("ns")
                    .rest(&["pods", "p", "exec"])),
            ),
            case(
                "GET",
                "/api/v1/namespaces/ns/pods/p/exec?command=ls",
                Ok(core("/api/v1/namespaces/ns/pods/p/exec", "get")
                    .ns("ns")
                    .rest(&["pods", "p", "exec"])),
            ),
            case(
                "GET",
                "/api/v1/nodes/n/proxy/metrics",
                Ok(core("/api/v1/nodes/n/proxy/metrics", "get").rest(&["nodes", "n", "proxy", "metrics"])),
            ),
            // Grouped resources.
            case(
                "PATCH",
                "/apis/apps/v1/namespaces/ns/deployments/d/scale",
                Ok(res("/apis/apps/v1/namespaces/ns/deployments/d/scale", "patch", "apis", "apps", "v1")
                    .ns("ns")
                    .rest(&["deployments", "d", "scale"])),
            ),
            case(
                "GET",
                "/apis/apps/v1/deployments",
                Ok(res("/apis/apps/v1/deployments", "list", "apis", "apps", "v1").rest(&["deployments"])),
            ),
            case(
                "GET",
                "/apis/resource.k8s.io/v1beta2/namespaces/default/resourceclaims?watch=true",
                Ok(res(
                    "/apis/resource.k8s.io/v1beta2/namespaces/default/resourceclaims",
                    "watch",
                    "apis",
                    "resource.k8s.io",
                    "v1beta2",
                )
                .ns("default")
                .rest(&["resourceclaims"])),
            ),
            // Special verbs.
            case(
                "GET",
                "/apis/apps/v1/watch/namespaces/ns/deployments/d",
                Ok(res("/apis/apps/v1/watch/namespaces/ns/deployments/d", "watch", "apis", "apps", "v1")
                    .ns("ns")
                    .rest(&["deployments", "d"])),
            ),
            case(
                "GET",
                "/apis/apps/v1/watch/namespaces/ns/deployments",
                Ok(res("/apis/apps/v1/watch/namespaces/ns/deployments", "watch", "apis", "apps", "v1")
                    .ns("ns")
                    .rest(&["deployments"])),
            ),
            case("GET", "/api/v1/watch/pods", Ok(core("/api/v1/watch/pods", "watch").rest(&["pods"]))),
            // The special verb wins over the method, and the query is not read.
            case(
                "POST",
                "/api/v1/watch/pods?watch=0",
                Ok(core("/api/v1/watch/pods", "watch").rest(&["pods"])),
            ),
            case(
                "GET",
                "/api/v1/watch/namespaces",
                Ok(core("/api/v1/watch/namespaces", "watch").rest(&["namespaces"])),
            ),
            case(
                "GET",
                "/api/v1/watch/namespaces/ns",
                Ok(core("/api/v1/watch/namespaces/ns", "watch").ns("ns").rest(&["namespaces", "ns"])),
            ),
            case(
                "GET",
                "/api/v1/watch/namespaces/ns/pods?fieldSelector=metadata.name%3Dfoo",
                Ok(core("/api/v1/watch/namespaces/ns/pods", "watch").ns("ns").rest(&["pods"])),
            ),
            // proxy: no subresource.
            case(
                "GET",
                "/api/v1/proxy/namespaces/ns/pods/p/some/path",
                Ok(core("/api/v1/proxy/namespaces/ns/pods/p/some/path", "proxy")
                    .ns("ns")
                    .resource("pods")
                    .name("p")
                    .parts(&["pods", "p", "some", "path"])),
            ),
            case(
                "DELETE",
                "/api/v1/proxy/nodes/n/x",
                Ok(core("/api/v1/proxy/nodes/n/x", "proxy")
                    .resource("nodes")
                    .name("n")
                    .parts(&["nodes", "n", "x"])),
            ),
            case(
                "GET",
                "/api/v1/namespaces/ns/pods/p/proxy/x/y",
                Ok(core("/api/v1/namespaces/ns/pods/p/proxy/x/y", "get")
                    .ns("ns")
                    .rest(&["pods", "p", "proxy", "x", "y"])),
            ),
            // Nothing after the special verb.
            case("GET", "/api/v1/watch", Err(MissingResourceAfterVerb)),
            case("GET", "/api/v1/watch/", Err(MissingResourceAfterVerb)),
            case("GET", "/api/v1/proxy", Err(MissingResourceAfterVerb)),
            case("GET", "/apis/g/v/proxy", Err(MissingResourceAfterVerb)),
            case("POST", "/apis/g/v/watch?watch=1", Err(MissingResourceAfterVerb)),
            // watch in the query.
            case("GET", "/api/v1/pods?watch=true", Ok(core("/api/v1/pods", "watch").rest(&["pods"]))),
            case("GET", "/api/v1/pods?watch=", Ok(core("/api/v1/pods", "watch").rest(&["pods"]))),
            case("GET", "/api/v1/pods?watch", Ok(core("/api/v1/pods", "watch").rest(&["pods"]))),
            case("GET", "/api/v1/pods?watch=no", Ok(core("/api/v1/pods", "watch").rest(&["pods"]))),
            case("GET", "/api/v1/pods?watch=0", Ok(core("/api/v1/pods", "list").rest(&["pods"]))),
            case("GET", "/api/v1/pods?watch=00", Ok(core("/api/v1/pods", "watch").rest(&["pods"]))),
            case("GET", "/api/v1/pods?watch=false", Ok(core("/api/v1/pods", "list").rest(&["pods"]))),
            case("GET", "/api/v1/pods?watch=FALSE", Ok(core("/api/v1/pods", "list").rest(&["pods"]))),
            case("GET", "/api/v1/pods?watch=fAlSe", Ok(core("/api/v1/pods", "list").rest(&["pods"]))),
            case("GET", "/api/v1/pods?watch=%66alse", Ok(core("/api/v1/pods", "list").rest(&["pods"]))),
            case("GET", "/api/v1/pods?watch=1&watch=false", Ok(core("/api/v1/pods", "watch").rest(&["pods"]))),
            case("GET", "/api/v1/pods?watch=false&watch=1", Ok(core("/api/v1/pods", "list").rest(&["pods"]))),
            case("GET", "/api/v1/pods?a=b&&watch=1&", Ok(core("/api/v1/pods", "watch").rest(&["pods"]))),
            // A pair with a bad escape is dropped; the next watch is the first one.
            case("GET", "/api/v1/pods?watch=%zz&watch=0", Ok(core("/api/v1/pods", "list").rest(&["pods"]))),
            case("GET", "/api/v1/pods?wat%zzch=1", Ok(core("/api/v1/pods", "list").rest(&["pods"]))),
            // A pair holding ';' is dropped.
            case("GET", "/api/v1/pods?watch=1;x=y", Ok(core("/api/v1/pods", "list").rest(&["pods"]))),
            case("GET", "/api/v1/pods?watch=1;", Ok(core("/api/v1/pods", "list").rest(&["pods"]))),
            case("GET", "/api/v1/pods?x=1;&watch=1", Ok(core("/api/v1/pods", "watch").rest(&["pods"]))),
            // Keys are exact and decoded.
            case("GET", "/api/v1/pods?Watch=1", Ok(core("/api/v1/pods", "list").rest(&["pods"]))),
            case("GET", "/api/v1/pods?watch%3D1", Ok(core("/api/v1/pods", "list").rest(&["pods"]))),
            case("GET", "/api/v1/pods?watch+=1", Ok(core("/api/v1/pods", "list").rest(&["pods"]))),
            case("GET", "/api/v1/pods?%77atch=1", Ok(core("/api/v1/pods", "watch").rest(&["pods"]))),
            // strings.EqualFold folds U+017F (long s) to 's'...
            case("GET", "/api/v1/pods?watch=fal%C5%BFe", Ok(core("/api/v1/pods", "list").rest(&["pods"]))),
            // ...the fallback's strings.ToLower does not.
            case(
                "GET",
                "/api/v1/pods?watch=fal%C5%BFe&limit=x",
                Ok(core("/api/v1/pods", "watch").rest(&["pods"])),
            ),
            case("GET", "/api/v1/pods?watch=FALSE&limit=x", Ok(core("/api/v1/pods", "list").rest(&["pods"]))),
            // A named get is not a list.
            case(
                "GET",
                "/api/v1/namespaces/ns/pods/p?watch=true",
                Ok(core("/api/v1/namespaces/ns/pods/p", "get").ns("ns").rest(&["pods", "p"])),
            ),
            case(
                "DELETE",
                "/api/v1/namespaces/ns/pods?watch=true",
                pods_list("deletecollection"),
            ),
            // fieldSelector=metadata.name=...
            case(
                "GET",
                "/api/v1/namespaces/ns/pods?fieldSelector=metadata.name%3Dfoo",
                Ok(core(PODS, "list").ns("ns").rest(&["pods"]).name("foo")),
            ),
            case(
                "GET",
                "/api/v1/namespaces/ns/pods?fieldSelector=metadata.name%3D%3Dfoo",
                Ok(core(PODS, "list").ns("ns").rest(&["pods"]).name("foo")),
            ),
            case(
                "GET",
                "/api/v1/namespaces/ns/pods?fieldSelector=metadata.name==foo&watch=1",
                Ok(core(PODS, "watch").ns("ns").rest(&["pods"]).name("foo")),
            ),
            case(
                "GET",
                "/api/v1/namespaces/ns/pods?fieldSelector=spec.nodeName%3Dn1,metadata.name%3Dfoo",
                Ok(core(PODS, "list").ns("ns").rest(&["pods"]).name("foo")),
            ),
            // The terms are sorted before the first match is taken.
            case(
                "GET",
                "/api/v1/namespaces/ns/pods?fieldSelector=metadata.name%3Db,metadata.name%3Da",
                Ok(core(PODS, "list").ns("ns").rest(&["pods"]).name("a")),
            ),
            case(
                "GET",
                "/api/v1/namespaces/ns/pods?fieldSelector=metadata.name%3Dfoo&fieldSelector=metadata.name%3Dbar",
                Ok(core(PODS, "list").ns("ns").rest(&["pods"]).name("foo")),
            ),
            case(
                "GET",
                "/api/v1/namespaces/ns/pods?fieldSelector=metadata.name%3Da%5C,b",
                Ok(core(PODS, "list").ns("ns").rest(&["pods"]).name("a,b")),
            ),
            case(
                "GET",
                "/api/v1/namespaces/ns/pods?fieldSelector=metadata.name%3Da+b",
                Ok(core(PODS, "list").ns("ns").rest(&["pods"]).name("a b")),
            ),
            case("GET", "/api/v1/namespaces/ns/pods?fieldSelector=metadata.name!%3Dfoo", pods_list("list")),
            case("GET", "/api/v1/namespaces/ns/pods?fieldSelector=metadata.name%3D", pods_list("list")),
            case("GET", "/api/v1/namespaces/ns/pods?fieldSelector=metadata.name%3D..", pods_list("list")),
            case("GET", "/api/v1/namespaces/ns/pods?fieldSelector=metadata.name%3D.", pods_list("list")),
            case("GET", "/api/v1/namespaces/ns/pods?fieldSelector=metadata.name%3Da/b", pods_list("list")),
            case("GET", "/api/v1/namespaces/ns/pods?fieldSelector=metadata.name%3Da%2525b", pods_list("list")),
            case("GET", "/api/v1/namespaces/ns/pods?fieldSelector=metadata.name%3Dfoo;", pods_list("list")),
            // An unparseable selector: no name.
            case(
                "GET",
                "/api/v1/namespaces/ns/pods?fieldSelector=metadata.name%3Dfoo,garbage",
                pods_list("list"),
            ),
            case(
                "GET",
                "/api/v1/namespaces/ns/pods?fieldSelector=metadata.name%3Dfoo,garbage&watch=1",
                pods_list("watch"),
            ),
            // Anything else in ListOptions that fails to decode: no name either.
            case("GET", "/api/v1/namespaces/ns/pods?fieldSelector=metadata.name%3Dfoo&limit=", pods_list("list")),
            case(
                "GET",
                "/api/v1/namespaces/ns/pods?fieldSelector=metadata.name%3Dfoo&limit=99999999999999999999",
                pods_list("list"),
            ),
            case(
                "GET",
                "/api/v1/namespaces/ns/pods?fieldSelector=metadata.name%3Dfoo&timeoutSeconds=1.5",
                pods_list("list"),
            ),
            case(
                "GET",
                "/api/v1/namespaces/ns/pods?fieldSelector=metadata.name%3Dfoo&labelSelector=a!!!",
                pods_list("list"),
            ),
            case(
                "GET",
                "/api/v1/namespaces/ns/pods?fieldSelector=metadata.name%3Dfoo&timeoutSeconds=30&limit=%2B500&labelSelector=app%3Dx,tier+in+(a,b)",
                Ok(core(PODS, "list").ns("ns").rest(&["pods"]).name("foo")),
            ),
            // labels.Parse reads a NUL byte as the end of the selector.
            case(
                "GET",
                "/api/v1/namespaces/ns/pods?fieldSelector=metadata.name%3Dfoo&labelSelector=a%00%00!!!",
                Ok(core(PODS, "list").ns("ns").rest(&["pods"]).name("foo")),
            ),
            // The query is not read for other verbs or a named get.
            case(
                "GET",
                "/api/v1/namespaces/ns/pods/p?fieldSelector=metadata.name%3Dfoo",
                Ok(core("/api/v1/namespaces/ns/pods/p", "get").ns("ns").rest(&["pods", "p"])),
            ),
            case(
                "DELETE",
                "/api/v1/namespaces/ns/pods?fieldSelector=metadata.name%3Dfoo",
                pods_list("deletecollection"),
            ),
            // Slashes.
            case(
                "GET",
                "//api//v1",
                Ok(res("//api//v1", "list", "api", "", "").rest(&["v1"])),
            ),
            case(
                "GET",
                "/apis//v1/pods",
                Ok(res("/apis//v1/pods", "list", "apis", "", "v1").rest(&["pods"])),
            ),
            case(
                "GET",
                "/api/v1//pods",
                Ok(core("/api/v1//pods", "get").rest(&["", "pods"])),
            ),
            case("GET", "/api/v1/pods/", Ok(core("/api/v1/pods/", "list").rest(&["pods"]))),
            case(
                "GET",
                "/api/v1/namespaces/ns/pods/p///",
                Ok(core("/api/v1/namespaces/ns/pods/p///", "get").ns("ns").rest(&["pods", "p"])),
            ),
            case(
                "GET",
                "///api/v1/pods///?watch=1",
                Ok(core("///api/v1/pods///", "watch").rest(&["pods"])),
            ),
            // An empty name between resource and subresource is still no name.
            case(
                "GET",
                "/api/v1/namespaces/ns/pods//log?watch=1",
                Ok(core("/api/v1/namespaces/ns/pods//log", "watch").ns("ns").rest(&["pods", "", "log"])),
            ),
            case(
                "DELETE",
                "/api/v1/namespaces/ns/pods//log",
                Ok(core("/api/v1/namespaces/ns/pods//log", "deletecollection").ns("ns").rest(&["pods", "", "log"])),
            ),
            // Escapes in the path are decoded before splitting.
            case(
                "GET",
                "/api/v1/namespaces/a%2Fb/pods",
                Ok(core("/api/v1/namespaces/a/b/pods", "get").ns("a").rest(&["b", "pods"])),
            ),
            case("GET", "/api%2Fv1%2Fpods", Ok(core("/api/v1/pods", "list").rest(&["pods"]))),
            case("GET", "/api/v1/%70ods", Ok(core("/api/v1/pods", "list").rest(&["pods"]))),
            case("GET", "/%41pi/v1/pods", Ok(non("/Api/v1/pods", "get"))),
            case(
                "GET",
                "/api/v1/namespaces/a+b/pods",
                Ok(core("/api/v1/namespaces/a+b/pods", "list").ns("a+b").rest(&["pods"])),
            ),
            case(
                "GET",
                "/api/v1/namespaces/a%20b/pods",
                Ok(core("/api/v1/namespaces/a b/pods", "list").ns("a b").rest(&["pods"])),
            ),
            case(
                "GET",
                "/api/v1/namespaces/a b/pods",
                Ok(core("/api/v1/namespaces/a b/pods", "list").ns("a b").rest(&["pods"])),
            ),
            case(
                "GET",
                "/api/v1/namespaces/%00/pods",
                Ok(core("/api/v1/namespaces/\0/pods", "list").ns("\0").rest(&["pods"])),
            ),
            case(
                "GET",
                "/api/v1/namespaces/é/pods",
                Ok(core("/api/v1/namespaces/é/pods", "list").ns("é").rest(&["pods"])),
            ),
            case(
                "GET",
                "/api/v1/namespaces/%C3%A9/pods",
                Ok(core("/api/v1/namespaces/é/pods", "list").ns("é").rest(&["pods"])),
            ),
            // Not UTF-8 once decoded: kept lossily.
            case(
                "GET",
                "/api/v1/namespaces/%ff/pods",
                Ok(core("/api/v1/namespaces/\u{FFFD}/pods", "list").ns("\u{FFFD}").rest(&["pods"])),
            ),
            case(
                "GET",
                "/api/v1/namespaces/ns/pods/%C3",
                Ok(core("/api/v1/namespaces/ns/pods/\u{FFFD}", "get").ns("ns").rest(&["pods", "\u{FFFD}"])),
            ),
            // Bad escapes in the path.
            case("GET", "/api/v1/pods%zz", Err(InvalidEscape)),
            case("GET", "/api/v1/pods%", Err(InvalidEscape)),
            case("GET", "/api/v1/pods%2", Err(InvalidEscape)),
            case("GET", "/api/v1/pods%2?x=1", Err(InvalidEscape)),
            case("GET", "/%zz", Err(InvalidEscape)),
            case("GET", "/healthz%", Err(InvalidEscape)),
            case("GET", "/api/v1/namespaces/ns/pods/p%g0", Err(InvalidEscape)),
            // ...but not in the query.
            case("GET", "/api/v1/pods?x=%zz", Ok(core("/api/v1/pods", "list").rest(&["pods"]))),
            case("GET", "/api/v1/pods?%", Ok(core("/api/v1/pods", "list").rest(&["pods"]))),
            // `..` is not cleaned.
            case(
                "GET",
                "/api/v1/namespaces/../pods",
                Ok(core("/api/v1/namespaces/../pods", "list").ns("..").rest(&["pods"])),
            ),
            case(
                "GET",
                "/api/v1/../../healthz",
                Ok(core("/api/v1/../../healthz", "get").rest(&["..", "..", "healthz"])),
            ),
            case(
                "GET",
                "/api/v1/namespaces/ns/pods/%2E%2E",
                Ok(core("/api/v1/namespaces/ns/pods/..", "get").ns("ns").rest(&["pods", ".."])),
            ),
            case(
                "GET",
                "/api/../api/v1/pods",
                Ok(res("/api/../api/v1/pods", "get", "api", "", "..").rest(&["api", "v1", "pods"])),
            ),
            // '#' is an ordinary character of a request-target.
            case("GET", "/api/v1/pods#frag", Ok(core("/api/v1/pods#frag", "list").rest(&["pods#frag"]))),
            case("GET", "/api/v1/pods?watch=0#frag", Ok(core("/api/v1/pods", "watch").rest(&["pods"]))),
            // Request-targets Go refuses.
            case("GET", "", Err(InvalidRequestTarget)),
            case("GET", "?", Err(InvalidRequestTarget)),
            case("GET", "?watch=1", Err(InvalidRequestTarget)),
            case("GET", "api/v1/pods", Err(InvalidRequestTarget)),
            case("GET", "*?x", Err(InvalidRequestTarget)),
            case("GET", "http://h/api/v1/pods", Err(InvalidRequestTarget)),
            case("GET", "/api/v1/pods\n", Err(InvalidRequestTarget)),
            case("GET", "/api/v1/pods?x=\t", Err(InvalidRequestTarget)),
            case("GET", "/api/v1/po\x7fds", Err(InvalidRequestTarget)),
            case("GET", "/\0", Err(InvalidRequestTarget)),
            // Big inputs.
            case(
                "GET",
                &long_path,
                Ok(core(&long_path, "get").ns("ns").rest(&["pods", long_name.as_str()])),
            ),
            case("GET", &"/".repeat(8192), Ok(non(&"/".repeat(8192), "get"))),
            case("GET", &many_segments, Ok(non(&many_segments, "get"))),
        ]
    }

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn table() {
        let mut failures = Vec::new();
        let cases = cases();
        for c in &cases {
            let got = parse(c.method, &c.target);
            if got != c.want {
                failures.push(format!(
                    "{} {:?}\n   got: {:?}\n  want: {:?}",
                    c.method,
                    c.target.chars().take(120).collect::<String>(),
                    got,
                    c.want
                ));
            }
        }
        assert!(
            failures.is_empty(),
            "{} of {} cases failed:\n{}",
            failures.len(),
            cases.len(),
            failures.join("\n")
        );
    }

    /// A path without escapes is parsed without copying it or its fields (the request path's
    /// allocations, issue 20's counted cost); a path with escapes owns its decoded copy, and the
    /// same fields come out of both.
    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn borrows_from_a_path_without_escapes() {
        let plain = parse("GET", "/apis/apps/v1/namespaces/ns/deployments/web/scale").unwrap();
        let escaped = parse("GET", "/apis/apps/v1/namespaces/ns/deployments/w%65b/scale").unwrap();
        assert_eq!(plain, escaped);
        fn all(info: &RequestInfo<'_>, borrowed: bool) -> bool {
            let fields = [
                &info.path,
                &info.api_group,
                &info.api_version,
                &info.namespace,
                &info.resource,
                &info.subresource,
                &info.name,
            ];
            fields
                .into_iter()
                .chain(&info.parts)
                .all(|f| matches!(f, Cow::Borrowed(_)) == borrowed)
        }
        assert!(all(&plain, true), "{plain:?}");
        assert!(all(&escaped, false), "{escaped:?}");
    }

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn long_hostile_query() {
        let target = format!("/api/v1/pods?watch=1&{}", "fieldSelector=%zz&".repeat(700));
        let got = parse("GET", &target).unwrap();
        assert_eq!(got.verb, "watch");
        let target = format!(
            "/api/v1/pods?labelSelector={}&fieldSelector=metadata.name%3Dx",
            "(".repeat(8192)
        );
        let got = parse("GET", &target).unwrap();
        assert_eq!((&*got.verb, &*got.name), ("list", ""));
    }

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn field_selectors() {
        let some = |s: &str| Ok(Some(s.to_string()));
        let table: Vec<(&str, Result<Option<String>, ()>)> = vec![
            ("", Ok(None)),
            (",", Ok(None)),
            ("=", Ok(None)),
            ("metadata.name=foo", some("foo")),
            ("metadata.name==foo", some("foo")),
            ("metadata.name!=foo", Ok(None)),
            ("a=b,metadata.name=c", some("c")),
            ("metadata.name=b,metadata.name=a", some("a")),
            ("metadata.name=b,metadata.name==a", some("a")),
            ("metadata.name!=a,metadata.name=b", some("b")),
            ("metadata.name=a\\=b", some("a=b")),
            ("metadata.name=a\\\\", some("a\\")),
            ("metadata.name=a\\,b", some("a,b")),
            ("metadata.name= a", some(" a")),
            (" metadata.name=a", Ok(None)),
            ("metadata.name=", some("")),
            ("metadata.name", Err(())),
            ("metadata.name=a=b", Err(())),
            ("metadata.name===a", Err(())),
            ("metadata.name!==a", Err(())),
            ("metadata.name=\\", Err(())),
            ("metadata.name=\\x", Err(())),
            ("metadata.name=foo,garbage", Err(())),
            ("x!y=1,metadata.name=ok", some("ok")),
        ];
        for (selector, want) in table {
            assert_eq!(field_selector::exact_name(selector), want, "{selector:?}");
        }
    }

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn label_selectors() {
        let long63 = "a".repeat(63);
        let long64 = "a".repeat(64);
        let valid = [
            "".to_string(),
            "a".into(),
            "!a".into(),
            "a=b".into(),
            "a==b".into(),
            "a!=b".into(),
            "a=".into(),
            "a==".into(),
            "a in (b,c)".into(),
            "a notin (b)".into(),
            "a in ()".into(),
            "a in (,)".into(),
            "a in (b,)".into(),
            "a in (,,b)".into(),
            "x>1".into(),
            " a = b , c ".into(),
            "\ta\r\n".into(),
            "example.com/a=b".into(),
            "a/b".into(),
            "in in (in)".into(),
            "notin notin (notin)".into(),
            "a,b,!c".into(),
            "a notin (b),c".into(),
            "a\0".into(),
            "a\0\0!!!".into(),
            // The NUL after a symbol is read by the symbol scan.
            "a,\0b".into(),
            long63.clone(),
            format!("a={long63}"),
            "A-b_c.D=E-f_g.H".into(),
        ];
        let invalid = [
            "!".to_string(),
            ",".into(),
            "a,".into(),
            ",a".into(),
            "a b".into(),
            "a=b c".into(),
            "a=b=c".into(),
            "a in".into(),
            "a in (".into(),
            "a in (b".into(),
            "a in b".into(),
            "a in (b c)".into(),
            "=b".into(),
            "a!".into(),
            "!a=b".into(),
            "a>b".into(),
            "a>".into(),
            "a>+1".into(),
            "a>99999999999999999999".into(),
            "A/b".into(),
            "/a".into(),
            "a/".into(),
            "a/b/c".into(),
            "-a".into(),
            "a-".into(),
            "a=-b".into(),
            "a=b-".into(),
            "a=é".into(),
            "a\0b".into(),
            "a,\0\0b".into(),
            "a=b,\0".into(),
            "x<-1".into(),
            long64.clone(),
            format!("a={long64}"),
            format!("{}/a", "b".repeat(254)),
        ];
        for s in &valid {
            assert!(label_selector::is_valid(s), "should be valid: {s:?}");
        }
        for s in &invalid {
            assert!(!label_selector::is_valid(s), "should be invalid: {s:?}");
        }
        assert!(label_selector::is_valid(&format!("{}/a", "b".repeat(253))));
    }

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn go_string_helpers() {
        assert!(go_equal_fold_false("false"));
        assert!(go_equal_fold_false("FaLsE"));
        assert!(go_equal_fold_false("fal\u{17F}e"));
        assert!(!go_equal_fold_false("fals"));
        assert!(!go_equal_fold_false("falsee"));
        assert!(!go_equal_fold_false("fal\u{17F}"));
        assert_eq!(go_to_lower("GET"), "get");
        assert_eq!(go_to_lower("\u{130}X"), "ix");
        assert_eq!(verb_for_method("get"), "");
        assert!(is_valid_path_segment_name("a..b"));
        assert!(!is_valid_path_segment_name(".."));
        assert!(!is_valid_path_segment_name("a%b"));
    }

    /// Deterministic xorshift64* generator: no new dependencies, same inputs every run.
    struct Rng(u64);

    impl Rng {
        fn next_u64(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next_u64() % n as u64) as usize
        }
        fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
            items[self.below(items.len())]
        }
    }

    const FRAGMENTS: &[&str] = &[
        "/",
        "/",
        "/",
        "//",
        "api",
        "apis",
        "v1",
        "apps",
        "namespaces",
        "ns",
        "pods",
        "p",
        "watch",
        "proxy",
        "status",
        "finalize",
        "log",
        "..",
        ".",
        "%",
        "%2",
        "%2F",
        "%2f",
        "%zz",
        "%ff",
        "%C3",
        "%C5%BF",
        "%00",
        "%25",
        "+",
        "?",
        "?",
        "&",
        "=",
        ";",
        "#",
        "*",
        "\\",
        ",",
        "(",
        ")",
        "!",
        "!=",
        "==",
        "<",
        ">",
        " ",
        "\t",
        "\0",
        "é",
        "ſ",
        "\u{130}",
        "\u{FFFD}",
        "watch=",
        "watch=0",
        "watch=false",
        "fieldSelector=",
        "metadata.name",
        "metadata.name%3D",
        "labelSelector=",
        " in ",
        "notin",
        "limit=",
        "timeoutSeconds=",
        "-1",
        "99999999999999999999",
    ];

    const METHODS: &[&str] = &[
        "GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "get", "", "İ", "PURGE",
    ];

    fn check_invariants(method: &str, target: &str) {
        let Ok(info) = parse(method, target) else {
            return;
        };
        if info.is_resource_request {
            assert!(
                API_PREFIXES.contains(&info.api_prefix),
                "{method} {target:?}: {info:?}"
            );
            assert!(!info.parts.is_empty(), "{method} {target:?}: {info:?}");
            assert_eq!(info.resource, info.parts[0], "{method} {target:?}");
        } else {
            assert!(info.parts.is_empty(), "{method} {target:?}: {info:?}");
            assert!(info.resource.is_empty(), "{method} {target:?}: {info:?}");
            assert_eq!(info.verb, go_to_lower(method), "{method} {target:?}");
        }
        assert_eq!(parse(method, target), Ok(info), "not deterministic");
    }

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn generated_hostile_inputs_never_panic() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        for i in 0..20_000 {
            let method = rng.pick(METHODS);
            let mut target = String::new();
            if i % 8 != 0 {
                target.push('/');
            }
            for _ in 0..rng.below(24) {
                target.push_str(rng.pick(FRAGMENTS));
            }
            check_invariants(method, &target);
        }
        // Random characters, up to 8 KiB.
        for len in [0, 1, 2, 3, 17, 255, 1024, 8192] {
            for _ in 0..8 {
                let mut target = String::from("/");
                while target.len() < len {
                    let c = match rng.below(4) {
                        0 => char::from(rng.below(128) as u8),
                        1 => char::from_u32(rng.below(0x11_0000) as u32).unwrap_or('x'),
                        _ => rng.pick(FRAGMENTS).chars().next().unwrap_or('/'),
                    };
                    target.push(c);
                }
                check_invariants(rng.pick(METHODS), &target);
            }
        }
    }

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn long_running_requests_match_kube_apiserver() {
        let cases = [
            ("GET", "/api/v1/pods?watch=true", true),
            ("GET", "/api/v1/pods?watch=", true),
            ("GET", "/api/v1/watch/pods", true),
            ("GET", "/api/v1/proxy/namespaces/n/pods/p/x", true),
            ("GET", "/api/v1/namespaces/n/pods/p/log", true),
            ("POST", "/api/v1/namespaces/n/pods/p/exec", true),
            ("GET", "/api/v1/namespaces/n/pods/p/attach", true),
            ("POST", "/api/v1/namespaces/n/pods/p/portforward", true),
            ("GET", "/api/v1/namespaces/n/services/s/proxy/x", true),
            ("GET", "/api/v1/pods", false),
            ("GET", "/api/v1/pods?watch=false", false),
            ("GET", "/api/v1/namespaces/n/pods/p", false),
            ("PUT", "/api/v1/namespaces/n/pods/p/status", false),
            (
                "POST",
                "/apis/resource.k8s.io/v1beta2/namespaces/d/resourceclaims",
                false,
            ),
            ("GET", "/healthz", false),
            ("GET", "/apis", false),
            // A non-resource path named like a subresource is not long-running.
            ("GET", "/logs/exec", false),
            // The profiler: as long as `seconds` asks (the decoded path is what kube checks).
            ("GET", "/debug/pprof/profile?seconds=120", true),
            ("GET", "/debug/pprof/trace?seconds=90", true),
            ("GET", "/debug/%70prof/profile", true),
            ("GET", "/debug/pprof/", true),
            ("GET", "/debug/pprof", false),
            ("GET", "/debug/flags/v", false),
        ];
        for (method, path, want) in cases {
            let info = parse(method, path).unwrap();
            assert_eq!(info.is_long_running(), want, "{method} {path}");
        }
    }

    /// The path's segments as Go's `strings.Split(strings.Trim(path, "/"), "/")` gives them
    /// (nothing for an empty path), multi-byte characters beside the slashes included.
    #[test]
    fn path_segments_are_a_split_on_slashes() {
        for path in [
            "",
            "/",
            "//",
            "/api",
            "api/v1/",
            "/apis/apps/v1/namespaces/default/deployments/web",
            "/a//b///c/",
            "/\u{e9}/\u{1f600}x/y\u{e9}",
            "/\u{e9}",
        ] {
            let trimmed = path.trim_matches('/');
            let want: Vec<&str> = if trimmed.is_empty() {
                Vec::new()
            } else {
                trimmed.split('/').collect()
            };
            assert_eq!(split_path(path), want, "{path:?}");
        }
    }
}
