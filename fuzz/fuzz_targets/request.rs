//! Fuzz target: `envtest::fuzzing::request` (see its doc for the parsers and properties).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| envtest::fuzzing::request(data));
