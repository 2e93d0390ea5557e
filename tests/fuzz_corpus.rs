//! Replays the fuzzers' corpora (`fuzz/corpus/<target>/`) through the same functions the
//! fuzz targets drive (the ONNX front end; the profile, cluster, strategy and plan
//! readers), so every input a fuzzer ever kept stays a regression test.

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

/// Every file of `fuzz/corpus/<target>/`, sorted.
fn corpus(target: &str) -> Vec<Vec<u8>> {
    let dir = common::root().join("fuzz/corpus").join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .collect();
    files.sort();
    files
        .iter()
        .map(|p| std::fs::read(p).expect("readable corpus file"))
        .collect()
}

#[test]
fn profile_cluster_strategy_and_plan_corpora_replay_without_panic() {
    for bytes in corpus("profile") {
        ralpc::passes::fuzzing::profile(&bytes);
    }
    for bytes in corpus("cluster") {
        ralpc::passes::fuzzing::cluster(&bytes);
    }
    for bytes in corpus("strategy") {
        ralpc::passes::fuzzing::strategy(&bytes);
    }
    let mut valid = 0;
    for bytes in corpus("plan") {
        if let Some(plan) = ralpc::codegen::fuzzing::plan(&bytes) {
            let _ = ralpc::codegen::simulate(&plan);
            valid += 1;
        }
    }
    assert!(valid >= 2, "the seed plans validate");
}
