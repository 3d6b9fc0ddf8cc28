#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| stoker::fuzzing::ranges(data));
