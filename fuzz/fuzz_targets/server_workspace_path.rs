#![no_main]
//! The server's lexical workspace path check (file tools, input files).

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = corral_server::fuzzing::workspace_path(data);
});
