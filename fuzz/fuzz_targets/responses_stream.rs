//! The Responses API stream translator: the body is `quipu_fuzz::formats::stream`.
#![no_main]
use quipu_core::error::ClientFormat::Responses;
libfuzzer_sys::fuzz_target!(|data: &[u8]| quipu_fuzz::formats::stream(Responses, data));
