#![no_main]
//! The proxy's SOCKS5 greeting and request parsers.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = corral_proxy::fuzzing::socks5(data);
});
