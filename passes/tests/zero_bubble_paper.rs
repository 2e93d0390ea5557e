//! The zero-bubble paper's bubble rates against ralpc's played orders
//! (`benches/zero_bubble_rows.rs`).

#[path = "../benches/common/zero_bubble_rows.rs"]
mod rows;

/// With the paper's own pass times (Table 5), ralpc's 1F1B and ZB-H1 orders leave the
/// bubble rates the paper calculates, to half a thousandth. Table 8's settings, played with
/// the same model's times (theirs are unpublished), within 2.5 points, ZB-V below ZB-H1
/// below 1F1B in every one. (PyTorch's ZB-V order, which ralpc runs, waits `(P − 1)·max(f,
/// b)` where the paper's searched ZB-V schedules wait less: 1.7 points more at 28.3 B.)
#[test]
fn played_orders_leave_the_papers_bubbles() {
    let rows = rows::compared();
    for r in &rows {
        println!(
            "{:>16} {:>6}: published {:.4}, ralpc {:.4}",
            r.setting, r.schedule, r.published, r.ours
        );
        let within = if r.own_times { 0.0005 } else { 0.025 };
        assert!((r.ours - r.published).abs() <= within, "{r:?}");
    }
    for chunk in rows
        .chunks(3)
        .filter(|c| c.len() == 3 && c[2].schedule == "zb-v")
    {
        assert!(
            chunk[2].ours < chunk[1].ours && chunk[1].ours < chunk[0].ours,
            "{chunk:?}"
        );
    }
}
