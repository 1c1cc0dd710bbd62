#![no_main]
//! The proxy's TLS ClientHello (server name) parser.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = corral_proxy::fuzzing::client_hello(data);
});
