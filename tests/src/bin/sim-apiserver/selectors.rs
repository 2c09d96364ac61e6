//! `labelSelector` and `fieldSelector` query parameters, the subset clients use:
//! label `k=v`, `k==v`, `k!=v`, `k`, `!k`, `k in (a,b)`, `k notin (a,b)`; field
//! `metadata.name` and `metadata.namespace` with `=`, `==`, `!=`.

use serde_json::Value;

#[derive(Debug, PartialEq)]
enum Op {
    Eq(String),
    NotEq(String),
    In(Vec<String>),
    NotIn(Vec<String>),
    Exists,
    NotExists,
}

impl Op {
    fn matches(&self, value: Option<&str>) -> bool {
        match self {
            Op::Eq(v) => value == Some(v.as_str()),
            Op::NotEq(v) => value != Some(v.as_str()),
            Op::In(vs) => value.is_some_and(|x| vs.iter().any(|v| v == x)),
            Op::NotIn(vs) => !value.is_some_and(|x| vs.iter().any(|v| v == x)),
            Op::Exists => value.is_some(),
            Op::NotExists => value.is_none(),
        }
    }
}

/// Parsed selectors of one request; the empty selector matches everything.
#[derive(Debug, Default)]
pub struct Selector {
    labels: Vec<(String, Op)>,
    fields: Vec<(String, Op)>,
}

/// Split on commas that are not inside parentheses.
fn split_terms(s: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0i32, 0usize);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(s[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(s[start..].trim());
    out.into_iter().filter(|t| !t.is_empty()).collect()
}

fn parse_set(s: &str) -> Result<Vec<String>, String> {
    let inner = s
        .trim()
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| format!("expected a (set) in {s:?}"))?;
    Ok(inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect())
}

fn parse_term(t: &str, allow_sets: bool) -> Result<(String, Op), String> {
    if let Some((k, v)) = t.split_once("!=") {
        return Ok((k.trim().into(), Op::NotEq(v.trim().into())));
    }
    if let Some((k, v)) = t.split_once("==").or_else(|| t.split_once('=')) {
        return Ok((k.trim().into(), Op::Eq(v.trim().into())));
    }
    if allow_sets {
        if let Some((k, set)) = t.split_once(" notin ") {
            return Ok((k.trim().into(), Op::NotIn(parse_set(set)?)));
        }
        if let Some((k, set)) = t.split_once(" in ") {
            return Ok((k.trim().into(), Op::In(parse_set(set)?)));
        }
        if let Some(k) = t.strip_prefix('!') {
            return Ok((k.trim().into(), Op::NotExists));
        }
        if !t.contains([' ', '(', ')']) {
            return Ok((t.into(), Op::Exists));
        }
    }
    Err(format!("unable to parse requirement: {t:?}"))
}

impl Selector {
    /// Parse both selectors; the error text is meant for a 400 BadRequest Status.
    pub fn parse(label: Option<&str>, field: Option<&str>) -> Result<Selector, String> {
        let labels = split_terms(label.unwrap_or(""))
            .into_iter()
            .map(|t| parse_term(t, true))
            .collect::<Result<Vec<_>, _>>()?;
        let fields = split_terms(field.unwrap_or(""))
            .into_iter()
            .map(|t| parse_term(t, false))
            .collect::<Result<Vec<_>, _>>()?;
        for (f, _) in &fields {
            if f != "metadata.name" && f != "metadata.namespace" {
                return Err(format!("field label not supported: {f}"));
            }
        }
        Ok(Selector { labels, fields })
    }

    /// A selector on `metadata.name` only (watching one object by its path).
    pub fn add_name(&mut self, name: &str) {
        self.fields
            .push(("metadata.name".into(), Op::Eq(name.into())));
    }

    pub fn matches(&self, obj: &Value) -> bool {
        let md = obj.get("metadata");
        let labels = md.and_then(|m| m.get("labels"));
        self.labels
            .iter()
            .all(|(k, op)| op.matches(labels.and_then(|l| l.get(k)).and_then(Value::as_str)))
            && self.fields.iter().all(|(f, op)| {
                let key = f.trim_start_matches("metadata.");
                let v = md
                    .and_then(|m| m.get(key))
                    .and_then(Value::as_str)
                    .unwrap_or("");
                op.matches(Some(v))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn o(name: &str, labels: Value) -> Value {
        json!({"metadata": {"name": name, "namespace": "ns", "labels": labels}})
    }

    #[test]
    fn labels() {
        let a = o("a", json!({"app": "web", "tier": "fe"}));
        let b = o("b", json!({"app": "db"}));
        let s = Selector::parse(Some("app=web"), None).unwrap();
        assert!(s.matches(&a) && !s.matches(&b));
        let s = Selector::parse(Some("app in (web, db),!tier"), None).unwrap();
        assert!(!s.matches(&a) && s.matches(&b));
        let s = Selector::parse(Some("tier"), None).unwrap();
        assert!(s.matches(&a) && !s.matches(&b));
        let s = Selector::parse(Some("app notin (web)"), None).unwrap();
        assert!(!s.matches(&a) && s.matches(&b));
        assert!(Selector::parse(None, None).unwrap().matches(&a));
    }

    #[test]
    fn fields() {
        let a = o("a", json!({}));
        let s = Selector::parse(None, Some("metadata.name=a")).unwrap();
        assert!(s.matches(&a));
        let s = Selector::parse(None, Some("metadata.namespace!=ns")).unwrap();
        assert!(!s.matches(&a));
        assert!(Selector::parse(None, Some("spec.nodeName=x")).is_err());
        let mut s = Selector::default();
        s.add_name("b");
        assert!(!s.matches(&a));
    }
}
