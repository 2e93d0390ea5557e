//! `ralpc._ralpc`, the Python extension: `plan` and `compile` over the Rust library
//! (in-process: no `ralpc` binary is run), and `RalpcError`.
//!
//! Options are `ralpc plan`'s, passed as keyword arguments and parsed by the same clap
//! definition ([`ralpc::PlanArgs`]), so names, defaults and checks are the command line's.

use std::ffi::OsString;
use std::path::PathBuf;

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

create_exception!(
    ralpc,
    RalpcError,
    PyException,
    "An error from ralpc: the message, its causes (`causes`, each also chained as \
     `__cause__`) and the exit status the command line would return (`exit_code`)."
);

/// The options both functions name in their signatures, in order.
const NAMED: [&str; 4] = ["gpus", "nodes", "cluster", "batch"];

/// `ralpc plan` options that only make sense on the command line.
const COMMAND_LINE_ONLY: [&str; 6] = ["out", "json", "quiet", "check", "force", "write_strategy"];

/// The error `e` as a `RalpcError` whose `__cause__` chain holds its sources.
fn to_python(py: Python<'_>, message: String, causes: Vec<String>, exit_code: u8) -> PyErr {
    let err = RalpcError::new_err(message);
    let value = err.value(py);
    let _ = value.setattr("causes", causes.clone());
    let _ = value.setattr("exit_code", exit_code);
    // Innermost first, so each cause is chained to its own.
    let mut chained: Option<PyErr> = None;
    for (i, cause) in causes.iter().enumerate().rev() {
        let e = RalpcError::new_err(cause.clone());
        let v = e.value(py);
        let _ = v.setattr("causes", causes[i + 1..].to_vec());
        let _ = v.setattr("exit_code", exit_code);
        e.set_cause(py, chained.take());
        chained = Some(e);
    }
    err.set_cause(py, chained);
    err
}

fn ralpc_error(py: Python<'_>, e: &ralpc::Error) -> PyErr {
    let mut causes = Vec::new();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        causes.push(s.to_string());
        source = s.source();
    }
    to_python(py, e.to_string(), causes, e.exit_code())
}

fn option_error(py: Python<'_>, message: String) -> PyErr {
    to_python(py, message, Vec::new(), 2)
}

/// `--name=value` tokens of one keyword argument.
fn tokens(key: &str, value: &Bound<'_, PyAny>, out: &mut Vec<OsString>) -> PyResult<()> {
    let py = value.py();
    let flag = format!("--{}", key.replace('_', "-"));
    if value.is_none() {
        return Ok(());
    }
    if key == "inputs" {
        let shapes = value.cast::<PyDict>().map_err(|_| {
            option_error(py, "inputs: a dict of input name to its full shape".into())
        })?;
        for (name, dims) in shapes.iter() {
            let dims: Vec<u64> = dims
                .extract()
                .map_err(|_| option_error(py, format!("inputs[{name}]: a list of dimensions")))?;
            let dims: Vec<String> = dims.iter().map(u64::to_string).collect();
            out.push(format!("--input={name}={}", dims.join(",")).into());
        }
        return Ok(());
    }
    if let Ok(on) = value.extract::<bool>() {
        match (on, key) {
            (true, _) => out.push(flag.into()),
            // The one on|off option; other flags are simply not given.
            (false, "sequence_parallel") => out.push(format!("{flag}=off").into()),
            (false, _) => {}
        }
        return Ok(());
    }
    if let Ok(list) = value.cast::<PyList>() {
        for item in list.iter() {
            tokens(key, &item, out)?;
        }
        return Ok(());
    }
    let text = value.str()?.to_string();
    out.push(format!("{flag}={text}").into());
    Ok(())
}

/// The arguments of a call, parsed by `ralpc plan`'s own definition.
fn arguments(
    py: Python<'_>,
    model: PathBuf,
    named: [Option<Bound<'_, PyAny>>; 4],
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<ralpc::PlanArgs> {
    let mut argv: Vec<OsString> = vec!["ralpc".into(), model.into_os_string()];
    for (key, value) in NAMED.iter().zip(&named) {
        if let Some(value) = value {
            tokens(key, value, &mut argv)?;
        }
    }
    if let Some(options) = options {
        for (key, value) in options.iter() {
            let key: String = key.extract()?;
            if key == "copies" {
                return Err(option_error(
                    py,
                    "copies: several models at once are placed by the command line's `ralpc \
                     plan A B …` or `--copies K`, which writes no plan"
                        .to_owned(),
                ));
            }
            if COMMAND_LINE_ONLY.contains(&key.as_str()) {
                return Err(option_error(
                    py,
                    format!(
                        "{key}: a command-line option of `ralpc plan` (ralpc.compile(out=…) \
                         writes the artifacts)"
                    ),
                ));
            }
            tokens(&key, &value, &mut argv)?;
        }
    }
    ralpc::PlanArgs::from_tokens(argv).map_err(|e| option_error(py, e.0))
}

/// The summary as a dict, with the placement and why a plan was not lowered.
fn summary(
    py: Python<'_>,
    report: &ralpc::PlanReport,
    strategy: Option<&ralpc::passes::plan::StrategyFile>,
    not_lowered: Option<&str>,
) -> PyResult<Py<PyAny>> {
    let json = py.import("json")?;
    let text = serde_json::to_string(report)
        .map_err(|e| to_python(py, format!("the plan summary: {e}"), Vec::new(), 4))?;
    let dict = json.call_method1("loads", (text,))?;
    let placement = match strategy {
        Some(s) => json.call_method1("loads", (s.to_json(),))?,
        None => py.None().into_bound(py),
    };
    dict.set_item("placement", placement)?;
    dict.set_item("not_lowered", not_lowered)?;
    Ok(dict.unbind())
}

/// Plans `model`; see `ralpc/_ralpc.pyi`.
#[pyfunction]
#[pyo3(signature = (model, gpus=None, nodes=None, cluster=None, batch=None, **options))]
fn plan(
    py: Python<'_>,
    model: PathBuf,
    gpus: Option<Bound<'_, PyAny>>,
    nodes: Option<Bound<'_, PyAny>>,
    cluster: Option<Bound<'_, PyAny>>,
    batch: Option<Bound<'_, PyAny>>,
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<Py<PyAny>> {
    let named = [gpus, nodes, cluster, batch];
    let args = arguments(py, model, named, options)?;
    if !args.emit.is_empty() {
        return Err(option_error(
            py,
            "emit: ralpc.compile(out=…, emit=[…]) writes the files for other engines".into(),
        ));
    }
    let options = ralpc::PlanOptions {
        executable: false,
        ..args.options()
    };
    let output = py
        .detach(|| ralpc::plan(&options))
        .map_err(|e| ralpc_error(py, &e))?;
    summary(
        py,
        &output.report,
        output.strategy.as_ref(),
        output.not_lowered.as_deref(),
    )
}

/// Plans `model` and writes its artifacts; see `ralpc/_ralpc.pyi`.
#[pyfunction]
#[pyo3(signature = (model, out=None, gpus=None, nodes=None, cluster=None, batch=None, **options))]
#[expect(clippy::too_many_arguments, reason = "Python keyword arguments")]
fn compile(
    py: Python<'_>,
    model: PathBuf,
    out: Option<PathBuf>,
    gpus: Option<Bound<'_, PyAny>>,
    nodes: Option<Bound<'_, PyAny>>,
    cluster: Option<Bound<'_, PyAny>>,
    batch: Option<Bound<'_, PyAny>>,
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<Py<PyAny>> {
    let named = [gpus, nodes, cluster, batch];
    let out = out.unwrap_or_else(|| ralpc::default_out_dir(&model));
    let args = arguments(py, model, named, options)?;
    let options = args.options();
    let (compiled, emitted) = py
        .detach(|| {
            let mut compiled = ralpc::compile(&options)?;
            let engine_files = ralpc::emit::render(&args.emit, &compiled)?;
            compiled.write(&out)?;
            let emitted = ralpc::emit::write(&engine_files, &out)?;
            let warnings = ralpc::emit::warnings(&args.emit, &compiled);
            compiled.report.warnings.extend(warnings);
            Ok::<_, ralpc::Error>((compiled, emitted))
        })
        .map_err(|e| ralpc_error(py, &e))?;
    let dict = summary(
        py,
        &compiled.report,
        compiled.strategy.as_ref(),
        compiled.not_lowered.as_deref(),
    )?;
    let bound = dict.bind(py);
    bound.set_item("out", out.display().to_string())?;
    let mut files: Vec<&str> = compiled.files.iter().map(|(name, _)| *name).collect();
    files.extend(emitted);
    bound.set_item("files", files)?;
    Ok(dict)
}

#[pymodule]
fn _ralpc(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("RalpcError", m.py().get_type::<RalpcError>())?;
    m.add_function(wrap_pyfunction!(plan, m)?)?;
    m.add_function(wrap_pyfunction!(compile, m)?)?;
    Ok(())
}
