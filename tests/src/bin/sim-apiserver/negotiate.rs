//! Accept-header negotiation for the two "as=" conversions clients ask for: aggregated
//! discovery (`as=APIGroupDiscoveryList`, v2 or v2beta1) and server-side tables (`as=Table`).
//! Parameter order and whitespace do not matter; clauses with `q=0` are ignored. A plain answer
//! is JSON or protobuf ([`plain`]).

/// Which aggregated discovery version to answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiscoveryVersion {
    V2,
    V2Beta1,
}

impl DiscoveryVersion {
    pub fn api_version(self) -> &'static str {
        match self {
            DiscoveryVersion::V2 => "apidiscovery.k8s.io/v2",
            DiscoveryVersion::V2Beta1 => "apidiscovery.k8s.io/v2beta1",
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            DiscoveryVersion::V2 => {
                "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
            }
            DiscoveryVersion::V2Beta1 => {
                "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList"
            }
        }
    }
}

/// Which `meta.k8s.io` Table version to answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TableVersion {
    V1,
    V1Beta1,
}

impl TableVersion {
    pub fn api_version(self) -> &'static str {
        match self {
            TableVersion::V1 => "meta.k8s.io/v1",
            TableVersion::V1Beta1 => "meta.k8s.io/v1beta1",
        }
    }
}

/// One media range of an Accept header: lower-cased type and its parameters.
struct Clause {
    media_type: String,
    params: Vec<(String, String)>,
}

impl Clause {
    fn param(&self, key: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    fn is_json(&self) -> bool {
        self.media_type == "application/json"
    }
}

fn parse_accept(accept: &str) -> Vec<Clause> {
    accept
        .split(',')
        .filter_map(|clause| {
            let mut parts = clause.split(';');
            let media_type = parts.next()?.trim().to_ascii_lowercase();
            if media_type.is_empty() {
                return None;
            }
            let params: Vec<(String, String)> = parts
                .filter_map(|p| {
                    let (k, v) = p.split_once('=')?;
                    Some((
                        k.trim().to_ascii_lowercase(),
                        v.trim().trim_matches('"').to_string(),
                    ))
                })
                .collect();
            let c = Clause { media_type, params };
            let zero_q = c.param("q").and_then(|q| q.parse::<f32>().ok()) == Some(0.0);
            (!zero_q).then_some(c)
        })
        .collect()
}

/// The aggregated discovery version the Accept header asks for, preferring v2, of those a
/// release serves (kube-apiserver 1.33 dropped v2beta1). A `profile` parameter (e.g.
/// `profile=nopeer`) is accepted and ignored.
pub fn aggregated_discovery_of(accept: &str, v2beta1: bool) -> Option<DiscoveryVersion> {
    let clauses = parse_accept(accept);
    let wants = |v: &str| {
        clauses.iter().any(|c| {
            c.is_json()
                && c.param("g") == Some("apidiscovery.k8s.io")
                && c.param("v") == Some(v)
                && c.param("as") == Some("APIGroupDiscoveryList")
        })
    };
    if wants("v2") {
        Some(DiscoveryVersion::V2)
    } else if v2beta1 && wants("v2beta1") {
        Some(DiscoveryVersion::V2Beta1)
    } else {
        None
    }
}

/// How a plain (not aggregated) answer is encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plain {
    Json,
    Protobuf,
    /// Nothing the Accept header lists: kube's 406.
    NotAcceptable,
}

/// The first media range of the Accept header kube-apiserver serves a plain object in: JSON
/// (`application/json`, `*/*`, `application/*`, or no Accept at all) or protobuf, each only
/// without an `as=` conversion.
pub fn plain(accept: &str) -> Plain {
    if accept.trim().is_empty() {
        return Plain::Json;
    }
    for c in parse_accept(accept) {
        if c.param("as").is_some() {
            continue;
        }
        match c.media_type.as_str() {
            "application/json" | "*/*" | "application/*" => return Plain::Json,
            crate::protobuf::CONTENT_TYPE => return Plain::Protobuf,
            _ => {}
        }
    }
    Plain::NotAcceptable
}

/// The Table version the Accept header asks for (kubectl get), preferring v1.
pub fn table(accept: &str) -> Option<TableVersion> {
    let clauses = parse_accept(accept);
    let wants = |v: &str| {
        clauses.iter().any(|c| {
            c.is_json()
                && c.param("g") == Some("meta.k8s.io")
                && c.param("v") == Some(v)
                && c.param("as") == Some("Table")
        })
    };
    if wants("v1") {
        Some(TableVersion::V1)
    } else if wants("v1beta1") {
        Some(TableVersion::V1Beta1)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discovery_clause_any_order_and_whitespace() {
        let kubectl = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";
        assert_eq!(
            aggregated_discovery_of(kubectl, true),
            Some(DiscoveryVersion::V2)
        );
        let reordered = "application/json, application/json ; as=APIGroupDiscoveryList ; v=v2 ; g=apidiscovery.k8s.io";
        assert_eq!(
            aggregated_discovery_of(reordered, true),
            Some(DiscoveryVersion::V2)
        );
        let beta_first = "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";
        assert_eq!(
            aggregated_discovery_of(beta_first, true),
            Some(DiscoveryVersion::V2)
        );
        let beta = "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList";
        assert_eq!(
            aggregated_discovery_of(beta, true),
            Some(DiscoveryVersion::V2Beta1)
        );
        let nopeer =
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList;profile=nopeer";
        assert_eq!(
            aggregated_discovery_of(nopeer, true),
            Some(DiscoveryVersion::V2)
        );
    }

    #[test]
    fn discovery_clause_rejects_others() {
        assert_eq!(aggregated_discovery_of("application/json, */*", true), None);
        assert_eq!(aggregated_discovery_of("", true), None);
        let proto = "application/vnd.kubernetes.protobuf;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";
        assert_eq!(aggregated_discovery_of(proto, true), None);
        let q0 = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList;q=0";
        assert_eq!(aggregated_discovery_of(q0, true), None);
    }

    #[test]
    fn plain_answers() {
        assert_eq!(plain(""), Plain::Json);
        assert_eq!(plain("application/json"), Plain::Json);
        assert_eq!(
            plain("application/vnd.kubernetes.protobuf"),
            Plain::Protobuf
        );
        assert_eq!(
            plain("application/vnd.kubernetes.protobuf, application/json"),
            Plain::Protobuf
        );
        let beta = "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList";
        assert_eq!(plain(beta), Plain::NotAcceptable);
        assert_eq!(plain(&format!("{beta},application/json")), Plain::Json);
        assert_eq!(aggregated_discovery_of(beta, false), None);
        assert_eq!(
            aggregated_discovery_of(beta, true),
            Some(DiscoveryVersion::V2Beta1)
        );
    }

    #[test]
    fn table_clause() {
        let kubectl = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
        assert_eq!(table(kubectl), Some(TableVersion::V1));
        assert_eq!(
            table("application/json;as=Table;v=v1beta1;g=meta.k8s.io"),
            Some(TableVersion::V1Beta1)
        );
        assert_eq!(table("application/json"), None);
    }
}
