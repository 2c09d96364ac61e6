//! What the filter behind an ADS stream reads, carried in Envoy's node metadata
//! (docs/ARCHITECTURE.md, "skewgate's own upgrades").
//!
//! `skewgate-control bootstrap` runs from Envoy's image, the image of the filter it loads, and
//! writes that filter's [`FilterDialect`] into the bootstrap's node ([`node_metadata`]):
//!
//! ```json
//! {"skewgate": {"filter_schemas": [1], "filter_features": []}}
//! ```
//!
//! Envoy sends its node on the first request of each ADS stream, and the xDS server reads it
//! back ([`negotiate`]) to render the filter configuration for that filter. Both sides are here,
//! so the shape is written down once. (Beside it under the same key the bootstrap advertises
//! its route timeout, [`super::route_timeout`], and its GOAWAY chance, [`super::goaway`].)
//!
//! The metadata is read leniently, as hostile input: a node without it is a filter of the
//! release before dialects were advertised ([`FilterDialect::unadvertised`]), and so is one
//! whose metadata is malformed. Entries that are not understood (a schema that is no whole
//! number, a feature of a newer release) are ignored, never an error; at most
//! [`MAX_ENTRIES`] of each list are looked at.

use std::collections::BTreeSet;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::google::protobuf::{value::Kind, ListValue, Struct, Value};

use skewgate_core::config::{FilterDialect, FilterFeature};

/// The node metadata key everything skewgate advertises sits under.
pub const METADATA_KEY: &str = "skewgate";
/// The schema versions the filter reads: a list of numbers.
pub const SCHEMAS_KEY: &str = "filter_schemas";
/// The optional features the filter reads: a list of names ([`FilterFeature::name`]).
pub const FEATURES_KEY: &str = "filter_features";
/// Entries of each list looked at, at most (a filter advertises a few).
pub const MAX_ENTRIES: usize = 64;

/// How the dialect of a stream's filter was learnt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Advertised {
    /// The node advertised it.
    Yes,
    /// No node, or no skewgate metadata: a filter of the release before dialects were
    /// advertised.
    Nothing,
    /// The metadata is there but not in the shape above: read as [`Advertised::Nothing`].
    Malformed(&'static str),
}

/// The dialect of a stream's filter, and how it was learnt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiated {
    pub dialect: FilterDialect,
    pub advertised: Advertised,
}

/// `dialect` as the bootstrap's node metadata.
pub fn node_metadata(dialect: &FilterDialect) -> Struct {
    let list = |values: Vec<Kind>| {
        Kind::ListValue(ListValue {
            values: values
                .into_iter()
                .map(|kind| Value { kind: Some(kind) })
                .collect(),
        })
    };
    let schemas = dialect
        .schemas
        .iter()
        .map(|s| Kind::NumberValue(f64::from(*s)))
        .collect();
    let features = dialect
        .features
        .iter()
        .map(|f| Kind::StringValue(f.name().to_string()))
        .collect();
    under_key([(SCHEMAS_KEY, list(schemas)), (FEATURES_KEY, list(features))])
}

/// Node metadata with `fields` under [`METADATA_KEY`], where everything skewgate advertises
/// sits (the bootstrap merges each part's into one).
pub fn under_key<const N: usize>(fields: [(&str, Kind); N]) -> Struct {
    let value = |kind| Value { kind: Some(kind) };
    let skewgate = Struct {
        fields: fields
            .into_iter()
            .map(|(key, kind)| (key.to_string(), value(kind)))
            .collect(),
    };
    Struct {
        fields: [(METADATA_KEY.to_string(), value(Kind::StructValue(skewgate)))].into(),
    }
}

/// A number of the node metadata: a number, or a string holding one. Envoy reads a YAML
/// bootstrap's numbers that are not whole into a `Struct` as strings (its YAML loader keeps
/// every non-integer scalar a string and leaves the conversion to the field's type, which a
/// `Struct` does not have); NaN is no number.
pub fn number(kind: &Kind) -> Option<f64> {
    match kind {
        Kind::NumberValue(n) => Some(*n),
        Kind::StringValue(s) if s.len() <= 64 => s.trim().parse::<f64>().ok(),
        _ => None,
    }
    .filter(|n| !n.is_nan())
}

/// The value of `key` under [`METADATA_KEY`] in `node`'s metadata, if there is one (for a part
/// that reads its own key leniently; [`negotiate`] tells a malformed `skewgate` apart).
pub fn advertised<'n>(node: Option<&'n Node>, key: &str) -> Option<&'n Kind> {
    let metadata = node?.metadata.as_ref()?;
    let Some(Kind::StructValue(skewgate)) = metadata
        .fields
        .get(METADATA_KEY)
        .and_then(|v| v.kind.as_ref())
    else {
        return None;
    };
    skewgate.fields.get(key).and_then(|v| v.kind.as_ref())
}

/// The dialect the filter behind `node` reads (the node of a stream's first request). Never
/// fails: whatever cannot be read is [`FilterDialect::unadvertised`].
pub fn negotiate(node: Option<&Node>) -> Negotiated {
    let fallback = |advertised| Negotiated {
        dialect: FilterDialect::unadvertised(),
        advertised,
    };
    let Some(skewgate) = node
        .and_then(|n| n.metadata.as_ref())
        .and_then(|m| m.fields.get(METADATA_KEY))
    else {
        return fallback(Advertised::Nothing);
    };
    let Some(Kind::StructValue(skewgate)) = &skewgate.kind else {
        return fallback(Advertised::Malformed("skewgate is not a struct"));
    };
    let Some(schemas) = list(skewgate, SCHEMAS_KEY) else {
        return fallback(Advertised::Malformed("filter_schemas is not a list"));
    };
    let schemas: BTreeSet<u32> = schemas.filter_map(schema).collect();
    if schemas.is_empty() {
        return fallback(Advertised::Malformed(
            "filter_schemas has no schema version",
        ));
    }
    let features = match skewgate.fields.get(FEATURES_KEY) {
        None => BTreeSet::new(),
        Some(_) => match list(skewgate, FEATURES_KEY) {
            Some(values) => values.filter_map(feature).collect(),
            None => return fallback(Advertised::Malformed("filter_features is not a list")),
        },
    };
    Negotiated {
        dialect: FilterDialect { schemas, features },
        advertised: Advertised::Yes,
    }
}

/// The first [`MAX_ENTRIES`] values of the list at `key`; `None` when it is missing or no list.
fn list<'a>(s: &'a Struct, key: &str) -> Option<impl Iterator<Item = &'a Value>> {
    match &s.fields.get(key)?.kind {
        Some(Kind::ListValue(l)) => Some(l.values.iter().take(MAX_ENTRIES)),
        _ => None,
    }
}

/// A schema version: a whole number from 1 to `u32::MAX` (protobuf numbers are doubles).
fn schema(v: &Value) -> Option<u32> {
    // Whole numbers, which the bootstrap writes whole: never a string.
    match v.kind {
        Some(Kind::NumberValue(n)) if n.fract() == 0.0 && n >= 1.0 && n <= f64::from(u32::MAX) => {
            // Whole and in range: the conversion is exact.
            Some(n as u32)
        }
        _ => None,
    }
}

/// A feature this release knows by name; any other entry is ignored.
fn feature(v: &Value) -> Option<FilterFeature> {
    match &v.kind {
        Some(Kind::StringValue(name)) => FilterFeature::from_name(name),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skewgate_core::config::READ_SCHEMAS;

    fn node(metadata: Option<Struct>) -> Node {
        Node {
            id: "envoy".into(),
            metadata,
            ..Default::default()
        }
    }

    fn value(json: serde_json::Value) -> Value {
        let kind = match json {
            serde_json::Value::Null => Kind::NullValue(0),
            serde_json::Value::Bool(b) => Kind::BoolValue(b),
            serde_json::Value::Number(n) => Kind::NumberValue(n.as_f64().expect("f64")),
            serde_json::Value::String(s) => Kind::StringValue(s),
            serde_json::Value::Array(a) => Kind::ListValue(ListValue {
                values: a.into_iter().map(value).collect(),
            }),
            serde_json::Value::Object(o) => Kind::StructValue(Struct {
                fields: o.into_iter().map(|(k, v)| (k, value(v))).collect(),
            }),
        };
        Value { kind: Some(kind) }
    }

    /// Node metadata from JSON (what Envoy would send for a bootstrap holding it).
    fn metadata(json: serde_json::Value) -> Struct {
        match value(json).kind {
            Some(Kind::StructValue(s)) => s,
            other => panic!("not an object: {other:?}"),
        }
    }

    fn dialect(schemas: &[u32]) -> FilterDialect {
        FilterDialect {
            schemas: schemas.iter().copied().collect(),
            features: BTreeSet::new(),
        }
    }

    #[test]
    fn what_the_bootstrap_writes_reads_back_as_this_filter() {
        let written = node_metadata(&FilterDialect::this_filter());
        let negotiated = negotiate(Some(&node(Some(written.clone()))));
        assert_eq!(
            negotiated,
            Negotiated {
                dialect: FilterDialect::this_filter(),
                advertised: Advertised::Yes
            }
        );
        // The shape the documentation shows.
        let want = metadata(serde_json::json!({"skewgate": {
            "filter_schemas": READ_SCHEMAS.map(f64::from).collect::<Vec<_>>(),
            "filter_features": FilterFeature::ALL.iter().map(|f| f.name()).collect::<Vec<_>>(),
        }}));
        assert_eq!(written, want);
    }

    #[test]
    fn a_node_that_advertises_nothing_is_the_previous_release() {
        let unadvertised = Negotiated {
            dialect: FilterDialect::unadvertised(),
            advertised: Advertised::Nothing,
        };
        assert_eq!(negotiate(None), unadvertised);
        assert_eq!(negotiate(Some(&node(None))), unadvertised);
        assert_eq!(
            negotiate(Some(&node(Some(metadata(serde_json::json!({"other": 1})))))),
            unadvertised
        );
        assert_eq!(FilterDialect::unadvertised(), dialect(&[1]));
    }

    #[test]
    fn hostile_or_malformed_metadata_advertises_nothing() {
        let cases = [
            serde_json::json!({"skewgate": "schema 1"}),
            serde_json::json!({"skewgate": [1]}),
            serde_json::json!({"skewgate": null}),
            serde_json::json!({"skewgate": {}}),
            serde_json::json!({"skewgate": {"filter_schemas": 1}}),
            serde_json::json!({"skewgate": {"filter_schemas": "1"}}),
            serde_json::json!({"skewgate": {"filter_schemas": []}}),
            serde_json::json!({"skewgate": {"filter_schemas": [0, -1, 1.5, 4294967296.0, 1e300, "1", null, true, [1], {"1": 1}]}}),
            serde_json::json!({"skewgate": {"filter_schemas": [1], "filter_features": "all"}}),
            serde_json::json!({"skewgate": {"filter_schemas": [1], "filter_features": {"a": 1}}}),
        ];
        for json in cases {
            let got = negotiate(Some(&node(Some(metadata(json.clone())))));
            assert_eq!(got.dialect, FilterDialect::unadvertised(), "{json}");
            assert!(
                matches!(got.advertised, Advertised::Malformed(_)),
                "{json}: {got:?}"
            );
        }
        // Numbers JSON cannot carry but protobuf can.
        for n in [
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::MIN_POSITIVE,
        ] {
            let number = Value {
                kind: Some(Kind::NumberValue(n)),
            };
            let skewgate = Struct {
                fields: [(
                    SCHEMAS_KEY.to_string(),
                    Value {
                        kind: Some(Kind::ListValue(ListValue {
                            values: vec![number],
                        })),
                    },
                )]
                .into(),
            };
            let m = Struct {
                fields: [(
                    METADATA_KEY.to_string(),
                    Value {
                        kind: Some(Kind::StructValue(skewgate)),
                    },
                )]
                .into(),
            };
            let got = negotiate(Some(&node(Some(m))));
            assert_eq!(got.dialect, FilterDialect::unadvertised(), "{n}");
            assert!(matches!(got.advertised, Advertised::Malformed(_)), "{n}");
        }
        // A value without a kind.
        let m = Struct {
            fields: [(METADATA_KEY.to_string(), Value { kind: None })].into(),
        };
        assert_eq!(
            negotiate(Some(&node(Some(m)))).dialect,
            FilterDialect::unadvertised()
        );
    }

    #[test]
    fn entries_it_does_not_understand_are_ignored() {
        let got = negotiate(Some(&node(Some(metadata(
            serde_json::json!({"skewgate": {
                "filter_schemas": [2, "3", 1.5, 7, 2],
                "filter_features": ["a-feature-of-a-newer-release", 1, null, "x".repeat(10_000)],
                "something_else": {"a": 1},
            }}),
        )))));
        assert_eq!(
            got,
            Negotiated {
                dialect: dialect(&[2, 7]),
                advertised: Advertised::Yes
            }
        );
        // Only the first MAX_ENTRIES of a list are looked at.
        let mut schemas: Vec<serde_json::Value> = vec![serde_json::json!("x"); MAX_ENTRIES];
        schemas.push(serde_json::json!(1));
        let got = negotiate(Some(&node(Some(metadata(
            serde_json::json!({"skewgate": {"filter_schemas": schemas}}),
        )))));
        assert!(matches!(got.advertised, Advertised::Malformed(_)));
        // A long list is no work: it is cut.
        let many: Vec<u32> = (1..=100_000).collect();
        let got = negotiate(Some(&node(Some(metadata(
            serde_json::json!({"skewgate": {"filter_schemas": many}}),
        )))));
        assert_eq!(got.dialect.schemas.len(), MAX_ENTRIES);
        // Without features: none.
        let got = negotiate(Some(&node(Some(metadata(
            serde_json::json!({"skewgate": {"filter_schemas": [1]}}),
        )))));
        assert_eq!(got.dialect, dialect(&[1]));
        assert_eq!(got.advertised, Advertised::Yes);
    }
}
