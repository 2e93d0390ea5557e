//! Property: no byte-level corruption of a real model makes the front end panic.
//!
//! Each case takes a fixture, applies a few seeded mutations (bit flips, byte overwrites,
//! truncation, insertion, splices of its own bytes) and runs import → bind → verify →
//! account. Every stage may fail; none may panic. `PROPTEST_CASES` raises the count for a
//! longer run (the fuzz target in `fuzz/` covers the importer for hours).

mod common;

use proptest::prelude::*;

fn models() -> Vec<Vec<u8>> {
    [
        "vgg16",
        "light_bvlc_alexnet",
        "light_squeezenet",
        "mobilenet_v2",
        "resnet50",
    ]
    .iter()
    .map(|case| {
        std::fs::read(common::fixture(&format!("onnx/{case}/model.onnx"))).expect("fixture")
    })
    .collect()
}

#[derive(Clone, Debug)]
enum Mutation {
    Flip { at: usize, bit: u8 },
    Set { at: usize, byte: u8 },
    Truncate { at: usize },
    Insert { at: usize, bytes: Vec<u8> },
    Splice { from: usize, to: usize, len: usize },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (any::<usize>(), 0u8..8).prop_map(|(at, bit)| Mutation::Flip { at, bit }),
        3 => (any::<usize>(), any::<u8>()).prop_map(|(at, byte)| Mutation::Set { at, byte }),
        1 => any::<usize>().prop_map(|at| Mutation::Truncate { at }),
        1 => (any::<usize>(), prop::collection::vec(any::<u8>(), 1..16)).prop_map(|(at, bytes)| Mutation::Insert { at, bytes }),
        1 => (any::<usize>(), any::<usize>(), 1usize..64).prop_map(|(from, to, len)| Mutation::Splice { from, to, len }),
    ]
}

fn apply(bytes: &mut Vec<u8>, m: &Mutation) {
    if bytes.is_empty() {
        return;
    }
    let n = bytes.len();
    match m {
        Mutation::Flip { at, bit } => bytes[at % n] ^= 1 << bit,
        Mutation::Set { at, byte } => bytes[at % n] = *byte,
        Mutation::Truncate { at } => bytes.truncate(at % n),
        Mutation::Insert { at, bytes: b } => {
            let at = at % n;
            bytes.splice(at..at, b.iter().copied());
        }
        Mutation::Splice { from, to, len } => {
            let from = from % n;
            let len = (*len).min(n - from);
            let chunk: Vec<u8> = bytes[from..from + len].to_vec();
            let to = to % n;
            let end = (to + len).min(n);
            bytes.splice(to..end, chunk);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(10_000),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn mutated_models_never_panic(which in 0usize..5, mutations in prop::collection::vec(mutation(), 1..6)) {
        thread_local!(static MODELS: Vec<Vec<u8>> = models());
        let mut bytes = MODELS.with(|m| m[which].clone());
        for m in &mutations {
            apply(&mut bytes, m);
        }
        ralpc_ir::fuzzing::front_end(&bytes);
    }
}
