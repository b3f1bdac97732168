//! Messages-format create requests: the body is `quipu_fuzz::formats::request`.
#![no_main]
use quipu_core::error::ClientFormat::Messages;
libfuzzer_sys::fuzz_target!(|data: &[u8]| quipu_fuzz::formats::request(Messages, data));
