//! Running a plan (`ralpc run PLAN --backend cpu`): every rank a thread of this process, a
//! real training step per iteration, and the single-device run it is held to.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ralpc_codegen::plan::Plan;
use ralpc_ir::input::{read_input, InputKind};
use ralpc_ir::{bind, onnx, verify, Bindings, Graph, GraphInfo};
use ralpc_passes::layers::{self, LayerGraph};
use ralpc_runtime_min::cpu::exec::{
    self, Checkpoint, Compute, ComputeFactory, Control, Executable, Fault, Refusal,
};
use ralpc_runtime_min::cpu::graph::Weights;
use ralpc_runtime_min::cpu::tensor::{Data, Tensor};
use ralpc_runtime_min::cpu::train::{self, Dataset, Loss, TrainOptions, TrainReport};
use ralpc_runtime_min::cuda::error::DeviceError;
use ralpc_runtime_min::dist::comm::World;
use ralpc_runtime_min::dist::Placement;

use crate::error::{Error, FileError};

mod background;
mod sizes;

pub use background::BackgroundRun;

/// What `ralpc run` does.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// The plan (`plan.json`, or the directory `ralpc plan` wrote).
    pub plan: PathBuf,
    /// The model, when not where the plan says it was.
    pub model: Option<PathBuf>,
    /// Training iterations.
    pub steps: u32,
    /// Seeds missing weights, inputs and labels.
    pub seed: u64,
    /// SGD learning rate.
    pub lr: f32,
    /// SGD momentum.
    pub momentum: f32,
    /// The objective; `None`: cross-entropy where the model's output has classes along an
    /// axis of their own, MSE where it is one value per sample (a regression head).
    pub loss: Option<Loss>,
    /// How long a rank waits for another before every rank gives up.
    pub timeout: Duration,
    /// Inputs and labels for the global batch (JSON, see [`read_data`]) instead of
    /// seeded ones.
    pub data: Option<PathBuf>,
    /// Write the training state to `checkpoint` after every this many steps.
    pub checkpoint_every: Option<u32>,
    /// The checkpoint file (`ralpc-checkpoint/4`, safetensors).
    pub checkpoint: Option<PathBuf>,
    /// Continue from this checkpoint file (written by a run of the same plan).
    pub resume: Option<PathBuf>,
    /// A fault to inject (testing what a failing rank does to the others).
    pub fault: Option<Fault>,
    /// Where to run: the CPU, or a GPU.
    pub backend: Backend,
    /// Run only this process's rank, meeting the other processes through the launcher's
    /// rendezvous ([`Placement::from_env`]); `None` runs every rank as a thread.
    pub placement: Option<Placement>,
    /// Whether the report carries the first output, the first-step gradients and the
    /// last weights (host copies of the whole model) besides the losses.
    pub report_tensors: bool,
}

impl Default for RunOptions {
    fn default() -> RunOptions {
        let train = TrainOptions::default();
        RunOptions {
            plan: PathBuf::new(),
            model: None,
            steps: 1,
            seed: train.seed,
            lr: train.lr,
            momentum: train.momentum,
            loss: None,
            timeout: Duration::from_secs(60),
            data: None,
            checkpoint_every: None,
            checkpoint: None,
            resume: None,
            fault: None,
            backend: Backend::Cpu,
            placement: None,
            report_tensors: train.report_tensors,
        }
    }
}

/// Where `ralpc run` trains.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Backend {
    /// Every rank a thread (or a process under a launcher), real numbers on the host.
    #[default]
    Cpu,
    /// NVIDIA GPUs: the NVRTC kernels and cuBLAS, every rank's tensors resident on one.
    Cuda,
}

impl RunOptions {
    /// The training options, with the loss [`Prepared`] settled on.
    fn train(&self, loss: Loss) -> TrainOptions {
        TrainOptions {
            steps: self.steps,
            seed: self.seed,
            lr: self.lr,
            momentum: self.momentum,
            loss,
            report_tensors: self.report_tensors,
        }
    }
}

/// What a run measured.
#[derive(Clone, Debug)]
pub struct RunOutput {
    /// Losses, outputs, gradients and weights.
    pub report: TrainReport,
    /// Ranks that ran.
    pub ranks: u32,
    /// The global batch.
    pub batch: u64,
    /// Wall-clock seconds of all steps.
    pub seconds: f64,
    /// Training samples per second.
    pub samples_per_s: f64,
    /// Weights the model did not carry, initialized from the seed.
    pub seeded_weights: usize,
    /// The plan's background job, each GPU's copy as it ran beside the ranks.
    pub background: Vec<BackgroundRun>,
    /// Why the plan's background job did not run, where it has one that did not.
    pub background_not_run: Option<String>,
}

/// A model ready to train: its graph at the global batch and everything derived from it.
struct Prepared {
    unbound: Graph,
    graph: Graph,
    info: GraphInfo,
    weights: Weights,
    data: Dataset,
    /// The loss asked for, or the one the output takes.
    loss: Loss,
}

/// `--fault RANK:INSTRUCTION` must name an instruction of the plan: one that does not
/// exist would never fire, and the test it was meant for would pass without a fault.
fn check_fault(plan: &Plan, fault: Option<Fault>) -> Result<(), Error> {
    let Some(f) = fault else {
        return Ok(());
    };
    let bad = |m: String| {
        Err(Error::setup(format!(
            "--fault {}:{}: {m}",
            f.rank, f.instruction
        )))
    };
    match plan.programs.get(f.rank as usize) {
        None => bad(format!("the plan has {} rank(s)", plan.programs.len())),
        Some(program) if f.instruction >= program.len() => bad(format!(
            "rank {}'s program has {} instruction(s)",
            f.rank,
            program.len()
        )),
        Some(_) => Ok(()),
    }
}

/// Name → elements of every weight a run of `p` trains (and checkpoints): the trainable
/// weights some node reads.
fn trained_weights(p: &Prepared) -> BTreeMap<String, Vec<usize>> {
    p.weights
        .trainable
        .iter()
        .filter(|&&v| !p.graph.consumers(v).is_empty())
        .filter_map(|&v| {
            let t = p.weights.tensors.get(&v)?;
            Some((p.graph.value(v).name.clone(), t.shape.clone()))
        })
        .collect()
}

/// The state `--resume` names, checked against the weights the run trains (`trained`) and
/// `--steps`.
fn resume_state(
    options: &RunOptions,
    plan: &Plan,
    trained: &BTreeMap<String, Vec<usize>>,
) -> Result<Option<Checkpoint>, Error> {
    let Some(path) = options.resume.as_deref() else {
        return Ok(None);
    };
    let c = crate::checkpoint::read(path, &plan.inputs)?;
    let sizes = trained
        .iter()
        .map(|(name, shape)| (name.clone(), shape.iter().product()))
        .collect();
    crate::checkpoint::check_against(&c, &sizes)
        .map_err(|m| Error::Checkpoint(Box::new(format!("{}: {m}", path.display()))))?;
    if c.step >= options.steps {
        return Err(Error::Checkpoint(Box::new(format!(
            "the checkpoint is after step {}; ask for more --steps than that",
            c.step
        ))));
    }
    Ok(Some(c))
}

/// Writes a run's checkpoints where `--checkpoint` (or beside the plan, for
/// `--checkpoint-every` alone) says. A checkpoint that cannot be written stops the run,
/// which then fails with the write's own error (exit 3, an output), not as a failed run (4).
struct CheckpointWriter<'a> {
    path: Option<PathBuf>,
    inputs: &'a str,
    trained: &'a BTreeMap<String, Vec<usize>>,
    failure: std::sync::Mutex<Option<Error>>,
}

impl<'a> CheckpointWriter<'a> {
    fn new(
        options: &RunOptions,
        plan_file: &Path,
        inputs: &'a str,
        trained: &'a BTreeMap<String, Vec<usize>>,
    ) -> CheckpointWriter<'a> {
        let path = match (&options.checkpoint, options.checkpoint_every) {
            (Some(path), _) => Some(path.clone()),
            (None, Some(_)) => Some(plan_file.with_file_name("checkpoint.safetensors")),
            (None, None) => None,
        };
        CheckpointWriter {
            path,
            inputs,
            trained,
            failure: std::sync::Mutex::default(),
        }
    }

    fn write(&self, c: &Checkpoint) -> Result<(), ralpc_runtime_min::cpu::exec::SinkError> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let state = c.weights.iter().map(|w| ("weight", w));
        let state = state.chain(c.velocity.iter().map(|v| ("momentum", v)));
        for (kind, (name, values)) in state {
            if let Some(x) = values.iter().find(|x| !x.is_finite()) {
                // Not written: the last good checkpoint stays.
                return Err(format!(
                    "after step {}: {kind} '{name}' holds {x}; the training diverged, the \
                     last checkpoint is kept",
                    c.step
                )
                .into());
            }
        }
        crate::checkpoint::write(path, self.inputs, c, self.trained).map_err(|e| {
            // The rank's error carries this one's words; the run reports the first itself.
            let message = chain(&e);
            if let Ok(mut first) = self.failure.lock() {
                first.get_or_insert(e);
            }
            message.into()
        })
    }

    /// The first write that failed.
    fn failure(&self) -> Option<Error> {
        self.failure.lock().ok().and_then(|mut w| w.take())
    }
}

/// The model verified at any batch, as [`Executable::info_at`] asks.
fn verifier<'a>(
    unbound: &'a Graph,
    shapes: &'a BTreeMap<String, Vec<u64>>,
) -> impl Fn(u64) -> Result<GraphInfo, Refusal> + Sync + 'a {
    move |batch| {
        at_batch(unbound, batch, shapes)
            .map(|(_, info)| info)
            .map_err(|e| Refusal(chain(&e)))
    }
}

/// `unbound` bound at the global `batch` (with the input `shapes` a plan was made at, their
/// batch axes set to `batch`) and verified.
pub(crate) fn at_batch(
    unbound: &Graph,
    batch: u64,
    shapes: &BTreeMap<String, Vec<u64>>,
) -> Result<(Graph, GraphInfo), Error> {
    let mut graph = unbound.clone();
    let inputs = ralpc_ir::bind::with_batch(unbound, shapes, batch);
    bind(
        &mut graph,
        &Bindings {
            batch: Some(batch),
            inputs,
        },
    )?;
    let info = verify(&graph)?;
    Ok((graph, info))
}

/// An error and its causes on one line.
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    ralpc_runtime_min::error_chain(e)
}

/// The model imported and bound at the global `batch`, nothing allocated for it yet.
struct Bound {
    unbound: Graph,
    graph: Graph,
    info: GraphInfo,
}

fn bind_model(
    model: &Path,
    batch: u64,
    shapes: &BTreeMap<String, Vec<u64>>,
    values: &BTreeMap<String, Vec<f64>>,
) -> Result<Bound, Error> {
    let mut unbound = onnx::import(model)?.graph;
    ralpc_ir::bind_values(&mut unbound, values)?;
    let (graph, info) = at_batch(&unbound, batch, shapes)?;
    check_value_sizes(&graph, &info, &format!("the plan's batch {batch}"), 0)?;
    Ok(Bound {
        unbound,
        graph,
        info,
    })
}

/// The input shapes and values a plan was made at.
type Given<'a> = (
    &'a BTreeMap<String, Vec<u64>>,
    &'a BTreeMap<String, Vec<f64>>,
);

fn prepare(
    model: &Path,
    batch: u64,
    (shapes, values): Given<'_>,
    options: &RunOptions,
) -> Result<Prepared, Error> {
    load(bind_model(model, batch, shapes, values)?, options)
}

/// The loss to train with: the one asked for, or — `None` — cross-entropy where the
/// model's output has classes along an axis of their own and MSE where it is one value
/// per sample. Cross-entropy asked for on such an output is refused: it would read the
/// batch as classes, and a plan that splits the batch would split the classes.
fn settle_loss(graph: &Graph, info: &GraphInfo, asked: Option<Loss>) -> Result<Loss, Error> {
    let Some(&output) = graph.outputs().first() else {
        return Ok(asked.unwrap_or_default());
    };
    let shape = &info.ty(output).shape;
    let per_sample = shape.rank() < 2;
    match asked {
        None if per_sample => Ok(Loss::Mse),
        None => Ok(Loss::CrossEntropy),
        Some(Loss::CrossEntropy) if per_sample => Err(Error::setup(format!(
            "the loss: cross-entropy needs classes along an axis of their own, but the \
                 model's output '{}' is {:?}, one value per sample: train it with --loss mse",
            graph.value(output).name,
            shape.as_sizes().unwrap_or_default()
        ))),
        Some(loss) => Ok(loss),
    }
}

/// Its weights and data.
fn load(bound: Bound, options: &RunOptions) -> Result<Prepared, Error> {
    let seed = options.seed;
    let Bound {
        unbound,
        graph,
        info,
    } = bound;
    let loss = settle_loss(&graph, &info, options.loss)?;
    let weights = Weights::load(&graph, seed).map_err(run_error)?;
    let data = match &options.data {
        Some(path) => read_data(path, &graph, &info, loss)?,
        None => Dataset::synthetic(&graph, &info, seed, loss),
    };
    Ok(Prepared {
        unbound,
        graph,
        info,
        weights,
        data,
        loss,
    })
}

/// `bytes` in the binary unit that shows it: `4096.00 GiB`, `3.00 KiB`, `100 B`.
pub(crate) fn size(bytes: u64) -> String {
    let units = [(1u64 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    match units.into_iter().find(|&(unit, _)| bytes >= unit) {
        Some((unit, name)) => format!("{:.2} {name}", bytes as f64 / unit as f64),
        None => format!("{bytes} B"),
    }
}

/// Refuses, before anything is allocated, a bound model (at `at`: "the plan's batch 8")
/// whose inputs together (with `beside` more bytes the host holds with them: the weights
/// `ralpc profile` loads), or any one value, cannot fit this machine's memory or overflow
/// when counted: a constant expanded to [2^20, 2^20], a wide `Concat` or `Pad` are sized
/// here from their verified shapes, not found by the allocator (an abort). Exit 1, naming
/// the value and its size.
pub(crate) fn check_value_sizes(
    graph: &Graph,
    info: &GraphInfo,
    at: &str,
    beside: u64,
) -> Result<(), Error> {
    let too_large = |m: String| Err(Error::setup(m));
    let bytes_of = |v: ralpc_ir::ValueId| -> Option<Option<u64>> {
        let ty = info.ty(v);
        // Unknown until run (data-dependent): not counted here.
        let sizes = ty.shape.as_sizes()?;
        Some(
            sizes
                .iter()
                .try_fold(ty.dtype.size_bytes(), |n, &d| n.checked_mul(d)),
        )
    };
    let have = memory_available();
    let mut inputs = 0u64;
    for &n in info.order() {
        for &v in &graph.node(n).outputs {
            let name = &graph.value(v).name;
            let Some(bytes) = bytes_of(v) else { continue };
            let Some(bytes) = bytes.filter(|&b| b <= isize::MAX as u64) else {
                return too_large(format!(
                    "{at} makes value '{name}' {:?} too large to count",
                    info.ty(v).shape.as_sizes().unwrap_or_default()
                ));
            };
            if let Some(have) = have.filter(|&have| bytes > have) {
                return too_large(format!(
                    "{at} makes value '{name}' {:?} need {} alone; this machine has {} \
                     available",
                    info.ty(v).shape.as_sizes().unwrap_or_default(),
                    size(bytes),
                    size(have)
                ));
            }
            if matches!(graph.node(n).op, ralpc_ir::Op::Input) {
                inputs = inputs.saturating_add(bytes);
            }
        }
    }
    let need = inputs.saturating_add(beside);
    match have {
        Some(have) if need > have => too_large(format!(
            "{at} makes the model's inputs{} need {}; this machine has {} available",
            if beside > 0 { " and weights" } else { " alone" },
            size(need),
            size(have)
        )),
        _ => Ok(()),
    }
}

/// Reads `--data`: a JSON object with every graph input's values for the global batch,
/// row-major, and the labels — one class index per output row (cross-entropy) or one
/// target per output element (MSE):
///
/// ```json
/// { "inputs": { "image": [0.1, 0.2, …] }, "labels": [3, 7, …] }
/// ```
///
/// # Errors
/// An unreadable file, malformed JSON, a missing or unknown input, or a size that does
/// not match the model at the plan's batch; the message names the field.
pub fn read_data(
    path: &Path,
    graph: &Graph,
    info: &GraphInfo,
    loss: Loss,
) -> Result<Dataset, Error> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct File {
        inputs: std::collections::BTreeMap<String, Vec<f64>>,
        labels: Vec<f64>,
    }
    let bad = |m: String| Error::Data(Box::new(format!("{}: {m}", path.display())));
    let text = String::from_utf8(read(path, InputKind::Text)?)
        .map_err(|_| bad("not UTF-8 text".into()))?;
    let file: File = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let sizes = |v: ralpc_ir::ValueId| -> Vec<usize> {
        info.ty(v)
            .shape
            .as_sizes()
            .unwrap_or_default()
            .iter()
            .map(|&d| d as usize)
            .collect()
    };
    let mut inputs = std::collections::BTreeMap::new();
    for v in graph.inputs() {
        let name = &graph.value(v).name;
        let values = file
            .inputs
            .get(name)
            .ok_or_else(|| bad(format!("inputs.{name} is missing")))?;
        let shape = sizes(v);
        let n: usize = shape.iter().product();
        if values.len() != n {
            return Err(bad(format!(
                "inputs.{name} has {} values; shape {shape:?} at this batch needs {n}",
                values.len()
            )));
        }
        let float = info.ty(v).dtype.is_float();
        if let Some((i, x)) = values.iter().enumerate().find(|(_, &x)| !fits(x, float)) {
            return Err(bad(format!(
                "inputs.{name}[{i}] is {x:?}, not {}",
                if float {
                    "a finite f32"
                } else {
                    "a whole number within i64"
                }
            )));
        }
        let data = if float {
            Data::F32(values.iter().map(|&x| x as f32).collect::<Vec<_>>().into())
        } else {
            Data::I64(values.iter().map(|&x| x as i64).collect::<Vec<_>>().into())
        };
        inputs.insert(v, Tensor { shape, data });
    }
    if let Some(extra) = file
        .inputs
        .keys()
        .find(|k| !graph.inputs().iter().any(|&v| graph.value(v).name == **k))
    {
        return Err(bad(format!("inputs.{extra}: the model has no such input")));
    }
    let output = graph
        .outputs()
        .first()
        .map(|&o| sizes(o))
        .unwrap_or_default();
    let n: usize = output.iter().product();
    let classes = ralpc_runtime_min::cpu::train::classes(&output);
    let labels = match loss {
        Loss::CrossEntropy => {
            if file.labels.len() != n / classes {
                return Err(bad(format!(
                    "labels has {} values; the output {output:?} has {} rows",
                    file.labels.len(),
                    n / classes
                )));
            }
            if let Some(l) = file
                .labels
                .iter()
                .find(|&&l| l.fract() != 0.0 || l < 0.0 || l >= classes as f64)
            {
                return Err(bad(format!("labels: {l} is not a class in 0..{classes}")));
            }
            Data::I64(
                file.labels
                    .iter()
                    .map(|&l| l as i64)
                    .collect::<Vec<_>>()
                    .into(),
            )
        }
        Loss::Mse => {
            if file.labels.len() != n {
                return Err(bad(format!(
                    "labels has {} values; the output {output:?} has {n} elements",
                    file.labels.len()
                )));
            }
            if let Some((i, l)) = file
                .labels
                .iter()
                .enumerate()
                .find(|(_, &l)| !fits(l, true))
            {
                return Err(bad(format!("labels[{i}] is {l:?}, not a finite f32")));
            }
            Data::F32(
                file.labels
                    .iter()
                    .map(|&l| l as f32)
                    .collect::<Vec<_>>()
                    .into(),
            )
        }
    };
    Ok(Dataset { inputs, labels })
}

/// Whether a JSON number is exactly what a tensor of the kind can hold: a finite `f32`
/// (which rounds, but must not become ±inf), or a whole number within `i64`.
fn fits(x: f64, float: bool) -> bool {
    if float {
        (x as f32).is_finite()
    } else {
        // 2^63 is the first f64 beyond i64.
        x.fract() == 0.0 && x >= -(2f64.powi(63)) && x < 2f64.powi(63)
    }
}

fn run_error(e: impl std::fmt::Display) -> Error {
    Error::Run(Box::new(e.to_string()))
}

fn read(path: &Path, kind: InputKind) -> Result<Vec<u8>, Error> {
    read_input(path, kind).map_err(|error| {
        Error::Read(Box::new(FileError {
            path: path.display().to_string(),
            error,
        }))
    })
}

/// The plan file: `PATH` itself, or `PATH/plan.json` for a directory.
/// Reads a plan: `plan.json` or the directory `ralpc plan` wrote. Returns the file read.
///
/// # Errors
/// An unreadable or malformed plan.
pub fn read_plan(path: &Path) -> Result<(PathBuf, Plan), Error> {
    let plan_file = plan_path(path);
    let text = String::from_utf8(read(&plan_file, InputKind::Text)?).map_err(|_| {
        Error::PlanFile(Box::new(format!("{}: not UTF-8 text", plan_file.display())))
    })?;
    let plan = Plan::parse(&text)
        .map_err(|e| Error::PlanFile(Box::new(format!("{}: {e}", plan_file.display()))))?;
    Ok((plan_file, plan))
}

fn plan_path(path: &Path) -> PathBuf {
    if path.is_dir() {
        path.join("plan.json")
    } else {
        path.to_path_buf()
    }
}

/// Where the plan's model is: `--model`, else the path it was planned from (relative to
/// the working directory), else its file name beside the plan's directory.
fn model_path(plan: &Plan, plan_file: &Path, given: Option<&Path>) -> Result<PathBuf, Error> {
    if let Some(m) = given {
        return Ok(m.to_path_buf());
    }
    find_model(&plan.model, plan_file, "model", "; give it with --model")
}

/// `model`'s file (the plan's `what`): where the plan recorded it, else beside the plan's
/// directory; an error naming it, ending with `advice`, where neither is a file.
fn find_model(
    model: &ralpc_codegen::ModelRef,
    plan_file: &Path,
    what: &str,
    advice: &str,
) -> Result<PathBuf, Error> {
    let recorded = model.path.as_ref().map(PathBuf::from);
    let beside = plan_file
        .parent()
        .and_then(Path::parent)
        .map(|dir| dir.join(&model.name));
    recorded
        .into_iter()
        .chain(beside)
        .find(|p| p.is_file())
        .ok_or_else(|| {
            Error::PlanFile(Box::new(format!(
                "{}: cannot find its {what} '{}' (planned from '{}'){advice}",
                plan_file.display(),
                model.name,
                model.path.as_deref().unwrap_or("?"),
            )))
        })
}

/// Memory this machine can give a run: `RALPC_MEMORY_AVAILABLE` (bytes) when set, else
/// Linux's `MemAvailable`; `None` when unknown.
pub(crate) fn memory_available() -> Option<u64> {
    if let Some(v) = std::env::var_os("RALPC_MEMORY_AVAILABLE") {
        return v.to_str()?.parse().ok();
    }
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Refuses a plan whose ranks, computing on this machine's CPU, together need more memory
/// than it has: the sum of every rank's peak in instruction order, without the GPU
/// kernels' workspace.
fn check_memory(plan: &Plan) -> Result<(), Error> {
    let workspace: u64 = plan
        .buffers
        .iter()
        .flatten()
        .filter(|b| b.kind == ralpc_codegen::plan::BufferKind::Workspace)
        .map(|b| b.bytes)
        .fold(0, u64::saturating_add);
    // Saturating: sizes come from the plan file, and two of 2^63 bytes wrapped to 0.
    let need = plan
        .peak_memory_bytes()
        .into_iter()
        .fold(0, u64::saturating_add)
        .saturating_sub(workspace);
    match memory_available() {
        Some(have) if need > have => Err(Error::setup(format!(
            "the plan's {} ranks need {:.2} GiB together (their peaks, without GPU \
                 workspace); this machine has {:.2} GiB available",
            plan.ranks,
            need as f64 / f64::from(1u32 << 30),
            have as f64 / f64::from(1u32 << 30)
        ))),
        _ => Ok(()),
    }
}

/// Every rank's device for `--backend cuda`: the GPU its launcher gave its process (GPU 0
/// without one; more local ranks than GPUs share them). Ranks as threads meet at the
/// same-device hub, device to device: every plan's sums over any group of ranks
/// (gradient buckets, tensor-parallel partial sums, tied weights), its resharding
/// gathers and its activation and gradient messages. One process per GPU does the same
/// through NCCL, with a communicator for each of the plan's groups and each direction of
/// its messages. The rest (ZeRO's shards, the loss statistics of a head split by classes,
/// integer messages; between processes sharing a GPU, everything) goes through the
/// interpreter's communicator.
fn gpu_factory(
    plan: &Plan,
    options: &RunOptions,
) -> impl Fn(u32) -> Result<Box<dyn Compute>, DeviceError> + Sync {
    use ralpc_runtime_min::cuda::{gpu::Gpu, libs::Lib, on_device::OnDevice};
    use ralpc_runtime_min::dist::same_device::{Hub, SameDevice};
    use std::sync::Arc;
    let ranks = plan.ranks.max(1);
    let topology = nccl_topology(plan);
    let group: Vec<u32> = (0..ranks).collect();
    let hub = (ranks > 1 && options.placement.is_none())
        .then(|| Arc::new(Hub::new(ranks as usize, options.timeout)));
    let placement = options.placement.clone();
    let timeout = options.timeout;
    move |rank: u32| -> Result<Box<dyn Compute>, DeviceError> {
        let gpus = ralpc_runtime_min::cuda::device::count()?.max(1);
        let local = placement.as_ref().map_or(0, |p| p.local_rank as usize);
        let gpu = Gpu::new(local % gpus)?;
        if let Some(hub) = &hub {
            let side = SameDevice::<Gpu>::new(hub.clone(), rank as usize);
            return Ok(Box::new(OnDevice::with_replicas(
                gpu,
                &group,
                Box::new(side),
            )));
        }
        match &placement {
            // NCCL needs a GPU per process.
            Some(place)
                if ranks > 1 && Lib::Nccl.loadable() && local_world(place.local_rank) <= gpus =>
            {
                let nccl =
                    ralpc_runtime_min::dist::nccl::Nccl::join(&gpu, place, timeout, &topology)?;
                Ok(Box::new(OnDevice::with_replicas(
                    gpu,
                    &group,
                    Box::new(nccl),
                )))
            }
            _ => Ok(Box::new(OnDevice::new(gpu))),
        }
    }
}

/// The groups of `plan`'s collectives and the (sender, receiver) of its messages, for
/// NCCL's communicators.
fn nccl_topology(plan: &Plan) -> ralpc_runtime_min::dist::nccl::Topology {
    use ralpc_codegen::plan::Instruction;
    let messages = plan
        .programs
        .iter()
        .enumerate()
        .flat_map(|(rank, program)| {
            program.iter().filter_map(move |i| match *i {
                Instruction::Send { to, .. } => Some((rank as u32, to)),
                _ => None,
            })
        })
        .collect();
    ralpc_runtime_min::dist::nccl::Topology {
        groups: plan.groups.clone(),
        messages,
    }
}

/// Processes on this machine: the launcher's `LOCAL_WORLD_SIZE`, else at least this one's
/// local rank and those before it.
fn local_world(local_rank: u32) -> usize {
    std::env::var("LOCAL_WORLD_SIZE")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(local_rank as usize + 1)
}

/// Trains the model on one device, as `batch` samples per step: the reference every plan
/// is compared with.
///
/// # Errors
/// An unreadable or invalid model, or an op the CPU backend cannot run.
pub fn train_single_device(
    model: &Path,
    batch: u64,
    options: &RunOptions,
) -> Result<TrainReport, Error> {
    let p = prepare(model, batch, (&BTreeMap::new(), &BTreeMap::new()), options)?;
    train::train_reference(
        &p.graph,
        &p.info,
        &p.weights,
        &p.data,
        &options.train(p.loss),
    )
    .map_err(run_error)
}

/// Refuses options the command line's parsers would refuse, for library callers: a
/// learning rate or momentum that is not finite (or a momentum outside [0, 1)), a timeout
/// beyond a year.
fn check_options(options: &RunOptions) -> Result<(), Error> {
    let refuse = |m: String| Err(Error::setup(m));
    if !crate::args::is_learning_rate(options.lr) {
        return refuse(format!(
            "the learning rate is {}: not a finite number >= 0",
            options.lr
        ));
    }
    if !crate::args::is_momentum(options.momentum) {
        return refuse(format!(
            "the momentum is {}: not in [0, 1)",
            options.momentum
        ));
    }
    if options.timeout > Duration::from_secs(crate::args::MAX_SECONDS) || options.timeout.is_zero()
    {
        return refuse(format!(
            "the timeout is {:?}: not between 1 s and a year",
            options.timeout
        ));
    }
    Ok(())
}

/// Runs a plan on the CPU backend: its ranks as threads, its messages and collectives in
/// shared memory, for `options.steps` training iterations.
///
/// # Errors
/// An unreadable plan or model, a plan made for another model, a plan the CPU backend
/// cannot execute, or a failed rank (the others stop within `options.timeout`).
pub fn run(options: &RunOptions) -> Result<RunOutput, Error> {
    run_with(options, None)
}

/// [`run`] with every rank's layers computed by `compute` (rank → its device): how plans
/// other than data parallelism run on GPUs, and how the CUDA executor is checked on the
/// host kernels. `options.backend` is ignored.
///
/// # Errors
/// As [`run`].
pub fn run_with_compute(
    options: &RunOptions,
    compute: &ComputeFactory<'_>,
) -> Result<RunOutput, Error> {
    run_with(options, Some(compute))
}

fn run_with(
    options: &RunOptions,
    compute: Option<&ComputeFactory<'_>>,
) -> Result<RunOutput, Error> {
    check_options(options)?;
    let (plan_file, plan) = read_plan(&options.plan)?;
    if let Some(placement) = options.placement.as_ref().filter(|p| p.world != plan.ranks) {
        // Before anything is sized by the launcher's world.
        return Err(Error::Join {
            rank: Some(placement.rank),
            source: Box::new(ralpc_runtime_min::dist::DistError::Environment(format!(
                "WORLD_SIZE={}: the plan has {} ranks, one process each",
                placement.world, plan.ranks
            ))),
        });
    }
    let model = model_path(&plan, &plan_file, options.model.as_deref())?;
    let bytes = read(&model, InputKind::Model)?;
    plan.check_model(&bytes)
        .map_err(|e| Error::PlanFile(Box::new(format!("{}: {e}", plan_file.display()))))?;
    check_fault(&plan, options.fault)?;
    let shapes = &plan.model.inputs;
    let bound = bind_model(&model, plan.batch, shapes, &plan.model.values)?;
    let layer_graph: LayerGraph =
        layers::build(&bound.graph, &bound.info, plan.batch, Default::default())
            .map_err(|e| Error::Layers(Box::new(e)))?;
    sizes::check(&plan, &plan_file, &bound.graph, &layer_graph)?;
    let gpus = gpu_factory(&plan, options);
    let compute = match (compute, options.backend) {
        (Some(c), _) => Some(c),
        (None, Backend::Cuda) => {
            ralpc_runtime_min::cuda::libs::check(&ralpc_runtime_min::cuda::libs::Lib::ONE_GPU)?;
            Some(&gpus as &ComputeFactory<'_>)
        }
        (None, Backend::Cpu) => None,
    };
    // On the CPU backend the ranks' tensors are in this machine's memory; on devices,
    // in theirs.
    if compute.is_none() {
        check_memory(&plan)?;
    }
    let p = load(bound, options)?;
    let info_at = verifier(&p.unbound, shapes);
    let exe = Executable {
        plan: &plan,
        graph: &p.graph,
        info: &p.info,
        weights: &p.weights,
        data: &p.data,
        info_at: &info_at,
        compute,
    };
    let trained = trained_weights(&p);
    let resume = resume_state(options, &plan, &trained)?;
    let writer = CheckpointWriter::new(options, &plan_file, &plan.inputs, &trained);
    if let Some(path) = &writer.path {
        // A checkpoint never replaces the plan, the model or the data (it may replace the
        // one resumed from), and an unwritable place is found now, not when one is due.
        let inputs: Vec<&Path> = [
            Some(plan_file.as_path()),
            Some(model.as_path()),
            options.data.as_deref(),
        ]
        .into_iter()
        .flatten()
        .collect();
        crate::output::refuse_overwriting_inputs(path, &inputs, false)?;
        crate::output::check_writable(path)?;
    }
    let write_checkpoint = |c: &Checkpoint| writer.write(c);
    let control = Control {
        timeout: options.timeout,
        fault: options.fault,
        checkpoint_every: options.checkpoint_every.filter(|_| writer.path.is_some()),
        on_checkpoint: Some(&write_checkpoint),
        resume: resume.as_ref(),
    };
    let done = options.steps - resume.as_ref().map_or(0, |c| c.step);
    // Each GPU's copy of the background job, for the ranks this process runs.
    let hosted: Vec<u32> = match (&options.placement, &plan.background) {
        (Some(placement), _) => vec![placement.rank],
        // The plan's ranks, and the GPUs it leaves to the background alone.
        (None, Some(b)) => (0..b.iterations_per_step.len() as u32).collect(),
        (None, None) => Vec::new(),
    };
    let (copies, background_not_run) = match &plan.background {
        None => (Vec::new(), None),
        Some(_) if compute.is_some() => (
            Vec::new(),
            Some(
                "the background job runs on the CPU backend only (on GPUs, DeepPool's \
                 low-priority stream is not built yet)"
                    .to_owned(),
            ),
        ),
        Some(b) => {
            let copies = background::copies(b, done, &hosted);
            let none = copies.is_empty().then(|| {
                format!(
                    "{done} step(s) of the plan leave no GPU room for a whole step of the \
                     background job"
                )
            });
            (copies, none)
        }
    };
    let background_job = match (&plan.background, copies.is_empty()) {
        (Some(b), false) => Some((b, background::model(b, &plan_file)?)),
        _ => None,
    };
    let (ran, background) = std::thread::scope(|scope| {
        let handles: Vec<_> = background_job
            .iter()
            .flat_map(|(b, model)| {
                copies.iter().map(move |&(rank, steps)| {
                    scope.spawn(move || background::train(model, b, rank, steps, options))
                })
            })
            .collect();
        let failed = |e| {
            writer
                .failure()
                .unwrap_or_else(|| Error::Ranks(Box::new(e)))
        };
        let ran = match &options.placement {
            None => exec::run(&exe, &options.train(p.loss), &control).map_err(failed),
            Some(placement) => match World::connect(placement, options.timeout) {
                Err(e) => Err(Error::Join {
                    rank: Some(placement.rank),
                    source: Box::new(e),
                }),
                Ok(world) => exec::run_process(
                    &exe,
                    &options.train(p.loss),
                    &control,
                    &world,
                    placement.rank,
                )
                .map_err(failed),
            },
        };
        let background: Result<Vec<BackgroundRun>, Error> = handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(Error::Internal(Box::new(
                        "a background job's thread panicked".into(),
                    )))
                })
            })
            .collect();
        (ran, background)
    });
    let (report, elapsed) = ran?;
    let background = background?;
    let seconds = elapsed.as_secs_f64();
    Ok(RunOutput {
        report,
        ranks: plan.ranks,
        batch: plan.batch,
        seconds,
        samples_per_s: (plan.batch * u64::from(done)) as f64 / seconds.max(1e-9),
        seeded_weights: p.weights.seeded,
        background,
        background_not_run,
    })
}
