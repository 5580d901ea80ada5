//! Fuzz target: `informer_core::fuzzing::list_page` (see its doc for the properties checked).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| informer_core::fuzzing::list_page(data));
