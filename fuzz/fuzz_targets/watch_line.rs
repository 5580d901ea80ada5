//! Fuzz target: `informer_core::fuzzing::watch_line` (see its doc for the properties checked).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| informer_core::fuzzing::watch_line(data));
