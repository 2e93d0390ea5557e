#![no_main]
//! Fuzzes the strategy reader: any bytes may be refused, none may panic.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    ralpc_passes::fuzzing::strategy(data);
});
