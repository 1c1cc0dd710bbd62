#![no_main]
//! The proxy's CONNECT / absolute-form target parser (host, port, authority), with a display round trip.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = corral_proxy::fuzzing::connect_target(data);
});
