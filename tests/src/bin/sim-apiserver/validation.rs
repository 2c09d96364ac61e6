//! Strict field validation (`?fieldValidation=Strict`) against a real OpenAPI schema: kube
//! refuses an object with fields its schema does not declare with 400 `BadRequest`
//! "strict decoding error: unknown field ...". Only kinds the sim has kube's real document for
//! are checked (`openapi.rs`); everything else is accepted as before.

use serde_json::Value;

/// How deep `$ref`s are followed: kube's schemas are far shallower; this only stops cycles.
const MAX_DEPTH: usize = 32;

/// The unknown fields of `obj` under `schema` (resolving `$ref` and `allOf` in `doc`), as kube
/// names them (`spec.foo`, `metadata.labels` never: maps take any key).
pub fn unknown_fields(obj: &Value, schema: &Value, doc: &Value) -> Vec<String> {
    let mut out = Vec::new();
    walk(obj, schema, doc, "", 0, &mut out);
    out
}

fn resolve<'a>(schema: &'a Value, doc: &'a Value, depth: usize) -> Option<&'a Value> {
    if depth > MAX_DEPTH {
        return None;
    }
    if let Some(r) = schema.get("$ref").and_then(Value::as_str) {
        let pointer = r.strip_prefix('#')?;
        return resolve(doc.pointer(pointer)?, doc, depth + 1);
    }
    if let Some(first) = schema
        .get("allOf")
        .and_then(Value::as_array)
        .and_then(|a| a.first())
    {
        return resolve(first, doc, depth + 1);
    }
    Some(schema)
}

fn walk(obj: &Value, schema: &Value, doc: &Value, at: &str, depth: usize, out: &mut Vec<String>) {
    let Some(schema) = resolve(schema, doc, depth) else {
        return;
    };
    match obj {
        Value::Object(fields) => {
            // A map (additionalProperties) or a free-form object takes any key.
            let Some(props) = schema.get("properties").and_then(Value::as_object) else {
                return;
            };
            for (name, value) in fields {
                let path = if at.is_empty() {
                    name.clone()
                } else {
                    format!("{at}.{name}")
                };
                match props.get(name) {
                    Some(sub) => walk(value, sub, doc, &path, depth + 1, out),
                    None => out.push(path),
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter().enumerate() {
                    walk(
                        item,
                        item_schema,
                        doc,
                        &format!("{at}[{i}]"),
                        depth + 1,
                        out,
                    );
                }
            }
        }
        _ => {}
    }
}

/// kube's message for a strict decoding failure.
pub fn message(kind: &str, version: &str, unknown: &[String]) -> String {
    let fields: Vec<String> = unknown
        .iter()
        .map(|f| format!("unknown field \"{f}\""))
        .collect();
    format!(
        "{kind} in version \"{version}\" cannot be handled as a {kind}: strict decoding error: {}",
        fields.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn unknown_fields_are_found_through_refs() {
        let doc = json!({"components": {"schemas": {
            "K": {"properties": {
                "apiVersion": {"type": "string"},
                "metadata": {"allOf": [{"$ref": "#/components/schemas/M"}]},
                "spec": {"allOf": [{"$ref": "#/components/schemas/S"}]}
            }},
            "M": {"properties": {
                "name": {"type": "string"},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}}
            }},
            "S": {"properties": {"a": {"type": "string"}, "list": {"items": {"$ref": "#/components/schemas/S"}}}}
        }}});
        let schema = &doc["components"]["schemas"]["K"];
        let cases = [
            (
                json!({"apiVersion": "v", "metadata": {"name": "x", "labels": {"any": "y"}}, "spec": {"a": "b"}}),
                vec![],
            ),
            (
                json!({"spec": {"a": "b", "nope": 1}, "top": 2}),
                vec!["spec.nope", "top"],
            ),
            (
                json!({"spec": {"list": [{"a": "1"}, {"b": "2"}]}}),
                vec!["spec.list[1].b"],
            ),
        ];
        for (obj, want) in cases {
            assert_eq!(unknown_fields(&obj, schema, &doc), want, "{obj}");
        }
        assert_eq!(
            message("LeaseCandidate", "v1beta1", &["spec.nope".into()]),
            "LeaseCandidate in version \"v1beta1\" cannot be handled as a LeaseCandidate: strict decoding error: unknown field \"spec.nope\""
        );
    }
}
