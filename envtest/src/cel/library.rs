//! The Kubernetes CEL libraries a CRD's rules call (`k8s.io/apiserver/pkg/cel/library`), on top
//! of cel-rust's standard library and its `strings` extension: lists (`isSorted`, `sum`, `min`,
//! `max`, `indexOf`, `lastIndexOf`), regex (`find`, `findAll`), URLs (`url`, `isURL`,
//! `getScheme`, `getHost`, `getHostname`, `getPort`, `getEscapedPath`, `getQuery`),
//! quantities (`quantity`, `isQuantity`, `sign`, `isInteger`, `asInteger`,
//! `asApproximateFloat`, `add`, `sub`, `isLessThan`, `isGreaterThan`, `compareTo`), IPs (`ip`,
//! `isIP`, `family`, `isUnspecified`, `isLoopback`, `isLinkLocalMulticast`,
//! `isLinkLocalUnicast`, `isGlobalUnicast`, `string`) and CIDRs (`cidr`, `isCIDR`, `containsIP`,
//! `containsCIDR`, `ip`, `prefixLength`, `masked`, `string`).
//!
//! Each is a function of the evaluation's [`Context`] called with any arguments (cel-rust has no
//! type checker), which checks its receiver and arguments itself and answers `no such overload`
//! otherwise, as cel-go does at run time. `indexOf`/`lastIndexOf` on lists and `string` of an IP
//! or CIDR are overloads of the [`Env`] instead, because the strings extension and the standard
//! library declare those names. URLs are parsed by `http::Uri` (Go's `url.ParseRequestURI`
//! accepts a few URIs it refuses, such as `mailto:` ones), addresses by `std::net`. What is not
//! here (`ip.isCanonical`, `format`, `authz`, `semver`) is refused when a CRD is written, as any
//! unknown function (see `cel/mod.rs`).

use super::quantity::{self, Quantity};
use cel::common::types::{DYN_TYPE, LIST_TYPE, Type};
use cel::common::value::CowVal;
use cel::objects::{Key, Opaque};
use cel::{Context, DeclarationError, Env, ExecutionError, FunctionContext, Value};
use std::cmp::Ordering;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

/// A Kubernetes function: its receiver (if called as a method) followed by its arguments.
type Library = fn(&str, &[Value]) -> Result<Value, ExecutionError>;

/// Every Kubernetes library function registered on the evaluation context, by name.
const FUNCTIONS: &[(&str, Library)] = &[
    ("isSorted", lists),
    ("sum", lists),
    ("min", lists),
    ("max", lists),
    ("find", regex),
    ("findAll", regex),
    ("url", urls),
    ("isURL", urls),
    ("getScheme", urls),
    ("getHost", urls),
    ("getHostname", urls),
    ("getPort", urls),
    ("getEscapedPath", urls),
    ("getQuery", urls),
    ("quantity", quantities),
    ("isQuantity", quantities),
    ("sign", quantities),
    ("isInteger", quantities),
    ("asInteger", quantities),
    ("asApproximateFloat", quantities),
    ("add", quantities),
    ("sub", quantities),
    ("isLessThan", quantities),
    ("isGreaterThan", quantities),
    ("compareTo", quantities),
    ("ip", ips),
    ("isIP", ips),
    ("family", ips),
    ("isUnspecified", ips),
    ("isLoopback", ips),
    ("isLinkLocalMulticast", ips),
    ("isLinkLocalUnicast", ips),
    ("isGlobalUnicast", ips),
    ("cidr", ips),
    ("isCIDR", ips),
    ("containsIP", ips),
    ("containsCIDR", ips),
    ("prefixLength", ips),
    ("masked", ips),
];

/// Whether `name` is one of the functions [`register`] adds (for the check at CRD creation).
pub(crate) fn is_library_function(name: &str) -> bool {
    FUNCTIONS.iter().any(|(n, _)| *n == name)
}

/// Adds the Kubernetes functions to an evaluation context.
pub(crate) fn register(ctx: &mut Context<'_, '_>) -> Result<(), DeclarationError> {
    for &(name, f) in FUNCTIONS {
        ctx.add_function(name, move |ftx: &FunctionContext| -> Result<Value, ExecutionError> {
            let mut args = Vec::with_capacity(ftx.args.len() + 1);
            for v in ftx.this.iter().chain(ftx.args.iter()) {
                args.push(Value::try_from(v.as_ref())?);
            }
            f(name, &args)
        })?;
    }
    Ok(())
}

/// Adds the member overloads that share a name with the strings extension's:
/// `list.indexOf(x)` and `list.lastIndexOf(x)`.
pub(crate) fn register_env(env: &mut Env) -> Result<(), DeclarationError> {
    env.add_member_overload("indexOf", "list_index_of", LIST_TYPE, vec![DYN_TYPE], |args| {
        member_on_list("indexOf", args)
    })?;
    // `string(ip)` and `string(cidr)`: `string` is the standard library's, so these are overloads
    // of it for the two opaque types.
    env.add_overload(
        "string",
        "string_ip",
        vec![Type::new_opaque_type(IP_TYPE)],
        to_string_overload,
    )?;
    env.add_overload(
        "string",
        "string_cidr",
        vec![Type::new_opaque_type(CIDR_TYPE)],
        to_string_overload,
    )?;
    env.add_member_overload("lastIndexOf", "list_last_index_of", LIST_TYPE, vec![DYN_TYPE], |args| {
        member_on_list("lastIndexOf", args)
    })
}

fn member_on_list<'b, 'v>(name: &str, args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let values = args
        .iter()
        .map(|v| Value::try_from(v.as_ref()))
        .collect::<Result<Vec<_>, _>>()?;
    let out = lists(name, &values)?;
    let boxed: Box<dyn cel::common::value::Val> = out.try_into()?;
    Ok(CowVal::from(boxed))
}

fn to_string_overload<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let values = args
        .iter()
        .map(|v| Value::try_from(v.as_ref()))
        .collect::<Result<Vec<_>, _>>()?;
    let text = match values.as_slice() {
        [v] => ip_of(v)
            .map(|ip| ip.to_string())
            .or_else(|| cidr_of(v).map(|c| c.to_string())),
        _ => None,
    };
    let text = text.ok_or_else(|| no_overload("string", &values))?;
    let boxed: Box<dyn cel::common::value::Val> = Value::from(text).try_into()?;
    Ok(CowVal::from(boxed))
}

fn no_overload(name: &str, args: &[Value]) -> ExecutionError {
    ExecutionError::no_such_overload(name, args.iter().map(|a| a.type_of().to_string()).collect())
}

fn fail(name: &str, message: impl ToString) -> ExecutionError {
    ExecutionError::function_error(name, message)
}

/// CEL's ordering of two comparable values (numbers across int, uint and double).
fn compare(name: &str, a: &Value, b: &Value) -> Result<Ordering, ExecutionError> {
    let num = |v: &Value| match v {
        Value::Int(i) => Some(*i as f64),
        Value::UInt(u) => Some(*u as f64),
        Value::Float(f) => Some(*f),
        _ => None,
    };
    let ord = match (a, b) {
        (Value::Int(x), Value::Int(y)) => Some(x.cmp(y)),
        (Value::UInt(x), Value::UInt(y)) => Some(x.cmp(y)),
        (Value::String(x), Value::String(y)) => Some(x.cmp(y)),
        (Value::Bool(x), Value::Bool(y)) => Some(x.cmp(y)),
        (Value::Bytes(x), Value::Bytes(y)) => Some(x.cmp(y)),
        (Value::Duration(x), Value::Duration(y)) => Some(x.cmp(y)),
        (Value::Timestamp(x), Value::Timestamp(y)) => Some(x.cmp(y)),
        (x, y) => match (num(x), num(y)) {
            (Some(x), Some(y)) => x.partial_cmp(&y),
            _ => None,
        },
    };
    ord.ok_or_else(|| no_overload(name, &[a.clone(), b.clone()]))
}

/// The lists library: `isSorted`, `sum`, `min`, `max`, `indexOf`, `lastIndexOf`.
fn lists(name: &str, args: &[Value]) -> Result<Value, ExecutionError> {
    let (list, rest) = match args {
        [Value::List(l), rest @ ..] => (l, rest),
        _ => return Err(no_overload(name, args)),
    };
    match (name, rest) {
        ("isSorted", []) => {
            for pair in list.windows(2) {
                if compare(name, &pair[0], &pair[1])? == Ordering::Greater {
                    return Ok(Value::Bool(false));
                }
            }
            Ok(Value::Bool(true))
        }
        ("sum", []) => {
            let mut items = list.iter();
            let Some(first) = items.next() else {
                return Ok(Value::Int(0));
            };
            items.try_fold(first.clone(), |acc, v| match (&acc, v) {
                (Value::Int(a), Value::Int(b)) => a
                    .checked_add(*b)
                    .map(Value::Int)
                    .ok_or_else(|| fail(name, "integer overflow")),
                (Value::UInt(a), Value::UInt(b)) => a
                    .checked_add(*b)
                    .map(Value::UInt)
                    .ok_or_else(|| fail(name, "unsigned integer overflow")),
                (Value::Float(a), Value::Float(b)) => Ok(Value::Float(a + b)),
                (Value::Duration(a), Value::Duration(b)) => a
                    .checked_add(b)
                    .map(Value::Duration)
                    .ok_or_else(|| fail(name, "duration overflow")),
                _ => Err(no_overload(name, args)),
            })
        }
        ("min" | "max", []) => {
            let mut items = list.iter();
            let Some(first) = items.next() else {
                return Err(fail(name, format!("{name} called on empty list")));
            };
            let want = if name == "min" {
                Ordering::Less
            } else {
                Ordering::Greater
            };
            items.try_fold(first.clone(), |best, v| {
                Ok(if compare(name, v, &best)? == want {
                    v.clone()
                } else {
                    best
                })
            })
        }
        ("indexOf", [x]) => Ok(Value::Int(list.iter().position(|v| v == x).map_or(-1, |i| i as i64))),
        ("lastIndexOf", [x]) => Ok(Value::Int(list.iter().rposition(|v| v == x).map_or(-1, |i| i as i64))),
        _ => Err(no_overload(name, args)),
    }
}

/// The regex library: `s.find(re)` (the first match, or `""`), `s.findAll(re)` and
/// `s.findAll(re, n)` (at most `n` matches; all when `n` is negative).
fn regex(name: &str, args: &[Value]) -> Result<Value, ExecutionError> {
    let (s, re, limit) = match args {
        [Value::String(s), Value::String(re)] => (s, re, -1),
        [Value::String(s), Value::String(re), Value::Int(n)] if name == "findAll" => (s, re, *n),
        _ => return Err(no_overload(name, args)),
    };
    let re = ::regex::Regex::new(re).map_err(|e| fail(name, e))?;
    if name == "find" {
        return Ok(Value::from(re.find(s).map_or("", |m| m.as_str()).to_owned()));
    }
    let take = usize::try_from(limit).unwrap_or(usize::MAX);
    let found: Vec<Value> = re
        .find_iter(s)
        .take(take)
        .map(|m| Value::from(m.as_str().to_owned()))
        .collect();
    Ok(Value::List(Arc::new(found)))
}

/// A URL as the URLs library sees it: Go's `url.ParseRequestURI` of an absolute URI or an
/// absolute path.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Url {
    scheme: String,
    /// The authority without user info (`host[:port]`, IPv6 hosts in brackets).
    host: String,
    path: String,
    query: String,
}

impl Opaque for Url {
    fn runtime_type_name(&self) -> &str {
        "kubernetes.URL"
    }
}

impl Url {
    /// Parses `s` (an absolute URI or an absolute path); the error is the URLs library's.
    pub(crate) fn parse(s: &str) -> Result<Url, String> {
        let error =
            |why: &dyn std::fmt::Display| format!("URL parse error during conversion from string: parse {s:?}: {why}");
        let scheme = s.split_once(':').map_or("", |(scheme, _)| scheme);
        let has_scheme = scheme.starts_with(|c: char| c.is_ascii_alphabetic())
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
        if !has_scheme && !s.starts_with('/') {
            return Err(error(&"invalid URI for request"));
        }
        let uri: http::Uri = s.parse().map_err(|e| error(&e))?;
        let host = uri
            .authority()
            .map(|a| a.as_str().rsplit_once('@').map_or(a.as_str(), |(_, h)| h).to_owned())
            .unwrap_or_default();
        Ok(Url {
            scheme: uri.scheme_str().unwrap_or("").to_owned(),
            host,
            path: uri.path().to_owned(),
            query: uri.query().unwrap_or("").to_owned(),
        })
    }

    /// The host without its port, and an IPv6 address without brackets (`Hostname()`).
    pub(crate) fn hostname(&self) -> &str {
        if let Some(rest) = self.host.strip_prefix('[') {
            return rest.split_once(']').map_or(rest, |(h, _)| h);
        }
        self.host.rsplit_once(':').map_or(&self.host, |(h, _)| h)
    }

    /// The port, or `""` (`Port()`).
    pub(crate) fn port(&self) -> &str {
        let after_host = match self.host.strip_prefix('[') {
            Some(rest) => rest.split_once(']').map_or("", |(_, p)| p),
            None => self.host.find(':').map_or("", |i| &self.host[i..]),
        };
        after_host.strip_prefix(':').unwrap_or("")
    }

    /// The query as `map(string, list(string))`, keys and values unescaped (`Query()`).
    pub(crate) fn query(&self) -> HashMap<String, Vec<String>> {
        let mut out: HashMap<String, Vec<String>> = HashMap::new();
        for pair in self.query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            out.entry(unescape_query(k)).or_default().push(unescape_query(v));
        }
        out
    }
}

/// Go's `url.QueryUnescape`: `+` is a space, `%XX` a byte; a malformed escape is kept as is.
fn unescape_query(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                match std::str::from_utf8(&bytes[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                {
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

fn url_of(v: &Value) -> Option<&Url> {
    match v {
        Value::Opaque(o) => o.downcast_ref::<Url>(),
        _ => None,
    }
}

/// The URLs library.
fn urls(name: &str, args: &[Value]) -> Result<Value, ExecutionError> {
    match (name, args) {
        ("url", [Value::String(s)]) => Url::parse(s)
            .map(|u| Value::Opaque(Arc::new(u)))
            .map_err(|e| fail(name, e)),
        ("isURL", [Value::String(s)]) => Ok(Value::Bool(Url::parse(s).is_ok())),
        (_, [u]) => {
            let u = url_of(u).ok_or_else(|| no_overload(name, args))?;
            Ok(match name {
                "getScheme" => Value::from(u.scheme.clone()),
                "getHost" => Value::from(u.host.clone()),
                "getHostname" => Value::from(u.hostname().to_owned()),
                "getPort" => Value::from(u.port().to_owned()),
                "getEscapedPath" => Value::from(u.path.clone()),
                "getQuery" => {
                    let map: HashMap<Key, Value> = u
                        .query()
                        .into_iter()
                        .map(|(k, vs)| {
                            let list = vs.into_iter().map(Value::from).collect::<Vec<_>>();
                            (Key::String(Arc::new(k)), Value::List(Arc::new(list)))
                        })
                        .collect();
                    Value::from(map)
                }
                _ => return Err(no_overload(name, args)),
            })
        }
        _ => Err(no_overload(name, args)),
    }
}

#[derive(Debug, PartialEq, Eq)]
struct QuantityVal(Quantity);

impl Opaque for QuantityVal {
    fn runtime_type_name(&self) -> &str {
        "kubernetes.Quantity"
    }
}

fn quantity_of(v: &Value) -> Option<Quantity> {
    match v {
        Value::Opaque(o) => o.downcast_ref::<QuantityVal>().map(|q| q.0),
        _ => None,
    }
}

fn quantity_value(q: Quantity) -> Value {
    Value::Opaque(Arc::new(QuantityVal(q)))
}

/// The quantity library.
fn quantities(name: &str, args: &[Value]) -> Result<Value, ExecutionError> {
    match (name, args) {
        ("quantity", [Value::String(s)]) => Quantity::parse(s)
            .map(quantity_value)
            .ok_or_else(|| fail(name, quantity::FORMAT_WRONG)),
        ("isQuantity", [Value::String(s)]) => Ok(Value::Bool(Quantity::parse(s).is_some())),
        (_, [q]) => {
            let q = quantity_of(q).ok_or_else(|| no_overload(name, args))?;
            match name {
                "sign" => Ok(Value::Int(q.sign())),
                "isInteger" => Ok(Value::Bool(q.as_integer().is_some())),
                "asInteger" => q
                    .as_integer()
                    .map(Value::Int)
                    .ok_or_else(|| fail(name, "cannot convert value to integer")),
                "asApproximateFloat" => Ok(Value::Float(q.as_approximate_float())),
                _ => Err(no_overload(name, args)),
            }
        }
        (_, [a, b]) => {
            let a = quantity_of(a).ok_or_else(|| no_overload(name, args))?;
            let b = match b {
                Value::Int(i) if matches!(name, "add" | "sub") => Quantity::from_int(*i),
                other => quantity_of(other).ok_or_else(|| no_overload(name, args))?,
            };
            match name {
                "add" => a
                    .add(b)
                    .map(quantity_value)
                    .ok_or_else(|| fail(name, "quantity overflow")),
                "sub" => a
                    .sub(b)
                    .map(quantity_value)
                    .ok_or_else(|| fail(name, "quantity overflow")),
                "isLessThan" => Ok(Value::Bool(a.cmp(b) == Ordering::Less)),
                "isGreaterThan" => Ok(Value::Bool(a.cmp(b) == Ordering::Greater)),
                "compareTo" => Ok(Value::Int(match a.cmp(b) {
                    Ordering::Less => -1,
                    Ordering::Equal => 0,
                    Ordering::Greater => 1,
                })),
                _ => Err(no_overload(name, args)),
            }
        }
        _ => Err(no_overload(name, args)),
    }
}

const IP_TYPE: &str = "net.IP";
const CIDR_TYPE: &str = "net.CIDR";

/// An IP address of the IP library (`netip.Addr`).
#[derive(Debug, PartialEq, Eq)]
struct Ip(IpAddr);

impl Opaque for Ip {
    fn runtime_type_name(&self) -> &str {
        IP_TYPE
    }
}

/// A CIDR of the CIDR library (`netip.Prefix`): an address, not necessarily masked, and a prefix
/// length.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub(crate) struct Cidr {
    addr: IpAddr,
    bits: u8,
}

impl Opaque for Cidr {
    fn runtime_type_name(&self) -> &str {
        CIDR_TYPE
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.bits)
    }
}

/// Parses an address as the IP library's `ip()`: no zone, no IPv4-mapped IPv6.
pub(crate) fn parse_ip(s: &str) -> Result<IpAddr, String> {
    let ip: IpAddr = s
        .parse()
        .map_err(|e| format!("IP Address {s:?} parse error during conversion from string: {e}"))?;
    if let IpAddr::V6(v6) = ip
        && v6.to_ipv4_mapped().is_some()
    {
        return Err(format!("IPv4-mapped IPv6 address {s:?} is not allowed"));
    }
    Ok(ip)
}

impl Cidr {
    /// Parses a prefix as the CIDR library's `cidr()`.
    pub(crate) fn parse(s: &str) -> Result<Cidr, String> {
        let bad = |why: &str| format!("network address {s:?} parse error during conversion from string: {why}");
        let (addr, bits) = s.split_once('/').ok_or_else(|| bad("no '/'"))?;
        let addr = parse_ip(addr).map_err(|e| bad(&e))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let bits: u8 = bits
            .parse()
            .ok()
            .filter(|b| *b <= max && !bits.starts_with('+') && (bits == "0" || !bits.starts_with('0')))
            .ok_or_else(|| bad("bad bits after slash"))?;
        Ok(Cidr { addr, bits })
    }

    /// The prefix with the host bits cleared.
    pub(crate) fn masked(self) -> Cidr {
        let addr = match self.addr {
            IpAddr::V4(v4) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.bits)).unwrap_or(0);
                IpAddr::V4((u32::from(v4) & mask).into())
            }
            IpAddr::V6(v6) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(self.bits)).unwrap_or(0);
                IpAddr::V6((u128::from(v6) & mask).into())
            }
        };
        Cidr { addr, bits: self.bits }
    }

    /// Whether `ip` is in the prefix (of the same family).
    pub(crate) fn contains(self, ip: IpAddr) -> bool {
        ip.is_ipv4() == self.addr.is_ipv4()
            && Cidr {
                addr: ip,
                bits: self.bits,
            }
            .masked()
                == self.masked()
    }
}

fn ip_of(v: &Value) -> Option<IpAddr> {
    match v {
        Value::Opaque(o) => o.downcast_ref::<Ip>().map(|ip| ip.0),
        _ => None,
    }
}

fn cidr_of(v: &Value) -> Option<Cidr> {
    match v {
        Value::Opaque(o) => o.downcast_ref::<Cidr>().copied(),
        _ => None,
    }
}

/// Go's `netip.Addr.IsGlobalUnicast`: not unspecified, loopback, multicast, link-local unicast
/// or the IPv4 broadcast address (private ranges count).
fn is_global_unicast(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            !(v4.is_unspecified() || v4.is_loopback() || v4.is_multicast() || v4.is_link_local() || v4.is_broadcast())
        }
        IpAddr::V6(v6) => !(v6.is_unspecified() || v6.is_loopback() || v6.is_multicast() || v6.is_unicast_link_local()),
    }
}

/// The IP and CIDR libraries.
fn ips(name: &str, args: &[Value]) -> Result<Value, ExecutionError> {
    let ip_value = |ip: IpAddr| Value::Opaque(Arc::new(Ip(ip)));
    match (name, args) {
        ("ip", [Value::String(s)]) => parse_ip(s).map(ip_value).map_err(|e| fail(name, e)),
        ("isIP", [Value::String(s)]) => Ok(Value::Bool(parse_ip(s).is_ok())),
        ("cidr", [Value::String(s)]) => Cidr::parse(s)
            .map(|c| Value::Opaque(Arc::new(c)))
            .map_err(|e| fail(name, e)),
        ("isCIDR", [Value::String(s)]) => Ok(Value::Bool(Cidr::parse(s).is_ok())),
        ("containsIP", [c, other]) => {
            let c = cidr_of(c).ok_or_else(|| no_overload(name, args))?;
            let ip = match other {
                Value::String(s) => parse_ip(s).map_err(|e| fail(name, e))?,
                v => ip_of(v).ok_or_else(|| no_overload(name, args))?,
            };
            Ok(Value::Bool(c.contains(ip)))
        }
        ("containsCIDR", [c, other]) => {
            let c = cidr_of(c).ok_or_else(|| no_overload(name, args))?;
            let other = match other {
                Value::String(s) => Cidr::parse(s).map_err(|e| fail(name, e))?,
                v => cidr_of(v).ok_or_else(|| no_overload(name, args))?,
            };
            Ok(Value::Bool(c.contains(other.addr) && c.bits <= other.bits))
        }
        (_, [v]) => {
            if let Some(c) = cidr_of(v) {
                return match name {
                    "ip" => Ok(ip_value(c.addr)),
                    "prefixLength" => Ok(Value::Int(i64::from(c.bits))),
                    "masked" => Ok(Value::Opaque(Arc::new(c.masked()))),
                    _ => Err(no_overload(name, args)),
                };
            }
            let ip = ip_of(v).ok_or_else(|| no_overload(name, args))?;
            let link_local_multicast = match ip {
                IpAddr::V4(v4) => v4.octets()[..3] == [224, 0, 0],
                IpAddr::V6(v6) => v6.segments()[0] & 0xff0f == 0xff02,
            };
            Ok(match name {
                "family" => Value::Int(if ip.is_ipv4() { 4 } else { 6 }),
                "isUnspecified" => Value::Bool(ip.is_unspecified()),
                "isLoopback" => Value::Bool(ip.is_loopback()),
                "isLinkLocalMulticast" => Value::Bool(link_local_multicast),
                "isLinkLocalUnicast" => Value::Bool(match ip {
                    IpAddr::V4(v4) => v4.is_link_local(),
                    IpAddr::V6(v6) => v6.is_unicast_link_local(),
                }),
                "isGlobalUnicast" => Value::Bool(is_global_unicast(ip)),
                _ => return Err(no_overload(name, args)),
            })
        }
        _ => Err(no_overload(name, args)),
    }
}
