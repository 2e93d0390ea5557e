//! `--emit torch`: a standalone Python file that applies the plan to the user's own model
//! class with PyTorch's distributed APIs and trains it under `torchrun`. It holds the plan
//! and the same mapping `ralpc.torch` runs (its source, included), so it needs torch only,
//! and can be read and edited.

use std::fmt::Write;

use ralpc_passes::layers::LayerKind;
use ralpc_passes::plan::{FileSplit, Schedule, StrategyFile};

use crate::plan::PlanReport;

/// `ralpc.torch`'s source: the mapping from a plan to PyTorch's APIs.
const TORCH_MAPPING: &str = include_str!("../../python/ralpc/torch.py");

/// A Python file that trains `report`'s model with its plan (`strategy`) on PyTorch.
pub fn torch_script(report: &PlanReport, strategy: &StrategyFile) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\"\"\"Trains a model with the plan ralpc {} made for {} ({} plan, {} GPUs, batch {}).\n",
        env!("CARGO_PKG_VERSION"),
        report.model,
        report.strategy,
        report.gpus_used,
        report.batch
    );
    out.push_str(
        "Run it under torchrun with as many processes as the plan's mesh has ranks:\n\n    \
         torchrun --nproc-per-node N train_torch.py --model mymodels:Gpt \\\n        \
         --batches mymodels:batch --loss mymodels:loss --steps 100\n\n\
         --model names the nn.Module class (or a function) the ONNX file was exported from;\n\
         --batches a function of the step returning (inputs, target) of the *global* batch\n\
         (every rank calls it; each takes its data-parallel share); --loss a function\n\
         (output, target) -> mean loss. Every rank builds the model from the same seed.\n\n\
         PLAN below is ralpc's placement (edit it to change the plan); the functions after it\n\
         are ralpc.torch's mapping onto PyTorch's APIs: layout(PLAN) says what is applied\n\
         to which module.\n\"\"\"\n\nfrom __future__ import annotations\n\n",
    );
    out.push_str("# Per layer: the module it came from, what it is, its split (sample×attribute×parameter).\n");
    for layer in &strategy.layers {
        let split = layer.split.unwrap_or(ralpc_passes::plan::FileSplit {
            sample: layer.gpus.unwrap_or(1),
            context: 1,
            attribute: 1,
            parameter: 1,
        });
        let _ = writeln!(
            out,
            "#   {:<36} {:<12} {}×{}×{}",
            layer.module.as_deref().unwrap_or(&layer.name),
            layer.kind.map_or("", |k| k.name()),
            split.sample,
            split.attribute,
            split.parameter
        );
    }
    let mut plan = serde_json::json!({
        "strategy": report.strategy,
        "gpus_used": report.gpus_used,
        "batch": report.batch,
        "placement": strategy,
    });
    if let Some(p) = &report.parallelism {
        plan["sequence_parallel"] = p.sequence_parallel.into();
    }
    // The families compared, from which a refusal names the nearest plan the model has.
    plan["candidates"] = report
        .candidates
        .iter()
        .map(|c| serde_json::json!({ "strategy": c.strategy }))
        .collect();
    let json = serde_json::to_string_pretty(&plan).unwrap_or_default();
    // JSON literals that Python spells differently.
    let python = json
        .replace(": true", ": True")
        .replace(": false", ": False")
        .replace(": null", ": None");
    let _ = writeln!(out, "PLAN = {python}\n");
    out.push_str("# ---- ralpc.torch: the plan onto PyTorch's APIs ----\n");
    out.push_str(&TORCH_MAPPING.replace("from __future__ import annotations\n", ""));
    out.push_str(TORCH_MAIN);
    out
}

const TORCH_MAIN: &str = r#"

# ---- training under torchrun ----
def _load(spec: str):
    import importlib
    import os
    import sys

    sys.path.insert(0, os.getcwd())
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="module:Class building the nn.Module")
    parser.add_argument("--batches", required=True, help="module:function, step -> (inputs, target)")
    parser.add_argument("--loss", required=True, help="module:function (output, target) -> loss")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--lr", type=float, default=0.1, help="SGD's learning rate")
    args = parser.parse_args()
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    if torch.cuda.is_available():
        torch.cuda.set_device(dist.get_rank() % torch.cuda.device_count())
    batches, loss_fn = _load(args.batches), _load(args.loss)
    torch.manual_seed(0)
    model = _load(args.model)()
    lay = layout(PLAN)
    inputs, _ = batches(0)
    example = _microbatches(_shard(inputs, 0, lay.dp), lay.microbatches)[0]
    parallel = parallelize(model, PLAN, loss_fn=loss_fn, example_inputs=example)
    for note in parallel.notes:
        if dist.get_rank() == 0:
            print(f"note: {note}", flush=True)
    opt = torch.optim.SGD(parallel.parameters(), lr=args.lr)
    for step in range(args.steps):
        x, y = batches(step)
        loss = parallel.step(x, y)
        opt.step()
        opt.zero_grad()
        if dist.get_rank() == 0:
            print(f"step {step} loss {loss:.6f}", flush=True)
    # Every rank done communicating before any tears its process group down: gloo aborts a
    # process whose peer closes a connection under a pending operation.
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
"#;

/// The nearest plan `ralpc.torch` names with a refusal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Nearest {
    /// Data parallelism (`--strategy dp`).
    DataParallel,
    /// Every layer split alike: Megatron-LM's layout for a transformer, else data
    /// parallelism.
    Aligned,
    /// The synchronous schedule (`--schedule 1f1b`).
    OneFOneB,
}

/// Why `ralpc.torch` will refuse `strategy` for its structure, and the plan it names
/// instead, or `None`. These are the rules of its `layout` that read the placement alone:
/// PipeDream's schedule, stages of unequal GPU counts, per-layer GPU counts, samples split
/// unlike the tensor-parallel layers', convolution splits, a split dense layer without a
/// module or split both ways. The rules that read the modules and the dataflow (fused
/// projections, heads, stage boundaries inside a module, mixed readers) are its alone
/// (`python/tests/check_torch.py` checks that both agree on the plans it tries).
pub fn torch_refusal(strategy: &StrategyFile) -> Option<(String, Nearest)> {
    if strategy.schedule == Schedule::Async {
        return Some((
            "PipeDream's asynchronous schedule has no PyTorch schedule".into(),
            Nearest::OneFOneB,
        ));
    }
    let Some(replicas) = strategy.stages.first().map(|s| s.replicas) else {
        return Some(("the plan has no stages".into(), Nearest::DataParallel));
    };
    // PyTorch's zero-bubble schedule runs microbatches in rounds of the pipeline's depth
    // (`ScheduleInterleavedZeroBubble`: M a multiple of M // P rounds).
    let (m, p) = (strategy.microbatches, strategy.stages.len() as u32);
    if strategy.schedule == Schedule::ZeroBubble && m % (m / p).max(1) != 0 {
        return Some((
            format!(
                "PyTorch's zero-bubble schedule runs {m} microbatches in rounds of its {p} \
                 stages, which they do not fill"
            ),
            Nearest::OneFOneB,
        ));
    }
    if strategy.stages.iter().any(|s| s.replicas != replicas) {
        return Some((
            "its stages run on different GPU counts; a PyTorch device mesh gives every stage \
             the same"
                .into(),
            Nearest::Aligned,
        ));
    }
    let split = |l: &ralpc_passes::plan::StrategyFileLayer| {
        l.split.unwrap_or(FileSplit {
            sample: l.gpus.unwrap_or(1),
            context: 1,
            attribute: 1,
            parameter: 1,
        })
    };
    let tensor = strategy
        .layers
        .iter()
        .map(|l| split(l).attribute * split(l).parameter)
        .max()
        .unwrap_or(1);
    // Per module: split by input features (rows) or output features.
    let mut styles: std::collections::BTreeMap<&str, bool> = std::collections::BTreeMap::new();
    for layer in &strategy.layers {
        let s = split(layer);
        let label = layer.module.as_deref().unwrap_or(&layer.name);
        if s.context > 1 {
            return Some((
                format!(
                    "layer '{label}' cuts each sequence into {} pieces (context parallelism), \
                     which ralpc.torch does not map onto PyTorch's context_parallel yet",
                    s.context
                ),
                Nearest::DataParallel,
            ));
        }
        let degree = s.sample * s.attribute * s.parameter;
        if degree != replicas {
            return Some((
                format!(
                    "layer '{label}' runs on {degree} of its stage's {replicas} GPUs (burst \
                     parallelism): PyTorch runs every module on the whole mesh"
                ),
                Nearest::DataParallel,
            ));
        }
        if s.sample * tensor != replicas {
            return Some((
                format!(
                    "layer '{label}' splits samples {} ways where the plan's tensor-parallel \
                     layers split them {} ways",
                    s.sample,
                    replicas / tensor.max(1)
                ),
                Nearest::Aligned,
            ));
        }
        if s.attribute * s.parameter == 1 {
            continue;
        }
        match layer.kind.unwrap_or(LayerKind::Elementwise) {
            kind @ (LayerKind::Conv | LayerKind::Pool | LayerKind::Norm) => {
                return Some((
                    format!(
                        "layer '{label}' ({}) is split by rows or channels: PyTorch's tensor \
                         parallelism has no convolution or pooling styles",
                        kind.name()
                    ),
                    Nearest::DataParallel,
                ));
            }
            LayerKind::Dense => {
                let Some(module) = layer.module.as_deref() else {
                    return Some((
                        format!(
                            "layer '{}' names no PyTorch module (export with torch.onnx.export \
                             so that nodes record their modules)",
                            layer.name
                        ),
                        Nearest::DataParallel,
                    ));
                };
                let by_columns = s.parameter > 1;
                if *styles.entry(module).or_insert(by_columns) != by_columns {
                    return Some((
                        format!("module '{module}' holds products split both by rows and columns"),
                        Nearest::DataParallel,
                    ));
                }
            }
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pipeline(schedule: &str, stages: usize, microbatches: u32) -> StrategyFile {
        let stages: Vec<String> = (0..stages)
            .map(|k| format!(r#"{{ "first_layer": "l{k}", "last_layer": "l{k}", "replicas": 1 }}"#))
            .collect();
        serde_json::from_str(&format!(
            r#"{{ "format": "ralpc-strategy/1", "schedule": "{schedule}",
                  "microbatches": {microbatches}, "stages": [{}] }}"#,
            stages.join(",")
        ))
        .expect("a strategy file")
    }

    #[test]
    fn zero_bubble_plans_pytorch_cannot_round_are_refused() {
        // ScheduleInterleavedZeroBubble: M a multiple of max(1, M // P).
        for (p, m, refused) in [
            (2, 4, false),
            (2, 5, true),
            (3, 7, true),
            (3, 9, false),
            (4, 3, false),
        ] {
            let got = torch_refusal(&pipeline("zb-h1", p, m));
            assert_eq!(got.is_some(), refused, "P {p}, M {m}: {got:?}");
            if let Some((_, nearest)) = got {
                assert_eq!(nearest, Nearest::OneFOneB);
            }
        }
        assert!(torch_refusal(&pipeline("1f1b", 2, 5)).is_none());
    }
}
