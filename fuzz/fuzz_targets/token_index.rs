#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| stoker::fuzzing::token_index(data));
