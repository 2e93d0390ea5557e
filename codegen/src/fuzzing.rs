//! The plan loader as a function of bytes, for fuzzers and their corpus replay: a plan
//! that parses (and so passed validation) is also measured — memory in instruction
//! order, link classes — so the fuzzer reaches the code that trusts a validated plan.

use crate::plan::Plan;

/// Reads `bytes` as a plan; uses it when it validates.
pub fn plan(bytes: &[u8]) -> Option<Plan> {
    let text = std::str::from_utf8(bytes).ok()?;
    let plan = Plan::parse(text).ok()?;
    let _ = plan.memory_by_instruction();
    let _ = plan.peak_memory_bytes();
    let _ = plan.to_json();
    Some(plan)
}
