//! The sweep as Gavel's throughput file, so that a heterogeneity-aware scheduler plans with
//! ralpc's estimates (Narayanan et al., "Heterogeneity-Aware Cluster Scheduling Policies
//! for Deep Learning Workloads", OSDI'20).
//!
//! Gavel reads `{worker type: {job type: {"null": steps/s, other job type: [steps/s,
//! steps/s], ...}}}` (`scheduler/utils.py`'s `read_all_throughputs_json_v2`,
//! stanford-futuredata/gavel @ c4fa4009): a job type is the text of a Python tuple,
//! `('MODEL (batch size B)', N)`, `N` its scale factor (the GPUs one job takes, each
//! training `B` samples a step); `"null"` is the job running alone, in steps per second
//! summed over its `N` workers (the scheduler hands each worker `1/N` of a job's steps and
//! adds their reports up), so `N` per iteration of the whole job; the other keys are the
//! job sharing its GPUs with another (space sharing, which ralpc does not price: none
//! written). A point with no plan is written as 0 steps/s, as Gavel's own table writes a
//! job that cannot run on a type (ResNet-50 at batch 128 on 2 or more K80s).

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

use super::SweepRow;
use crate::{Error, FileError};

/// Per worker type, per job type, per co-located job type (`null`: alone), throughput.
pub type Throughputs = BTreeMap<String, BTreeMap<String, BTreeMap<String, Value>>>;

/// Gavel's name of a job: `'MODEL (batch size B)'` at scale factor `gpus`, as Python
/// prints the tuple (the name in single quotes, so it holds none).
pub fn job_type(model: &str, batch: u64, gpus: u32) -> String {
    format!(
        "('{} (batch size {batch})', {gpus})",
        model.replace('\'', "")
    )
}

/// `existing` with this sweep's points of `model` at `batch` samples per GPU added
/// (replacing the same job types'): each row's iterations per second times its GPUs as its
/// job type's `null` throughput on its GPU type.
pub fn add(mut existing: Throughputs, model: &str, batch: u64, rows: &[SweepRow]) -> Throughputs {
    for row in rows {
        let steps = match row.error {
            None if row.iteration_time_us > 0.0 => {
                f64::from(row.gpus) * 1e6 / row.iteration_time_us
            }
            _ => 0.0,
        };
        let alone = BTreeMap::from([("null".to_owned(), Value::from(steps))]);
        existing
            .entry(row.gpu_type.to_ascii_lowercase())
            .or_default()
            .insert(job_type(model, batch, row.gpus), alone);
    }
    existing
}

/// The throughputs already in `path`, or none when there is no such file.
///
/// # Errors
/// [`Error::Read`] when the file cannot be read or is not a throughput file.
pub fn read(path: &Path) -> Result<Throughputs, Error> {
    let failed = |error: std::io::Error| {
        Error::Read(Box::new(FileError {
            path: path.display().to_string(),
            error,
        }))
    };
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Throughputs::new()),
        Err(e) => return Err(failed(e)),
    };
    serde_json::from_str(&text).map_err(|e| {
        failed(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("not a Gavel throughput file ({{worker type: {{job type: {{...}}}}}}): {e}"),
        ))
    })
}

/// The file's text: two-space indented JSON, keys sorted, as deterministic as the sweep.
pub fn to_json(throughputs: &Throughputs) -> String {
    serde_json::to_string_pretty(throughputs).unwrap_or_default() + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(gpu_type: &str, gpus: u32, iteration_time_us: f64) -> SweepRow {
        SweepRow {
            gpu_type: gpu_type.into(),
            cluster: String::new(),
            gpus,
            gpus_used: gpus,
            strategy: "dp".into(),
            iteration_time_us,
            samples_per_second: 0.0,
            speedup: 1.0,
            efficiency: 1.0,
            gpu_sec_amplification: 1.0,
            peak_memory_bytes: 0.0,
            batch: 64,
            error: None,
        }
    }

    #[test]
    fn rows_become_job_types_per_worker_type() {
        let mut failed = row("V100", 8, 0.0);
        failed.error = Some("does not fit".into());
        let rows = [row("A100", 1, 500_000.0), row("A100", 8, 100_000.0), failed];
        let t = add(Throughputs::new(), "vgg16", 64, &rows);
        let a100 = &t["a100"];
        assert_eq!(a100["('vgg16 (batch size 64)', 1)"]["null"], 2.0);
        // Eight workers' steps, each a tenth of a second apart.
        assert_eq!(a100["('vgg16 (batch size 64)', 8)"]["null"], 80.0);
        assert_eq!(t["v100"]["('vgg16 (batch size 64)', 8)"]["null"], 0.0);
        // Another model joins the file; the same job again replaces its entry.
        let t = add(t, "it's", 32, &[row("a100", 1, 1e6)]);
        assert_eq!(t["a100"]["('its (batch size 32)', 1)"]["null"], 1.0);
        assert_eq!(t["a100"].len(), 3);
        let t = add(t, "vgg16", 64, &[row("a100", 1, 250_000.0)]);
        assert_eq!(t["a100"]["('vgg16 (batch size 64)', 1)"]["null"], 4.0);
        assert_eq!(t["a100"].len(), 3);
    }
}
