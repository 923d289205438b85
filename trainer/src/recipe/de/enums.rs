//! `EnumAccess` for the two ways recipes write enums: a bare scalar (`dtype: bf16`) and a
//! mapping tagged by `kind` (`method: {kind: lora, r: 16}`).

use serde::de::{self, DeserializeSeed, Deserializer, IntoDeserializer, Visitor};

use super::{De, DeError, PathStack, TAG_KEY};
use crate::recipe::yaml::{Entry, NodeKind};

/// A unit enum written as a scalar, e.g. `dtype: bf16`.
pub(super) struct UnitEnum<'a, 'b> {
    pub(super) de: &'b De<'a>,
    /// The variant to read: the scalar's text, or a stand-in once an unknown one was noted.
    pub(super) name: &'b str,
}

impl<'de> de::EnumAccess<'de> for UnitEnum<'_, '_> {
    type Error = DeError;
    type Variant = Self;

    fn variant_seed<V: DeserializeSeed<'de>>(self, seed: V) -> Result<(V::Value, Self), DeError> {
        let name: de::value::StrDeserializer<'_, DeError> = self.name.into_deserializer();
        let value = seed.deserialize(name).map_err(|e| e.located(self.de.loc, self.de.path))?;
        Ok((value, self))
    }
}

impl<'de> de::VariantAccess<'de> for UnitEnum<'_, '_> {
    type Error = DeError;

    fn unit_variant(self) -> Result<(), DeError> {
        Ok(())
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, _seed: T) -> Result<T::Value, DeError> {
        Err(self.de.expected("a mapping"))
    }

    fn tuple_variant<V: Visitor<'de>>(self, _len: usize, _visitor: V) -> Result<V::Value, DeError> {
        Err(self.de.expected("a list"))
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        _fields: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value, DeError> {
        Err(self.de.expected("a mapping"))
    }
}

/// A mapping whose `kind` names the variant and whose other keys are the variant's fields.
pub(super) struct TaggedEnum<'a, 'b> {
    pub(super) de: &'b De<'a>,
    pub(super) tag: &'a Entry,
    /// The variants' names: an unknown `kind` ends the pass (no stand-in variant's fields
    /// would say anything true about the others).
    pub(super) variants: &'static [&'static str],
}

impl<'de> de::EnumAccess<'de> for TaggedEnum<'_, '_> {
    type Error = DeError;
    type Variant = Self;

    fn variant_seed<V: DeserializeSeed<'de>>(self, seed: V) -> Result<(V::Value, Self), DeError> {
        let path = PathStack::Key(self.de.path, TAG_KEY);
        let de = De::new(&self.tag.value, self.tag.key_loc, &path, self.de.sink);
        let value = match &de.node.kind {
            NodeKind::Scalar { text, .. } if !self.variants.contains(&text.as_str()) => {
                let e: DeError = de::Error::unknown_variant(text, self.variants);
                return Err(e.located(de.loc, &path));
            }
            NodeKind::Scalar { .. } => seed.deserialize(de)?,
            _ => return Err(de.expected("a method name").located(de.loc, &path)),
        };
        Ok((value, self))
    }
}

impl<'de> de::VariantAccess<'de> for TaggedEnum<'_, '_> {
    type Error = DeError;

    /// Every other key is noted as unknown (and set aside); the variant itself is fine.
    fn unit_variant(self) -> Result<(), DeError> {
        let kind = match &self.tag.value.kind {
            NodeKind::Scalar { text, .. } => text.as_str(),
            _ => "",
        };
        let entries = self.de.mapping().map_or(&[][..], |m| m.entries());
        for extra in entries.iter().filter(|e| e.live() && &*e.key != TAG_KEY) {
            let path = || PathStack::Key(self.de.path, &extra.key).to_path();
            let message = || format!("unknown field `{}`; `kind: {kind}` takes no other fields", extra.key);
            self.de.sink.note_unknown(extra.key_loc, path, message);
            extra.dropped.set(true);
        }
        Ok(())
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, DeError> {
        seed.deserialize(self.de.untagged())
    }

    fn tuple_variant<V: Visitor<'de>>(self, _len: usize, _visitor: V) -> Result<V::Value, DeError> {
        Err(self.de.expected("a list"))
    }

    fn struct_variant<V: Visitor<'de>>(self, fields: &'static [&'static str], visitor: V) -> Result<V::Value, DeError> {
        self.de.untagged().deserialize_struct("", fields, visitor)
    }
}
