//! Running a plan (`ralpc run PLAN --backend cpu`): every rank a thread of this process, a
//! real training step per iteration, and the single-device run it is held to.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ralpc_codegen::plan::Plan;
use ralpc_ir::{bind, onnx, verify, Bindings, Graph, GraphInfo};
use ralpc_passes::layers::{self, LayerGraph};
use ralpc_runtime_min::cpu::exec::{self, Executable};
use ralpc_runtime_min::cpu::graph::Weights;
use ralpc_runtime_min::cpu::train::{self, Dataset, Loss, TrainOptions, TrainReport};

use crate::error::{Error, FileError};

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
    /// The objective.
    pub loss: Loss,
    /// How long a rank waits for another before every rank gives up.
    pub timeout: Duration,
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
            loss: train.loss,
            timeout: Duration::from_secs(60),
        }
    }
}

impl RunOptions {
    fn train(&self) -> TrainOptions {
        TrainOptions {
            steps: self.steps,
            seed: self.seed,
            lr: self.lr,
            momentum: self.momentum,
            loss: self.loss,
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
}

/// A model ready to train: its graph at the global batch and everything derived from it.
struct Prepared {
    unbound: Graph,
    graph: Graph,
    info: GraphInfo,
    weights: Weights,
    data: Dataset,
}

fn prepare(model: &Path, batch: u64, seed: u64, loss: Loss) -> Result<Prepared, Error> {
    let unbound = onnx::import(model)?.graph;
    let mut graph = unbound.clone();
    bind(
        &mut graph,
        &Bindings {
            batch: Some(batch),
            inputs: Default::default(),
        },
    )?;
    let info = verify(&graph)?;
    let weights = Weights::load(&graph, seed).map_err(run_error)?;
    let data = Dataset::synthetic(&graph, &info, seed, loss);
    Ok(Prepared {
        unbound,
        graph,
        info,
        weights,
        data,
    })
}

fn run_error(e: impl std::fmt::Display) -> Error {
    Error::Run(Box::new(e.to_string()))
}

fn read(path: &Path) -> Result<Vec<u8>, Error> {
    std::fs::read(path).map_err(|error| {
        Error::Read(Box::new(FileError {
            path: path.display().to_string(),
            error,
        }))
    })
}

/// The plan file: `PATH` itself, or `PATH/plan.json` for a directory.
fn plan_path(path: &Path) -> PathBuf {
    if path.is_dir() {
        path.join("plan.json")
    } else {
        path.to_path_buf()
    }
}

/// Where the plan's model is: `--model`, else the name it was planned with (as given,
/// then beside the plan's directory).
fn model_path(plan: &Plan, plan_file: &Path, given: Option<&Path>) -> PathBuf {
    if let Some(m) = given {
        return m.to_path_buf();
    }
    let named = PathBuf::from(&plan.model.name);
    if named.exists() {
        return named;
    }
    plan_file
        .parent()
        .and_then(Path::parent)
        .map(|dir| dir.join(&named))
        .filter(|p| p.exists())
        .unwrap_or(named)
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
    let p = prepare(model, batch, options.seed, options.loss)?;
    train::train_reference(&p.graph, &p.info, &p.weights, &p.data, &options.train())
        .map_err(run_error)
}

/// Runs a plan on the CPU backend: its ranks as threads, its messages and collectives in
/// shared memory, for `options.steps` training iterations.
///
/// # Errors
/// An unreadable plan or model, a plan made for another model, a plan the CPU backend
/// cannot execute, or a failed rank (the others stop within `options.timeout`).
pub fn run(options: &RunOptions) -> Result<RunOutput, Error> {
    let plan_file = plan_path(&options.plan);
    let text = String::from_utf8(read(&plan_file)?).map_err(|_| {
        Error::PlanFile(Box::new(format!("{}: not UTF-8 text", plan_file.display())))
    })?;
    let plan = Plan::parse(&text)
        .map_err(|e| Error::PlanFile(Box::new(format!("{}: {e}", plan_file.display()))))?;
    let model = model_path(&plan, &plan_file, options.model.as_deref());
    let bytes = read(&model)?;
    plan.check_model(&bytes)
        .map_err(|e| Error::PlanFile(Box::new(format!("{}: {e}", plan_file.display()))))?;
    let p = prepare(&model, plan.batch, options.seed, options.loss)?;
    let layer_graph: LayerGraph = layers::build(&p.graph, &p.info, plan.batch, Default::default())
        .map_err(|e| Error::Layers(Box::new(e)))?;
    let unbound = &p.unbound;
    let info_at = move |batch: u64| -> Result<GraphInfo, String> {
        let mut g = unbound.clone();
        bind(
            &mut g,
            &Bindings {
                batch: Some(batch),
                inputs: Default::default(),
            },
        )
        .map_err(|e| e.to_string())?;
        verify(&g).map_err(|e| e.to_string())
    };
    let exe = Executable {
        plan: &plan,
        graph: &p.graph,
        info: &p.info,
        layers: &layer_graph,
        weights: &p.weights,
        data: &p.data,
        info_at: &info_at,
    };
    let (report, elapsed) =
        exec::run(&exe, &options.train(), options.timeout).map_err(run_error)?;
    let seconds = elapsed.as_secs_f64();
    Ok(RunOutput {
        report,
        ranks: plan.ranks,
        batch: plan.batch,
        seconds,
        samples_per_s: (plan.batch * u64::from(options.steps)) as f64 / seconds.max(1e-9),
        seeded_weights: p.weights.seeded,
    })
}
