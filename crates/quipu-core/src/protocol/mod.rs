//! Serde wire types, by protocol. No I/O, no translation logic.
//!
//! - [`upstream`]: OpenAI chat completions as vLLM / SGLang / llama.cpp serve it.
//! - [`anthropic`]: the Anthropic messages format, request direction.
//! - [`anthropic_out`]: the Anthropic messages format, response direction (stream events).
//! - [`responses`]: the OpenAI Responses API, request direction.
//!
//! Request-side types of the client formats are declared with `raw_object!` (below): structs of
//! optional borrowed fields, read from a JSON object and nothing else.

use serde::de::{self, Deserialize, Deserializer};
use std::borrow::Cow;
use std::fmt;

/// An object key, borrowed unless it had escapes.
pub(crate) struct Key<'de>(pub(crate) Cow<'de, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> de::Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object key")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Key(Cow::Owned(v.to_owned())))
            }
        }
        d.deserialize_str(KeyVisitor)
    }
}

/// Declares a struct of optional fields (mostly `&RawValue`) read from a JSON object — and only an
/// object: serde's derived impls also accept an array of the fields in order, which would let
/// `["text", "hi"]` pass as a block. One pass; unknown keys skipped; a repeated key is an
/// error; `null` reads as `None`.
macro_rules! raw_object {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $( $(#[$fmeta:meta])* $field:ident: $ty:ty = $key:literal, )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Default)]
        pub struct $name<'a> {
            $( $(#[$fmeta])* pub $field: Option<$ty>, )*
        }

        impl<'de: 'a, 'a> serde::Deserialize<'de> for $name<'a> {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct ObjectVisitor<'a>(std::marker::PhantomData<&'a ()>);
                impl<'de: 'a, 'a> serde::de::Visitor<'de> for ObjectVisitor<'a> {
                    type Value = $name<'a>;
                    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                        f.write_str("a JSON object")
                    }
                    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                        let mut out = $name::default();
                        while let Some($crate::protocol::Key(key)) = map.next_key::<$crate::protocol::Key<'de>>()? {
                            match key.as_ref() {
                                $(
                                    $key => {
                                        if out.$field.is_some() {
                                            return Err(serde::de::Error::duplicate_field($key));
                                        }
                                        out.$field = map.next_value::<Option<$ty>>()?;
                                    }
                                )*
                                _ => {
                                    map.next_value::<serde::de::IgnoredAny>()?;
                                }
                            }
                        }
                        Ok(out)
                    }
                }
                d.deserialize_map(ObjectVisitor(std::marker::PhantomData))
            }
        }
    };
}

pub mod anthropic;
pub mod anthropic_out;
pub mod responses;
pub mod upstream;
