//! CRD validation rules: `x-kubernetes-validations`, CEL expressions on schema nodes, checked
//! when a CRD is written and evaluated on every write of its custom resources.
//!
//! Where it sits: the last step of a custom resource's validation (`schema.rs` calls
//! [`validate`] after the structural checks, as kube-apiserver's `customResourceStrategy` does,
//! and skips it when a type, required, enum or size error already makes the object the wrong
//! shape); and in the CRD's own validation (`crd.rs` calls [`check_schema`]).
//!
//! Parsing and evaluation are cel-rust's (the `cel` crate: standard library, macros, the
//! `strings` extension, `optional`), with the Kubernetes libraries in `library.rs` (lists, regex,
//! URLs, quantities, IPs and CIDRs). What
//! apiextensions-apiserver's `pkg/apiserver/schema/cel` does and this module does too:
//! - `self` is the node's value: objects as maps (property names escaped as Kubernetes escapes
//!   them: `__dash__`, `__dot__`, `__slash__`, `__underscores__`, `__{keyword}__`), lists,
//!   scalars; a `number` node is a `double`, a string of `format: duration` a duration, of
//!   `date`/`date-time` a timestamp, of `byte` bytes; at the root and in embedded resources, `apiVersion`,
//!   `kind` and `metadata.name`/`metadata.generateName` are visible;
//! - a rule that references `oldSelf` (a transition rule) runs only on update and only where the
//!   old value exists at the same place: object properties (not under
//!   `x-kubernetes-map-type: atomic`) and items of `x-kubernetes-list-type: map` lists matched by
//!   their keys; with `optionalOldSelf: true` it always runs and `oldSelf` is an optional;
//! - a failure is `field.Invalid` at the node's path (the root is `<nil>`) plus the rule's
//!   `fieldPath`, with the node's schema type as the value and `message`, a `messageExpression`'s
//!   string (the message again when it fails) or `failed rule: <rule>`; `reason` picks
//!   `FieldValueForbidden`, `FieldValueRequired` or `FieldValueDuplicate` instead;
//! - a run-time error is `Invalid` at the node: `<error> evaluating rule: <rule>`;
//! - at CRD creation and update every rule and `messageExpression` is compiled: a syntax error, a
//!   function or variable that is not declared, a field the schema does not declare (selected
//!   from `self`/`oldSelf` or a comprehension variable over a list), a transition rule under a
//!   list that is not a map list, an unknown `reason`, a `fieldPath` that names no field, a
//!   `message` that is blank or has a line break (or is missing for a multi-line rule) are refused
//!   with `422` at `spec.versions[i].schema.openAPIV3Schema…x-kubernetes-validations[j].rule` (or
//!   `.message`, `.reason`, `.fieldPath`, `.messageExpression`), e.g. `compilation failed: ERROR:
//!   <input>:1:6: undeclared reference to 'foo' (in container '')`.
//!
//! What differs from kube-apiserver:
//! - no type checker: a rule applying an operator or function to the wrong type (an int-or-string
//!   compared to a number, `size(self)` on an int) is accepted at CRD creation and fails when it
//!   runs (`no such overload`), where kube-apiserver refuses the CRD;
//! - no cost estimation or run-time cost budget: kube-apiserver refuses a rule whose estimated
//!   cost over `maxItems`/`maxLength` is too high and stops a rule that runs over its budget;
//!   here every rule runs to the end (CEL has no loops, so every rule ends, in time proportional
//!   to the object's size to the power of its comprehensions' nesting);
//! - a string with `format: duration`, `date`, `date-time` or `byte` that does not parse as one
//!   stays a string (kube-apiserver refuses it before the rules run); `x-kubernetes-list-type:
//!   set`/`map` lists compare in order;
//! - `ip.isCanonical`, the `format`, `semver` and two-variable comprehension libraries are not
//!   implemented, so a rule using them is refused at CRD creation; ratcheting (an unchanged
//!   invalid value allowed with a warning) is not implemented;
//! - the value shown for a refused rule is the rule as JSON, where Go prints its struct.

mod library;
mod quantity;
mod size;

use crate::field::{FieldError, join};
use cel::common::ast::{EntryExpr, Expr, IdedExpr};
use cel::common::types::CelOptional;
use cel::common::value::Val;
use cel::objects::Key;
use cel::{Context, Env, ExecutionError, Program, Value as Cel};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

/// The environment every rule compiles and runs in: the standard library and macros, the
/// strings extension, and the list overloads of the Kubernetes library.
static ENV: LazyLock<Result<Arc<Env>, String>> = LazyLock::new(|| {
    let mut env = Env::stdlib();
    env.add_extension(cel::extensions::strings)
        .map_err(|e| format!("strings extension: {e}"))?;
    library::register_env(&mut env).map_err(|e| format!("Kubernetes lists library: {e}"))?;
    Ok(Arc::new(env))
});

fn env() -> Result<&'static Arc<Env>, String> {
    ENV.as_ref()
        .map_err(|e| format!("rule compiler initialization error: {e}"))
}

/// Compiled rules by source, so a rule is parsed once rather than on every write. Bounded: the
/// cache is emptied when it holds [`PROGRAM_CACHE_ENTRIES`] programs.
static PROGRAMS: LazyLock<Mutex<HashMap<String, Arc<Program>>>> = LazyLock::new(Mutex::default);
const PROGRAM_CACHE_ENTRIES: usize = 4096;

/// `source` compiled, from the cache when it was compiled before.
fn compile(source: &str) -> Result<Arc<Program>, String> {
    size::check(source)?;
    if let Some(p) = PROGRAMS.lock().unwrap_or_else(|p| p.into_inner()).get(source) {
        return Ok(p.clone());
    }
    let program = Arc::new(env()?.compile(source).map_err(|e| e.to_string())?);
    let mut cache = PROGRAMS.lock().unwrap_or_else(|p| p.into_inner());
    if cache.len() >= PROGRAM_CACHE_ENTRIES {
        cache.clear();
    }
    cache.insert(source.to_owned(), program.clone());
    Ok(program)
}

/// One entry of `x-kubernetes-validations`.
struct Rule<'a> {
    /// The entry as written (the value shown when it is refused).
    raw: &'a Value,
    rule: &'a str,
    message: &'a str,
    message_expression: &'a str,
    reason: Option<&'a str>,
    field_path: &'a str,
    optional_old_self: bool,
}

impl<'a> Rule<'a> {
    fn of(raw: &'a Value) -> Rule<'a> {
        let s = |k: &str| raw.get(k).and_then(Value::as_str).unwrap_or("");
        Rule {
            raw,
            rule: s("rule"),
            message: s("message"),
            message_expression: s("messageExpression"),
            reason: raw.get("reason").and_then(Value::as_str),
            field_path: s("fieldPath"),
            optional_old_self: raw.get("optionalOldSelf").and_then(Value::as_bool) == Some(true),
        }
    }

    /// `ruleErrorString`: the message if there is one, else the rule.
    fn error_string(&self) -> &str {
        if self.message.trim().is_empty() {
            self.rule.trim()
        } else {
            self.message.trim()
        }
    }

    /// `ruleMessageOrDefault`.
    fn message_or_default(&self) -> String {
        if self.message.is_empty() {
            format!("failed rule: {}", self.error_string())
        } else {
            self.message.trim().to_owned()
        }
    }
}

fn rules_of(schema: &Value) -> impl Iterator<Item = Rule<'_>> {
    schema
        .get("x-kubernetes-validations")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(Rule::of)
}

/// Whether any node of `schema` carries a rule.
pub(crate) fn has_rules(schema: &Value) -> bool {
    if rules_of(schema).next().is_some() {
        return true;
    }
    let props = schema.get("properties").and_then(Value::as_object);
    props.into_iter().flat_map(|p| p.values()).any(has_rules)
        || schema.get("items").is_some_and(has_rules)
        || schema.get("additionalProperties").is_some_and(has_rules)
}

fn flag(schema: &Value, key: &str) -> bool {
    schema.get(key).and_then(Value::as_bool).unwrap_or(false)
}

/// The schema Kubernetes gives the root's (and an embedded resource's) `apiVersion`, `kind` and
/// `metadata` in rules: only `metadata.name` and `metadata.generateName` are visible.
static RESOURCE_FIELDS: LazyLock<Value> = LazyLock::new(|| {
    json!({
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "metadata": {"type": "object", "properties": {
            "name": {"type": "string"}, "generateName": {"type": "string"}}},
    })
});

const RESERVED: &[&str] = &[
    "true",
    "false",
    "null",
    "in",
    "as",
    "break",
    "const",
    "continue",
    "else",
    "for",
    "function",
    "if",
    "import",
    "let",
    "loop",
    "package",
    "namespace",
    "return",
    "var",
    "void",
    "while",
];

/// A property name as rules spell it (`k8s.io/apiserver/pkg/cel.Escape`); `None` for a name no
/// rule can select.
fn escape(name: &str) -> Option<String> {
    if RESERVED.contains(&name) {
        return Some(format!("__{name}__"));
    }
    let mut chars = name.chars();
    let first = chars.next()?;
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | '/');
    if !(first.is_ascii_alphabetic() || matches!(first, '_' | '.' | '-' | '/')) || !chars.all(allowed) {
        return None;
    }
    let mut out = String::with_capacity(name.len());
    let mut rest = name;
    while let Some(c) = rest.chars().next() {
        if rest.starts_with("__") {
            out.push_str("__underscores__");
            rest = &rest[2..];
            continue;
        }
        match c {
            '.' => out.push_str("__dot__"),
            '-' => out.push_str("__dash__"),
            '/' => out.push_str("__slash__"),
            c => out.push(c),
        }
        rest = &rest[c.len_utf8()..];
    }
    Some(out)
}

/// The schema of property `field` (as rules spell it) of an object node, if declared.
fn property<'a>(schema: &'a Value, field: &str, resource: bool) -> Option<&'a Value> {
    if resource && let Some(s) = RESOURCE_FIELDS.get(field) {
        return Some(s);
    }
    schema
        .get("properties")
        .and_then(Value::as_object)?
        .iter()
        .find(|(k, _)| escape(k).as_deref() == Some(field))
        .map(|(_, v)| v)
}

/// A JSON value as the CEL value a rule sees at a node of schema `schema`.
fn to_cel(v: &Value, schema: Option<&Value>, resource: bool) -> Cel {
    let ty = schema.and_then(|s| s.get("type")).and_then(Value::as_str);
    match v {
        Value::Null => Cel::Null,
        Value::Bool(b) => Cel::Bool(*b),
        Value::Number(n) => match (ty, n.as_i64(), n.as_u64()) {
            (Some("number"), _, _) => Cel::Float(n.as_f64().unwrap_or(f64::NAN)),
            (_, Some(i), _) => Cel::Int(i),
            (_, None, Some(u)) => Cel::UInt(u),
            _ => Cel::Float(n.as_f64().unwrap_or(f64::NAN)),
        },
        Value::String(s) => match schema.and_then(|s| s.get("format")).and_then(Value::as_str) {
            Some("duration") => typed_string("duration", s),
            Some("date-time") => typed_string("timestamp", s),
            Some("date") => typed_string("timestamp", &format!("{s}T00:00:00Z")),
            Some("byte") => {
                use base64::Engine as _;
                base64::engine::general_purpose::STANDARD
                    .decode(s)
                    .map_or_else(|_| Cel::from(s.clone()), |b| Cel::Bytes(Arc::new(b)))
            }
            _ => Cel::from(s.clone()),
        },
        Value::Array(items) => {
            let item_schema = schema.and_then(|s| s.get("items"));
            let items = items
                .iter()
                .map(|i| to_cel(i, item_schema, embedded(item_schema)))
                .collect();
            Cel::List(Arc::new(items))
        }
        Value::Object(map) => {
            let declared = schema.and_then(|s| s.get("properties")).is_some() || resource;
            let extra = schema
                .and_then(|s| s.get("additionalProperties"))
                .filter(|a| a.is_object());
            let mut out: HashMap<Key, Cel> = HashMap::with_capacity(map.len());
            for (k, child) in map {
                if declared {
                    let (Some(s), Some(name)) = (schema, escape(k)) else {
                        continue;
                    };
                    let Some(sub) = property(s, &name, resource) else {
                        if extra.is_none() && !schema.is_some_and(|s| flag(s, "x-kubernetes-preserve-unknown-fields")) {
                            continue;
                        }
                        out.insert(Key::String(Arc::new(name)), to_cel(child, extra, false));
                        continue;
                    };
                    let value = if resource && k == "metadata" {
                        let kept = child
                            .as_object()
                            .map(|m| {
                                m.iter()
                                    .filter(|(k, _)| matches!(k.as_str(), "name" | "generateName"))
                                    .map(|(k, v)| (k.clone(), v.clone()))
                                    .collect::<serde_json::Map<_, _>>()
                            })
                            .unwrap_or_default();
                        to_cel(&Value::Object(kept), Some(sub), false)
                    } else {
                        to_cel(child, Some(sub), embedded(Some(sub)))
                    };
                    out.insert(Key::String(Arc::new(name)), value);
                } else {
                    out.insert(Key::String(Arc::new(k.clone())), to_cel(child, extra, embedded(extra)));
                }
            }
            Cel::from(out)
        }
    }
}

/// A string of a `format: duration`/`date-time`/`date` node as the duration or timestamp
/// kube-apiserver gives rules, converted by CEL's own `duration()`/`timestamp()`; the string
/// itself when it does not parse (envtest does not check `format`).
fn typed_string(conversion: &str, s: &str) -> Cel {
    let converted = (|| {
        let env = env().ok()?;
        let program = compile(&format!("{conversion}(value)")).ok()?;
        let mut ctx = Context::with_env(env.clone());
        ctx.add_variable_from_value("value", s.to_owned());
        program.execute(&ctx).ok()
    })();
    converted.unwrap_or_else(|| Cel::from(s.to_owned()))
}

fn embedded(schema: Option<&Value>) -> bool {
    schema.is_some_and(|s| flag(s, "x-kubernetes-embedded-resource"))
}

/// A field path as apimachinery prints it: `<nil>` for the root.
fn shown(path: &str) -> String {
    if path.is_empty() {
        "<nil>".to_owned()
    } else {
        path.to_owned()
    }
}

/// Evaluates every rule of `schema` (a CRD version's `openAPIV3Schema`) on `obj`, a whole
/// custom resource, with `old`, the stored object on update, for transition rules.
pub(crate) fn validate(schema: &Value, obj: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let mut errs = Vec::new();
    walk(schema, obj, old, "", true, &mut errs);
    errs
}

fn walk(schema: &Value, v: &Value, old: Option<&Value>, path: &str, resource: bool, errs: &mut Vec<FieldError>) {
    if v.is_null() {
        return;
    }
    let old = old.filter(|o| !o.is_null());
    if schema.get("x-kubernetes-validations").is_some() {
        evaluate(schema, v, old, path, resource, errs);
    }
    match v {
        Value::Object(map) => {
            let correlatable = schema.get("x-kubernetes-map-type").and_then(Value::as_str) != Some("atomic");
            let old_of = |k: &str| old.filter(|_| correlatable).and_then(|o| o.get(k));
            let props = schema.get("properties").and_then(Value::as_object);
            let extra = schema.get("additionalProperties").filter(|a| a.is_object());
            for (k, child) in map {
                if resource && matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
                    continue;
                }
                if let Some(sub) = props.and_then(|p| p.get(k)) {
                    walk(sub, child, old_of(k), &join(path, k), embedded(Some(sub)), errs);
                } else if let Some(sub) = extra {
                    walk(
                        sub,
                        child,
                        old_of(k),
                        &format!("{path}[{k}]"),
                        embedded(Some(sub)),
                        errs,
                    );
                }
            }
        }
        Value::Array(items) => {
            let Some(sub) = schema.get("items").filter(|s| s.is_object()) else {
                return;
            };
            let keys: Vec<&str> = if schema.get("x-kubernetes-list-type").and_then(Value::as_str) == Some("map") {
                schema
                    .get("x-kubernetes-list-map-keys")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .collect()
            } else {
                Vec::new()
            };
            let old_items = old.and_then(Value::as_array);
            for (i, item) in items.iter().enumerate() {
                // Only map lists correlate an item with its old self, by its keys.
                let old_item = old_items
                    .filter(|_| !keys.is_empty())
                    .and_then(|olds| olds.iter().find(|o| keys.iter().all(|k| o.get(*k) == item.get(*k))));
                walk(sub, item, old_item, &format!("{path}[{i}]"), embedded(Some(sub)), errs);
            }
        }
        _ => {}
    }
}

/// A context with the Kubernetes libraries, `self` and (when given) `oldSelf` bound.
fn context(env: &Arc<Env>, this: &Cel, old: Option<Option<&Cel>>) -> Result<Context<'static, 'static>, String> {
    let mut ctx = Context::with_env(env.clone());
    library::register(&mut ctx).map_err(|e| format!("rule compiler initialization error: {e}"))?;
    ctx.add_variable_from_value("self", this.clone());
    match old {
        None => {}
        Some(Some(o)) => ctx.add_variable_from_value("oldSelf", o.clone()),
        Some(None) => ctx.add_variable_as_val("oldSelf", Box::new(CelOptional::none())),
    }
    Ok(ctx)
}

fn optional_of(v: &Cel) -> Result<Box<dyn Val>, ExecutionError> {
    let inner: Box<dyn Val> = v.clone().try_into()?;
    Ok(Box::new(CelOptional::of(inner)))
}

/// A run-time error in cel-go's words where they differ.
fn error_text(e: &ExecutionError) -> String {
    match e {
        ExecutionError::NoSuchKey(k) => format!("no such key: {k}"),
        ExecutionError::NoSuchOverload(o) => format!("no such overload: {o}"),
        other => other.to_string(),
    }
}

fn evaluate(schema: &Value, v: &Value, old: Option<&Value>, path: &str, resource: bool, errs: &mut Vec<FieldError>) {
    let ty = json!(schema.get("type").and_then(Value::as_str).unwrap_or(""));
    let env = match env() {
        Ok(env) => env,
        Err(e) => {
            errs.push(FieldError::invalid(shown(path), ty, e));
            return;
        }
    };
    let this = to_cel(v, Some(schema), resource);
    let old_cel = old.map(|o| to_cel(o, Some(schema), resource));
    for rule in rules_of(schema) {
        if rule.rule.trim().is_empty() {
            continue;
        }
        let program = match compile(rule.rule) {
            Ok(p) => p,
            Err(e) => {
                errs.push(FieldError::invalid(
                    shown(path),
                    ty.clone(),
                    format!("rule compile error: {e}"),
                ));
                continue;
            }
        };
        let uses_old = program.references().has_variable("oldSelf");
        if uses_old && old_cel.is_none() && !rule.optional_old_self {
            continue;
        }
        let bound = if !uses_old {
            None
        } else if rule.optional_old_self {
            Some(None)
        } else {
            Some(old_cel.as_ref())
        };
        let mut ctx = match context(env, &this, bound) {
            Ok(c) => c,
            Err(e) => {
                errs.push(FieldError::invalid(shown(path), ty.clone(), e));
                return;
            }
        };
        if rule.optional_old_self
            && uses_old
            && let Some(o) = &old_cel
        {
            match optional_of(o) {
                Ok(opt) => ctx.add_variable_as_val("oldSelf", opt),
                Err(e) => {
                    errs.push(FieldError::invalid(
                        shown(path),
                        ty.clone(),
                        format!("{} evaluating rule: {}", error_text(&e), rule.error_string()),
                    ));
                    continue;
                }
            }
        }
        match program.execute(&ctx) {
            Ok(Cel::Bool(true)) => {}
            Ok(Cel::Bool(false)) => {
                let detail = message_expression(&rule, &ctx).unwrap_or_else(|| rule.message_or_default());
                let at = match normalized_field_path(schema, rule.field_path) {
                    Ok(p) if !p.is_empty() => join(path, &p),
                    _ => path.to_owned(),
                };
                errs.push(error_for_reason(rule.reason, shown(&at), ty.clone(), detail));
            }
            Ok(other) => errs.push(FieldError::invalid(
                shown(path),
                ty.clone(),
                format!(
                    "rule evaluated to {:?}, not a bool, evaluating rule: {}",
                    other.type_of(),
                    rule.error_string()
                ),
            )),
            Err(e @ ExecutionError::NoSuchOverload(_)) => errs.push(FieldError::invalid(
                shown(path),
                ty.clone(),
                format!(
                    "'{}': call arguments did not match a supported operator, function or macro signature for rule: {}",
                    error_text(&e),
                    rule.error_string()
                ),
            )),
            Err(e) => errs.push(FieldError::invalid(
                shown(path),
                ty.clone(),
                format!("{} evaluating rule: {}", error_text(&e), rule.error_string()),
            )),
        }
    }
}

/// The rule's `messageExpression` evaluated, when it gives a usable message (a non-empty string
/// of one line); `None` sends the caller to the static message, as kube-apiserver does.
fn message_expression(rule: &Rule<'_>, ctx: &Context<'_, '_>) -> Option<String> {
    if rule.message_expression.trim().is_empty() {
        return None;
    }
    let program = compile(rule.message_expression).ok()?;
    match program.execute(ctx) {
        Ok(Cel::String(s)) => {
            let s = s.trim();
            (!s.is_empty() && !s.contains('\n') && s.len() <= 5 * 1024).then(|| s.to_owned())
        }
        Ok(_) => None,
        Err(e) => {
            tracing::debug!(message_expression = rule.message_expression, error = %e, "messageExpression evaluation failed");
            None
        }
    }
}

/// `fieldErrorForReason`.
fn error_for_reason(reason: Option<&str>, path: String, ty: Value, detail: String) -> FieldError {
    match reason {
        Some("FieldValueForbidden") => FieldError::forbidden(path, detail),
        Some("FieldValueRequired") => FieldError::required(path, detail),
        Some("FieldValueDuplicate") => FieldError::duplicate(path, ty),
        _ => FieldError::invalid(path, ty, detail),
    }
}

/// The reasons a rule may give, sorted as kube-apiserver lists them.
const REASONS: [&str; 4] = [
    "FieldValueDuplicate",
    "FieldValueForbidden",
    "FieldValueInvalid",
    "FieldValueRequired",
];

/// A rule's `fieldPath` (`.spec.x`, `.map['key']`) checked against the node's schema and
/// rendered as the path it adds (`spec.x`, `map[key]`): `ValidFieldPath`.
fn normalized_field_path(schema: &Value, field_path: &str) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = field_path;
    let step = |node: &Value, name: &str, out: &mut String| -> Result<Value, String> {
        if let Some(props) = node.get("properties").and_then(Value::as_object) {
            let sub = props.get(name).ok_or("does not refer to a valid field")?;
            if !out.is_empty() {
                out.push('.');
            }
            out.push_str(name);
            Ok(sub.clone())
        } else if let Some(extra) = node.get("additionalProperties").filter(|a| a.is_object()) {
            out.push_str(&format!("[{name}]"));
            Ok(extra.clone())
        } else {
            Err("does not refer to a valid field".to_owned())
        }
    };
    let mut current = schema.clone();
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix("['") {
            let end = r.find("']").ok_or("unexpected end of JSON path")?;
            current = step(&current, &r[..end], &mut out)?;
            rest = &r[end + 2..];
        } else if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            if end == 0 {
                return Err("unexpected end of JSON path".to_owned());
            }
            current = step(&current, &r[..end], &mut out)?;
            rest = &r[end..];
        } else {
            return Err(format!("expected [ or . but got: {rest}"));
        }
    }
    Ok(out)
}

/// The type names an expression may use as values (`type(x) == string`).
const TYPE_NAMES: &[&str] = &[
    "int",
    "uint",
    "double",
    "bool",
    "string",
    "bytes",
    "list",
    "map",
    "null_type",
    "type",
    "dyn",
    "duration",
    "timestamp",
    "optional_type",
];

/// Whether the environment declares a function `name` (cel-rust refuses to add a context
/// function under a name the environment declares).
fn env_declares(env: &Arc<Env>, name: &str) -> bool {
    let mut probe = Context::with_env(env.clone());
    probe.add_function(name, || false).is_err()
}

/// What a rule may refer to, for the check at CRD creation.
struct Checker<'a> {
    env: &'a Arc<Env>,
    source: &'a str,
    program: &'a Program,
    /// The node's schema, for the fields selected from `self`/`oldSelf`.
    schema: &'a Value,
    resource: bool,
    /// The variables the expression may name: `self`/`oldSelf` for a CRD rule (checked against
    /// `schema`), `object`/`oldObject`/`request` for an admission match condition.
    variables: &'a [&'a str],
    /// The comprehension variables in scope, innermost last, each with the schema of what it
    /// iterates over when known (`self.items.all(i, …)`: `i` is an item of `items`).
    scope: Vec<(String, Option<(Value, bool)>)>,
    errors: Vec<String>,
}

impl Checker<'_> {
    fn error(&mut self, id: u64, msg: String) {
        let offset = self
            .program
            .source_info()
            .offset_for(id)
            .map_or(0, |(start, _)| start as usize);
        let before: String = self.source.chars().take(offset).collect();
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        let text = format!("ERROR: <input>:{line}:{column}: {msg}");
        if !self.errors.contains(&text) {
            self.errors.push(text);
        }
    }

    fn is_variable(&self, name: &str) -> bool {
        self.scope.iter().any(|(s, _)| s == name)
    }

    fn check(&mut self, e: &IdedExpr) {
        match &e.expr {
            Expr::Ident(n) => {
                let ok =
                    self.variables.contains(&n.as_str()) || self.is_variable(n) || TYPE_NAMES.contains(&n.as_str());
                if !ok {
                    self.error(e.id, format!("undeclared reference to '{n}' (in container '')"));
                }
            }
            Expr::Select(s) => {
                let schema = self.schema.clone();
                if let Some(Err((id, msg))) = self.selected_owned(&s.operand, &schema, &s.field) {
                    self.error(id.unwrap_or(e.id), msg);
                }
                self.check(&s.operand);
            }
            Expr::Call(c) => {
                let name = c.func_name.as_str();
                let operator = !name.starts_with(|ch: char| ch.is_ascii_alphabetic());
                let qualified = c.target.as_deref().and_then(|t| match &t.expr {
                    Expr::Ident(ns) if !self.is_variable(ns) && !self.variables.contains(&ns.as_str()) => {
                        Some(format!("{ns}.{name}"))
                    }
                    _ => None,
                });
                if let Some(q) = &qualified
                    && env_declares(self.env, q)
                {
                    // `optional.of(x)`: the target is a namespace, not a value.
                } else {
                    if !operator && !library::is_library_function(name) && !env_declares(self.env, name) {
                        self.error(e.id, format!("undeclared reference to '{name}' (in container '')"));
                    }
                    if let Some(t) = &c.target {
                        self.check(t);
                    }
                }
                for a in &c.args {
                    self.check(a);
                }
            }
            Expr::Comprehension(c) => {
                self.check(&c.iter_range);
                self.check(&c.accu_init);
                let pushed = 2 + usize::from(c.iter_var2.is_some());
                // Over a list, the variable is an item; over a map (or with two variables) it
                // is a key, not checked.
                let item = match &c.iter_var2 {
                    None => {
                        let schema = self.schema.clone();
                        self.chain(&c.iter_range, &schema).and_then(|(node, _)| {
                            let items = node.get("items").filter(|i| i.is_object())?;
                            Some((items.clone(), embedded(Some(items))))
                        })
                    }
                    Some(_) => None,
                };
                self.scope.push((c.iter_var.clone(), item));
                self.scope.push((c.accu_var.clone(), None));
                if let Some(v) = &c.iter_var2 {
                    self.scope.push((v.clone(), None));
                }
                self.check(&c.loop_cond);
                self.check(&c.loop_step);
                self.check(&c.result);
                self.scope.truncate(self.scope.len() - pushed);
            }
            Expr::List(l) => l.elements.iter().for_each(|x| self.check(x)),
            Expr::Map(m) => {
                for entry in &m.entries {
                    match &entry.expr {
                        EntryExpr::MapEntry(me) => {
                            self.check(&me.key);
                            self.check(&me.value);
                        }
                        EntryExpr::StructField(f) => self.check(&f.value),
                    }
                }
            }
            Expr::Struct(s) => self.error(
                e.id,
                format!("undeclared reference to '{}' (in container '')", s.type_name),
            ),
            Expr::Literal(_) | Expr::Unspecified => {}
        }
    }

    /// Checks `operand.field` when `operand` is a `self…` chain: the error, if the field is not
    /// declared at that node.
    fn selected_owned(
        &self,
        operand: &IdedExpr,
        schema: &Value,
        field: &str,
    ) -> Option<Result<(), (Option<u64>, String)>> {
        let (node, resource) = self.chain(operand, schema)?;
        match field_of(&node, field, resource) {
            Ok(_) => Some(Ok(())),
            Err(m) => Some(Err((None, m))),
        }
    }

    /// The schema node (and whether it is a resource root) a `self.a.b` chain reaches (or one
    /// starting at a comprehension variable whose schema is known); `None` when the chain starts
    /// elsewhere or reaches a node that is not checked.
    fn chain(&self, e: &IdedExpr, schema: &Value) -> Option<(Value, bool)> {
        match &e.expr {
            Expr::Ident(n) if self.is_variable(n) => {
                let (_, known) = self.scope.iter().rev().find(|(s, _)| s == n)?;
                known.clone()
            }
            Expr::Ident(n) if n == "self" || n == "oldSelf" => Some((schema.clone(), self.resource)),
            Expr::Select(s) if !s.test => {
                let (node, resource) = self.chain(&s.operand, schema)?;
                field_of(&node, &s.field, resource)
                    .ok()
                    .flatten()
                    .map(|(v, r)| (v.clone(), r))
            }
            _ => None,
        }
    }
}

/// The schema of `field` selected from a node: `Ok(None)` when the node allows any field (a map,
/// preserved unknown fields, or no schema), `Err` when it declares no such field.
fn field_of<'a>(node: &'a Value, field: &str, resource: bool) -> Result<Option<(&'a Value, bool)>, String> {
    if flag(node, "x-kubernetes-preserve-unknown-fields") || flag(node, "x-kubernetes-int-or-string") {
        return Ok(None);
    }
    if let Some(sub) = property(node, field, resource) {
        return Ok(Some((sub, embedded(Some(sub)))));
    }
    if let Some(extra) = node.get("additionalProperties").filter(|a| a.is_object()) {
        return Ok(Some((extra, embedded(Some(extra)))));
    }
    match node.get("type").and_then(Value::as_str) {
        Some("object") => Err(format!("undefined field '{field}'")),
        Some(t @ ("string" | "integer" | "number" | "boolean" | "array")) => {
            let cel_type = match t {
                "integer" => "int",
                "number" => "double",
                "boolean" => "bool",
                "array" => "list",
                other => other,
            };
            Err(format!("type '{cel_type}' does not support field selection"))
        }
        _ => Ok(None),
    }
}

/// Compiles `source` for a node of `schema` and checks what it refers to: the errors, in
/// cel-go's words, joined as `compilation failed: ` would show them.
fn check_expression(source: &str, schema: &Value, resource: bool) -> Result<Arc<Program>, String> {
    let env = env()?;
    let program = compile(source)?;
    let mut checker = Checker {
        env,
        source,
        program: &program,
        schema,
        resource,
        variables: &["self", "oldSelf"],
        scope: Vec::new(),
        errors: Vec::new(),
    };
    checker.check(program.expression());
    if checker.errors.is_empty() {
        Ok(program)
    } else {
        Err(checker.errors.join("\n"))
    }
}

/// Checks every rule of a CRD version's `openAPIV3Schema` (at `path`, e.g.
/// `spec.versions[0].schema.openAPIV3Schema`), as kube-apiserver does when the CRD is written.
pub(crate) fn check_schema(schema: &Value, path: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    check_node(schema, path, true, None, &mut errs);
    errs
}

fn check_node(schema: &Value, path: &str, resource: bool, uncorrelatable: Option<&str>, errs: &mut Vec<FieldError>) {
    for (i, rule) in rules_of(schema).enumerate() {
        let at = |field: &str| format!("{path}.x-kubernetes-validations[{i}].{field}");
        let message = rule.message.trim();
        if rule.rule.trim().is_empty() {
            errs.push(FieldError::required(at("rule"), "rule is not specified"));
            continue;
        } else if !rule.message.is_empty() && message.is_empty() {
            errs.push(FieldError::invalid(
                at("message"),
                json!(rule.message),
                "message must be non-empty if specified",
            ));
        } else if message.contains('\n') {
            errs.push(FieldError::invalid(
                at("message"),
                json!(rule.message),
                "message must not contain line breaks",
            ));
        } else if rule.rule.trim().contains('\n') && message.is_empty() {
            errs.push(FieldError::required(
                at("message"),
                "message must be specified if rule contains line breaks",
            ));
        }
        if !rule.message_expression.is_empty() && rule.message_expression.trim().is_empty() {
            errs.push(FieldError::required(
                at("messageExpression"),
                "messageExpression must be non-empty if specified",
            ));
        }
        match check_expression(rule.rule, schema, resource) {
            Err(e) => errs.push(FieldError::invalid(
                at("rule"),
                rule.raw.clone(),
                format!("compilation failed: {e}"),
            )),
            Ok(program) => {
                if program.references().has_variable("oldSelf")
                    && let Some(within) = uncorrelatable
                {
                    errs.push(FieldError::invalid(
                        at("rule"),
                        json!(rule.rule),
                        format!("oldSelf cannot be used on the uncorrelatable portion of the schema within {within}"),
                    ));
                }
            }
        }
        if !rule.message_expression.trim().is_empty()
            && let Err(e) = check_expression(rule.message_expression, schema, resource)
        {
            errs.push(FieldError::invalid(
                at("messageExpression"),
                rule.raw.clone(),
                format!("messageExpression compilation failed: {e}"),
            ));
        }
        if let Some(reason) = rule.reason
            && !REASONS.contains(&reason)
        {
            let allowed: Vec<Value> = REASONS.iter().map(|r| json!(r)).collect();
            errs.push(FieldError::not_supported(at("reason"), json!(reason), &allowed));
        }
        if !rule.field_path.is_empty()
            && let Err(e) = normalized_field_path(schema, rule.field_path)
        {
            errs.push(FieldError::invalid(
                at("fieldPath"),
                json!(rule.field_path),
                format!("fieldPath must be a valid path: {e}"),
            ));
        }
    }
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (k, sub) in props {
            check_node(
                sub,
                &format!("{path}.properties[{k}]"),
                embedded(Some(sub)),
                uncorrelatable,
                errs,
            );
        }
    }
    if let Some(sub) = schema.get("additionalProperties").filter(|a| a.is_object()) {
        check_node(
            sub,
            &format!("{path}.additionalProperties"),
            embedded(Some(sub)),
            uncorrelatable,
            errs,
        );
    }
    if let Some(sub) = schema.get("items").filter(|a| a.is_object()) {
        let map_list = schema.get("x-kubernetes-list-type").and_then(Value::as_str) == Some("map");
        let within = if map_list || uncorrelatable.is_some() {
            uncorrelatable.map(str::to_owned)
        } else {
            Some(path.to_owned())
        };
        check_node(
            sub,
            &format!("{path}.items"),
            embedded(Some(sub)),
            within.as_deref(),
            errs,
        );
    }
}

/// Compiles an admission expression (a webhook's `matchConditions[*].expression`) that may
/// name `variables` (whose values are untyped JSON, so their fields are not checked): the
/// errors in cel-go's words, joined as `compilation failed: ` shows them.
pub(crate) fn check_admission_expression(source: &str, variables: &[&str]) -> Result<(), String> {
    let env = env()?;
    let program = compile(source)?;
    let mut checker = Checker {
        env,
        source,
        program: &program,
        schema: &Value::Null,
        resource: false,
        variables,
        scope: Vec::new(),
        errors: Vec::new(),
    };
    checker.check(program.expression());
    if checker.errors.is_empty() {
        Ok(())
    } else {
        Err(checker.errors.join("\n"))
    }
}

/// Evaluates an admission expression with `variables` bound to JSON values (objects as maps
/// with their keys as written, `null` as CEL's null), in the rules' environment and libraries:
/// the boolean it gives, or the evaluation error (a result that is not a bool is one).
pub(crate) fn evaluate_admission_expression(source: &str, variables: &[(&str, &Value)]) -> Result<bool, String> {
    let env = env()?;
    let program = compile(source)?;
    let mut ctx = Context::with_env(env.clone());
    library::register(&mut ctx).map_err(|e| format!("expression environment initialization error: {e}"))?;
    for (name, value) in variables {
        ctx.add_variable_from_value(*name, to_cel(value, None, false));
    }
    match program.execute(&ctx) {
        Ok(Cel::Bool(b)) => Ok(b),
        Ok(other) => Err(format!("expression evaluated to {:?}, not a bool", other.type_of())),
        Err(e) => Err(error_text(&e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `expr` evaluated with `self` bound to `this` (no schema).
    fn eval(expr: &str, this: Value) -> Result<Cel, String> {
        let env = env()?;
        let program = check_expression(expr, &json!({}), false)?;
        let ctx = context(env, &to_cel(&this, None, false), None)?;
        program.execute(&ctx).map_err(|e| error_text(&e))
    }

    fn yes(expr: &str) {
        assert_eq!(eval(expr, Value::Null), Ok(Cel::Bool(true)), "{expr}");
    }

    fn fails(expr: &str, contains: &str) {
        match eval(expr, Value::Null) {
            Err(e) => assert!(e.contains(contains), "{expr}: {e}"),
            Ok(v) => panic!("{expr} should fail, got {v:?}"),
        }
    }

    #[test]
    fn standard_library_and_macros() {
        for e in [
            "[1, 2, 3].all(x, x > 0)",
            "[1, 2, 3].exists(x, x == 2)",
            "[1, 2, 3].exists_one(x, x == 2)",
            "[1, 2, 3].map(x, x * 2) == [2, 4, 6]",
            "[1, 2, 3].filter(x, x > 1) == [2, 3]",
            "size([1, 2]) == 2 && size('abc') == 3 && size({'a': 1}) == 1",
            "has({'a': 1}.a) && !has({'a': 1}.b)",
            "'abc'.startsWith('a') && 'abc'.endsWith('c') && 'abc'.contains('b')",
            "'example.com'.matches('^[a-z]+\\\\.com$')",
            "int('5') == 5 && string(5) == '5' && double(1) == 1.0 && type(1) == int",
            "duration('1h') < duration('2h') && timestamp('2024-01-01T00:00:00Z') < timestamp('2025-01-01T00:00:00Z')",
            "optional.of(1).hasValue() && !optional.none().hasValue() && optional.none().orValue(2) == 2",
            "'a' in ['a', 'b'] && 'k' in {'k': 1}",
        ] {
            yes(e);
        }
    }

    #[test]
    fn strings_extension() {
        for e in [
            "'AbC'.lowerAscii() == 'abc' && 'AbC'.upperAscii() == 'ABC'",
            "'a,b'.split(',') == ['a', 'b'] && ['a', 'b'].join('-') == 'a-b'",
            "'  x '.trim() == 'x' && 'aXa'.replace('X', 'y') == 'aya'",
            "'hello'.indexOf('l') == 2 && 'hello'.lastIndexOf('l') == 3",
            "'hello'.substring(1, 3) == 'el' && 'hello'.charAt(1) == 'e'",
            "'%s-%d'.format(['a', 1]) == 'a-1'",
        ] {
            yes(e);
        }
    }

    #[test]
    fn lists_library() {
        yes("[1, 2, 2, 3].isSorted() && !([2, 1].isSorted()) && ['a', 'b'].isSorted()");
        yes("[1, 2, 3].sum() == 6 && [1.5, 2.5].sum() == 4.0 && [].sum() == 0");
        yes("[3, 1, 2].min() == 1 && [3, 1, 2].max() == 3 && ['b', 'a'].min() == 'a'");
        yes("[1, 2, 1].indexOf(1) == 0 && [1, 2, 1].lastIndexOf(1) == 2 && [1].indexOf(5) == -1");
        fails("[].min() == 0", "min called on empty list");
        fails("[1, 'a'].isSorted()", "no such overload");
    }

    #[test]
    fn regex_library() {
        yes("'abc 123 def 456'.find('[0-9]+') == '123'");
        yes("'abc'.find('[0-9]+') == ''");
        yes("'a1b2c3'.findAll('[0-9]') == ['1', '2', '3']");
        yes("'a1b2c3'.findAll('[0-9]', 2) == ['1', '2']");
        fails("'a'.find('(') == ''", "regex");
    }

    #[test]
    fn urls_library() {
        yes("url('https://user@example.com:8443/a%20b?x=1&x=2&y=z+w').getScheme() == 'https'");
        yes("url('https://user@example.com:8443/p').getHost() == 'example.com:8443'");
        yes("url('https://example.com:8443/p').getHostname() == 'example.com'");
        yes("url('https://example.com:8443/p').getPort() == '8443'");
        yes("url('https://example.com/p').getPort() == ''");
        yes("url('https://[::1]:80/p').getHostname() == '::1' && url('https://[::1]:80/p').getPort() == '80'");
        yes("url('https://example.com/a%20b').getEscapedPath() == '/a%20b'");
        yes("url('https://e.com/?x=1&x=2&y=z+w').getQuery() == {'x': ['1', '2'], 'y': ['z w']}");
        yes("url('/absolute/path').getScheme() == '' && url('/absolute/path').getEscapedPath() == '/absolute/path'");
        yes("isURL('https://example.com') && !isURL('example.com') && !isURL('not a url')");
        yes("url('https://a.com') == url('https://a.com')");
        fails(
            "url('relative/path') != null",
            r#"parse "relative/path": invalid URI for request"#,
        );
    }

    #[test]
    fn quantity_library() {
        yes("quantity('1Gi').isGreaterThan(quantity('1G')) && quantity('500m').isLessThan(quantity('1'))");
        yes("quantity('1k') == quantity('1000')");
        yes("quantity('1Gi').compareTo(quantity('1024Mi')) == 0 && quantity('1').compareTo(quantity('2')) == -1");
        yes("quantity('1Gi').add(quantity('512Mi')) == quantity('1.5Gi') && quantity('1').add(2) == quantity('3')");
        yes("quantity('1').sub(quantity('1500m')).sign() == -1 && quantity('2').sub(1) == quantity('1')");
        yes("quantity('2k').asInteger() == 2000 && quantity('1.5').isInteger() == false && quantity('3').isInteger()");
        yes("quantity('250m').asApproximateFloat() == 0.25");
        yes("isQuantity('10Mi') && !isQuantity('10MB') && !isQuantity('')");
        fails("quantity('1.5').asInteger() == 1", "cannot convert value to integer");
        fails(
            "quantity('10MB') == quantity('1')",
            "quantities must match the regular expression",
        );
        fails("quantity(1) == quantity('1')", "no such overload");
    }

    #[test]
    fn ip_and_cidr_libraries() {
        yes(
            "isIP('10.0.0.1') && isIP('::1') && !isIP('10.0.0.256') && !isIP('::ffff:10.0.0.1') && !isIP('fe80::1%eth0')",
        );
        yes("ip('10.0.0.1').family() == 4 && ip('2001:db8::1').family() == 6");
        yes("ip('127.0.0.1').isLoopback() && ip('::').isUnspecified() && ip('0.0.0.0').isUnspecified()");
        yes("ip('169.254.1.1').isLinkLocalUnicast() && ip('fe80::1').isLinkLocalUnicast()");
        yes(
            "ip('224.0.0.1').isLinkLocalMulticast() && ip('ff02::1').isLinkLocalMulticast() && !ip('224.0.1.1').isLinkLocalMulticast()",
        );
        yes(
            "ip('10.0.0.1').isGlobalUnicast() && !ip('255.255.255.255').isGlobalUnicast() && !ip('127.0.0.1').isGlobalUnicast()",
        );
        yes("string(ip('2001:0db8::0001')) == '2001:db8::1' && ip('10.0.0.1') == ip('10.0.0.1')");
        yes("isCIDR('10.0.0.0/8') && !isCIDR('10.0.0.0/33') && !isCIDR('10.0.0.0') && !isCIDR('10.0.0.0/08')");
        yes("cidr('10.0.0.0/8').containsIP('10.1.2.3') && !cidr('10.0.0.0/8').containsIP(ip('11.0.0.1'))");
        yes("!cidr('10.0.0.0/8').containsIP('::1')");
        yes("cidr('10.0.0.0/8').containsCIDR('10.1.0.0/16') && !cidr('10.1.0.0/16').containsCIDR(cidr('10.0.0.0/8'))");
        yes("cidr('10.1.2.3/8').ip() == ip('10.1.2.3') && cidr('10.1.2.3/8').prefixLength() == 8");
        yes(
            "string(cidr('10.1.2.3/8').masked()) == '10.0.0.0/8' && string(cidr('2001:db8::1/32').masked()) == '2001:db8::/32'",
        );
        yes("cidr('0.0.0.0/0').containsIP('1.2.3.4') && string(cidr('1.2.3.4/0').masked()) == '0.0.0.0/0'");
        fails(
            "ip('nope') == ip('10.0.0.1')",
            "parse error during conversion from string",
        );
        fails("ip('::ffff:1.2.3.4').family() == 6", "IPv4-mapped IPv6 address");
        fails(
            "cidr('10.0.0.0/99').prefixLength() == 1",
            "parse error during conversion from string",
        );
    }

    #[test]
    fn property_names_are_escaped_as_kubernetes_does() {
        assert_eq!(escape("foo-bar").as_deref(), Some("foo__dash__bar"));
        assert_eq!(escape("a.b/c").as_deref(), Some("a__dot__b__slash__c"));
        assert_eq!(escape("__x").as_deref(), Some("__underscores__x"));
        assert_eq!(escape("namespace").as_deref(), Some("__namespace__"));
        assert_eq!(escape("1abc"), None);
        assert_eq!(escape("a b"), None);
        let schema =
            json!({"type": "object", "properties": {"foo-bar": {"type": "integer"}, "ratio": {"type": "number"}}});
        let v = to_cel(&json!({"foo-bar": 1, "ratio": 1}), Some(&schema), false);
        let ctx = context(env().unwrap(), &v, None).unwrap();
        let p = compile("self.foo__dash__bar == 1 && type(self.ratio) == double").unwrap();
        assert_eq!(p.execute(&ctx), Ok(Cel::Bool(true)));
    }

    #[test]
    fn formatted_strings_are_durations_timestamps_and_bytes() {
        let schema = json!({"type": "object", "properties": {
            "every": {"type": "string", "format": "duration"},
            "at": {"type": "string", "format": "date-time"},
            "on": {"type": "string", "format": "date"},
            "blob": {"type": "string", "format": "byte"},
            "bad": {"type": "string", "format": "duration"},
        }});
        let v = to_cel(
            &json!({"every": "1h30m", "at": "2024-05-01T10:00:00Z", "on": "2024-05-01", "blob": "aGk=", "bad": "soon"}),
            Some(&schema),
            false,
        );
        let ctx = context(env().unwrap(), &v, None).unwrap();
        let p = compile(
            "self.every == duration('90m') && self.at > timestamp('2024-05-01T00:00:00Z') \
             && self.on == timestamp('2024-05-01T00:00:00Z') && self.blob == b'hi' && self.bad == 'soon'",
        )
        .unwrap();
        assert_eq!(p.execute(&ctx), Ok(Cel::Bool(true)));
    }

    fn rule_schema(rules: Value) -> Value {
        json!({"type": "object", "properties": {
            "spec": {"type": "object", "x-kubernetes-validations": rules, "properties": {
                "replicas": {"type": "integer"},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "items": {"type": "array", "items": {"type": "object",
                    "x-kubernetes-validations": [{"rule": "self.name == oldSelf.name"}],
                    "properties": {"name": {"type": "string"}}}},
            }},
        }})
    }

    fn check_texts(rules: Value) -> Vec<String> {
        check_schema(&rule_schema(rules), "spec.versions[0].schema.openAPIV3Schema")
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn crd_rules_are_compiled_and_checked() {
        let errs = check_texts(json!([
            {"rule": "self.replicas > 0 && self.labels.all(k, k != '') && has(self.items)"},
            {"rule": "self.replicas.frobnicate()"},
            {"rule": "self.replica > 0"},
            {"rule": "self.replicas >"},
            {"rule": "ghost > 0"},
            {"rule": "self.replicas.x == 1"},
            {"rule": "true", "reason": "Bogus"},
            {"rule": "true", "fieldPath": ".nope"},
            {"rule": "true", "messageExpression": "nope()"},
            {"rule": "self.replicas == oldSelf.replicas"},
            {"rule": "self.items.all(i, i.nam != '') && self.items.exists(i, i.name == 'x')"},
            {"rule": "self.labels.all(k, k.size() > 0 && self.labels[k].startsWith('a'))"},
            {"rule": "true &&\ntrue"},
            {"rule": "true", "message": "two\nlines"},
            {"rule": "true", "message": "  "},
            {"rule": "true", "messageExpression": " "},
        ]));
        let at = |i: usize, f: &str| {
            format!("spec.versions[0].schema.openAPIV3Schema.properties[spec].x-kubernetes-validations[{i}].{f}")
        };
        let find = |needle: &str| {
            errs.iter()
                .find(|e| e.contains(needle))
                .cloned()
                .unwrap_or_else(|| panic!("{needle} not in {errs:#?}"))
        };
        assert!(
            !errs
                .iter()
                .any(|e| e.starts_with(&at(0, "rule")) || e.starts_with(&at(9, "rule"))),
            "{errs:#?}"
        );
        assert!(find("undeclared reference to 'frobnicate'").starts_with(&at(1, "rule")));
        assert!(
            find("compilation failed: ERROR: <input>:1:")
                .contains("undeclared reference to 'frobnicate' (in container '')")
        );
        assert!(find("undefined field 'replica'").starts_with(&at(2, "rule")));
        assert!(
            errs.iter()
                .any(|e| e.starts_with(&at(3, "rule")) && e.contains("compilation failed: ERROR: <input>:1:")),
            "{errs:#?}"
        );
        assert!(find("undeclared reference to 'ghost'").starts_with(&at(4, "rule")));
        assert!(find("type 'int' does not support field selection").starts_with(&at(5, "rule")));
        assert_eq!(
            find("Unsupported value"),
            format!(
                r#"{}: Unsupported value: "Bogus": supported values: "FieldValueDuplicate", "FieldValueForbidden", "FieldValueInvalid", "FieldValueRequired""#,
                at(6, "reason")
            )
        );
        assert!(find("fieldPath must be a valid path").starts_with(&at(7, "fieldPath")));
        assert_eq!(
            find("message must be specified if rule contains line breaks"),
            format!(
                "{}: Required value: message must be specified if rule contains line breaks",
                at(12, "message")
            )
        );
        assert!(find("message must not contain line breaks").starts_with(&at(13, "message")));
        assert!(find("message must be non-empty if specified").starts_with(&at(14, "message")));
        assert!(find("messageExpression must be non-empty if specified").starts_with(&at(15, "messageExpression")));
        assert!(
            find("undefined field 'nam'").starts_with(&at(10, "rule")),
            "a list item's fields are checked"
        );
        assert!(
            !errs.iter().any(|e| e.starts_with(&at(11, "rule"))),
            "a map's keys are not fields: {errs:#?}"
        );
        assert!(find("messageExpression compilation failed").starts_with(&at(8, "messageExpression")));
        let uncorrelated = find("oldSelf cannot be used");
        assert!(uncorrelated.starts_with(
            "spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[items].items.x-kubernetes-validations[0].rule"
        ), "{uncorrelated}");
        assert!(
            uncorrelated.ends_with("within spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[items]"),
            "{uncorrelated}"
        );
    }

    #[test]
    fn failures_are_field_errors_at_the_node_plus_field_path() {
        let schema = rule_schema(json!([
            {"rule": "self.replicas < 5"},
            {"rule": "self.replicas < 4", "message": " too many ", "fieldPath": ".replicas"},
            {"rule": "self.replicas < 3", "messageExpression": "'got ' + string(self.replicas)", "reason": "FieldValueForbidden"},
            {"rule": "self.replicas < 2", "messageExpression": "self.nope", "message": "fallback", "reason": "FieldValueRequired"},
            {"rule": "self.replicas < 1", "reason": "FieldValueDuplicate", "fieldPath": ".labels['a.b']"},
            {"rule": "self.labels.x == 'y'"},
        ]));
        let obj = json!({"apiVersion": "x/v1", "kind": "X", "metadata": {"name": "a"}, "spec": {"replicas": 7, "labels": {}}});
        let errs: Vec<String> = validate(&schema, &obj, None).iter().map(ToString::to_string).collect();
        assert_eq!(
            errs,
            [
                r#"spec: Invalid value: "object": failed rule: self.replicas < 5"#,
                r#"spec.replicas: Invalid value: "object": too many"#,
                "spec: Forbidden: got 7",
                "spec: Required value: fallback",
                r#"spec.labels[a.b]: Duplicate value: "object""#,
                r#"spec: Invalid value: "object": no such key: x evaluating rule: self.labels.x == 'y'"#,
            ]
        );
    }

    #[test]
    fn transition_rules_see_the_old_value_where_it_correlates() {
        let schema = json!({"type": "object",
        "x-kubernetes-validations": [{"rule": "self.metadata.name == 'a' && !has(self.metadata.labels)"}],
        "properties": {"spec": {"type": "object", "properties": {
            "mode": {"type": "string", "x-kubernetes-validations": [
                {"rule": "self == oldSelf", "message": "field is immutable"},
                {"rule": "!oldSelf.hasValue() || oldSelf.value() != 'locked'", "optionalOldSelf": true, "message": "was locked"},
            ]},
            "ports": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
                "items": {"type": "object", "properties": {"name": {"type": "string"}, "port": {"type": "integer",
                    "x-kubernetes-validations": [{"rule": "self >= oldSelf", "message": "may only grow"}]}}}},
        }}}});
        let obj = |mode: &str, ports: Value| json!({"metadata": {"name": "a", "labels": {"x": "y"}}, "spec": {"mode": mode, "ports": ports}});
        let texts = |new: &Value, old: Option<&Value>| -> Vec<String> {
            validate(&schema, new, old).iter().map(ToString::to_string).collect()
        };
        let v1 = obj("open", json!([{"name": "http", "port": 80}]));
        assert!(
            texts(&v1, None).is_empty(),
            "create runs no transition rule: {:?}",
            texts(&v1, None)
        );
        assert!(texts(&v1, Some(&v1)).is_empty());
        let changed = obj(
            "closed",
            json!([{"name": "https", "port": 1}, {"name": "http", "port": 70}]),
        );
        assert_eq!(
            texts(&changed, Some(&v1)),
            [
                r#"spec.mode: Invalid value: "string": field is immutable"#,
                r#"spec.ports[1].port: Invalid value: "integer": may only grow"#,
            ]
        );
        let locked = obj("locked", json!([]));
        assert_eq!(texts(&obj("locked", json!([])), None), Vec::<String>::new());
        assert_eq!(
            texts(&obj("open", json!([])), Some(&locked)),
            [
                r#"spec.mode: Invalid value: "string": field is immutable"#,
                r#"spec.mode: Invalid value: "string": was locked"#,
            ]
        );
    }
}
