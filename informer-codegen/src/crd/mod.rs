//! Rust types, typed informers and listers from a `CustomResourceDefinition`'s YAML.
//!
//! For each served version of a CRD, [`generate_crd`] emits a module (`v1`, `v1beta1`) with:
//!
//! - the root type (`Certificate`): `metadata`, `spec` (absent when the schema has
//!   none), `status` only when the version has a status subresource (otherwise a `status` in the
//!   schema is a plain field), every other top-level field of the schema as a typed field, and
//!   `extra`, a flattened map of the top-level fields the schema does not declare, so a write
//!   built from a cached object never erases a field the server holds. Its serde impls write
//!   `apiVersion` and `kind` first (as kube's derive and k8s-openapi do) and ignore them when
//!   reading; it implements `kube::Resource`, `HasSpec`/`HasStatus` where they apply, `new(name,
//!   spec)` (when nothing else is required), and `CustomResourceExt`, whose `crd()` is the CRD
//!   document itself (every version, printer columns, short names, categories, subresources);
//!   the scale subresource's paths are in the type's doc. kube's `CustomResource` derive is not
//!   used: its root has `metadata`, `spec` and `status` alone;
//! - a version marked `served: false` is skipped (naming it in [`CrdOptions::versions`] is an
//!   error); a `deprecated` one's root type is `#[deprecated]` with the CRD's
//!   `deprecationWarning` or kube-apiserver's default warning;
//! - one struct per object shape with properties, one open enum
//!   per string enum (the known values, then `Other(String)`, which keeps a value added to the
//!   CRD later and writes it back unchanged, so an older controller still reads newer objects;
//!   variant names as `variant_names` says; `Default` when the schema has a default), `f64` for
//!   `number`, written with `__codegen::number` so an integral value within ±2^53 is written as
//!   an integer (`100` stays `100`, as kube-apiserver, which reads custom resources as
//!   unstructured JSON, stores it anyway), `Option<T>` for fields that are not required (or are
//!   required and nullable: `null` reads as `None`, and `None` is written `null`),
//!   `Option<Option<T>>` for a nullable field that is not required (absent is `None`, an
//!   explicit `null` is `Some(None)`, as the server stores it, and each is written back as it
//!   was read), `BTreeMap`
//!   for `additionalProperties`, `IntOrString` for `x-kubernetes-int-or-string` (in arrays and
//!   maps too), kinformer's `quantity::Quantity` for a resource quantity (controller-gen's
//!   int-or-string with the quantity `pattern`: it writes `cpu: 1` back as a number, where
//!   k8s-openapi's `Quantity` would write `"1"`, and holds `8589934592`, where `IntOrString`'s
//!   `i32` would not decode), and
//!   `serde_json::Value` for `x-kubernetes-preserve-unknown-fields` without properties and for
//!   embedded resources; an object that keeps unknown fields next to known ones gets a
//!   flattened map for them, so nothing the server sends is lost on a round trip;
//! - type names as `names::plan` chooses them: Pascal case with acronyms as words (`HTTPRoute`
//!   → `HttpRoute`, `TLSConfig` → `TlsConfig`), the shortest suffix of the type's path that no
//!   other type takes (`PrivateKey`, then `TlsConfigSecret` and `BackendSecret` when two
//!   `secret` shapes differ; enums at least parent and field, `PrivateKeyAlgorithm`), at most
//!   40 characters before a clash is numbered. A shape that occurs under several paths
//!   (`podSelector`, `namespaceSelector`) is one type (`Selector`): equal schemas, descriptions
//!   inside included, less the description, default and nullability of the field that holds
//!   it (on the corpus, 416 places make 324 types; 357 if the field's description counted too,
//!   316 if no description counted, which would give shared fields wrong docs);
//! - serde derives (and schemars' `JsonSchema` with [`CrdOptions::schemars`]), with
//!   `#[serde(rename)]` wherever the Rust name (snake case,
//!   keywords raw, clashes numbered) differs from the JSON name, and doc comments from each
//!   `description` (and the server's `default`, when there is one);
//! - the same `FooInformer`, `FooLister` and `FooNamespaceLister` that `#[derive(Informer)]`
//!   emits (one generator, [`crate::generate`]).
//!
//! Every path in the output goes through the kinformer facade (`::kinformer::kube`,
//! `::kinformer::serde`, `::kinformer::schemars`, …), so a crate that uses the generated code
//! needs no dependency but `kinformer`.
//!
//! # What the generated types do not model
//!
//! - `default:` values are documented, not applied (the server applies them; a client that
//!   decodes a stored object already has them); an enum's `Default` is the schema's default.
//! - Validation (`pattern`, `minimum`, `maxLength`, `anyOf`/`oneOf`/`allOf`/`not`, CEL
//!   `x-kubernetes-validations`) is the server's business and is not checked on the client;
//!   types come from `type` alone.
//! - An `IntOrString` holds an `i32` (k8s-openapi's type): an int-or-string field that is not a
//!   quantity and holds a larger integer does not decode.
//! - A `number` is an `f64`: an integer beyond ±2^53 loses precision, and a float with no
//!   fraction (`2.0`) is written `2`, as the server would store it.
//! - A missing `spec` whose type has a `Default` reads as empty and is written back as
//!   `spec: {}`.
//! - Unknown fields are kept at the top level (`extra`) and in objects the schema marks
//!   `x-kubernetes-preserve-unknown-fields`; elsewhere the server prunes them, so there is
//!   nothing to keep.
//! - `Other("Strict")` built by hand is not equal to the known variant `Strict` (both write
//!   `"Strict"`; decoding always picks the known variant).
//! - An embedded resource (`x-kubernetes-embedded-resource`) is `serde_json::Value`, not a typed
//!   object; list and map semantics (`x-kubernetes-list-type`, `x-kubernetes-list-map-keys`,
//!   `x-kubernetes-map-type`) are not modelled (a list is a `Vec`, a map a `BTreeMap`).
//! - The status and scale subresources have no types of their own: write status through
//!   `Api::replace_status`/`patch_status` with the root type, scale with kube's `Scale`.
//! - `CustomResourceExt::crd()` returns the whole CRD (every version), where kube's derive
//!   returns one version's.

mod names;
mod root;
pub mod schema;

use std::collections::{BTreeMap, BTreeSet};

use proc_macro2::TokenStream;
use quote::{format_ident, quote};
use syn::{Ident, Path};

use crate::{ResourceDesc, generate};
use names::{Wanted, field_ident, kind_type_name, type_ident};
use schema::{AdditionalProperties, Crd, CrdVersion, Schema};

/// Why a CRD could not be turned into Rust.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CrdError {
    /// The CRD's name (`certificates.cert-manager.io`), or where it came from.
    pub crd: String,
    /// What is wrong.
    pub message: String,
}

impl CrdError {
    /// An error about `crd` (its name, or where it came from).
    pub fn new(crd: impl Into<String>, message: impl Into<String>) -> Self {
        CrdError {
            crd: crd.into(),
            message: message.into(),
        }
    }
}

impl std::fmt::Display for CrdError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.crd, self.message)
    }
}

impl std::error::Error for CrdError {}

/// The `CustomResourceDefinition`s of a YAML text (one or several documents separated by
/// `---`); documents of other kinds are skipped. A CRD of `apiextensions.k8s.io/v1beta1` is an
/// error: that API was removed in Kubernetes 1.22 and its schema layout differs.
pub fn crds_from_yaml(text: &str, origin: &str) -> Result<Vec<Crd>, CrdError> {
    let error = |message: String| CrdError {
        crd: origin.to_string(),
        message,
    };
    let documents: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(text).map_err(|e| error(format!("not YAML: {e}")))?;
    let mut crds = Vec::new();
    for document in documents {
        if document.get("kind").and_then(serde_json::Value::as_str) != Some("CustomResourceDefinition") {
            continue;
        }
        let mut crd: Crd = serde_json::from_value(document.clone())
            .map_err(|e| error(format!("not a CustomResourceDefinition: {e}")))?;
        crd.document = document;
        if crd.api_version != "apiextensions.k8s.io/v1" {
            return Err(error(format!(
                "{} is {}; only apiextensions.k8s.io/v1 CRDs are read",
                crd.metadata.name, crd.api_version
            )));
        }
        crds.push(crd);
    }
    Ok(crds)
}

/// The file a CRD's code goes to: `<plural>_<group>.rs`, `.` and `-` as `_`.
pub fn file_stem(crd: &Crd) -> String {
    format!("{}_{}", crd.spec.names.plural, crd.spec.group).replace(['.', '-'], "_")
}

/// How [`generate_crd`] writes its output: `CrdOptions::new().versions(["v1"]).schemars(true)`.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct CrdOptions {
    /// The path generated code reaches kinformer by (`::kinformer`).
    pub krate: Path,
    /// The versions to generate; empty means every served version.
    pub versions: Vec<String>,
    /// Derive schemars' `JsonSchema` for the generated types (off by default: the types are
    /// made from the CRD's schema, which the generated code does not need to derive again).
    pub schemars: bool,
}

impl Default for CrdOptions {
    fn default() -> Self {
        CrdOptions {
            krate: syn::parse_quote!(::kinformer),
            versions: Vec::new(),
            schemars: false,
        }
    }
}

impl CrdOptions {
    /// The defaults: code reaches kinformer by `::kinformer`, every served version, no
    /// schemars derives.
    pub fn new() -> Self {
        CrdOptions::default()
    }

    /// The path generated code reaches kinformer by.
    #[must_use]
    pub fn krate(mut self, krate: Path) -> Self {
        self.krate = krate;
        self
    }

    /// The versions to generate; none means every served version.
    #[must_use]
    pub fn versions<I, V>(mut self, versions: I) -> Self
    where
        I: IntoIterator<Item = V>,
        V: Into<String>,
    {
        self.versions = versions.into_iter().map(Into::into).collect();
        self
    }

    /// Whether to derive schemars' `JsonSchema` for the generated types.
    #[must_use]
    pub fn schemars(mut self, schemars: bool) -> Self {
        self.schemars = schemars;
        self
    }
}

/// One module per chosen version of `crd`, with its types, informer and listers (see the
/// module docs).
pub fn generate_crd(crd: &Crd, options: &CrdOptions) -> Result<TokenStream, CrdError> {
    let name = if crd.metadata.name.is_empty() {
        format!("{}.{}", crd.spec.names.plural, crd.spec.group)
    } else {
        crd.metadata.name.clone()
    };
    let error = |message: String| CrdError {
        crd: name.clone(),
        message,
    };
    for wanted in &options.versions {
        match crd.spec.versions.iter().find(|v| &v.name == wanted) {
            None => return Err(error(format!("has no version {wanted}"))),
            Some(v) if !v.served => {
                return Err(error(format!(
                    "version {wanted} is not served (served: false): the server answers 404 for it"
                )));
            }
            Some(_) => {}
        }
    }
    if crd.document.is_null() {
        return Err(error(
            "has no source document (read CRDs with crds_from_yaml)".to_string(),
        ));
    }
    let chosen: Vec<_> = crd
        .spec
        .versions
        .iter()
        .filter(|v| {
            if options.versions.is_empty() {
                v.served
            } else {
                options.versions.contains(&v.name)
            }
        })
        .collect();
    if chosen.is_empty() {
        return Err(error("serves no version".to_string()));
    }
    let mut modules = TokenStream::new();
    for version in chosen {
        let schema = version
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .ok_or_else(|| error(format!("version {} has no openAPIV3Schema", version.name)))?;
        let body = generate_version(crd, version, schema, options)
            .map_err(|m| error(format!("version {}: {m}", version.name)))?;
        let module = crate::generate::ident(&version.name);
        let doc = format!(
            " `{}/{}` `{}`{}{}.",
            crd.spec.group,
            version.name,
            crd.spec.names.kind,
            if version.storage { ", the storage version" } else { "" },
            if version.deprecated { " (deprecated)" } else { "" }
        );
        // A deprecated version's root type is `#[deprecated]`; its own module uses it freely.
        let allow = version.deprecated.then(|| quote!(#[allow(deprecated)]));
        modules.extend(quote! {
            #[doc = #doc]
            #allow
            pub mod #module {
                #body
            }
        });
    }
    // The CRD document, which every version's `CustomResourceExt::crd()` returns.
    let json = serde_json::to_string(&crd.document).map_err(|e| error(format!("cannot write the CRD as JSON: {e}")))?;
    let json_ident = format_ident!("{}", root::CRD_JSON);
    Ok(quote! {
        /// The `CustomResourceDefinition` the types were generated from, as JSON.
        const #json_ident: &str = #json;
        #modules
    })
}

/// [`generate_crd`] as a formatted file: a `DO NOT EDIT` line naming `source`, a module doc,
/// the lints generated code may trip allowed, and the modules.
pub fn crd_file(crd: &Crd, options: &CrdOptions, source: &str) -> Result<String, CrdError> {
    let modules = generate_crd(crd, options)?;
    let doc = format!(
        " Types, informers and listers of the custom resource `{}` (`{}`, kind `{}`), generated from `{source}`.",
        crd.metadata.name, crd.spec.group, crd.spec.names.kind
    );
    let file = quote! {
        #![doc = #doc]
        #![allow(missing_docs, clippy::all, clippy::pedantic, rustdoc::all)]
        #modules
    };
    Ok(format!(
        "// Code generated by kinformer codegen from {source}. DO NOT EDIT.\n\n{}",
        crate::pretty(file)
    ))
}

/// The code of one version: its types, then its informer and listers.
///
/// The code is made twice: the first time only to find every struct and enum the schema asks
/// for and each place it occurs, so that the second can name them knowing all of them
/// ([`names::plan`]) and write each shape once.
fn generate_version(
    crd: &Crd,
    version: &CrdVersion,
    schema: &Schema,
    options: &CrdOptions,
) -> Result<TokenStream, String> {
    let mut survey = Types::new(crd, options, None);
    version_code(crd, version, schema, options, &mut survey)?;
    let plan = survey.plan();
    let mut types = Types::new(crd, options, Some(plan));
    let code = version_code(crd, version, schema, options, &mut types)?;
    if !options.schemars {
        return Ok(code);
    }
    // schemars' derive names `serde::Serializer` in what it writes for a field with
    // `serialize_with` (the number fields): kinformer's serde, so the user's crate needs none.
    let krate = &options.krate;
    Ok(quote! {
        #[allow(unused_imports)]
        use #krate::serde;
        #code
    })
}

/// One walk of [`generate_version`].
fn version_code(
    crd: &Crd,
    version: &CrdVersion,
    schema: &Schema,
    options: &CrdOptions,
    types: &mut Types,
) -> Result<TokenStream, String> {
    let kind = &crd.spec.names.kind;
    let kind_name = kind_type_name(kind);
    let kind_ident: Ident = syn::parse_str(&kind_name).map_err(|_| format!("kind {kind:?} is not a Rust type name"))?;
    let krate = &options.krate;
    let root = &schema.properties;
    let namespaced = match crd.spec.scope.as_str() {
        "Namespaced" => true,
        "Cluster" => false,
        other => return Err(format!("scope {other:?} is neither Namespaced nor Cluster")),
    };
    let spec = match root.get("spec") {
        Some(spec_schema) => {
            let spec_name = format!("{kind_name}Spec");
            types.used.insert(spec_name.clone());
            let spec_ident = format_ident!("{}", spec_name);
            // The struct reads before the types of its fields.
            let slot = types.items.len();
            types.items.push(TokenStream::new());
            let fields = types.fields(spec_schema, &spec_name, true)?;
            let derives = types.struct_derives(fields.all_optional);
            let serde_crate = types.path("serde");
            let schemars_attr = types.schemars_attr();
            let doc = doc_attrs(spec_schema.description.as_deref(), None);
            let body = fields.tokens;
            let compact = types.compact_impl(&spec_ident, &fields.compact);
            types.items[slot] = quote! {
                #doc
                #[derive(#derives)]
                #[serde(crate = #serde_crate)]
                #schemars_attr
                pub struct #spec_ident #body

                #compact
            };
            Some(root::Part {
                ty: quote!(#spec_ident),
                doc,
                default: fields.all_optional,
            })
        }
        None => None,
    };
    // `status` is the status subresource's only when the version has one; otherwise it is a
    // plain top-level field.
    let has_status_subresource = version.subresources.as_ref().is_some_and(|s| s.status.is_some());
    let status = match root.get("status").filter(|_| has_status_subresource) {
        Some(status) => {
            let name = format!("{kind_name}Status");
            let ident = match types.ty(status, &name)? {
                Ty::Named(ident) => ident,
                other => {
                    let alias = types.unique(&name);
                    let tokens = types.tokens(&other);
                    let doc = doc_attrs(status.description.as_deref(), None);
                    types.items.push(quote! {
                        #doc
                        pub type #alias = #tokens;
                    });
                    alias
                }
            };
            Some(root::Part {
                ty: quote!(#ident),
                doc: doc_attrs(status.description.as_deref(), None),
                default: false,
            })
        }
        None => None,
    };
    // Every other top-level field, typed, and a map of the ones the schema does not declare.
    let mut others = schema.clone();
    others.description = None;
    let mut reserved = vec!["metadata"];
    for name in ["apiVersion", "kind", "metadata", "spec"] {
        others.properties.remove(name);
    }
    if spec.is_some() {
        reserved.push("spec");
    }
    if status.is_some() {
        others.properties.remove("status");
        reserved.push("status");
    }
    others.required.retain(|r| others.properties.contains_key(r));
    let fields = types.fields_of(&others, TypePath::from(&kind_name), true, &reserved)?;
    let unknown = fields
        .unknown
        .clone()
        .ok_or_else(|| "the root has no map of unknown fields".to_string())?;
    let (spec_present, status_present) = (spec.is_some(), status.is_some());
    let kind_ident_for_impl = kind_ident.clone();
    let root_type = root::root_type(&root::Root {
        crd,
        version,
        krate,
        ident: &kind_ident,
        namespaced,
        description: schema.description.as_deref(),
        spec,
        status,
        fields: &fields.list,
        unknown: &unknown,
        fields_optional: fields.all_optional,
    });
    let desc = ResourceDesc {
        ty: kind_ident.clone().into(),
        name: kind_ident,
        group: crd.spec.group.clone(),
        version: version.name.clone(),
        kind: kind.clone(),
        plural: crd.spec.names.plural.clone(),
        namespaced,
        krate: krate.clone(),
        inherent_impl: true,
        projection: false,
    };
    let informers = generate(&desc);
    let items = std::mem::take(&mut types.items);
    let factory = quote!(#krate::factory);
    let spec_compact = spec_present.then(|| quote!(#factory::Compact::compact(&mut self.spec);));
    let status_compact = status_present.then(|| quote!(#factory::Compact::compact(&mut self.status);));
    let others_compact = &fields.compact;
    Ok(quote! {
        #root_type
        #(#items)*
        #informers

        impl #factory::InformerResource for #kind_ident_for_impl {
            #[inline]
            fn compact(&mut self) {
                #factory::Compact::compact(&mut self.metadata);
                #spec_compact
                #status_compact
                #(#factory::Compact::compact(&mut self.#others_compact);)*
            }
        }
    })
}

/// A field's Rust type.
#[derive(Debug, Clone, PartialEq)]
enum Ty {
    String,
    I32,
    I64,
    F64,
    Bool,
    IntOrString,
    /// A resource quantity (see [`is_quantity`]): kinformer's, which writes back an integer as
    /// an integer.
    Quantity,
    Value,
    Vec(Box<Ty>),
    Map(Box<Ty>),
    Named(Ident),
}

impl Ty {
    /// Whether an `f64` is in it, at any depth: such a field is written with
    /// `__codegen::number`, integral values as integers.
    fn has_number(&self) -> bool {
        match self {
            Ty::F64 => true,
            Ty::Vec(inner) | Ty::Map(inner) => inner.has_number(),
            _ => false,
        }
    }

    /// Whether a value of it can hold a list (a `Vec` at any depth, a `serde_json::Value`, a
    /// generated type), which its `Compact` walk shrinks.
    fn holds_list(&self) -> bool {
        match self {
            Ty::Vec(_) | Ty::Value | Ty::Named(_) => true,
            Ty::Map(inner) => inner.holds_list(),
            _ => false,
        }
    }

    /// Whether an `IntOrString` is in it, at any depth.
    fn has_int_or_string(&self) -> bool {
        match self {
            Ty::IntOrString => true,
            Ty::Vec(inner) | Ty::Map(inner) => inner.has_int_or_string(),
            _ => false,
        }
    }
}

/// controller-gen's `pattern` of a `resource.Quantity` field (with `anyOf: [{type: integer},
/// {type: string}]` and `x-kubernetes-int-or-string: true`).
const QUANTITY_PATTERN: &str = r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$";

/// Whether an int-or-string schema is a resource quantity: it has the quantity pattern.
fn is_quantity(schema: &Schema) -> bool {
    schema.pattern.as_deref() == Some(QUANTITY_PATTERN)
}

/// The fields of a struct, as a braced body.
struct Fields {
    tokens: TokenStream,
    /// Every field is an `Option` (or the flattened map), so the struct can derive `Default`.
    all_optional: bool,
    /// The same fields one by one (the root type writes them twice, see [`root`]).
    list: Vec<Field>,
    /// The flattened map of unknown fields, if there is one.
    unknown: Option<Ident>,
    /// The fields whose values can hold a list (see [`Ty::holds_list`]).
    compact: Vec<Ident>,
}

/// One field of [`Fields`], in parts.
struct Field {
    ident: Ident,
    /// Its doc attributes.
    doc: TokenStream,
    /// Its `#[serde]` attribute, if any.
    serde: TokenStream,
    /// `pub name: Type`.
    decl: TokenStream,
}

/// Where a schema sits, for naming its type: the root-level name it hangs under
/// (`CertificateSpec`), then the Pascal-case name of each field on the way (`PrivateKey`). An
/// array's items and a map's values sit where the array or map does.
#[derive(Debug, Clone)]
struct TypePath(Vec<String>);

impl TypePath {
    fn child(&self, json: &str) -> TypePath {
        let mut path = self.0.clone();
        path.push(type_ident(json));
        TypePath(path)
    }
}

impl From<&str> for TypePath {
    /// A root-level name (`CertificateStatus`).
    fn from(root: &str) -> Self {
        TypePath(vec![root.to_string()])
    }
}

impl From<&String> for TypePath {
    fn from(root: &String) -> Self {
        TypePath::from(root.as_str())
    }
}

/// A struct or enum the survey walk found: every place it occurs, and their descriptions.
struct Shape {
    is_enum: bool,
    paths: Vec<Vec<String>>,
    descriptions: BTreeSet<Option<String>>,
}

/// The name and doc of each shape, by [`shape_key`].
type Plan = BTreeMap<String, (String, Option<String>)>;

/// What makes two schemas one type: their JSON, less what belongs to the field that holds
/// them (its description, default and nullability: the field's doc and `Option` carry those).
/// Everything inside, descriptions included, must be equal, so the fields of the one type are
/// documented truly for every place it is used.
fn shape_key(schema: &Schema) -> String {
    let mut bare = schema.clone();
    bare.description = None;
    bare.default = None;
    bare.nullable = false;
    serde_json::to_string(&bare).unwrap_or_default()
}

/// The named types of one version, as they are made.
struct Types {
    krate: Path,
    schemars: bool,
    items: Vec<TokenStream>,
    used: BTreeSet<String>,
    /// The survey walk: every shape met, by key, with its places (`None` in the second walk).
    shapes: Option<BTreeMap<String, Shape>>,
    /// The second walk: each shape's name and doc, and the shapes already written.
    plan: Plan,
    written: BTreeSet<String>,
}

impl Types {
    /// Types for one version of `crd`; `plan` is `None` for the survey walk.
    fn new(crd: &Crd, options: &CrdOptions, plan: Option<Plan>) -> Types {
        let kind = kind_type_name(&crd.spec.names.kind);
        // The root type and the names the informer generator gives its types.
        let used = ["", "Informer", "Lister", "NamespaceLister"]
            .iter()
            .map(|suffix| format!("{kind}{suffix}"))
            .collect();
        Types {
            krate: options.krate.clone(),
            schemars: options.schemars,
            items: Vec::new(),
            used,
            shapes: plan.is_none().then(BTreeMap::new),
            plan: plan.unwrap_or_default(),
            written: BTreeSet::new(),
        }
    }

    /// After the survey walk: the name and doc of every shape it met (see [`names::plan`]).
    /// A shared type keeps a doc only when every place describes it the same way.
    fn plan(&self) -> Plan {
        let shapes = self
            .shapes
            .as_ref()
            .map(|s| s.iter().collect::<Vec<_>>())
            .unwrap_or_default();
        let wanted: Vec<Wanted> = shapes
            .iter()
            .map(|(_, shape)| Wanted {
                paths: shape.paths.clone(),
                min_names: if shape.is_enum { 2 } else { 1 },
            })
            .collect();
        let names = names::plan(&wanted, &self.used);
        shapes
            .into_iter()
            .zip(names)
            .map(|((key, shape), name)| {
                let doc = match shape.descriptions.iter().collect::<Vec<_>>()[..] {
                    [Some(one)] => Some(one.clone()),
                    _ => None,
                };
                (key.clone(), (name, doc))
            })
            .collect()
    }

    /// The shape of `schema` at `path`: its name, its doc, and whether to write it now (the
    /// second walk writes each shape once; the survey walk writes every place, under a
    /// placeholder name, to meet the shapes inside each).
    fn shape(&mut self, schema: &Schema, path: &TypePath, is_enum: bool) -> (Ident, Option<String>, bool) {
        let key = shape_key(schema);
        if let Some(shapes) = &mut self.shapes {
            let shape = shapes.entry(key.clone()).or_insert_with(|| Shape {
                is_enum,
                paths: Vec::new(),
                descriptions: BTreeSet::new(),
            });
            shape.paths.push(path.0.clone());
            shape.descriptions.insert(schema.description.clone());
            return (format_ident!("Shape"), schema.description.clone(), true);
        }
        let (name, doc) = self
            .plan
            .get(&key)
            .cloned()
            .unwrap_or_else(|| (path.0.concat(), schema.description.clone()));
        let first = self.written.insert(key);
        (format_ident!("{}", name), doc, first)
    }

    /// A type name not yet used in this version (`Name`, then `Name2`, `Name3`, …).
    fn unique(&mut self, name: &str) -> Ident {
        let base = type_ident(name);
        let mut candidate = base.clone();
        let mut n = 2;
        while self.used.contains(&candidate) {
            candidate = format!("{base}{n}");
            n += 1;
        }
        self.used.insert(candidate.clone());
        format_ident!("{}", candidate)
    }

    /// `sub` under the kinformer path, as a string for an attribute (`"::kinformer::serde"`).
    fn path(&self, sub: &str) -> String {
        let krate = &self.krate;
        format!("{}::{sub}", quote!(#krate).to_string().replace(' ', ""))
    }

    fn tokens(&self, ty: &Ty) -> TokenStream {
        let krate = &self.krate;
        match ty {
            Ty::String => quote!(::std::string::String),
            Ty::I32 => quote!(i32),
            Ty::I64 => quote!(i64),
            Ty::F64 => quote!(f64),
            Ty::Bool => quote!(bool),
            Ty::IntOrString => quote!(#krate::k8s_openapi::apimachinery::pkg::util::intstr::IntOrString),
            Ty::Quantity => quote!(#krate::quantity::Quantity),
            Ty::Value => quote!(#krate::serde_json::Value),
            Ty::Vec(inner) => {
                let inner = self.tokens(inner);
                quote!(::std::vec::Vec<#inner>)
            }
            Ty::Map(inner) => {
                let inner = self.tokens(inner);
                quote!(::std::collections::BTreeMap<::std::string::String, #inner>)
            }
            Ty::Named(ident) => quote!(#ident),
        }
    }

    /// `ty` with `IntOrString` replaced by a type whose `JsonSchema` says int-or-string
    /// (k8s-openapi's has one only with its `schemars` feature), for `#[schemars(with)]`.
    fn schema_twin(&self, ty: &Ty) -> TokenStream {
        match ty {
            Ty::IntOrString => {
                let krate = &self.krate;
                quote!(#krate::__codegen::IntOrStringSchema)
            }
            Ty::Vec(inner) => {
                let inner = self.schema_twin(inner);
                quote!(::std::vec::Vec<#inner>)
            }
            Ty::Map(inner) => {
                let inner = self.schema_twin(inner);
                quote!(::std::collections::BTreeMap<::std::string::String, #inner>)
            }
            other => self.tokens(other),
        }
    }

    /// `impl Compact for #ident`, walking `fields` (see `factory::Compact`).
    fn compact_impl(&self, ident: &Ident, fields: &[Ident]) -> TokenStream {
        let krate = &self.krate;
        quote! {
            impl #krate::factory::Compact for #ident {
                #[inline]
                fn compact(&mut self) {
                    #(#krate::factory::Compact::compact(&mut self.#fields);)*
                }
            }
        }
    }

    /// `#[schemars(crate = …)]` when schemars derives are on.
    fn schemars_attr(&self) -> TokenStream {
        if self.schemars {
            let schemars_crate = self.path("schemars");
            quote!(#[schemars(crate = #schemars_crate)])
        } else {
            TokenStream::new()
        }
    }

    fn struct_derives(&self, default: bool) -> TokenStream {
        let krate = &self.krate;
        let default = if default {
            quote!(, ::core::default::Default)
        } else {
            TokenStream::new()
        };
        let schemars = if self.schemars {
            quote!(, #krate::schemars::JsonSchema)
        } else {
            TokenStream::new()
        };
        quote! {
            #krate::serde::Serialize,
            #krate::serde::Deserialize,
            ::core::clone::Clone,
            ::core::fmt::Debug,
            ::core::cmp::PartialEq
            #schemars
            #default
        }
    }

    /// The Rust type of `schema`; object and enum schemas become types named after where they
    /// sit (see [`names::plan`]).
    fn ty(&mut self, schema: &Schema, path: impl Into<TypePath>) -> Result<Ty, String> {
        let path = path.into();
        if schema.int_or_string {
            return Ok(if is_quantity(schema) {
                Ty::Quantity
            } else {
                Ty::IntOrString
            });
        }
        if schema.embedded_resource {
            return Ok(Ty::Value);
        }
        let type_ = schema
            .type_
            .as_deref()
            .unwrap_or(if schema.properties.is_empty() { "" } else { "object" });
        Ok(match type_ {
            "object" => {
                if !schema.properties.is_empty() {
                    Ty::Named(self.object(schema, &path)?)
                } else if let Some(AdditionalProperties::Schema(values)) = &schema.additional_properties {
                    Ty::Map(Box::new(self.ty(values, path)?))
                } else if schema.preserve_unknown_fields {
                    Ty::Value
                } else {
                    Ty::Map(Box::new(Ty::Value))
                }
            }
            "array" => match &schema.items {
                Some(items) => Ty::Vec(Box::new(self.ty(items, path)?)),
                None => Ty::Vec(Box::new(Ty::Value)),
            },
            "string" => match string_enum(schema) {
                Some(values) => Ty::Named(self.enumeration(schema, &path, &values)),
                None => Ty::String,
            },
            "integer" => match schema.format.as_deref() {
                Some("int32") => Ty::I32,
                _ => Ty::I64,
            },
            "number" => Ty::F64,
            "boolean" => Ty::Bool,
            "" => Ty::Value,
            other => return Err(format!("{}: unknown schema type {other:?}", path.0.concat())),
        })
    }

    /// A struct for an object schema with properties.
    fn object(&mut self, schema: &Schema, path: &TypePath) -> Result<Ident, String> {
        let (ident, doc, write) = self.shape(schema, path, false);
        if !write {
            return Ok(ident);
        }
        // Reserve the place: the struct reads before the types of its fields.
        let slot = self.items.len();
        self.items.push(TokenStream::new());
        let fields = self.fields(schema, path.clone(), false)?;
        let derives = self.struct_derives(fields.all_optional);
        let body = fields.tokens;
        let doc = doc_attrs(doc.as_deref(), None);
        let serde_crate = self.path("serde");
        let schemars_attr = self.schemars_attr();
        let compact = self.compact_impl(&ident, &fields.compact);
        self.items[slot] = quote! {
            #doc
            #[derive(#derives)]
            #[serde(crate = #serde_crate)]
            #schemars_attr
            pub struct #ident #body

            #compact
        };
        Ok(ident)
    }

    /// The braced fields of an object schema. `force_struct` adds the flattened map of unknown
    /// fields even without `x-kubernetes-preserve-unknown-fields` when there are no properties
    /// (a spec must be a struct).
    fn fields(&mut self, schema: &Schema, owner: impl Into<TypePath>, force_struct: bool) -> Result<Fields, String> {
        let keep_unknown = schema.preserve_unknown_fields || (force_struct && schema.properties.is_empty());
        self.fields_of(schema, owner.into(), keep_unknown, &[])
    }

    /// The fields of an object schema: Rust names avoid `reserved`; `keep_unknown` adds the
    /// flattened map of the fields the schema does not name.
    fn fields_of(
        &mut self,
        schema: &Schema,
        owner: TypePath,
        keep_unknown: bool,
        reserved: &[&str],
    ) -> Result<Fields, String> {
        let mut taken: BTreeSet<String> = reserved.iter().map(|r| r.to_string()).collect();
        let mut list = Vec::new();
        let mut fields = Vec::new();
        let mut compact = Vec::new();
        let mut all_optional = true;
        for (json, property) in &schema.properties {
            let ty = self.ty(property, owner.child(json))?;
            let required = schema.required.iter().any(|r| r == json);
            let optional = !required || property.nullable;
            // Absent, `null` and a value are three states the server keeps apart (it stores an
            // explicit `null`): `None`, `Some(None)`, `Some(Some(v))`.
            let double = !required && property.nullable;
            all_optional &= optional;
            let ident = field_ident(json, &mut taken);
            if ty.holds_list() {
                compact.push(ident.clone());
            }
            let mut serde_args = Vec::new();
            if ident.to_string().trim_start_matches("r#") != json {
                serde_args.push(quote!(rename = #json));
            }
            if ty.has_number() {
                let with = self.path("__codegen::number");
                serde_args.push(quote!(serialize_with = #with));
            }
            if optional {
                serde_args.push(quote!(default));
                if double {
                    let with = self.path("__codegen::nullable");
                    serde_args.push(quote!(deserialize_with = #with));
                }
                if !required {
                    serde_args.push(quote!(skip_serializing_if = "Option::is_none"));
                }
            }
            let serde_attr = if serde_args.is_empty() {
                TokenStream::new()
            } else {
                quote!(#[serde(#(#serde_args),*)])
            };
            // schemars reads serde's `serialize_with` and cannot derive through it: a number
            // field states its type instead.
            let schemars_attr = if !self.schemars || !(ty.has_int_or_string() || ty.has_number()) {
                TokenStream::new()
            } else if ty == Ty::IntOrString {
                let with = self.path(if optional {
                    "__codegen::optional_int_or_string_schema"
                } else {
                    "__codegen::int_or_string_schema"
                });
                quote!(#[schemars(schema_with = #with)])
            } else {
                let mut twin = self.schema_twin(&ty);
                if optional {
                    twin = quote!(::core::option::Option<#twin>);
                }
                if double {
                    twin = quote!(::core::option::Option<#twin>);
                }
                let twin = twin.to_string().replace(' ', "");
                quote!(#[schemars(with = #twin)])
            };
            let mut ty_tokens = self.tokens(&ty);
            if optional {
                ty_tokens = quote!(::core::option::Option<#ty_tokens>);
            }
            if double {
                ty_tokens = quote!(::core::option::Option<#ty_tokens>);
            }
            let doc = doc_attrs(property.description.as_deref(), property.default.as_ref());
            fields.push(quote! {
                #doc
                #serde_attr
                #schemars_attr
                pub #ident: #ty_tokens
            });
            list.push(Field {
                ident: ident.clone(),
                doc,
                serde: serde_attr,
                decl: quote!(pub #ident: #ty_tokens),
            });
        }
        let mut unknown = None;
        if keep_unknown {
            let values = match (&schema.additional_properties, schema.properties.is_empty()) {
                (Some(AdditionalProperties::Schema(values)), true) => self.ty(values, owner.child("value"))?,
                _ => Ty::Value,
            };
            let schemars_attr = if self.schemars && values.has_int_or_string() {
                let twin = self.schema_twin(&Ty::Map(Box::new(values.clone())));
                let twin = twin.to_string().replace(' ', "");
                quote!(#[schemars(with = #twin)])
            } else {
                TokenStream::new()
            };
            let holds_list = values.holds_list();
            let values = self.tokens(&values);
            let ident = field_ident("extra", &mut taken);
            if holds_list {
                compact.push(ident.clone());
            }
            fields.push(quote! {
                /// Fields the schema does not name, kept as the server sent them.
                #[serde(flatten)]
                #schemars_attr
                pub #ident: ::std::collections::BTreeMap<::std::string::String, #values>
            });
            list.push(Field {
                ident: ident.clone(),
                doc: quote!(#[doc = " Fields the schema does not name, kept as the server sent them."]),
                serde: quote!(#[serde(flatten)]),
                decl: quote!(pub #ident: ::std::collections::BTreeMap<::std::string::String, #values>),
            });
            unknown = Some(ident);
        }
        Ok(Fields {
            tokens: quote!({ #(#fields),* }),
            all_optional,
            list,
            unknown,
            compact,
        })
    }

    /// An enum for a string schema with an `enum` of strings.
    fn enumeration(&mut self, schema: &Schema, path: &TypePath, values: &[String]) -> Ident {
        let (ident, doc, write) = self.shape(schema, path, true);
        if !write {
            return ident;
        }
        let default = schema
            .default
            .as_ref()
            .and_then(serde_json::Value::as_str)
            .filter(|d| values.iter().any(|v| v == d));
        let variants = values.iter().zip(variant_names(values)).map(|(value, variant)| {
            let variant = format_ident!("{}", variant);
            let doc = if value.is_empty() {
                " `\"\"`".to_string()
            } else {
                format!(" `{value}`")
            };
            let default = (default == Some(value.as_str())).then(|| quote!(#[default]));
            quote! {
                #[doc = #doc]
                #[serde(rename = #value)]
                #default
                #variant
            }
        });
        let default_derive = default.map(|_| quote!(, ::core::default::Default));
        let doc = doc_attrs(doc.as_deref(), None);
        let krate = &self.krate;
        let serde_crate = self.path("serde");
        let schemars_attr = self.schemars_attr();
        let schemars_derive = if self.schemars {
            quote!(, #krate::schemars::JsonSchema)
        } else {
            TokenStream::new()
        };
        self.items.push(quote! {
            #doc
            #[derive(
                #krate::serde::Serialize,
                #krate::serde::Deserialize,
                ::core::clone::Clone,
                ::core::fmt::Debug,
                ::core::cmp::PartialEq,
                ::core::cmp::Eq,
                ::core::hash::Hash
                #schemars_derive
                #default_derive
            )]
            #[serde(crate = #serde_crate)]
            #schemars_attr
            pub enum #ident {
                #(#variants,)*
                /// A value this type was generated without (the CRD gained it later), kept as
                /// the server sent it and written back unchanged.
                #[serde(untagged)]
                Other(::std::string::String)
            }

            impl #krate::factory::Compact for #ident {
                #[inline]
                fn compact(&mut self) {}
            }
        });
        ident
    }
}

/// The catch-all variant of every generated enum; a value whose own name would be `Other`
/// is numbered (`Other2`) so that the catch-all keeps its name when a CRD adds such a value.
const OTHER_VARIANT: &str = "Other";

/// The variant names of an enum's `values`, in their order: each value's Pascal case (the
/// casing of every generated name), `Empty` for `""`, a spelled-out name for a value without
/// letters or digits (`*` → `Star`, `>=` → `GreaterEqual`, see [`symbol_name`]). Values whose
/// names clash (`https` and `HTTPS`) are told apart without depending on the order the CRD
/// lists them in: the value spelled most like the name (most letters in the same case) keeps
/// it, the others are numbered in that order, ties in the byte order of the values (`https` →
/// `Https`, `HTTPS` → `Https2`; `In` → `In`, `in` → `In2`). A number never takes a name that
/// another value has by itself.
fn variant_names(values: &[String]) -> Vec<String> {
    let bases: Vec<String> = values.iter().map(|v| variant_base(v)).collect();
    let mut groups: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, base) in bases.iter().enumerate() {
        groups.entry(base).or_default().push(i);
    }
    let mut taken: BTreeSet<String> = bases.iter().cloned().collect();
    taken.insert(OTHER_VARIANT.to_string());
    let mut names = bases.clone();
    for (base, mut members) in groups {
        // How many of a value's letters and digits are spelled as in the name.
        let likeness = |i: usize| {
            let spelled = values[i].chars().filter(char::is_ascii_alphanumeric);
            spelled.zip(base.chars()).filter(|(a, b)| a == b).count()
        };
        members.sort_by(|a, b| {
            likeness(*b)
                .cmp(&likeness(*a))
                .then_with(|| values[*a].cmp(&values[*b]))
        });
        let mut n = 2;
        for (place, member) in members.into_iter().enumerate() {
            if place == 0 && base != OTHER_VARIANT {
                continue;
            }
            while taken.contains(&format!("{base}{n}")) {
                n += 1;
            }
            names[member] = format!("{base}{n}");
            taken.insert(names[member].clone());
        }
    }
    names
}

/// A value's own variant name, before clashes are numbered.
fn variant_base(value: &str) -> String {
    if value.is_empty() {
        "Empty".to_string()
    } else if value.chars().any(|c| c.is_ascii_alphanumeric()) {
        type_ident(value)
    } else {
        value.chars().map(symbol_name).collect()
    }
}

/// The name of a character in a value made only of symbols (`*` → `Star`, `-` → `Dash`); a
/// character without one is written as its code point (`U2192`).
fn symbol_name(c: char) -> String {
    let name = match c {
        '*' => "Star",
        '-' => "Dash",
        '+' => "Plus",
        '/' => "Slash",
        '\\' => "Backslash",
        '.' => "Dot",
        '=' => "Equal",
        '!' => "Not",
        '<' => "Less",
        '>' => "Greater",
        '_' => "Underscore",
        ':' => "Colon",
        ';' => "Semicolon",
        ',' => "Comma",
        ' ' => "Space",
        '%' => "Percent",
        '&' => "And",
        '|' => "Or",
        '~' => "Tilde",
        '?' => "Question",
        '@' => "At",
        '#' => "Hash",
        '$' => "Dollar",
        '^' => "Caret",
        '(' => "OpenParen",
        ')' => "CloseParen",
        '[' => "OpenBracket",
        ']' => "CloseBracket",
        '{' => "OpenBrace",
        '}' => "CloseBrace",
        '\'' => "Quote",
        '"' => "DoubleQuote",
        '`' => "Backtick",
        _ => return format!("U{:04X}", u32::from(c)),
    };
    name.to_string()
}

/// The values of a string enum, when every value is a string (`null` aside).
fn string_enum(schema: &Schema) -> Option<Vec<String>> {
    let values = schema.enum_.as_ref()?;
    let mut out = Vec::new();
    for value in values {
        match value {
            serde_json::Value::String(s) => {
                if !out.contains(s) {
                    out.push(s.clone());
                }
            }
            serde_json::Value::Null => {}
            _ => return None,
        }
    }
    (!out.is_empty()).then_some(out)
}

/// Doc attributes from a schema description (and default), made safe for rustdoc: lines are
/// trimmed (an indented line would be a code block, and so a doctest) and code fences are
/// marked `text`.
fn doc_attrs(description: Option<&str>, default: Option<&serde_json::Value>) -> TokenStream {
    let mut lines: Vec<String> = Vec::new();
    let mut in_fence = false;
    for line in description.unwrap_or_default().lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("```") {
            lines.push(if in_fence {
                "```".to_string()
            } else {
                format!("```text{}", rest.trim_start_matches(char::is_alphanumeric))
            });
            in_fence = !in_fence;
        } else {
            lines.push(line.to_string());
        }
    }
    if in_fence {
        lines.push("```".to_string());
    }
    while lines.last().is_some_and(String::is_empty) {
        lines.pop();
    }
    if let Some(default) = default {
        if !lines.is_empty() {
            lines.push(String::new());
        }
        lines.push(format!("Defaults to `{default}` on the server."));
    }
    let lines = lines.into_iter().map(|l| format!(" {l}"));
    quote!(#(#[doc = #lines])*)
}

#[cfg(test)]
mod tests;
