//! The zero-bubble paper's settings (Qi et al., arXiv:2401.10241v1, Tables 5, 8 and 9;
//! `fixtures/anchors/zero-bubble/`) played in ralpc's 1F1B, ZB-H1 and ZB-V orders with the
//! paper's profiled pass times: shared by the test that holds them to the published bubble
//! rates and the bench that prints them.

use ralpc_passes::plan::{even_pipeline_bubble, Schedule};
use serde_json::Value;

const RATES: &str = include_str!("../../../fixtures/anchors/zero-bubble/bubble-rates.json");

/// One published bubble rate beside ralpc's.
#[derive(Debug)]
pub struct Compared {
    /// Model, pipeline stages and microbatches.
    pub setting: String,
    pub schedule: &'static str,
    pub published: f64,
    pub ours: f64,
    /// Whether the paper published the pass times of this very setting (Table 5; Table 8's
    /// ZB-V settings are played with the same model's Table 5 times).
    pub own_times: bool,
}

/// Every published 1F1B, ZB-H1 and ZB-V rate beside ralpc's.
pub fn compared() -> Vec<Compared> {
    let doc: Value = serde_json::from_str(RATES).expect("the fixture parses");
    let table5 = doc["table5"].as_array().expect("table5");
    let mut out = Vec::new();
    let times = |row: &Value| {
        ["t_f", "t_b", "t_w", "t_comm"].map(|k| row[k].as_f64().expect("a profiled time"))
    };
    let mut play =
        |row: &Value, [f, b, w, c]: [f64; 4], own_times: bool, names: &[&'static str]| {
            let (p, m) = (
                row["stages"].as_u64().unwrap(),
                row["microbatches"].as_u64().unwrap(),
            );
            let setting = format!("{} p{p} m{m}", row["model"].as_str().unwrap());
            for &name in names {
                let schedule = Schedule::parse(name).expect("a schedule");
                out.push(Compared {
                    setting: setting.clone(),
                    schedule: name,
                    published: row["bubble_rate"][name].as_f64().unwrap(),
                    ours: even_pipeline_bubble(schedule, p as usize, m as u32, f, b, w, c),
                    own_times,
                });
            }
        };
    for row in table5 {
        play(row, times(row), true, &["1f1b", "zb-h1"]);
    }
    for row in doc["table8"].as_array().expect("table8") {
        let same_model = table5
            .iter()
            .find(|r| r["model"] == row["model"])
            .expect("a profiled row of the model");
        play(row, times(same_model), false, &["1f1b", "zb-h1", "zb-v"]);
    }
    out
}
