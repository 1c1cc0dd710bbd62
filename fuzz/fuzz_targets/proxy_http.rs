#![no_main]
//! The proxy's HTTP request head: framing, parsing, interpretation and the forwarded head.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = corral_proxy::fuzzing::http_request(data);
});
