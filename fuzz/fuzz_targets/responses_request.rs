//! Responses API create requests: the body is `quipu_fuzz::formats::request`.
#![no_main]
use quipu_core::error::ClientFormat::Responses;
libfuzzer_sys::fuzz_target!(|data: &[u8]| quipu_fuzz::formats::request(Responses, data));
