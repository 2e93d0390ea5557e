//! The front end as one function of bytes, for fuzzers and byte-mutation tests.
//!
//! Runs import → bind (batch 1 and 3) → verify → account → print on `bytes`; every stage
//! may fail, none may panic. Shared by `fuzz/fuzz_targets/import.rs`, the corpus replay
//! and the mutation property test, so all three exercise exactly the same path.

use std::path::Path;

/// Feeds `bytes` through the whole front end, discarding the results.
pub fn front_end(bytes: &[u8]) {
    let Ok(model) = crate::onnx::import_bytes(bytes, Path::new("fuzzed.onnx"), None) else {
        return;
    };
    let _ = crate::verify(&model.graph);
    for batch in [Some(1), Some(3)] {
        let mut graph = model.graph.clone();
        let bindings = crate::Bindings {
            batch,
            ..Default::default()
        };
        if crate::bind(&mut graph, &bindings).is_err() {
            continue;
        }
        if let Ok(info) = crate::verify(&graph) {
            let _ = crate::account(&graph, &info);
            let _ = crate::text::print(&graph, &info);
        }
    }
}
