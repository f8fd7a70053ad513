//! `decode_review` never panics on any body; an accepted request's uid survives the round trip
//! through `encode_review`.
#![no_main]

use handoff::admission::{API_VERSION, AdmissionResponse, KIND, decode_review, encode_review};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(req) = decode_review(data) else {
        return;
    };
    assert!(!req.uid.is_empty(), "decode_review accepted an empty uid");
    let out = encode_review(&AdmissionResponse::allow(&req.uid));
    let v: serde_json::Value =
        serde_json::from_slice(&out).expect("encode_review produced invalid JSON");
    assert_eq!(v["apiVersion"], API_VERSION);
    assert_eq!(v["kind"], KIND);
    assert_eq!(
        v["response"]["uid"].as_str(),
        Some(req.uid.as_str()),
        "uid did not survive the round trip"
    );
    assert_eq!(v["response"]["allowed"], true);
});
