#![no_main]
//! Fuzzes the plan reader: any bytes may be refused, none may panic.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some(plan) = ralpc_codegen::fuzzing::plan(data) {
        // A plan that validates must simulate without panicking.
        let _ = ralpc_codegen::simulate(&plan);
    }
});
