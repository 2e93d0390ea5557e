//! The planner against training steps measured on a real GPU (`fixtures/measured/`): with
//! the op profile `ralpc profile --device cuda:0` took on that GPU, the predicted step of a
//! one-GPU plan is within 10% of the step `ralpc run --backend cuda` measured there.

mod common;

use common::{fixture, ralpc};
use serde_json::Value;

#[test]
fn profile_guided_predictions_match_steps_measured_on_an_h100() {
    let dir = fixture("measured/h100");
    let steps: Value =
        serde_json::from_slice(&std::fs::read(dir.join("steps.json")).expect("steps.json"))
            .expect("JSON");
    let models = steps["models"].as_object().expect("models");
    assert!(!models.is_empty());
    let out = tempfile::tempdir().expect("temp dir");
    for (name, m) in models {
        let batch = m["batch"].as_u64().expect("batch").to_string();
        let profile = dir.join(m["profile"].as_str().expect("profile"));
        let plan = ralpc()
            .arg(fixture(&format!("onnx/{name}/model.onnx")))
            .args([
                "--gpus",
                "1",
                "--batch",
                &batch,
                "--cluster",
                "dgx-h100",
                "--json",
            ])
            .arg("--profile")
            .arg(&profile)
            .arg("-o")
            .arg(out.path().join(name))
            .assert()
            .success();
        let plan: Value = serde_json::from_slice(&plan.get_output().stdout).expect("JSON");
        let predicted = plan["iteration_time_us"].as_f64().expect("a time") * 1e-6;
        let measured = m["ralpc_step_s"].as_f64().expect("a time");
        let error = (predicted - measured) / measured;
        eprintln!("{name}: predicted {predicted:.4} s, measured {measured:.4} s ({error:+.1e})");
        assert!(
            error.abs() <= 0.10,
            "{name}: predicted {predicted} s against {measured} s measured"
        );
    }
}
