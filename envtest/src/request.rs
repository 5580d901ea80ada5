//! Request decoding: resource paths and query strings.
//!
//! Paths follow <https://kubernetes.io/docs/reference/using-api/api-concepts/#resource-uris>:
//! `/api/v1[/namespaces/{ns}]/{resource}[/{name}[/{subresource}]]` and the same under
//! `/apis/{group}/{version}`. Query strings are parsed leniently, as kube sends them
//! (`?&watch=true&...`: empty pairs are skipped).

use crate::resources::{Registry, ResourceInfo};
use crate::status::ApiError;
use std::sync::Arc;

/// A decoded resource path.
#[derive(Debug, Clone)]
pub(crate) struct ResourcePath {
    pub(crate) info: Arc<ResourceInfo>,
    /// The namespace in the path, if any.
    pub(crate) namespace: Option<String>,
    pub(crate) name: Option<String>,
    pub(crate) subresource: Option<String>,
}

/// Percent-decodes a query component (`+` is a space).
pub(crate) fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                match hex {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Decodes a query string into (name, value) pairs, skipping empty pairs.
pub(crate) fn parse_query(q: &str) -> Vec<(String, String)> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (percent_decode(k), percent_decode(v)),
            None => (percent_decode(p), String::new()),
        })
        .collect()
}

/// The query parameters envtest understands.
#[derive(Debug, Default, Clone)]
pub(crate) struct Query {
    pairs: Vec<(String, String)>,
}

impl Query {
    pub(crate) fn parse(q: &str) -> Self {
        Query { pairs: parse_query(q) }
    }

    /// The last value of a parameter.
    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.pairs
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// A boolean parameter (`true`/`1`).
    pub(crate) fn flag(&self, name: &str) -> bool {
        matches!(self.get(name), Some("true" | "1"))
    }

    /// A non-negative integer parameter; malformed → `400`.
    pub(crate) fn uint(&self, name: &str) -> Result<Option<u64>, ApiError> {
        match self.get(name) {
            None | Some("") => Ok(None),
            Some(v) => v
                .parse::<u64>()
                .map(Some)
                .map_err(|_| ApiError::bad_request(format!("invalid value for {name}: {v:?}"))),
        }
    }
}

/// The representation of a response that the `Accept` header asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Representation {
    /// The objects as stored.
    Full,
    /// `meta.k8s.io/v1` `PartialObjectMetadata` (one object, or each object of a watch) or
    /// `PartialObjectMetadataList` (a list): kind, apiVersion and metadata only.
    Metadata,
    /// A `meta.k8s.io` `Table` of the object or list, or a one-row Table per watch event
    /// (`table.rs`), in this version of `meta.k8s.io` (`v1` or `v1beta1`).
    Table(&'static str),
}

/// Picks the representation from `accept` for a list (`list`) or for one object or a watch, as
/// kube-apiserver negotiates: media ranges in order; one with `as=PartialObjectMetadata[List]`
/// (`g=meta.k8s.io`, `v=v1`) that fits the request, or `as=Table` (`g=meta.k8s.io`, `v=v1` or
/// `v1beta1`), wins, a plain JSON (or wildcard, or protobuf, answered as JSON) range means the
/// object as stored, and other conversions are skipped. Only `as=` ranges that all fit nothing
/// make a `406`.
pub(crate) fn negotiate(accept: Option<&str>, list: bool) -> Result<Representation, ApiError> {
    let Some(accept) = accept.filter(|a| !a.trim().is_empty()) else {
        return Ok(Representation::Full);
    };
    let wanted = if list {
        "PartialObjectMetadataList"
    } else {
        "PartialObjectMetadata"
    };
    for range in accept.split(',') {
        let mut parts = range.split(';').map(str::trim);
        let media = parts.next().unwrap_or("");
        let (mut as_, mut group, mut version) = (None, None, None);
        for param in parts {
            match param.split_once('=') {
                Some(("as", v)) => as_ = Some(v),
                Some(("g", v)) => group = Some(v),
                Some(("v", v)) => version = Some(v),
                _ => {}
            }
        }
        match as_ {
            None => return Ok(Representation::Full),
            Some(kind) if kind == wanted && group == Some("meta.k8s.io") && version == Some("v1") => {
                if media == "application/json" || media == "*/*" || media == "application/*" {
                    return Ok(Representation::Metadata);
                }
            }
            Some("Table") if group == Some("meta.k8s.io") => {
                let json = media == "application/json" || media == "*/*" || media == "application/*";
                match version {
                    Some("v1") if json => return Ok(Representation::Table("v1")),
                    Some("v1beta1") if json => return Ok(Representation::Table("v1beta1")),
                    _ => {}
                }
            }
            Some(_) => {}
        }
    }
    Err(ApiError::not_acceptable(accept))
}

/// `obj` as a `PartialObjectMetadata`.
pub(crate) fn partial_object_metadata(obj: &serde_json::Value) -> serde_json::Value {
    serde_json::json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj.get("metadata").cloned().unwrap_or_else(|| serde_json::json!({})),
    })
}

/// A list response as a `PartialObjectMetadataList`.
pub(crate) fn partial_object_metadata_list(list: &serde_json::Value) -> serde_json::Value {
    let items: Vec<serde_json::Value> = list
        .get("items")
        .and_then(serde_json::Value::as_array)
        .map(|items| items.iter().map(partial_object_metadata).collect())
        .unwrap_or_default();
    serde_json::json!({
        "kind": "PartialObjectMetadataList",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": list.get("metadata").cloned().unwrap_or_else(|| serde_json::json!({})),
        "items": items,
    })
}

/// What kind of path a request names.
pub(crate) enum Route {
    /// A resource path.
    Resource(ResourcePath),
    /// Anything else (discovery, health, admin): handled by path string.
    Other,
}

/// Decodes a path against the registry. `Err` for paths under `/api`/`/apis` that name no
/// served resource.
pub(crate) fn route(registry: &Registry, path: &str) -> Result<Route, ApiError> {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let (group, version, rest) = match segs.as_slice() {
        ["api", v, rest @ ..] if !rest.is_empty() => ("", *v, rest),
        ["apis", g, v, rest @ ..] if !rest.is_empty() => (*g, *v, rest),
        _ => return Ok(Route::Other),
    };
    let lookup = |plural: &str| registry.get(group, version, plural);
    // /namespaces/{ns}/{resource}/... for namespaced resources.
    if let ["namespaces", ns, resource, tail @ ..] = rest
        && let Some(info) = lookup(resource).filter(|i| i.namespaced)
    {
        let (name, sub) = split_tail(tail)?;
        return Ok(Route::Resource(ResourcePath {
            info,
            namespace: Some((*ns).to_owned()),
            name,
            subresource: sub,
        }));
    }
    let [resource, tail @ ..] = rest else {
        return Err(ApiError::no_route());
    };
    let info = lookup(resource).ok_or_else(ApiError::no_route)?;
    if info.namespaced && !tail.is_empty() {
        // A namespaced resource addressed without a namespace only lists/watches across all.
        return Err(ApiError::no_route());
    }
    let (name, sub) = split_tail(tail)?;
    Ok(Route::Resource(ResourcePath {
        info,
        namespace: None,
        name,
        subresource: sub,
    }))
}

fn split_tail(tail: &[&str]) -> Result<(Option<String>, Option<String>), ApiError> {
    match tail {
        [] => Ok((None, None)),
        [name] => Ok((Some((*name).to_owned()), None)),
        [name, sub] => Ok((Some((*name).to_owned()), Some((*sub).to_owned()))),
        _ => Err(ApiError::no_route()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_is_lenient() {
        let q = Query::parse("&&watch=true&labelSelector=app%3Dweb%2Ctier+in+(a)&x");
        assert!(q.flag("watch"));
        assert_eq!(q.get("labelSelector"), Some("app=web,tier in (a)"));
        assert_eq!(q.get("x"), Some(""));
        assert_eq!(percent_decode("%zz%4"), "%zz%4");
        assert_eq!(percent_decode("%"), "%");
    }

    #[test]
    fn routes() {
        let r = Registry::new();
        let p = |s: &str| match route(&r, s) {
            Ok(Route::Resource(p)) => Some((p.info.plural.clone(), p.namespace, p.name, p.subresource)),
            _ => None,
        };
        assert_eq!(p("/api/v1/namespaces").unwrap().0, "namespaces");
        assert_eq!(p("/api/v1/namespaces/x").unwrap().2.as_deref(), Some("x"));
        assert_eq!(p("/api/v1/namespaces/x/status").unwrap().3.as_deref(), Some("status"));
        let cm = p("/api/v1/namespaces/d/configmaps/c").unwrap();
        assert_eq!(
            (cm.0.as_str(), cm.1.as_deref(), cm.2.as_deref()),
            ("configmaps", Some("d"), Some("c"))
        );
        assert_eq!(p("/apis/apps/v1/deployments").unwrap().0, "deployments");
        assert!(p("/api/v1/configmaps/x").is_none());
        assert!(route(&r, "/api/v1/nothing").is_err());
        assert!(matches!(route(&r, "/version"), Ok(Route::Other)));
    }
}
