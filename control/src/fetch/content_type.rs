//! What a discovery answer is, decided by its `Content-Type` (pure).
//!
//! kube-apiserver answers the aggregated Accept clause it picked with
//! `application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList` (or `v=v2beta1`), and
//! answers plain `application/json` with the legacy document of the path (`APIVersions` at
//! `/api`, `APIGroupList` at `/apis`). Parameters may come in any order, with spaces, quoted, and
//! with extra ones (`profile`, `charset`) that do not change the format.

/// The Accept header of a discovery fetch: each apiserver's own aggregated document first
/// (`profile=nopeer`: not a merged one, on apiservers that merge), then aggregated v2 without
/// the profile (apiservers that do not know it), v2beta1 (1.26-1.29), legacy last.
pub const DISCOVERY_ACCEPT: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList;profile=nopeer,application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";

/// The Accept header of legacy group-version documents (`/api/v1`, `/apis/<g>/<v>`).
pub const LEGACY_ACCEPT: &str = "application/json";

/// The format of a discovery answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DocumentFormat {
    /// `apidiscovery.k8s.io/v2` `APIGroupDiscoveryList`.
    AggregatedV2,
    /// `apidiscovery.k8s.io/v2beta1` `APIGroupDiscoveryList` (same shape as v2).
    AggregatedV2Beta1,
    /// Plain JSON: the legacy document of the path.
    Legacy,
}

impl DocumentFormat {
    pub fn is_aggregated(self) -> bool {
        !matches!(self, DocumentFormat::Legacy)
    }

    pub fn label(self) -> &'static str {
        match self {
            DocumentFormat::AggregatedV2 => "aggregated v2",
            DocumentFormat::AggregatedV2Beta1 => "aggregated v2beta1",
            DocumentFormat::Legacy => "legacy",
        }
    }
}

/// A `Content-Type` we do not read (with the reason, for the error message).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unexpected Content-Type {value:?}: {reason}")]
pub struct UnsupportedContentType {
    pub value: String,
    pub reason: &'static str,
}

const AGGREGATED_GROUP: &str = "apidiscovery.k8s.io";
const AGGREGATED_AS: &str = "APIGroupDiscoveryList";

/// Classify a `Content-Type` header value (`None`: the header is missing).
pub fn classify_content_type(
    value: Option<&str>,
) -> Result<DocumentFormat, UnsupportedContentType> {
    let unsupported = |reason| UnsupportedContentType {
        value: value.unwrap_or("").chars().take(200).collect(),
        reason,
    };
    let value = value.ok_or_else(|| unsupported("no Content-Type header"))?;
    let mut parts = value.split(';');
    let media_type = parts.next().unwrap_or("").trim();
    if !media_type.eq_ignore_ascii_case("application/json") {
        return Err(unsupported("not application/json"));
    }
    let (mut g, mut v, mut as_kind) = (None, None, None);
    for param in parts {
        let param = param.trim();
        if param.is_empty() {
            continue;
        }
        let Some((key, val)) = param.split_once('=') else {
            return Err(unsupported("a parameter without a value"));
        };
        let val = val.trim();
        let val = val
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .unwrap_or(val);
        let slot = match key.trim().to_ascii_lowercase().as_str() {
            "g" => &mut g,
            "v" => &mut v,
            "as" => &mut as_kind,
            // profile, charset, stream, ...: no change of format.
            _ => continue,
        };
        if slot.replace(val).is_some() {
            return Err(unsupported("a repeated g, v or as parameter"));
        }
    }
    match (g, v, as_kind) {
        (None, None, None) => Ok(DocumentFormat::Legacy),
        (Some(g), Some(v), Some(a))
            if g.eq_ignore_ascii_case(AGGREGATED_GROUP) && a == AGGREGATED_AS =>
        {
            match v {
                "v2" => Ok(DocumentFormat::AggregatedV2),
                "v2beta1" => Ok(DocumentFormat::AggregatedV2Beta1),
                _ => Err(unsupported(
                    "an aggregated discovery version we do not read",
                )),
            }
        }
        _ => Err(unsupported(
            "a conversion (g, v, as) other than aggregated discovery",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_types() {
        use DocumentFormat::*;
        let cases: [(Option<&str>, Option<DocumentFormat>); 22] = [
            (
                Some("application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"),
                Some(AggregatedV2),
            ),
            (
                Some("application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList"),
                Some(AggregatedV2Beta1),
            ),
            // Any order, spaces, case of the type and keys, quotes, extra parameters.
            (
                Some("application/json; as=APIGroupDiscoveryList ;v=v2; g=apidiscovery.k8s.io"),
                Some(AggregatedV2),
            ),
            (
                Some("Application/JSON;AS=APIGroupDiscoveryList;V=v2beta1;G=apidiscovery.k8s.io"),
                Some(AggregatedV2Beta1),
            ),
            (
                Some(r#"application/json;g="apidiscovery.k8s.io";v="v2";as="APIGroupDiscoveryList""#),
                Some(AggregatedV2),
            ),
            (
                Some("application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList;profile=nopeer"),
                Some(AggregatedV2),
            ),
            (
                Some("application/json;profile=nopeer;charset=utf-8;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"),
                Some(AggregatedV2),
            ),
            (
                Some("application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList;"),
                Some(AggregatedV2),
            ),
            // Legacy.
            (Some("application/json"), Some(Legacy)),
            (Some("application/json; charset=utf-8"), Some(Legacy)),
            (Some(" application/json ;charset=UTF-8"), Some(Legacy)),
            // Refused.
            (None, None),
            (Some(""), None),
            (Some("text/html; charset=utf-8"), None),
            (Some("text/plain"), None),
            (Some("application/vnd.kubernetes.protobuf"), None),
            (
                Some("application/vnd.kubernetes.protobuf;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"),
                None,
            ),
            (
                Some("application/json;g=apidiscovery.k8s.io;v=v3;as=APIGroupDiscoveryList"),
                None,
            ),
            (Some("application/json;g=meta.k8s.io;v=v1;as=Table"), None),
            (Some("application/json;as=APIGroupDiscoveryList"), None),
            (
                Some("application/json;g=apidiscovery.k8s.io;v=v2;v=v2beta1;as=APIGroupDiscoveryList"),
                None,
            ),
            (Some("application/json;charset"), None),
        ];
        for (value, want) in cases {
            let got = classify_content_type(value);
            assert_eq!(got.as_ref().ok().copied(), want, "{value:?}: {got:?}");
        }
    }

    #[test]
    fn accept_asks_for_the_servers_own_document_first() {
        let clauses: Vec<&str> = DISCOVERY_ACCEPT.split(',').collect();
        assert_eq!(clauses.len(), 4);
        assert!(clauses[0].ends_with(";profile=nopeer"));
        assert!(clauses[1].contains("v=v2;"));
        assert!(clauses[2].contains("v=v2beta1;"));
        assert_eq!(clauses[3], "application/json");
        // Every aggregated clause is one we read back.
        for clause in &clauses[..3] {
            assert!(classify_content_type(Some(clause)).unwrap().is_aggregated());
        }
    }
}
