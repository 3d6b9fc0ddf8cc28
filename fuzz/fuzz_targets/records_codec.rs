#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| stoker::fuzzing::records_codec(data));
