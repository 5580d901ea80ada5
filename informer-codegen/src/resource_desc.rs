//! [`ResourceDesc`]: what the generator needs to know about a resource, read from a derive
//! input (`#[kube(...)]` next to `CustomResource`, or `#[informer(...)]`) or from a line of
//! xtask's resource table. Both front ends fill the same struct, so derived and generated code
//! come from the same generator call.

use syn::spanned::Spanned;
use syn::{Data, DeriveInput, Fields, Ident, LitStr, Path};

/// Everything the generator needs to know about one resource type.
#[derive(Debug, Clone)]
pub struct ResourceDesc {
    /// The Rust type the informer is for (a path, e.g. `Foo` or `::k8s_openapi::api::core::v1::Pod`).
    pub ty: Path,
    /// The type's name, which prefixes the generated names (`Foo` → `FooInformer`).
    pub name: Ident,
    /// API group (`""` for core).
    pub group: String,
    /// API version (`v1`).
    pub version: String,
    /// Kind (`Foo`).
    pub kind: String,
    /// Plural resource name (`foos`), used for the namespace lister accessor.
    pub plural: String,
    /// Whether objects live in namespaces.
    pub namespaced: bool,
    /// The path generated code uses to reach kinformer (`::kinformer` by default).
    pub krate: Path,
    /// Whether to emit `impl Foo { pub fn informer(..) }` (not possible for foreign types).
    pub inherent_impl: bool,
    /// A projection (`#[informer(projection, ...)]`): a partial, read-only type bound to the
    /// resource its attributes name (see [`crate::generate_informer_resource`]).
    pub projection: bool,
}

/// The default plural of a kind, kube-derive's rule (so the accessor matches the CRD's plural):
/// lowercase; after `s`, `x`, `z`, `ch`, `sh` add `es`; consonant + `y` → `ies`; else add `s`.
/// Irregular plurals are given with `plural = "..."`.
pub fn default_plural(kind: &str) -> String {
    let lower = kind.to_ascii_lowercase();
    if lower.ends_with(['s', 'x', 'z']) || lower.ends_with("ch") || lower.ends_with("sh") {
        format!("{lower}es")
    } else if let Some(stem) = lower.strip_suffix('y')
        && !stem.ends_with(['a', 'e', 'i', 'o', 'u'])
    {
        format!("{stem}ies")
    } else {
        format!("{lower}s")
    }
}

#[derive(Default)]
struct Attrs {
    group: Option<String>,
    version: Option<String>,
    kind: Option<LitStr>,
    plural: Option<LitStr>,
    namespaced: bool,
    krate: Option<Path>,
    projection: bool,
}

/// Whether a plural (`foos`, `foo-bars`) can become a method name: `generate` turns `.` and
/// `-` into `_` and makes keywords raw, so it must start with a letter or `_` and hold only
/// ASCII alphanumerics, `_`, `.` and `-`.
fn can_name_a_method(plural: &str) -> bool {
    plural.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && plural
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
        && !matches!(plural, "self" | "Self" | "super" | "crate" | "_")
}

/// Skips the value of a `key = value` or `key(...)` meta item we do not own.
fn skip_value(meta: &syn::meta::ParseNestedMeta) -> syn::Result<()> {
    if meta.input.peek(syn::Token![=]) {
        let _: syn::Expr = meta.value()?.parse()?;
    } else if meta.input.peek(syn::token::Paren) {
        let _: proc_macro2::TokenTree = meta.input.parse()?;
    }
    Ok(())
}

impl ResourceDesc {
    /// Reads a derive input in either form (see the crate docs). Errors carry spans: missing
    /// kind, an enum or tuple struct, an unknown `#[informer]` key.
    pub fn from_derive_input(input: &DeriveInput) -> syn::Result<Self> {
        match &input.data {
            Data::Struct(data) => {
                if let Fields::Unnamed(fields) = &data.fields {
                    return Err(syn::Error::new(
                        fields.span(),
                        "#[derive(Informer)] needs a struct with named fields, not a tuple struct",
                    ));
                }
            }
            Data::Enum(data) => {
                return Err(syn::Error::new(
                    data.enum_token.span,
                    "#[derive(Informer)] works on structs (a resource or a CustomResource spec), not enums",
                ));
            }
            Data::Union(data) => {
                return Err(syn::Error::new(
                    data.union_token.span,
                    "#[derive(Informer)] works on structs, not unions",
                ));
            }
        }

        if let Some(param) = input.generics.params.first() {
            return Err(syn::Error::new(
                param.span(),
                "#[derive(Informer)] does not support generic types: an informer is for one concrete resource type",
            ));
        }

        let mut attrs = Attrs::default();
        let mut from_kube = false;
        for attr in &input.attrs {
            if attr.path().is_ident("kube") {
                from_kube = true;
                attr.parse_nested_meta(|meta| {
                    let key = meta.path.get_ident().map(Ident::to_string).unwrap_or_default();
                    match key.as_str() {
                        "group" => attrs.group = Some(meta.value()?.parse::<LitStr>()?.value()),
                        "version" => attrs.version = Some(meta.value()?.parse::<LitStr>()?.value()),
                        "kind" => attrs.kind = Some(meta.value()?.parse::<LitStr>()?),
                        "plural" => attrs.plural = Some(meta.value()?.parse::<LitStr>()?),
                        "namespaced" => attrs.namespaced = true,
                        // The rest of kube's keys (status, shortname, derive, printcolumn, ...)
                        // are kube-derive's business.
                        _ => skip_value(&meta)?,
                    }
                    Ok(())
                })?;
            }
        }
        for attr in &input.attrs {
            if attr.path().is_ident("informer") {
                attr.parse_nested_meta(|meta| {
                    let key = meta.path.get_ident().map(Ident::to_string).unwrap_or_default();
                    match key.as_str() {
                        "group" => attrs.group = Some(meta.value()?.parse::<LitStr>()?.value()),
                        "version" => attrs.version = Some(meta.value()?.parse::<LitStr>()?.value()),
                        "kind" => attrs.kind = Some(meta.value()?.parse::<LitStr>()?),
                        "plural" => attrs.plural = Some(meta.value()?.parse::<LitStr>()?),
                        "namespaced" => attrs.namespaced = true,
                        "crate" => attrs.krate = Some(meta.value()?.parse::<LitStr>()?.parse::<Path>()?),
                        "projection" => attrs.projection = true,
                        _ => {
                            return Err(meta.error(format!(
                                "unknown informer attribute `{key}`; expected one of: group, version, kind, plural, namespaced, crate, projection"
                            )));
                        }
                    }
                    Ok(())
                })?;
            }
        }

        let Some(kind) = attrs.kind else {
            return Err(syn::Error::new(
                input.ident.span(),
                "#[derive(Informer)] needs a kind: add #[informer(kind = \"...\")] (or #[kube(kind = \"...\")] next to CustomResource)",
            ));
        };
        let kind_value = kind.value();
        // Next to CustomResource the derive sits on the spec struct; the resource is the root
        // type kube generates, named after the kind.
        let name = if from_kube {
            let mut name = syn::parse_str::<Ident>(&kind_value)
                .map_err(|_| syn::Error::new(kind.span(), format!("kind \"{kind_value}\" is not a Rust type name")))?;
            name.set_span(kind.span());
            name
        } else if attrs.projection {
            // A projection is its own type, bound to another kind's resource.
            input.ident.clone()
        } else {
            if input.ident != kind_value {
                return Err(syn::Error::new(
                    kind.span(),
                    format!("kind \"{kind_value}\" must match the type's name `{}`", input.ident),
                ));
            }
            input.ident.clone()
        };
        let Some(version) = attrs.version else {
            return Err(syn::Error::new(
                input.ident.span(),
                "#[derive(Informer)] needs a version: add #[informer(version = \"v1\")] (or #[kube(version = \"...\")])",
            ));
        };
        let plural = match attrs.plural {
            Some(plural) if !can_name_a_method(plural.value().as_str()) => {
                return Err(syn::Error::new(
                    plural.span(),
                    format!(
                        "plural \"{}\" cannot name the namespace lister accessor",
                        plural.value()
                    ),
                ));
            }
            Some(plural) => plural.value(),
            None => default_plural(&kind_value),
        };
        Ok(ResourceDesc {
            ty: name.clone().into(),
            plural,
            name,
            group: attrs.group.unwrap_or_default(),
            version,
            kind: kind_value,
            namespaced: attrs.namespaced,
            krate: attrs.krate.unwrap_or_else(|| syn::parse_quote!(::kinformer)),
            inherent_impl: true,
            projection: attrs.projection,
        })
    }
}

impl ResourceDesc {
    /// Reads one line of `cargo xtask codegen`'s resource table:
    /// `group version Kind plural namespaced|cluster type::path` (the core group as `core`).
    /// Generated code reaches kinformer through `krate`.
    pub fn from_table_line(line: &str, krate: Path) -> Result<Self, String> {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [group, version, kind, plural, scope, ty] = fields[..] else {
            return Err(format!("expected 6 fields, got {}", fields.len()));
        };
        let namespaced = match scope {
            "namespaced" => true,
            "cluster" => false,
            other => return Err(format!("scope must be namespaced or cluster, not {other}")),
        };
        if !can_name_a_method(plural) {
            return Err(format!("plural {plural} cannot name an accessor method"));
        }
        let ty: Path = syn::parse_str(ty).map_err(|e| format!("type path {ty}: {e}"))?;
        let name = syn::parse_str::<Ident>(kind).map_err(|e| format!("kind {kind}: {e}"))?;
        Ok(ResourceDesc {
            ty,
            name,
            group: if group == "core" {
                String::new()
            } else {
                group.to_string()
            },
            version: version.to_string(),
            kind: kind.to_string(),
            plural: plural.to_string(),
            namespaced,
            krate,
            inherent_impl: false,
            projection: false,
        })
    }
}
