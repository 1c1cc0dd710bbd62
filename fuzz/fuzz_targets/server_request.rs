#![no_main]
//! A POST /v1/executions body: the JSON request, its file paths and base64 contents.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = corral_server::fuzzing::execution_request(data);
    corral_server::fuzzing::base64_text(data);
});
