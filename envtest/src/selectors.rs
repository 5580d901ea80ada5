//! Label and field selectors, as list and watch requests carry them in the query string.
//!
//! Label selector grammar (<https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#label-selectors>):
//! comma-separated requirements `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k`, `!k`.
//! Field selectors support `metadata.name` and `metadata.namespace` with `=`, `==`, `!=`, and
//! Events' own fields (`events.rs`: `involvedObject.name`, `reason`, `type`, …).

use crate::object;
use serde_json::Value;

/// One label requirement.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

/// A parsed label selector; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
}

fn valid_key(k: &str) -> bool {
    !k.is_empty()
        && k.len() <= 317
        && k.bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.' | b'/'))
}

fn valid_value(v: &str) -> bool {
    v.len() <= 63
        && v.bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// Splits on commas that are not inside parentheses.
fn split_top_level(s: &str) -> Result<Vec<&str>, String> {
    let mut parts = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth < 0 {
                    return Err("unbalanced ')'".into());
                }
            }
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err("unbalanced '('".into());
    }
    parts.push(&s[start..]);
    Ok(parts)
}

fn parse_set(rest: &str) -> Result<Vec<String>, String> {
    let rest = rest.trim();
    let inner = rest
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| format!("expected '(values)', found {rest:?}"))?;
    let values: Vec<String> = inner
        .split(',')
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
        .collect();
    if values.is_empty() {
        return Err("set must not be empty".into());
    }
    if let Some(v) = values.iter().find(|v| !valid_value(v)) {
        return Err(format!("invalid label value {v:?}"));
    }
    Ok(values)
}

impl LabelSelector {
    /// Parses a selector; the error text goes into a `400 BadRequest`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut requirements = Vec::new();
        if s.trim().is_empty() {
            return Ok(LabelSelector { requirements });
        }
        for part in split_top_level(s)? {
            let part = part.trim();
            if part.is_empty() {
                return Err(format!("empty requirement in selector {s:?}"));
            }
            let req = if let Some(key) = part.strip_prefix('!') {
                let key = key.trim();
                if !valid_key(key) {
                    return Err(format!("invalid label key {key:?}"));
                }
                Requirement::DoesNotExist(key.to_owned())
            } else if let Some((k, v)) = part.split_once("!=") {
                Requirement::NotEquals(k.trim().to_owned(), v.trim().to_owned())
            } else if let Some((k, v)) = part.split_once("==") {
                Requirement::Equals(k.trim().to_owned(), v.trim().to_owned())
            } else if let Some((k, v)) = part.split_once('=') {
                Requirement::Equals(k.trim().to_owned(), v.trim().to_owned())
            } else if let Some((k, rest)) = part.split_once(" notin ") {
                Requirement::NotIn(k.trim().to_owned(), parse_set(rest)?)
            } else if let Some((k, rest)) = part.split_once(" in ") {
                Requirement::In(k.trim().to_owned(), parse_set(rest)?)
            } else {
                Requirement::Exists(part.to_owned())
            };
            match &req {
                Requirement::Equals(k, v) | Requirement::NotEquals(k, v) => {
                    if !valid_key(k) {
                        return Err(format!("invalid label key {k:?}"));
                    }
                    if !valid_value(v) {
                        return Err(format!("invalid label value {v:?}"));
                    }
                }
                Requirement::In(k, _)
                | Requirement::NotIn(k, _)
                | Requirement::Exists(k)
                | Requirement::DoesNotExist(k) => {
                    if !valid_key(k) {
                        return Err(format!("invalid label key {k:?}"));
                    }
                }
            }
            requirements.push(req);
        }
        Ok(LabelSelector { requirements })
    }

    /// Whether the object's labels satisfy every requirement.
    pub fn matches(&self, obj: &Value) -> bool {
        if self.requirements.is_empty() {
            return true;
        }
        let get = |key: &str| object::labels(obj).find(|(k, _)| *k == key).map(|(_, v)| v);
        self.requirements.iter().all(|r| match r {
            Requirement::Equals(k, v) => get(k) == Some(v.as_str()),
            Requirement::NotEquals(k, v) => get(k) != Some(v.as_str()),
            Requirement::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            Requirement::NotIn(k, vs) => !get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            Requirement::Exists(k) => get(k).is_some(),
            Requirement::DoesNotExist(k) => get(k).is_none(),
        })
    }
}

/// A parsed field selector over `metadata.name` / `metadata.namespace` (and a kind's own
/// selectable fields).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector {
    /// (field, value, equal?) triples.
    terms: Vec<(String, String, bool)>,
}

impl FieldSelector {
    /// Parses a selector; unsupported fields are an error (kube-apiserver answers 400).
    pub fn parse(s: &str) -> Result<Self, String> {
        Self::parse_with(s, &[])
    }

    /// Parses a selector that may also name the `kind_fields` of the resource (a core Event's
    /// `involvedObject.name`, `reason`, …: kube-apiserver's per-kind selectable fields).
    pub(crate) fn parse_with(s: &str, kind_fields: &[&str]) -> Result<Self, String> {
        let mut terms = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (field, value, eq) = if let Some((f, v)) = part.split_once("!=") {
                (f, v, false)
            } else if let Some((f, v)) = part.split_once("==") {
                (f, v, true)
            } else if let Some((f, v)) = part.split_once('=') {
                (f, v, true)
            } else {
                return Err(format!("invalid field selector term {part:?}"));
            };
            let field = field.trim();
            if !matches!(field, "metadata.name" | "metadata.namespace") && !kind_fields.contains(&field) {
                return Err(format!("field label not supported: {field}"));
            }
            terms.push((field.to_owned(), value.trim().to_owned(), eq));
        }
        Ok(FieldSelector { terms })
    }

    /// Whether the object satisfies every term.
    pub fn matches(&self, obj: &Value) -> bool {
        self.terms.iter().all(|(field, value, eq)| {
            let actual = match field.as_str() {
                "metadata.name" => object::name(obj),
                "metadata.namespace" => object::namespace(obj),
                // A core Event's `source` selects its `source.component`.
                "source" => obj["source"]["component"].as_str().unwrap_or(""),
                path => path
                    .split('.')
                    .try_fold(obj, |v, step| v.get(step))
                    .and_then(Value::as_str)
                    .unwrap_or(""),
            };
            (actual == value) == *eq
        })
    }

    /// The name an `metadata.name=` term pins, if any.
    pub fn exact_name(&self) -> Option<&str> {
        self.terms
            .iter()
            .find(|(f, _, eq)| f == "metadata.name" && *eq)
            .map(|(_, v, _)| v.as_str())
    }
}

/// What a list or watch selects: namespace, labels and fields.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// Only this namespace (namespaced requests).
    pub namespace: Option<String>,
    /// Label selector.
    pub labels: LabelSelector,
    /// Field selector.
    pub fields: FieldSelector,
}

impl Filter {
    /// Whether the object passes the filter.
    pub fn matches(&self, obj: &Value) -> bool {
        if let Some(ns) = &self.namespace
            && object::namespace(obj) != ns
        {
            return false;
        }
        self.labels.matches(obj) && self.fields.matches(obj)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(labels: Value) -> Value {
        json!({"metadata": {"name": "n", "namespace": "ns", "labels": labels}})
    }

    #[test]
    fn label_grammar() {
        let o = obj(json!({"app": "web", "tier": "fe"}));
        for (sel, want) in [
            ("", true),
            ("app=web", true),
            ("app==web", true),
            ("app!=web", false),
            ("app in (web,db)", true),
            ("app notin (web)", false),
            ("tier", true),
            ("!tier", false),
            ("!missing", true),
            ("app=web,tier in (fe)", true),
            ("missing notin (x)", true),
        ] {
            assert_eq!(LabelSelector::parse(sel).unwrap().matches(&o), want, "{sel}");
        }
        for bad in ["app=(", "a b c", "=x", "app in ()", ",", "app in (a", "app=web,"] {
            assert!(LabelSelector::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn field_grammar() {
        let o = obj(json!({}));
        assert!(FieldSelector::parse("metadata.name=n").unwrap().matches(&o));
        assert!(!FieldSelector::parse("metadata.namespace!=ns").unwrap().matches(&o));
        assert!(FieldSelector::parse("spec.x=1").is_err());
    }
}
