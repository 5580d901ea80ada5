//! [`Quantity`]: a resource quantity (`cpu: 500m`, `memory: 1Gi`, `replicas: 1`) as a custom
//! resource stores it.
//!
//! Where it sits: the types `kinformer::codegen` generates from CRD YAML use it for every field
//! of the resource-quantity shape controller-gen writes (`anyOf: [{type: integer}, {type:
//! string}]`, `x-kubernetes-int-or-string: true` and the quantity `pattern`), so it is what an
//! informer's cache holds and what a write sends back.
//!
//! Why not k8s-openapi's `Quantity`: it reads a JSON number (`cpu: 1`) but writes it back as a
//! string (`"1"`). kube-apiserver keeps a custom resource's JSON as it was sent (it does not
//! canonicalise quantities inside CRDs), so an object read from the cache and written back
//! would change. Nor `IntOrString`: its integer is an `i32`, and a memory size written in bytes
//! (`8589934592`) does not fit, so the object would not decode at all. This type keeps the JSON
//! form, number or string, exactly, and converts to and from k8s-openapi's `Quantity` for
//! arithmetic and for built-in types.
//!
//! ```
//! use kinformer::quantity::Quantity;
//! use kinformer::k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
//!
//! let cpu: Quantity = kinformer::serde_json::from_str("1").unwrap();
//! assert_eq!(kinformer::serde_json::to_string(&cpu).unwrap(), "1"); // still a number
//! assert_eq!(K8sQuantity::from(cpu), K8sQuantity("1".into()));
//! assert_eq!(Quantity::from("500m").to_string(), "500m");
//! ```

use std::fmt;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};

/// A resource quantity as it was written: a JSON number or a string (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Quantity {
    /// Written as a JSON number (`1`, `8589934592`, `0.5`), kept as serde_json read it.
    Number(serde_json::Number),
    /// Written as a string (`"500m"`, `"1Gi"`, `"1"`).
    String(String),
}

impl Quantity {
    /// The quantity as k8s-openapi's `Quantity` (a number becomes its decimal string).
    #[must_use]
    pub fn to_k8s(&self) -> K8sQuantity {
        K8sQuantity(self.to_string())
    }
}

impl fmt::Display for Quantity {
    /// The quantity's text: the string, or the number as JSON writes it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Quantity::Number(n) => fmt::Display::fmt(n, f),
            Quantity::String(s) => f.write_str(s),
        }
    }
}

impl From<Quantity> for K8sQuantity {
    fn from(q: Quantity) -> Self {
        match q {
            Quantity::Number(n) => K8sQuantity(n.to_string()),
            Quantity::String(s) => K8sQuantity(s),
        }
    }
}

impl From<K8sQuantity> for Quantity {
    /// A k8s-openapi `Quantity` is always written as a string.
    fn from(q: K8sQuantity) -> Self {
        Quantity::String(q.0)
    }
}

impl From<&str> for Quantity {
    fn from(s: &str) -> Self {
        Quantity::String(s.to_string())
    }
}

impl From<String> for Quantity {
    fn from(s: String) -> Self {
        Quantity::String(s)
    }
}

impl From<i64> for Quantity {
    fn from(n: i64) -> Self {
        Quantity::Number(n.into())
    }
}

impl From<i32> for Quantity {
    fn from(n: i32) -> Self {
        Quantity::Number(n.into())
    }
}

impl From<u64> for Quantity {
    fn from(n: u64) -> Self {
        Quantity::Number(n.into())
    }
}

impl Serialize for Quantity {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Quantity::Number(n) => n.serialize(serializer),
            Quantity::String(s) => serializer.serialize_str(s),
        }
    }
}

impl<'de> Deserialize<'de> for Quantity {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct QuantityVisitor;

        impl Visitor<'_> for QuantityVisitor {
            type Value = Quantity;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a resource quantity (a number or a string)")
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Quantity, E> {
                Ok(Quantity::Number(v.into()))
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Quantity, E> {
                Ok(Quantity::Number(v.into()))
            }

            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Quantity, E> {
                serde_json::Number::from_f64(v)
                    .map(Quantity::Number)
                    .ok_or_else(|| E::custom(format!("{v} is not a quantity")))
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<Quantity, E> {
                Ok(Quantity::String(v.to_string()))
            }

            fn visit_string<E: de::Error>(self, v: String) -> Result<Quantity, E> {
                Ok(Quantity::String(v))
            }
        }

        deserializer.deserialize_any(QuantityVisitor)
    }
}

impl JsonSchema for Quantity {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Quantity".into()
    }

    /// The schema controller-gen writes for a `resource.Quantity` field.
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$",
            "x-kubernetes-int-or-string": true
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn numbers_and_strings_come_back_as_they_were_written() {
        for written in [
            json!(1),
            json!(8_589_934_592_u64),
            json!(0.5),
            json!("500m"),
            json!("1Gi"),
            json!("1"),
        ] {
            let q: Quantity = serde_json::from_value(written.clone()).unwrap();
            assert_eq!(serde_json::to_value(&q).unwrap(), written);
        }
        let big: Quantity = serde_json::from_value(json!(8_589_934_592_u64)).unwrap();
        assert_eq!(big.to_k8s(), K8sQuantity("8589934592".into()));
        assert!(serde_json::from_value::<Quantity>(json!(true)).is_err());
    }
}
