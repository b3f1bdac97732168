//! Images in a prompt, checked alike by every format that takes them: the model must accept
//! images ([`check_vision`]), and an image URL must be inline base64 data or a URL the
//! operator's policy lets the upstream fetch ([`validate_image_url`]). The messages format
//! reads its `source` objects itself (their own error wording) and calls [`check_vision`].

use crate::config::{Config, Model};
use crate::error::ApiError;
use crate::translate::base64::is_base64;
use crate::translate::common::request::invalid;
use crate::translate::image_url::{check_image_url, ImageUrlRejection};

/// A 400 naming `param` unless `model` accepts images; it lists the models that do.
/// `client_model` is the name the client sent.
pub fn check_vision(
    model: &Model,
    config: &Config,
    client_model: &str,
    param: &dyn Fn() -> String,
) -> Result<(), ApiError> {
    if model.vision {
        return Ok(());
    }
    let with: Vec<String> = config
        .models
        .iter()
        .filter(|m| m.vision)
        .map(|m| format!("`{}`", m.slug))
        .collect();
    Err(invalid(
        param(),
        format!(
            "model `{client_model}` does not accept images; models with vision: {}",
            if with.is_empty() {
                "none".to_owned()
            } else {
                with.join(", ")
            }
        ),
    ))
}

/// Accepts `data:image/<png|jpeg|gif|webp>;base64,<base64>` and, unless the operator rejects
/// URLs, http(s) URLs that [`check_image_url`] lets through (fetched by the upstream, never by
/// the gateway; internal hosts are refused).
pub fn validate_image_url(url: &str, config: &Config, param: &str) -> Result<(), ApiError> {
    if let Some(rest) = url.strip_prefix("data:") {
        let (meta, data) = rest
            .split_once(',')
            .ok_or_else(|| ApiError::invalid(param, "a data URL needs a `,` before its data"))?;
        let media = meta.strip_suffix(";base64").ok_or_else(|| {
            ApiError::invalid(
                param,
                "image data URLs must be base64 (`data:image/png;base64,…`)",
            )
        })?;
        if !matches!(
            media,
            "image/png" | "image/jpeg" | "image/gif" | "image/webp"
        ) {
            return Err(ApiError::invalid(
                param,
                format!("unsupported image type \"{media}\"; use image/png, image/jpeg, image/gif or image/webp"),
            ));
        }
        if !is_base64(data.as_bytes()) {
            return Err(ApiError::invalid(
                param,
                "the image data is not valid base64",
            ));
        }
        return Ok(());
    }
    match check_image_url(url, config.security.image_urls) {
        Ok(()) => Ok(()),
        Err(ImageUrlRejection::NotAccepted) => Err(ApiError::invalid(
            param,
            "images must be sent inline as base64 data URLs",
        )),
        Err(e) => Err(ApiError::invalid(param, e.message())),
    }
}
