#![no_main]
//! The helper's plan decoding: the JSON SandboxPlan the parent sends. A
//! decoded plan re-encodes, and decodes again to the same JSON.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(plan) = serde_json::from_slice::<corral_helper::SandboxPlan>(data) {
        let json = serde_json::to_vec(&plan).expect("a decoded plan encodes");
        let again: corral_helper::SandboxPlan =
            serde_json::from_slice(&json).expect("an encoded plan decodes");
        assert_eq!(
            serde_json::to_vec(&again).expect("a decoded plan encodes"),
            json,
            "plan does not round-trip"
        );
    }
});
