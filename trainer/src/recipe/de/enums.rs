//! `EnumAccess` for the two ways recipes write enums: a bare scalar (`dtype: bf16`) and a
//! mapping tagged by `kind` (`method: {kind: lora, r: 16}`).

use serde::de::{self, DeserializeSeed, Deserializer, Visitor};

use super::{De, DeError, PathStack, TAG_KEY};
use crate::recipe::yaml::{Entry, NodeKind};

/// A unit enum written as a scalar, e.g. `dtype: bf16`.
pub(super) struct UnitEnum<'a, 'b> {
    pub(super) de: &'b De<'a>,
}

impl<'de> de::EnumAccess<'de> for UnitEnum<'_, '_> {
    type Error = DeError;
    type Variant = Self;

    fn variant_seed<V: DeserializeSeed<'de>>(self, seed: V) -> Result<(V::Value, Self), DeError> {
        let de = De { node: self.de.node, loc: self.de.loc, path: self.de.path, skip_tag: false };
        Ok((seed.deserialize(de)?, self))
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
}

impl<'de> de::EnumAccess<'de> for TaggedEnum<'_, '_> {
    type Error = DeError;
    type Variant = Self;

    fn variant_seed<V: DeserializeSeed<'de>>(self, seed: V) -> Result<(V::Value, Self), DeError> {
        let path = PathStack::Key(self.de.path, TAG_KEY);
        let de = De { node: &self.tag.value, loc: self.tag.key_loc, path: &path, skip_tag: false };
        let value = match de.node.kind {
            NodeKind::Scalar { .. } => seed.deserialize(de)?,
            _ => return Err(de.expected("a method name").located(de.loc, &path)),
        };
        Ok((value, self))
    }
}

impl<'de> de::VariantAccess<'de> for TaggedEnum<'_, '_> {
    type Error = DeError;

    fn unit_variant(self) -> Result<(), DeError> {
        let kind = match &self.tag.value.kind {
            NodeKind::Scalar { text, .. } => text.as_str(),
            _ => "",
        };
        match self.de.entries().and_then(|e| e.iter().find(|e| e.key != TAG_KEY)) {
            Some(extra) => {
                let path = PathStack::Key(self.de.path, &extra.key);
                let message = format!("unknown field `{}`; `kind: {kind}` takes no other fields", extra.key);
                Err(DeError { message, missing: None, at: None }.located(extra.key_loc, &path))
            }
            None => Ok(()),
        }
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, DeError> {
        seed.deserialize(De { node: self.de.node, loc: self.de.loc, path: self.de.path, skip_tag: true })
    }

    fn tuple_variant<V: Visitor<'de>>(self, _len: usize, _visitor: V) -> Result<V::Value, DeError> {
        Err(self.de.expected("a list"))
    }

    fn struct_variant<V: Visitor<'de>>(self, fields: &'static [&'static str], visitor: V) -> Result<V::Value, DeError> {
        let de = De { node: self.de.node, loc: self.de.loc, path: self.de.path, skip_tag: true };
        de.deserialize_struct("", fields, visitor)
    }
}
