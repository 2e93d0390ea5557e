//! `cargo +nightly fuzz run import`: the ONNX importer and the whole front end on
//! arbitrary bytes. Seed corpus: `fuzz/corpus/import/` (replayed by `tests/fuzz_corpus.rs`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ralpc_ir::fuzzing::front_end(data);
});
