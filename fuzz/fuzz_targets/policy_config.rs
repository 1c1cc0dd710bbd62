#![no_main]
//! The TOML policy parser and its validation (`Config::parse`).

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = corral_policy::Config::parse(text, None);
    }
});
