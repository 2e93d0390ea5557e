//! A crate that ships the executable plan `build.rs` made for it.

/// The plan (`ralpc-plan/3` JSON) made at build time.
pub const PLAN: &str = include_str!(concat!(env!("OUT_DIR"), "/vgg16.ralpc/plan.json"));

/// The number of ranks the embedded plan runs on.
pub fn ranks() -> Option<u64> {
    serde_json::from_str::<serde_json::Value>(PLAN)
        .ok()?
        .get("ranks")?
        .as_u64()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_plan_made_at_build_time_is_embedded() {
        assert_eq!(super::ranks(), Some(8));
        assert!(super::PLAN.contains("\"format\": \"ralpc-plan/3\""));
    }
}
