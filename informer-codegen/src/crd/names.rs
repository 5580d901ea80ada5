//! Rust names for JSON names: snake case fields, Pascal case types and variants, keywords made
//! raw (or suffixed where Rust has no raw form), clashes numbered.

use std::collections::BTreeSet;

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
            let acronym_end = prev.is_ascii_uppercase() && next_lower && !is_plural_s(&chars, i);
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
    }
}
