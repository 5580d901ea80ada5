//! Per-type cache options (controller-runtime's `cache.Options.ByObject`): which objects of one
//! type an informer lists and watches, by label selector, field selector and namespaces.
//!
//! The factory keeps one informer per (type, options). A type's *shared* informer — the one
//! [`informer_for`](crate::SharedInformerFactory::informer_for) returns — has the options given
//! to [`by_object`](crate::SharedInformerFactoryBuilder::by_object), or none; asking for it with
//! other options is refused ([`FactoryError::ConflictingOptions`](crate::FactoryError)), so two
//! controllers never silently share a cache filtered for one of them. A consumer that wants a
//! differently filtered cache says so with
//! [`informer_for_with`](crate::SharedInformerFactory::informer_for_with), which returns the
//! informer for exactly its options.
//!
//! Namespaces: [`namespace`](CacheOptions::namespace) watches one;
//! [`namespaces`](CacheOptions::namespaces) several, as controller-runtime's
//! `ByObject[obj].Namespaces`: the informer runs one list/watch per namespace and is one
//! informer to its consumers (one cache answering for every namespace, handlers hearing all of
//! them, synced once all are; see `informer_core::Partition`). Each namespace may carry its own
//! selectors ([`namespace_with`](CacheOptions::namespace_with)), which replace the type's for
//! that namespace, as controller-runtime's per-namespace `cache.Config`.
//!
//! Selector strings are checked when the informer is requested: a bad one is a
//! [`SelectorError`], never a panic and never a request the server refuses in a retry loop.
//! kube-core has label selector *types* ([`Selector`], [`Expression`]) but no parser of the
//! string form, so [`parse_label_selector`] is written here (Kubernetes' grammar:
//! `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k`, `!k`, comma-separated).
//!
//! ```
//! use factory::CacheOptions;
//!
//! let options = CacheOptions::default().labels("app=web,tier in (front,back)").namespace("prod");
//! assert!(options.validate().is_ok());
//! let two = CacheOptions::default().labels("app=web").namespaces(["prod", "staging"]);
//! assert_eq!(two.to_string(), "labels=app=web; namespaces=prod,staging");
//! assert!(CacheOptions::default().labels("app in (").validate().is_err());
//! ```

use std::collections::BTreeMap;
use std::fmt;

use kube::core::{Expression, Selector};

/// Which objects of one type an informer lists and watches. `Default`: every object (in the
/// factory's namespace, if it has one).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct CacheOptions {
    /// Label selector for list and watch (`app=web`).
    pub label_selector: Option<String>,
    /// Field selector for list and watch (`metadata.name=x`, `status.phase!=Running`).
    pub field_selector: Option<String>,
    /// Watch only this namespace (overrides the factory's namespace; namespaced types only).
    pub namespace: Option<String>,
    /// Watch these namespaces, each with its own list/watch, behind one informer (overrides
    /// the factory's namespace; namespaced types only). Each namespace's selectors, where set,
    /// replace the type's.
    pub namespaces: BTreeMap<String, NamespaceConfig>,
}

/// The selectors of one namespace of [`CacheOptions::namespaces`] (controller-runtime's
/// per-namespace `cache.Config`): where set, they replace the type's selectors in that
/// namespace. `Default`: the type's selectors.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct NamespaceConfig {
    /// Label selector for this namespace's list and watch.
    pub label_selector: Option<String>,
    /// Field selector for this namespace's list and watch.
    pub field_selector: Option<String>,
}

impl NamespaceConfig {
    /// Only objects whose labels match `selector`, in this namespace.
    #[must_use]
    pub fn labels(mut self, selector: impl Into<String>) -> Self {
        self.label_selector = Some(selector.into());
        self
    }

    /// Only objects whose fields match `selector`, in this namespace.
    #[must_use]
    pub fn fields(mut self, selector: impl Into<String>) -> Self {
        self.field_selector = Some(selector.into());
        self
    }
}

impl CacheOptions {
    /// Only objects whose labels match `selector` (Kubernetes' label selector syntax).
    #[must_use]
    pub fn labels(mut self, selector: impl Into<String>) -> Self {
        self.label_selector = Some(selector.into());
        self
    }

    /// Only objects whose fields match `selector` (`field=value`, `field!=value`, comma-separated).
    #[must_use]
    pub fn fields(mut self, selector: impl Into<String>) -> Self {
        self.field_selector = Some(selector.into());
        self
    }

    /// Only objects in `namespace`.
    #[must_use]
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = Some(namespace.into());
        self
    }

    /// Only objects in these namespaces, each listed and watched on its own behind one
    /// informer (controller-runtime's `ByObject[obj].Namespaces`), with the type's selectors.
    /// Adds to the namespaces already given; one already given keeps its selectors.
    #[must_use]
    pub fn namespaces<S: Into<String>>(mut self, namespaces: impl IntoIterator<Item = S>) -> Self {
        for namespace in namespaces {
            self.namespaces.entry(namespace.into()).or_default();
        }
        self
    }

    /// Also objects in `namespace`, selected by `config`'s selectors where it sets them (else
    /// the type's).
    #[must_use]
    pub fn namespace_with(mut self, namespace: impl Into<String>, config: NamespaceConfig) -> Self {
        self.namespaces.insert(namespace.into(), config);
        self
    }

    /// The options one namespace of [`namespaces`](Self::namespaces) lists and watches with:
    /// the namespace, and its own selectors where set, else the type's.
    pub fn for_namespace(&self, namespace: &str) -> CacheOptions {
        let config = self.namespaces.get(namespace).cloned().unwrap_or_default();
        CacheOptions {
            label_selector: config.label_selector.or_else(|| self.label_selector.clone()),
            field_selector: config.field_selector.or_else(|| self.field_selector.clone()),
            namespace: Some(namespace.to_owned()),
            namespaces: BTreeMap::new(),
        }
    }

    /// Checks both selectors' syntax (and every namespace's), and that namespaces are not
    /// empty and not given both as one and as several.
    pub fn validate(&self) -> Result<(), SelectorError> {
        if let Some(selector) = &self.label_selector {
            parse_label_selector(selector)?;
        }
        if let Some(selector) = &self.field_selector {
            validate_field_selector(selector)?;
        }
        if self.namespace.as_deref() == Some("") || self.namespaces.contains_key("") {
            return Err(SelectorError::new("", "the namespace is empty"));
        }
        if let Some(namespace) = &self.namespace
            && !self.namespaces.is_empty()
        {
            return Err(SelectorError::new(
                namespace,
                "both namespace and namespaces are set: give every namespace to namespaces",
            ));
        }
        for config in self.namespaces.values() {
            if let Some(selector) = &config.label_selector {
                parse_label_selector(selector)?;
            }
            if let Some(selector) = &config.field_selector {
                validate_field_selector(selector)?;
            }
        }
        Ok(())
    }

    /// Whether these are the default options (every object).
    pub fn is_default(&self) -> bool {
        *self == CacheOptions::default()
    }
}

/// Shown in informer names: `labels=app=web; namespace=prod`, `namespaces=a,b(labels=x=y)`.
impl fmt::Display for CacheOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let namespaces = (!self.namespaces.is_empty()).then(|| {
            let each: Vec<String> = self
                .namespaces
                .iter()
                .map(|(namespace, config)| {
                    let own: Vec<String> = [("labels", &config.label_selector), ("fields", &config.field_selector)]
                        .into_iter()
                        .filter_map(|(name, value)| value.as_ref().map(|v| format!("{name}={v}")))
                        .collect();
                    if own.is_empty() {
                        namespace.clone()
                    } else {
                        format!("{namespace}({})", own.join("; "))
                    }
                })
                .collect();
            each.join(",")
        });
        let parts = [
            ("labels", &self.label_selector),
            ("fields", &self.field_selector),
            ("namespace", &self.namespace),
            ("namespaces", &namespaces),
        ];
        let mut first = true;
        for (name, value) in parts {
            if let Some(value) = value {
                if !first {
                    f.write_str("; ")?;
                }
                write!(f, "{name}={value}")?;
                first = false;
            }
        }
        Ok(())
    }
}

/// A label or field selector that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid selector {selector:?}: {reason}")]
#[non_exhaustive]
pub struct SelectorError {
    /// The selector as given.
    pub selector: String,
    /// What is wrong with it.
    pub reason: String,
}

impl SelectorError {
    fn new(selector: &str, reason: impl Into<String>) -> Self {
        SelectorError {
            selector: selector.to_owned(),
            reason: reason.into(),
        }
    }
}

fn valid_key(key: &str) -> bool {
    // A label key is an optional DNS subdomain prefix and a name of at most 63 characters.
    let name = key.rsplit_once('/').map_or(key, |(_, name)| name);
    !name.is_empty()
        && key.len() <= 317
        && name.len() <= 63
        && key
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.' | b'/'))
}

fn valid_value(value: &str) -> bool {
    value.len() <= 63
        && value
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// Splits on the commas outside parentheses.
fn split_requirements(selector: &str) -> Result<Vec<&str>, String> {
    let (mut parts, mut depth, mut start) = (Vec::new(), 0usize, 0);
    for (i, c) in selector.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.checked_sub(1).ok_or("unbalanced ')'")?,
            ',' if depth == 0 => {
                parts.push(&selector[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err("unbalanced '('".into());
    }
    parts.push(&selector[start..]);
    Ok(parts)
}

fn parse_set(set: &str) -> Result<Vec<String>, String> {
    let inner = set
        .trim()
        .strip_prefix('(')
        .and_then(|s| s.strip_suffix(')'))
        .ok_or_else(|| format!("expected '(values)', found {set:?}"))?;
    let values: Vec<String> = inner.split(',').map(|v| v.trim().to_owned()).collect();
    match values.iter().find(|v| !valid_value(v)) {
        Some(v) => Err(format!("invalid label value {v:?}")),
        None => Ok(values),
    }
}

/// Parses a label selector string into kube's [`Selector`] (the empty string selects
/// everything).
///
/// ```
/// use kube::core::SelectorExt;
///
/// let selector = factory::parse_label_selector("app=web,!legacy").unwrap();
/// assert!(selector.matches(&[("app".to_string(), "web".to_string())].into()));
/// assert!(factory::parse_label_selector("app==").is_ok()); // empty value
/// assert!(factory::parse_label_selector("=web").is_err());
/// ```
pub fn parse_label_selector(selector: &str) -> Result<Selector, SelectorError> {
    let error = |reason: String| SelectorError::new(selector, reason);
    let mut expressions = Vec::new();
    if selector.trim().is_empty() {
        return Ok(Selector::default());
    }
    for part in split_requirements(selector).map_err(error)? {
        let part = part.trim();
        let key_value = |key: &str, value: &str| -> Result<(String, String), SelectorError> {
            let (key, value) = (key.trim(), value.trim());
            if !valid_key(key) {
                return Err(error(format!("invalid label key {key:?}")));
            }
            if !valid_value(value) {
                return Err(error(format!("invalid label value {value:?}")));
            }
            Ok((key.to_owned(), value.to_owned()))
        };
        let key_set = |key: &str, set: &str| -> Result<(String, std::collections::BTreeSet<String>), SelectorError> {
            let key = key.trim();
            if !valid_key(key) {
                return Err(error(format!("invalid label key {key:?}")));
            }
            Ok((key.to_owned(), parse_set(set).map_err(error)?.into_iter().collect()))
        };
        let expression = if part.is_empty() {
            return Err(error("empty requirement".into()));
        } else if let Some(key) = part.strip_prefix('!') {
            let (key, _) = key_value(key, "")?;
            Expression::DoesNotExist(key)
        } else if let Some((key, value)) = part.split_once("!=") {
            let (key, value) = key_value(key, value)?;
            Expression::NotEqual(key, value)
        } else if let Some((key, value)) = part.split_once("==").or_else(|| part.split_once('=')) {
            let (key, value) = key_value(key, value)?;
            Expression::Equal(key, value)
        } else if let Some((key, set)) = part.split_once(" notin ") {
            let (key, set) = key_set(key, set)?;
            Expression::NotIn(key, set)
        } else if let Some((key, set)) = part.split_once(" in ") {
            let (key, set) = key_set(key, set)?;
            Expression::In(key, set)
        } else {
            let (key, _) = key_value(part, "")?;
            Expression::Exists(key)
        };
        expressions.push(expression);
    }
    Ok(expressions.into_iter().collect())
}

/// Checks a field selector: comma-separated `field=value`, `field==value`, `field!=value`.
fn validate_field_selector(selector: &str) -> Result<(), SelectorError> {
    if selector.trim().is_empty() {
        return Ok(());
    }
    for part in selector.split(',') {
        let field = part
            .split_once("!=")
            .or_else(|| part.split_once("=="))
            .or_else(|| part.split_once('='))
            .map(|(field, _)| field.trim());
        match field {
            Some(field)
                if !field.is_empty()
                    && field
                        .bytes()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'-' | b'_')) => {}
            _ => {
                return Err(SelectorError::new(
                    selector,
                    format!("{part:?} is not field=value, field==value or field!=value"),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use kube::core::SelectorExt;

    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> std::collections::BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn label_selectors_parse_to_the_expressions_they_name() {
        let selector = parse_label_selector("app=web, tier in (front,back),!legacy,env,x!=y,z==1").unwrap();
        let matching = labels(&[("app", "web"), ("tier", "front"), ("env", "p"), ("z", "1")]);
        assert!(selector.matches(&matching));
        for (key, value) in [("app", "db"), ("tier", "mid"), ("legacy", "1"), ("x", "y")] {
            let mut changed = matching.clone();
            changed.insert(key.into(), value.into());
            assert!(!selector.matches(&changed), "{key}={value} must not match");
        }
        let mut no_env = matching.clone();
        no_env.remove("env");
        assert!(!selector.matches(&no_env));
        assert!(
            parse_label_selector("a notin (b)")
                .unwrap()
                .matches(&labels(&[("a", "c")]))
        );
        assert!(parse_label_selector("").unwrap().selects_all());
    }

    #[test]
    fn bad_selectors_are_errors() {
        for bad in [
            "=x",
            "a=b=c",
            "a in (",
            "a in b",
            "a)",
            "a,,b",
            "a=b c",
            "!",
            "a in (b c)",
        ] {
            assert!(parse_label_selector(bad).is_err(), "{bad:?} parsed");
        }
        for bad in ["name", "=x", "a=b,", "a b=c"] {
            let options = CacheOptions::default().fields(bad);
            assert!(options.validate().is_err(), "field selector {bad:?} passed");
        }
        assert!(
            CacheOptions::default()
                .fields("metadata.name=x,status.phase!=Running")
                .validate()
                .is_ok()
        );
        assert!(CacheOptions::default().namespace("").validate().is_err());
        assert!(CacheOptions::default().namespaces([""]).validate().is_err());
        assert!(
            CacheOptions::default()
                .namespace("a")
                .namespaces(["b"])
                .validate()
                .is_err()
        );
        let bad_override = CacheOptions::default().namespace_with("a", NamespaceConfig::default().labels("x in ("));
        assert!(bad_override.validate().is_err());
    }

    #[test]
    fn each_namespace_lists_with_its_own_selectors_or_the_types() {
        let options = CacheOptions::default()
            .labels("app=web")
            .fields("metadata.name!=x")
            .namespaces(["a", "b"])
            .namespace_with("b", NamespaceConfig::default().labels("app=db"));
        assert_eq!(
            options.for_namespace("a"),
            CacheOptions::default()
                .labels("app=web")
                .fields("metadata.name!=x")
                .namespace("a")
        );
        assert_eq!(
            options.for_namespace("b"),
            CacheOptions::default()
                .labels("app=db")
                .fields("metadata.name!=x")
                .namespace("b")
        );
        assert_eq!(
            options.to_string(),
            "labels=app=web; fields=metadata.name!=x; namespaces=a,b(labels=app=db)"
        );
        // Adding a namespace again keeps its own selectors.
        assert_eq!(options.clone().namespaces(["b"]), options);
    }

    #[test]
    fn options_display_what_they_filter() {
        assert_eq!(CacheOptions::default().to_string(), "");
        let options = CacheOptions::default().labels("a=b").namespace("ns");
        assert_eq!(options.to_string(), "labels=a=b; namespace=ns");
        assert!(!options.is_default() && CacheOptions::default().is_default());
    }
}
