//! Decoding that drops `metadata.managedFields` while it decodes, instead of after.
//!
//! `managedFields` is often the largest part of an object (a Pod's two entries are a third of
//! its JSON), its `fieldsV1` is a tree of `serde_json::Value` maps, and controllers rarely read
//! it. Stripping it after decoding (a transform) frees that memory, but only once every map
//! was built. [`SkipManagedFields`] wraps a serde `Deserializer` and passes every value through
//! to the type being decoded, except that a struct named `ObjectMeta` never sees a
//! `managedFields` key: its value is skipped in the input, never allocated. The wrapping is the
//! usual serde adapter shape (wrap the visitor, and through it every nested map, sequence,
//! enum and seed) so that it reaches the `ObjectMeta` of each item of a list.
//!
//! Types whose metadata is decoded from buffered content (`DynamicObject`, through
//! `#[serde(flatten)]`) keep their managedFields here; the factory's strip transform still
//! removes them after decoding.

use std::fmt;

use serde::de::{
    self, DeserializeSeed, Deserializer, EnumAccess, IgnoredAny, MapAccess, SeqAccess, VariantAccess, Visitor,
};

/// The name k8s-openapi (and kube's derived types) give `ObjectMeta` to serde.
const OBJECT_META: &str = "ObjectMeta";

/// The key skipped inside `ObjectMeta`.
const MANAGED_FIELDS: &str = "managedFields";

/// A `Deserializer` that drops `managedFields` from every `ObjectMeta` it decodes.
pub(crate) struct SkipManagedFields<D>(pub(crate) D);

/// Wraps a visitor: what the inner deserializer hands it is wrapped in turn. `in_meta` marks
/// the visitor of an `ObjectMeta` struct, whose map skips `managedFields`.
struct Wrap<V> {
    visitor: V,
    in_meta: bool,
}

/// Wraps a seed so the value it deserializes goes through [`SkipManagedFields`].
struct Seed<S>(S);

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for Seed<S> {
    type Value = S::Value;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        self.0.deserialize(SkipManagedFields(deserializer))
    }
}

macro_rules! forward_deserialize {
    ($($method:ident),* $(,)?) => {
        $(
            fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
                self.0.$method(Wrap { visitor, in_meta: false })
            }
        )*
    };
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for SkipManagedFields<D> {
    type Error = D::Error;

    forward_deserialize!(
        deserialize_any,
        deserialize_bool,
        deserialize_i8,
        deserialize_i16,
        deserialize_i32,
        deserialize_i64,
        deserialize_i128,
        deserialize_u8,
        deserialize_u16,
        deserialize_u32,
        deserialize_u64,
        deserialize_u128,
        deserialize_f32,
        deserialize_f64,
        deserialize_char,
        deserialize_str,
        deserialize_string,
        deserialize_bytes,
        deserialize_byte_buf,
        deserialize_option,
        deserialize_unit,
        deserialize_seq,
        deserialize_map,
        deserialize_identifier,
        deserialize_ignored_any,
    );

    fn deserialize_unit_struct<V: Visitor<'de>>(self, name: &'static str, visitor: V) -> Result<V::Value, D::Error> {
        self.0.deserialize_unit_struct(
            name,
            Wrap {
                visitor,
                in_meta: false,
            },
        )
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(self, name: &'static str, visitor: V) -> Result<V::Value, D::Error> {
        self.0.deserialize_newtype_struct(
            name,
            Wrap {
                visitor,
                in_meta: false,
            },
        )
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, D::Error> {
        self.0.deserialize_tuple(
            len,
            Wrap {
                visitor,
                in_meta: false,
            },
        )
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.0.deserialize_tuple_struct(
            name,
            len,
            Wrap {
                visitor,
                in_meta: false,
            },
        )
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        let in_meta = name == OBJECT_META;
        self.0.deserialize_struct(name, fields, Wrap { visitor, in_meta })
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.0.deserialize_enum(
            name,
            variants,
            Wrap {
                visitor,
                in_meta: false,
            },
        )
    }

    fn is_human_readable(&self) -> bool {
        self.0.is_human_readable()
    }
}

macro_rules! forward_visit {
    ($($method:ident($ty:ty)),* $(,)?) => {
        $(
            fn $method<E: de::Error>(self, v: $ty) -> Result<Self::Value, E> {
                self.visitor.$method(v)
            }
        )*
    };
}

impl<'de, V: Visitor<'de>> Visitor<'de> for Wrap<V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        self.visitor.expecting(f)
    }

    forward_visit!(
        visit_bool(bool),
        visit_i8(i8),
        visit_i16(i16),
        visit_i32(i32),
        visit_i64(i64),
        visit_i128(i128),
        visit_u8(u8),
        visit_u16(u16),
        visit_u32(u32),
        visit_u64(u64),
        visit_u128(u128),
        visit_f32(f32),
        visit_f64(f64),
        visit_char(char),
        visit_str(&str),
        visit_borrowed_str(&'de str),
        visit_string(String),
        visit_bytes(&[u8]),
        visit_borrowed_bytes(&'de [u8]),
        visit_byte_buf(Vec<u8>),
    );

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        self.visitor.visit_none()
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        self.visitor.visit_unit()
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        self.visitor.visit_some(SkipManagedFields(deserializer))
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        self.visitor.visit_newtype_struct(SkipManagedFields(deserializer))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        self.visitor.visit_seq(Seq(seq))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        self.visitor.visit_map(Map {
            map,
            in_meta: self.in_meta,
        })
    }

    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<Self::Value, A::Error> {
        self.visitor.visit_enum(Enum(data))
    }
}

struct Seq<A>(A);

impl<'de, A: SeqAccess<'de>> SeqAccess<'de> for Seq<A> {
    type Error = A::Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>, A::Error> {
        self.0.next_element_seed(Seed(seed))
    }

    fn size_hint(&self) -> Option<usize> {
        self.0.size_hint()
    }
}

struct Map<A> {
    map: A,
    in_meta: bool,
}

/// A map key as read: borrowed from the input when it can be, so skipping costs no allocation.
enum Key<'de> {
    Borrowed(&'de str),
    Owned(String),
}

impl Key<'_> {
    fn as_str(&self) -> &str {
        match self {
            Key::Borrowed(s) => s,
            Key::Owned(s) => s,
        }
    }
}

struct KeyVisitor;

impl<'de> Visitor<'de> for KeyVisitor {
    type Value = Key<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a field name")
    }

    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Key<'de>, E> {
        Ok(Key::Borrowed(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Key<'de>, E> {
        Ok(Key::Owned(v.to_string()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Key<'de>, E> {
        Ok(Key::Owned(v))
    }
}

struct KeySeed;

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = Key<'de>;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Key<'de>, D::Error> {
        deserializer.deserialize_str(KeyVisitor)
    }
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for Map<A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, A::Error> {
        if !self.in_meta {
            return self.map.next_key_seed(Seed(seed));
        }
        loop {
            let Some(key) = self.map.next_key_seed(KeySeed)? else {
                return Ok(None);
            };
            if key.as_str() == MANAGED_FIELDS {
                self.map.next_value::<IgnoredAny>()?;
                continue;
            }
            return match key {
                Key::Borrowed(s) => seed.deserialize(de::value::BorrowedStrDeserializer::new(s)).map(Some),
                Key::Owned(s) => seed.deserialize(de::value::StringDeserializer::new(s)).map(Some),
            };
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, A::Error> {
        self.map.next_value_seed(Seed(seed))
    }

    fn size_hint(&self) -> Option<usize> {
        self.map.size_hint()
    }
}

struct Enum<A>(A);

impl<'de, A: EnumAccess<'de>> EnumAccess<'de> for Enum<A> {
    type Error = A::Error;
    type Variant = Variant<A::Variant>;

    fn variant_seed<V: DeserializeSeed<'de>>(self, seed: V) -> Result<(V::Value, Self::Variant), A::Error> {
        let (value, variant) = self.0.variant_seed(Seed(seed))?;
        Ok((value, Variant(variant)))
    }
}

struct Variant<A>(A);

impl<'de, A: VariantAccess<'de>> VariantAccess<'de> for Variant<A> {
    type Error = A::Error;

    fn unit_variant(self) -> Result<(), A::Error> {
        self.0.unit_variant()
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, A::Error> {
        self.0.newtype_variant_seed(Seed(seed))
    }

    fn tuple_variant<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, A::Error> {
        self.0.tuple_variant(
            len,
            Wrap {
                visitor,
                in_meta: false,
            },
        )
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, A::Error> {
        self.0.struct_variant(
            fields,
            Wrap {
                visitor,
                in_meta: false,
            },
        )
    }
}

/// Decodes `text` as a `T`, dropping `managedFields` from every `ObjectMeta` on the way.
pub(crate) fn from_str<'a, T: de::Deserialize<'a>>(text: &'a str) -> serde_json::Result<T> {
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let value = T::deserialize(SkipManagedFields(&mut deserializer))?;
    deserializer.end()?;
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ConfigMap, Pod};
    use kube::core::ObjectList;

    const POD: &str = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","namespace":"ns",
        "managedFields":[{"manager":"kubelet","operation":"Update","fieldsType":"FieldsV1","fieldsV1":{"f:status":{}}}],
        "labels":{"managedFields":"a label, kept"},"ownerReferences":[{"apiVersion":"apps/v1","kind":"ReplicaSet","name":"rs","uid":"u"}]},
        "spec":{"containers":[{"name":"c","image":"i","env":[{"name":"managedFields","value":"kept"}]}]},
        "status":{"phase":"Running"}}"#;

    #[test]
    fn managed_fields_are_dropped_from_metadata_and_nothing_else() {
        let skipped: Pod = from_str(POD).unwrap();
        let mut stripped: Pod = serde_json::from_str(POD).unwrap();
        assert!(stripped.metadata.managed_fields.is_some());
        stripped.metadata.managed_fields = None;
        assert_eq!(skipped, stripped);
        assert_eq!(skipped.metadata.labels.unwrap()["managedFields"], "a label, kept");
    }

    #[test]
    fn every_item_of_a_list_loses_them_and_errors_stay_errors() {
        let list =
            format!(r#"{{"apiVersion":"v1","kind":"PodList","metadata":{{"continue":"c"}},"items":[{POD},{POD}]}}"#);
        let decoded: ObjectList<Pod> = from_str(&list).unwrap();
        assert_eq!(decoded.items.len(), 2);
        assert!(decoded.items.iter().all(|p| p.metadata.managed_fields.is_none()));
        assert_eq!(decoded.metadata.continue_.as_deref(), Some("c"));
        // An escaped key is read as an owned string and still recognised.
        let escaped = r#"{"metadata":{"name":"x","managed\u0046ields":[{"manager":"m"}]}}"#;
        let cm: ConfigMap = from_str(escaped).unwrap();
        assert_eq!(
            (cm.metadata.name.as_deref(), cm.metadata.managed_fields),
            (Some("x"), None)
        );
        // Malformed input is the same error it would be without the adapter.
        assert!(from_str::<Pod>(r#"{"metadata":{"managedFields":[}"#).is_err());
        assert!(from_str::<Pod>(r#"{"metadata":{"name":1}}"#).is_err());
        assert!(from_str::<Pod>(&format!("{POD} trailing")).is_err());
    }
}
