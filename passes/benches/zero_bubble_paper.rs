//! Prints the zero-bubble paper's bubble rates (Qi et al., arXiv:2401.10241v1, Tables 5 and
//! 8) beside those of ralpc's 1F1B, ZB-H1 and ZB-V orders played with the paper's profiled
//! pass times (Table 9), and each schedule's bubble against 1F1B's.
//!
//! `cargo bench -p ralpc-passes --bench zero_bubble_paper`

#[path = "common/zero_bubble_rows.rs"]
mod zero_bubble_rows;

fn main() {
    let rows = zero_bubble_rows::compared();
    println!(
        "{:>16} {:>6} {:>9} {:>9} {:>12} {:>12}",
        "setting", "", "published", "ralpc", "/1f1b paper", "/1f1b ralpc"
    );
    let mut base = (1.0, 1.0);
    for r in &rows {
        if r.schedule == "1f1b" {
            base = (r.published, r.ours);
        }
        println!(
            "{:>16} {:>6} {:>9.4} {:>9.4} {:>12.2} {:>12.2}{}",
            r.setting,
            r.schedule,
            r.published,
            r.ours,
            r.published / base.0,
            r.ours / base.1,
            if r.own_times {
                ""
            } else {
                "  (the model's Table 5 times)"
            }
        );
    }
}
