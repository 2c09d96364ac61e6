//! PATCH bodies: JSON merge patch (RFC 7386, also used as an approximation for strategic
//! merge and server-side apply bodies) and JSON patch (RFC 6902: add, remove, replace, test).

use serde_json::Value;

/// Apply an RFC 7386 merge patch in place.
pub fn merge(target: &mut Value, patch: &Value) {
    let Some(p) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Default::default());
    }
    let t = target.as_object_mut().expect("object");
    for (k, v) in p {
        if v.is_null() {
            t.remove(k);
        } else {
            merge(t.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

fn unescape(token: &str) -> String {
    token.replace("~1", "/").replace("~0", "~")
}

/// Split a JSON pointer into its parent pointer and last token.
fn split_pointer(path: &str) -> Result<(&str, String), String> {
    let at = path
        .rfind('/')
        .ok_or_else(|| format!("invalid path {path:?}"))?;
    Ok((&path[..at], unescape(&path[at + 1..])))
}

/// Apply an RFC 6902 patch (an array of operations) in place.
pub fn json_patch(target: &mut Value, ops: &Value) -> Result<(), String> {
    let ops = ops.as_array().ok_or("a JSON patch must be an array")?;
    for op in ops {
        let kind = op.get("op").and_then(Value::as_str).ok_or("missing op")?;
        let path = op
            .get("path")
            .and_then(Value::as_str)
            .ok_or("missing path")?;
        match kind {
            "test" => {
                if target.pointer(path) != op.get("value") {
                    return Err(format!("test failed for path {path}"));
                }
            }
            "remove" => {
                let (parent, last) = split_pointer(path)?;
                let p = target
                    .pointer_mut(parent)
                    .ok_or_else(|| format!("missing path {path}"))?;
                match p {
                    Value::Object(m) => {
                        m.remove(&last)
                            .ok_or_else(|| format!("missing path {path}"))?;
                    }
                    Value::Array(a) => {
                        let i: usize = last.parse().map_err(|_| format!("bad index in {path}"))?;
                        if i >= a.len() {
                            return Err(format!("missing path {path}"));
                        }
                        a.remove(i);
                    }
                    _ => return Err(format!("missing path {path}")),
                }
            }
            "add" | "replace" => {
                let value = op.get("value").cloned().ok_or("missing value")?;
                if path.is_empty() {
                    *target = value;
                    continue;
                }
                let (parent, last) = split_pointer(path)?;
                let p = target
                    .pointer_mut(parent)
                    .ok_or_else(|| format!("missing path {path}"))?;
                match p {
                    Value::Object(m) => {
                        if kind == "replace" && !m.contains_key(&last) {
                            return Err(format!("missing path {path}"));
                        }
                        m.insert(last, value);
                    }
                    Value::Array(a) => {
                        if last == "-" && kind == "add" {
                            a.push(value);
                        } else {
                            let i: usize =
                                last.parse().map_err(|_| format!("bad index in {path}"))?;
                            match kind {
                                "add" if i <= a.len() => a.insert(i, value),
                                "replace" if i < a.len() => a[i] = value,
                                _ => return Err(format!("index out of range in {path}")),
                            }
                        }
                    }
                    _ => return Err(format!("missing path {path}")),
                }
            }
            other => return Err(format!("unsupported JSON patch op {other:?}")),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch() {
        let mut t = json!({"metadata": {"labels": {"a": "1", "b": "2"}}, "spec": {"x": 1}});
        merge(
            &mut t,
            &json!({"metadata": {"labels": {"a": null, "c": "3"}}, "spec": {"y": [1]}}),
        );
        assert_eq!(
            t,
            json!({"metadata": {"labels": {"b": "2", "c": "3"}}, "spec": {"x": 1, "y": [1]}})
        );
    }

    #[test]
    fn json_patch_ops() {
        let mut t = json!({"metadata": {"labels": {"a": "1"}}, "list": [1, 2]});
        json_patch(
            &mut t,
            &json!([
                {"op": "add", "path": "/metadata/labels/b~1c", "value": "2"},
                {"op": "remove", "path": "/metadata/labels/a"},
                {"op": "replace", "path": "/list/0", "value": 9},
                {"op": "add", "path": "/list/-", "value": 3},
                {"op": "test", "path": "/list/2", "value": 3}
            ]),
        )
        .unwrap();
        assert_eq!(
            t,
            json!({"metadata": {"labels": {"b/c": "2"}}, "list": [9, 2, 3]})
        );
        assert!(json_patch(&mut t, &json!([{"op": "remove", "path": "/nope"}])).is_err());
    }
}
