//! Replays the fuzzer's corpus (`fuzz/corpus/import/`) through the same front end the
//! fuzz target drives, so every input the fuzzer ever kept stays a regression test.

mod common;

#[test]
fn fuzz_corpus_replays_without_panic() {
    let dir = common::root().join("fuzz/corpus/import");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("fuzz corpus")
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .collect();
    files.sort();
    assert!(files.len() >= 20, "corpus has {} files", files.len());
    for path in files {
        let bytes = std::fs::read(&path).expect("readable corpus file");
        ralpc_ir::fuzzing::front_end(&bytes);
    }
}
