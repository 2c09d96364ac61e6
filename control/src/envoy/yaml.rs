//! Envoy's configuration as YAML a person can read, diff and review: the same protobuf
//! messages the renderers build, serialised by proto3's JSON mapping (`prost-reflect`, with
//! the descriptors `build.rs` compiles from the `.proto` files the Rust types were generated
//! from) and written in YAML's JSON form, indented, one field per line (`serde_json`). Never
//! text pasted into text: a hostile string is one double-quoted, escaped scalar, whatever it
//! holds.
//!
//! Why YAML's JSON form and not its plain style: Envoy reads YAML with yaml-cpp and then
//! guesses each unquoted scalar's type the YAML 1.1 way, so a plain `yes`, `on`, `n` or `off`
//! is a boolean to it (`cluster: yes` and Envoy refuses the bootstrap), `0x1F` and `0755`
//! numbers; YAML 1.2 emitters (serde_yaml_ng among them) leave those plain. A double-quoted
//! scalar is a string to yaml-cpp whatever it says. (Seen with Envoy 1.40; the tests are
//! `tests/tests/envoy_yaml.rs` and `tests/tests/fallback.rs`, the hostile strings.) Numbers stay plain; Envoy keeps a plain
//! number that is not whole as a string until a field's type converts it, which a `Struct`
//! never does: whole numbers are written whole ([`whole`]), and the node metadata's readers
//! take a number in a string too (`super::dialect::number`).
//!
//! Field names are the `.proto` ones (`connect_timeout`, as Envoy's documentation writes them),
//! in key order, fields left at their default are left out, and every file starts with a
//! comment line naming what wrote it ([`header`]). [`from_yaml`] reads a file back (any YAML):
//! every renderer checks the round trip ([`round_trip`]).

use std::sync::OnceLock;

use prost::{Message, Name};
use prost_reflect::{
    DescriptorPool, DeserializeOptions, DynamicMessage, ReflectMessage as _, SerializeOptions,
};
use serde::de::IntoDeserializer as _;

/// The descriptors of every package skewgate renders (`build.rs`).
const DESCRIPTORS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/envoy-descriptors.bin"));

/// The file extension that tells Envoy a file is YAML (its `-c` and file-based xDS alike).
/// (Named `.json`, the same text would be read by protobuf's JSON parser instead, but would no
/// longer hold the first line's comment.)
pub const EXTENSION: &str = "yaml";

/// Why a message could not be written or read as YAML.
#[derive(Debug, thiserror::Error)]
pub enum YamlError {
    #[error("the descriptors of Envoy's API do not load: {0}")]
    Descriptors(String),
    #[error("{0} is not in the descriptors of Envoy's API (build.rs PACKAGES)")]
    UnknownMessage(String),
    #[error("{message} does not decode with its descriptor: {error}")]
    Decode { message: String, error: String },
    #[error("{message} has fields its descriptor lacks (build.rs compiles an older API?)")]
    UnknownFields { message: String },
    #[error("{message} as YAML: {error}")]
    Serialise { message: String, error: String },
    #[error("not a {message} in YAML: {error}")]
    Parse { message: String, error: String },
}

fn pool() -> Result<&'static DescriptorPool, YamlError> {
    static POOL: OnceLock<Result<DescriptorPool, String>> = OnceLock::new();
    POOL.get_or_init(|| DescriptorPool::decode(DESCRIPTORS).map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|e| YamlError::Descriptors(e.clone()))
}

fn descriptor<M: Name>() -> Result<prost_reflect::MessageDescriptor, YamlError> {
    pool()?
        .get_message_by_name(&M::full_name())
        .ok_or_else(|| YamlError::UnknownMessage(M::full_name()))
}

/// The first line of every file: what wrote it, so a reader (or a `git diff`) knows where a
/// configuration came from.
pub fn header(writer: &str) -> String {
    format!(
        "# Written by skewgate-control {writer} {}; do not edit: re-render it.\n",
        env!("CARGO_PKG_VERSION")
    )
}

/// `message` as YAML, after the [`header`] naming `writer` (`bootstrap`, `render-static`, ...).
pub fn to_yaml<M: Message + Name>(message: &M, writer: &str) -> Result<String, YamlError> {
    let name = M::full_name();
    let dynamic = DynamicMessage::decode(descriptor::<M>()?, message.encode_to_vec().as_slice())
        .map_err(|e| YamlError::Decode {
            message: name.clone(),
            error: e.to_string(),
        })?;
    // A field the descriptors do not know would be dropped from the YAML without a word.
    if has_unknown_fields(&dynamic) {
        return Err(YamlError::UnknownFields { message: name });
    }
    let options = SerializeOptions::new()
        .use_proto_field_name(true)
        .skip_default_fields(true);
    let serialise = |error: String| YamlError::Serialise {
        message: name.clone(),
        error,
    };
    // serde_json's maps are ordered by key: two renders of one configuration are the same text
    // (prost-reflect holds protobuf maps in a HashMap).
    let value = dynamic
        .serialize_with_options(serde_json::value::Serializer, &options)
        .map_err(|e| serialise(e.to_string()))?;
    let body = serde_json::to_string_pretty(&whole(value)).map_err(|e| serialise(e.to_string()))?;
    Ok(header(writer) + &body + "\n")
}

/// `value` with every number that is whole and an `int32` written as an integer (`1`, not
/// `1.0`), which Envoy's YAML loader reads as a number; it keeps `1.0` a string.
fn whole(value: serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match value {
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() && f.fract() == 0.0 && f.abs() <= f64::from(i32::MAX) => {
                // Whole and in range: the conversion is exact.
                Value::from(f as i64)
            }
            _ => Value::Number(n),
        },
        Value::Array(items) => Value::Array(items.into_iter().map(whole).collect()),
        Value::Object(fields) => Value::Object(
            fields
                .into_iter()
                .map(|(key, value)| (key, whole(value)))
                .collect(),
        ),
        other => other,
    }
}

/// A message's fields that its descriptor did not know, at any depth (through `Any` too).
fn has_unknown_fields(message: &DynamicMessage) -> bool {
    use prost_reflect::Value;
    fn value_has(value: &Value) -> bool {
        match value {
            Value::Message(m) => has_unknown_fields(m),
            Value::List(items) => items.iter().any(value_has),
            Value::Map(entries) => entries.values().any(value_has),
            _ => false,
        }
    }
    if message.unknown_fields().next().is_some() {
        return true;
    }
    if message.descriptor().full_name() == "google.protobuf.Any" {
        let packed = message
            .get_field_by_name("type_url")
            .and_then(|v| v.as_str().map(str::to_owned))
            .and_then(|url| {
                let name = url.rsplit('/').next()?.to_owned();
                let descriptor = message
                    .descriptor()
                    .parent_pool()
                    .get_message_by_name(&name)?;
                let bytes = message.get_field_by_name("value")?.as_bytes()?.clone();
                DynamicMessage::decode(descriptor, bytes).ok()
            });
        return packed.as_ref().is_none_or(has_unknown_fields);
    }
    message.fields().any(|(_, value)| value_has(value))
}

/// [`to_yaml`], checked: the text read back ([`from_yaml`]) and written again is the same text.
/// (The message read back can differ from `message` in the bytes of an `Any`, which proto3's
/// JSON mapping writes as fields and reads back in field-number order; the text cannot.)
pub fn round_trip<M: Message + Name + Default>(
    message: &M,
    writer: &str,
) -> Result<String, YamlError> {
    let text = to_yaml(message, writer)?;
    let again = to_yaml(&from_yaml::<M>(&text)?, writer)?;
    if again != text {
        return Err(YamlError::Parse {
            message: M::full_name(),
            error: "it does not read back as written".into(),
        });
    }
    Ok(text)
}

/// A message written by [`to_yaml`] (or by hand), read back.
pub fn from_yaml<M: Message + Name + Default>(text: &str) -> Result<M, YamlError> {
    let name = M::full_name();
    let parse = |error: String| YamlError::Parse {
        message: name.clone(),
        error,
    };
    let value: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(text).map_err(|e| parse(e.to_string()))?;
    let dynamic = DynamicMessage::deserialize_with_options(
        descriptor::<M>()?,
        value.into_deserializer(),
        &DeserializeOptions::new(),
    )
    .map_err(|e| parse(e.to_string()))?;
    M::decode(dynamic.encode_to_vec().as_slice()).map_err(|e| parse(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::config::bootstrap::v3::Bootstrap;
    use envoy_types::pb::envoy::config::core::v3::Node;

    /// Strings that mean something else to YAML (or to a YAML 1.1 reader such as yaml-cpp,
    /// Envoy's) come back as the same strings.
    #[test]
    fn hostile_strings_round_trip() {
        for s in [
            "{{",
            "'",
            "\"",
            "a: b",
            "# c",
            "---",
            "&anchor",
            "*alias",
            "!!tag",
            " lead",
            "trail ",
            "\ttab",
            "new\nline",
            "nul\0",
            "\x07bell",
            "\\x41",
            "yes",
            "no",
            "on",
            "off",
            "y",
            "N",
            "true",
            "~",
            "null",
            "0755",
            "0o17",
            "0x1F",
            "1e3",
            ".inf",
            "-",
            "",
        ] {
            let b = Bootstrap {
                node: Some(Node {
                    id: s.into(),
                    cluster: format!("{s}{s}"),
                    ..Default::default()
                }),
                ..Default::default()
            };
            let text = to_yaml(&b, "test").expect("YAML");
            assert_eq!(
                from_yaml::<Bootstrap>(&text).expect("read back"),
                b,
                "{s:?}: {text}"
            );
        }
    }

    #[test]
    fn the_first_line_says_what_wrote_it_and_defaults_are_left_out() {
        let text = to_yaml(&Bootstrap::default(), "bootstrap").expect("YAML");
        let mut lines = text.lines();
        assert!(lines
            .next()
            .is_some_and(|l| l.starts_with("# Written by skewgate-control bootstrap ")));
        assert_eq!(lines.collect::<Vec<_>>(), ["{}"]);
    }
}
