//! Rust names for JSON names: snake case fields, Pascal case types and variants, keywords made
//! raw (or suffixed where Rust has no raw form), clashes numbered.

use std::collections::{BTreeMap, BTreeSet};

use proc_macro2::Span;
use syn::Ident;

/// The words of a JSON name, lowercased: split at non-alphanumerics and at case changes
/// (`podCIDRs` → `pod`, `cidrs`; `CIDRBlock` → `cidr`, `block`).
fn words(name: &str) -> Vec<String> {
    let chars: Vec<char> = name.chars().collect();
    let mut words = Vec::new();
    let mut current = String::new();
    for (i, &c) in chars.iter().enumerate() {
        if !c.is_ascii_alphanumeric() {
            if !current.is_empty() {
                words.push(std::mem::take(&mut current));
            }
            continue;
        }
        if c.is_ascii_uppercase() && !current.is_empty() {
            let prev = chars[i - 1];
            let next_lower = chars.get(i + 1).is_some_and(char::is_ascii_lowercase);
            // A new word starts at an upper-case letter after a lower-case letter or a digit
            // (`podIP`), or at the last capital of an acronym followed by lower case
            // (`CIDRBlock` → `CIDR`, `Block`), except a plural `s` (`IPs`).
            let acronym_end =
                prev.is_ascii_uppercase() && next_lower && !is_plural_s(&chars, i) && !is_version(&chars, i);
            if prev.is_ascii_lowercase() || prev.is_ascii_digit() || acronym_end {
                words.push(std::mem::take(&mut current));
            }
        }
        current.push(c.to_ascii_lowercase());
    }
    if !current.is_empty() {
        words.push(current);
    }
    words
}

/// Whether `chars[i]` is the last capital of an acronym followed by a version (`IPv6`, `HTTPv2`):
/// the acronym and its version are one word (`ipv6`, not `i`, `pv6`).
fn is_version(chars: &[char], i: usize) -> bool {
    chars.get(i + 1) == Some(&'v') && chars.get(i + 2).is_some_and(char::is_ascii_digit)
}

/// Whether `chars[i]` starts a lone lower-case `s` ending the name or a word (`IPs`, `CIDRs`).
fn is_plural_s(chars: &[char], i: usize) -> bool {
    chars.get(i + 1) == Some(&'s') && !chars.get(i + 2).is_some_and(char::is_ascii_lowercase)
}

/// Pascal case of a JSON name (`privateKey` → `PrivateKey`, `tls-cert` → `TlsCert`).
pub(crate) fn pascal(name: &str) -> String {
    words(name)
        .iter()
        .map(|w| {
            let mut chars = w.chars();
            match chars.next() {
                Some(first) => first.to_ascii_uppercase().to_string() + chars.as_str(),
                None => String::new(),
            }
        })
        .collect()
}

/// A type or variant name for `name`: Pascal case, `V` in front of a leading digit, `Value`
/// when nothing alphanumeric is left.
pub(crate) fn type_ident(name: &str) -> String {
    let pascal = pascal(name);
    if pascal.is_empty() {
        "Value".to_string()
    } else if pascal.starts_with(|c: char| c.is_ascii_digit()) {
        format!("V{pascal}")
    } else if pascal == "Self" {
        "Self_".to_string()
    } else {
        pascal
    }
}

/// The Rust name of a CRD's kind: the root type's name and the first word of the version's
/// other root-level names (`HTTPRoute` → `HttpRoute`, `HttpRouteSpec`, `HttpRouteStatus`). The
/// same rule as every other generated type name: Pascal case, acronyms as words.
pub(crate) fn kind_type_name(kind: &str) -> String {
    type_ident(kind)
}

/// The longest generated type name [`plan`] makes by adding parents (a clash that is still
/// unresolved at this length is numbered instead).
pub(crate) const MAX_TYPE_NAME: usize = 40;

/// Names the code must not shadow: the Rust prelude's types and variants (generated serde
/// attributes write `Option::is_none`), which a field called `option` or `result` would
/// otherwise take.
const PRELUDE: &[&str] = &[
    "Option",
    "Some",
    "None",
    "Result",
    "Ok",
    "Err",
    "String",
    "Vec",
    "Box",
    "Default",
    "Clone",
    "Copy",
    "Send",
    "Sync",
    "Sized",
    "Unpin",
    "Drop",
    "Fn",
    "FnMut",
    "FnOnce",
    "Iterator",
    "IntoIterator",
    "Extend",
    "ToString",
    "ToOwned",
    "From",
    "Into",
    "TryFrom",
    "TryInto",
    "AsRef",
    "AsMut",
    "PartialEq",
    "Eq",
    "PartialOrd",
    "Ord",
    "DoubleEndedIterator",
    "ExactSizeIterator",
    "FromIterator",
    "Self_",
];

/// A type the first pass over a version's schema asks for: where it occurs (each place as the
/// Pascal-case path of names that leads to it: the root-level type it hangs under, then one
/// name per field, `["CertificateSpec", "PrivateKey", "Algorithm"]`), and how many of the
/// last names its name takes at least.
#[derive(Debug, Clone)]
pub(crate) struct Wanted {
    /// Every place the shape occurs; never empty.
    pub paths: Vec<Vec<String>>,
    /// 1 for structs (`PrivateKey`), 2 for enums (`PrivateKeyAlgorithm`): a field name alone
    /// (`Type`, `Phase`, `Mode`) says little about the values it holds.
    pub min_names: usize,
}

/// Short, deterministic names for the types of one version, in the order of `wanted`.
///
/// A type is named by the shortest suffix of its path that no other type's name and nothing
/// in `reserved` takes: its field's name (`TlsConfig`), then prefixed by its parents as long as
/// it clashes (`CaSecret`, `TlsConfigCaSecret`). Every type of a clash grows, not only the one
/// met second, so a name depends on the whole schema and not on the order of the walk. A shape
/// that occurs in several places is named after its shortest path; when its field names
/// differ (`podSelector`, `namespaceSelector`) it takes the words they end with in common
/// (`Selector`). A clash that no prefix within [`MAX_TYPE_NAME`] resolves is numbered in
/// path order (`Secret`, `Secret2`).
pub(crate) fn plan(wanted: &[Wanted], reserved: &BTreeSet<String>) -> Vec<String> {
    struct Entry {
        /// The shortest path, without its last name.
        parents: Vec<String>,
        /// The last name.
        last: String,
        level: usize,
    }
    let mut entries: Vec<Entry> = wanted
        .iter()
        .map(|w| {
            let shortest = w
                .paths
                .iter()
                .min_by(|a, b| a.len().cmp(&b.len()).then_with(|| a.cmp(b)))
                .cloned()
                .unwrap_or_default();
            let mut parents = shortest;
            let last = parents.pop().unwrap_or_else(|| "Value".to_string());
            let last = common_last_words(&w.paths).unwrap_or(last);
            let level = w.min_names.clamp(1, parents.len() + 1);
            Entry { parents, last, level }
        })
        .collect();
    let name = |e: &Entry, level: usize| -> String {
        let mut name: String = e.parents[e.parents.len() + 1 - level..].concat();
        name.push_str(&e.last);
        name
    };
    let taken = |n: &str| reserved.contains(n) || PRELUDE.contains(&n);
    loop {
        let mut by_name: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for (i, e) in entries.iter().enumerate() {
            by_name.entry(name(e, e.level)).or_default().push(i);
        }
        let mut grown = false;
        for (n, group) in by_name {
            if group.len() < 2 && !taken(&n) {
                continue;
            }
            for i in group {
                let e = &entries[i];
                if e.level <= e.parents.len() && name(e, e.level + 1).len() <= MAX_TYPE_NAME {
                    entries[i].level += 1;
                    grown = true;
                }
            }
        }
        if !grown {
            break;
        }
    }
    // What is left clashing is numbered, in the order of the shortest paths.
    let mut order: Vec<usize> = (0..entries.len()).collect();
    order.sort_by(|&a, &b| {
        let key = |e: &Entry| (name(e, e.level), e.parents.clone());
        key(&entries[a]).cmp(&key(&entries[b]))
    });
    let mut used: BTreeSet<String> = BTreeSet::new();
    let mut names = vec![String::new(); entries.len()];
    for i in order {
        let base = name(&entries[i], entries[i].level);
        let mut candidate = base.clone();
        let mut n = 2;
        while taken(&candidate) || used.contains(&candidate) {
            candidate = format!("{base}{n}");
            n += 1;
        }
        used.insert(candidate.clone());
        names[i] = candidate;
    }
    names
}

/// The words the last names of `paths` end with in common, when they are not all the same
/// (`PodSelector`, `NamespaceSelector` → `Selector`); `None` when they are, or share no word.
fn common_last_words(paths: &[Vec<String>]) -> Option<String> {
    let lasts: BTreeSet<&str> = paths.iter().filter_map(|p| p.last()).map(String::as_str).collect();
    if lasts.len() < 2 {
        return None;
    }
    let split: Vec<Vec<String>> = lasts.iter().map(|l| words(l)).collect();
    let mut common = 0;
    while split.iter().all(|w| w.len() > common)
        && split
            .iter()
            .all(|w| w[w.len() - 1 - common] == split[0][split[0].len() - 1 - common])
    {
        common += 1;
    }
    let first = &split[0];
    (common > 0).then(|| pascal(&first[first.len() - common..].join("_")))
}

/// A field name for `json`, not in `taken` (which it joins): snake case, `_` in front of a
/// leading digit, keywords raw (`r#type`), `self`/`super`/`crate` suffixed, clashes numbered.
pub(crate) fn field_ident(json: &str, taken: &mut BTreeSet<String>) -> Ident {
    let mut base = words(json).join("_");
    if base.is_empty() {
        base = "field".to_string();
    } else if base.starts_with(|c: char| c.is_ascii_digit()) {
        base = format!("_{base}");
    }
    if matches!(base.as_str(), "self" | "super" | "crate" | "extern") {
        base.push('_');
    }
    let mut candidate = base.clone();
    let mut n = 2;
    while !taken.insert(candidate.clone()) {
        candidate = format!("{base}_{n}");
        n += 1;
    }
    match syn::parse_str::<Ident>(&candidate) {
        Ok(ident) => ident,
        Err(_) => Ident::new_raw(&candidate, Span::call_site()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_names_become_rust_names() {
        let mut taken = BTreeSet::new();
        let mut field = |json: &str| field_ident(json, &mut taken).to_string();
        assert_eq!(field("privateKey"), "private_key");
        assert_eq!(field("podCIDRs"), "pod_cidrs");
        assert_eq!(field("ipAddresses"), "ip_addresses");
        assert_eq!(field("CIDRBlock"), "cidr_block");
        assert_eq!(field("type"), "r#type");
        assert_eq!(field("self"), "self_");
        assert_eq!(field("3des"), "_3des");
        assert_eq!(field("x-kubernetes-name"), "x_kubernetes_name");
        assert_eq!(field("private_key"), "private_key_2");
        assert_eq!(field("$ref"), "r#ref");
        assert_eq!(field("tlsConfig"), "tls_config");
        assert_eq!(type_ident("RSA"), "Rsa");
        assert_eq!(type_ident("http/1.1"), "Http11");
        assert_eq!(type_ident("1m"), "V1m");
        assert_eq!(type_ident("-"), "Value");
        assert_eq!(pascal("matchExpressions"), "MatchExpressions");
        assert_eq!(pascal("podIPs"), "PodIps");
        assert_eq!(kind_type_name("HTTPRoute"), "HttpRoute");
        assert_eq!(type_ident("TLSConfig"), "TlsConfig");
        assert_eq!(type_ident("IPv6"), "Ipv6");
        assert_eq!(field("IPv6Address"), "ipv6_address");
        assert_eq!(field("podIPv4"), "pod_ipv4");
        assert_eq!(field("s3Bucket"), "s3_bucket");
        assert_eq!(field("x509Certificate"), "x509_certificate");
        assert_eq!(field("http2"), "http2");
    }

    fn wanted(paths: &[&str], min_names: usize) -> Wanted {
        Wanted {
            paths: paths.iter().map(|p| p.split('.').map(String::from).collect()).collect(),
            min_names,
        }
    }

    #[test]
    fn types_take_the_shortest_path_suffix_that_nothing_else_takes() {
        let reserved = BTreeSet::from(["FooSpec".to_string(), "Foo".to_string()]);
        let all = [
            wanted(&["FooSpec.TlsConfig"], 1),
            wanted(&["FooSpec.TlsConfig.Secret"], 1),
            wanted(&["FooSpec.Backend.Secret"], 1),
            wanted(
                &["FooSpec.PodSelector", "FooStatus.Selector", "FooSpec.NamespaceSelector"],
                1,
            ),
            wanted(&["FooSpec.Backend.Mode"], 2),
            wanted(&["FooSpec.Option"], 1),
            wanted(&["FooSpec.Foo"], 1),
            wanted(&["FooStatus"], 1),
        ];
        let names = plan(&all, &reserved);
        assert_eq!(
            names,
            [
                "TlsConfig",
                "TlsConfigSecret",
                "BackendSecret",
                "Selector",
                "BackendMode",
                "FooSpecOption",
                "FooSpecFoo",
                "FooStatus"
            ]
        );
        // The names do not depend on the order the walk met the types in.
        let mut reversed = all.to_vec();
        reversed.reverse();
        let mut again = plan(&reversed, &reserved);
        again.reverse();
        assert_eq!(again, names);
    }

    #[test]
    fn a_clash_no_prefix_resolves_within_the_cap_is_numbered_in_path_order() {
        let (a, b) = ("A".repeat(MAX_TYPE_NAME), "B".repeat(MAX_TYPE_NAME));
        let all = [
            wanted(&[&format!("{b}.Secret")], 1),
            wanted(&[&format!("{a}.Secret")], 1),
            wanted(&["Root.Same"], 1),
            wanted(&["Root.Same"], 1),
        ];
        let names = plan(&all, &BTreeSet::new());
        assert_eq!(names, ["Secret2", "Secret", "RootSame", "RootSame2"]);
    }
}
