//! The chat-format stream translator: the body is `quipu_fuzz::formats::stream`.
#![no_main]
use quipu_core::error::ClientFormat::Chat;
libfuzzer_sys::fuzz_target!(|data: &[u8]| quipu_fuzz::formats::stream(Chat, data));
