//! The YAML skewgate writes for Envoy (`control/src/envoy/yaml.rs`), read by the real Envoy:
//! every string arrives as it was written, whatever YAML (or yaml-cpp, Envoy's reader, which
//! guesses unquoted scalars' types the YAML 1.1 way) would make of it, and whole numbers stay
//! numbers. Before the strings were double-quoted, `cluster: yes` made Envoy refuse the
//! bootstrap, and the node metadata's `1.0` reached the control plane as the string "1.0".

use anyhow::Result;
use envoy_types::pb::envoy::config::bootstrap::v3::{Admin, Bootstrap};
use envoy_types::pb::envoy::config::core::v3::{
    address, socket_address, Address as EnvoyAddress, Node, SocketAddress,
};
use envoy_types::pb::google::protobuf::{value::Kind, ListValue, Struct, Value};
use serde_json::json;
use skewgate_control::envoy::{yaml, Address};
use skewgate_tests::Envoy;

/// Strings that YAML, or yaml-cpp, reads as something else when they stand unquoted.
const HOSTILE: [&str; 31] = [
    "yes",
    "No",
    "on",
    "OFF",
    "y",
    "n",
    "true",
    "~",
    "null",
    "0755",
    "0o17",
    "0x1F",
    "1e3",
    ".inf",
    "1.0",
    "12",
    "-",
    " leading",
    "trailing ",
    "\ttab",
    "new\nline",
    "nul\0x",
    "# c",
    "a: b",
    "&anchor",
    "*alias",
    "!!tag",
    "---",
    "...",
    "{{node_id}}",
    "\\x41 \\q",
];

fn list(values: impl IntoIterator<Item = Kind>) -> Value {
    Value {
        kind: Some(Kind::ListValue(ListValue {
            values: values
                .into_iter()
                .map(|k| Value { kind: Some(k) })
                .collect(),
        })),
    }
}

#[tokio::test]
async fn every_string_reaches_envoy_as_written_and_whole_numbers_as_numbers() -> Result<()> {
    let long = "y".repeat(64 * 1024);
    let strings: Vec<String> = HOSTILE
        .iter()
        .map(|s| s.to_string())
        .chain([long.clone()])
        .collect();
    let bootstrap = Bootstrap {
        node: Some(Node {
            id: "yaml-probe".into(),
            cluster: "yes".into(),
            metadata: Some(Struct {
                fields: [
                    (
                        "strings".to_string(),
                        list(strings.iter().cloned().map(Kind::StringValue)),
                    ),
                    (
                        "numbers".to_string(),
                        list([1.0, 70.0, 0.5].map(Kind::NumberValue)),
                    ),
                ]
                .into(),
            }),
            ..Default::default()
        }),
        admin: Some(Admin {
            address: Some(EnvoyAddress {
                address: Some(address::Address::SocketAddress(SocketAddress {
                    address: "127.0.0.1".into(),
                    port_specifier: Some(socket_address::PortSpecifier::PortValue(0)),
                    ..Default::default()
                })),
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let text = yaml::round_trip(&bootstrap, "test")?;
    let envoy = Envoy::spawn(text.as_bytes(), Address::parse_listen("127.0.0.1:0")?).await?;
    let dump: serde_json::Value = serde_json::from_str(&envoy.admin("/config_dump").await?)?;
    let node = &dump["configs"][0]["bootstrap"]["node"];
    assert_eq!(node["cluster"], "yes");
    assert_eq!(node["metadata"]["strings"], json!(strings));
    // Whole numbers are numbers; a number that is not whole Envoy keeps as a string in a
    // Struct (its YAML loader leaves the conversion to the field's type): the readers of the
    // node metadata take both (`skewgate_control::envoy::dialect::number`).
    assert_eq!(node["metadata"]["numbers"], json!([1, 70, "0.5"]));
    Ok(())
}
