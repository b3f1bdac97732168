//! Config parsing: any text is either a valid config or a list of problems; never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use quipu_core::config::Config;
use quipu_core::money::Rate;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    match Config::parse(&text, "fuzz") {
        Ok(c) => {
            assert!(!c.models.is_empty());
            for m in &c.models {
                for r in [m.prices.input, m.prices.cached, m.prices.output] {
                    let again =
                        Rate::parse(&r.per_million().to_decimal()).expect("a rate prints back");
                    assert_eq!(again, r);
                }
            }
        }
        Err(e) => assert!(!e.0.is_empty()),
    }
});
