//! `ralpc inspect MODEL [--batch N] [--input NAME=D0,...] [--json]`.

use std::fmt::Write;
use std::path::PathBuf;

use ralpc::{InspectOptions, Inspection};

pub const EXAMPLES: &str = "\
Examples:
  ralpc inspect fixtures/onnx/vgg16/model.onnx
  ralpc inspect model.onnx --batch 32 --json
  ralpc inspect detector.onnx --input images=1,3,800,1333";

/// Arguments of `ralpc inspect`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The ONNX model (weights stored as external data need not be present).
    pub model: PathBuf,
    /// Batch size: binds every input's batch axis (a fixed-batch export is re-batched)
    /// [default: the batch of the --input shapes, else the exported batch, else 1].
    #[arg(long, value_parser = super::parse_positive)]
    pub batch: Option<u64>,
    /// Full shape of one input, e.g. `images=1,3,800,1333` (repeatable).
    #[arg(long = "input", value_name = "NAME=D0,D1,...", value_parser = super::parse_input_shape)]
    pub inputs: Vec<(String, Vec<u64>)>,
    /// The value of one input, which becomes a constant of the model (`sr=16000`: what
    /// depends on it folds; repeatable).
    #[arg(long = "value", value_name = "NAME=V0,V1,...", value_parser = super::parse_input_value)]
    pub values: Vec<(String, Vec<f64>)>,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &Args) -> Result<(), ralpc::Error> {
    let options = InspectOptions {
        model: args.model.clone(),
        batch: args.batch,
        inputs: args.inputs.iter().cloned().collect(),
        values: args.values.iter().cloned().collect(),
    };
    let report = ralpc::inspect(&options)?;
    if !args.json {
        for warning in &report.warnings {
            eprintln!("warning: {}", crate::printable::printable(warning));
        }
    }
    let text = if args.json {
        // Serializing plain integers and strings cannot fail.
        serde_json::to_string_pretty(&report).unwrap_or_default() + "\n"
    } else {
        table(&report)
    };
    super::print_stdout(&text);
    Ok(())
}

/// 1234567 → "1.23 M".
pub fn si(v: u64) -> String {
    let v = v as f64;
    for (scale, unit) in [(1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")] {
        if v >= scale {
            return format!("{:.2} {unit}", v / scale);
        }
    }
    format!("{v}")
}

fn bytes(v: u64) -> String {
    let v = v as f64;
    for (scale, unit) in [(1u64 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")] {
        if v >= scale as f64 {
            return format!("{:.1} {unit}", v / scale as f64);
        }
    }
    format!("{v} B")
}

fn table(r: &Inspection) -> String {
    let rows: Vec<[String; 6]> = r
        .layers
        .iter()
        .map(|l| {
            let shape = l
                .output_shape
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join("x");
            [
                crate::printable::printable(&l.name).into_owned(),
                l.op.clone(),
                shape,
                si(l.params),
                si(l.macs),
                bytes(l.activation_bytes),
            ]
        })
        .collect();
    let header = ["layer", "op", "output", "params", "MACs", "activations"];
    let mut width = header.map(str::len);
    for row in &rows {
        for (w, cell) in width.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    width[0] = width[0].min(48);
    let mut out = String::new();
    let line = |out: &mut String, cells: [&str; 6]| {
        let name: String = if cells[0].chars().count() > width[0] {
            let tail: String = cells[0]
                .chars()
                .rev()
                .take(width[0] - 1)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            format!("…{tail}")
        } else {
            cells[0].to_owned()
        };
        let _ = writeln!(
            out,
            "{:<w0$}  {:<w1$}  {:<w2$}  {:>w3$}  {:>w4$}  {:>w5$}",
            name,
            cells[1],
            cells[2],
            cells[3],
            cells[4],
            cells[5],
            w0 = width[0],
            w1 = width[1],
            w2 = width[2],
            w3 = width[3],
            w4 = width[4],
            w5 = width[5]
        );
    };
    let inputs: Vec<String> = r
        .inputs
        .iter()
        .map(|(n, s)| {
            format!(
                "{n} {}",
                s.iter().map(u64::to_string).collect::<Vec<_>>().join("x")
            )
        })
        .collect();
    let producer = match r.producer.as_str() {
        "" => String::new(),
        p => format!(", {p}"),
    };
    let _ = writeln!(
        out,
        "model: {}  (opset {}, IR {}{producer})",
        r.model, r.opset, r.ir_version
    );
    let _ = writeln!(out, "inputs: {}\n", inputs.join(", "));
    line(&mut out, header);
    for row in &rows {
        line(
            &mut out,
            [&row[0], &row[1], &row[2], &row[3], &row[4], &row[5]],
        );
    }
    let _ = writeln!(
        out,
        "\n{} layers, {} parameters ({}), {} MACs, {} other FLOPs, {} of activations",
        r.layers.len(),
        si(r.params),
        bytes(r.weight_bytes),
        si(r.macs),
        si(r.flops),
        bytes(r.activation_bytes)
    );
    out
}
