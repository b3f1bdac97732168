//! The messages-format stream translator: the body is `quipu_fuzz::formats::stream`.
#![no_main]
use quipu_core::error::ClientFormat::Messages;
libfuzzer_sys::fuzz_target!(|data: &[u8]| quipu_fuzz::formats::stream(Messages, data));
