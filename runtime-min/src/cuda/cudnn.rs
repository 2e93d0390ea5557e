//! Convolutions through cuDNN on the GPU's stream: NCHW fp32 with FMA math only (no TF32,
//! as PyTorch runs with `allow_tf32 = False`), each direction's fastest algorithm timed on
//! the GPU once per shape (PyTorch's `cudnn.benchmark = True`: on an H100 the heuristics'
//! first choice for VGG16's 256-channel 3×3 convolution ran 3.7× slower than the fastest). Geometry cuDNN cannot describe
//! (asymmetric padding) returns `false`, and the caller lowers to im2col instead.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use cudarc::cudnn::result::CudnnError;
use cudarc::cudnn::sys::{
    cudnnConvolutionBwdDataAlgo_t, cudnnConvolutionBwdFilterAlgo_t, cudnnConvolutionFwdAlgo_t,
    cudnnConvolutionMode_t, cudnnMathType_t, cudnnTensorFormat_t,
};
use cudarc::cudnn::{
    ConvBackwardData, ConvBackwardFilter, ConvDescriptor, ConvForward, Cudnn, FilterDescriptor,
    TensorDescriptor,
};
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaSlice, CudaStream};

use super::backend::R;
use super::error::unsupported;
use super::error::DeviceError;
use crate::cpu::kernels::Conv2d;

/// cuDNN's handle on one stream.
pub struct Convolutions {
    handle: Arc<Cudnn>,
    stream: Arc<CudaStream>,
    /// Each direction's algorithm, by geometry: chosen once per shape, since timing them
    /// all (or even asking the heuristics, about a millisecond of host time) costs more
    /// than most convolutions run.
    chosen: Mutex<Chosen>,
    /// Scratch space shared by every call on the stream, grown to the largest asked for.
    workspace: Mutex<Option<CudaSlice<u8>>>,
}

/// A convolution's geometry, as a map key.
type Key = [usize; 15];

/// Each direction's algorithm and its workspace bytes, by geometry.
#[derive(Default)]
struct Chosen {
    forward: BTreeMap<Key, (cudnnConvolutionFwdAlgo_t, usize)>,
    data: BTreeMap<Key, (cudnnConvolutionBwdDataAlgo_t, usize)>,
    filter: BTreeMap<Key, (cudnnConvolutionBwdFilterAlgo_t, usize)>,
}

fn key(g: &Conv2d) -> Key {
    [
        g.batch,
        g.in_channels,
        g.out_channels,
        g.input.0,
        g.input.1,
        g.kernel.0,
        g.kernel.1,
        g.stride.0,
        g.stride.1,
        g.dilation.0,
        g.dilation.1,
        g.padding[0],
        g.padding[1],
        g.padding[2],
        g.groups,
    ]
}

/// The cached choice for `g`, or `pick` asked and remembered.
fn choose<A: Copy>(
    map: &mut BTreeMap<Key, (A, usize)>,
    g: &Conv2d,
    pick: impl FnOnce() -> R<(A, usize)>,
) -> R<(A, usize)> {
    if let Some(&hit) = map.get(&key(g)) {
        return Ok(hit);
    }
    let picked = pick()?;
    map.insert(key(g), picked);
    Ok(picked)
}

/// The most scratch memory an algorithm may ask for.
const WORKSPACE_LIMIT: usize = 1 << 30;

/// Every forward algorithm cuDNN has, timed once per shape.
const FORWARD: [cudnnConvolutionFwdAlgo_t; 8] = {
    use cudnnConvolutionFwdAlgo_t::*;
    [
        CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
        CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM,
        CUDNN_CONVOLUTION_FWD_ALGO_GEMM,
        CUDNN_CONVOLUTION_FWD_ALGO_DIRECT,
        CUDNN_CONVOLUTION_FWD_ALGO_FFT,
        CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING,
        CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD,
        CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED,
    ]
};

/// Every input-gradient algorithm.
const DATA: [cudnnConvolutionBwdDataAlgo_t; 6] = {
    use cudnnConvolutionBwdDataAlgo_t::*;
    [
        CUDNN_CONVOLUTION_BWD_DATA_ALGO_0,
        CUDNN_CONVOLUTION_BWD_DATA_ALGO_1,
        CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT,
        CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING,
        CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD,
        CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED,
    ]
};

/// Every weight-gradient algorithm.
const FILTER: [cudnnConvolutionBwdFilterAlgo_t; 7] = {
    use cudnnConvolutionBwdFilterAlgo_t::*;
    [
        CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0,
        CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1,
        CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT,
        CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3,
        CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD,
        CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED,
        CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING,
    ]
};

/// One convolution's descriptors.
struct Descriptors {
    conv: ConvDescriptor<f32>,
    x: TensorDescriptor<f32>,
    w: FilterDescriptor<f32>,
    y: TensorDescriptor<f32>,
}

fn fail<E: std::fmt::Debug>(what: &'static str) -> impl FnOnce(E) -> DeviceError {
    DeviceError::debug(format!("cuDNN {what}"))
}

fn int(v: usize) -> R<i32> {
    i32::try_from(v).map_err(|_| DeviceError::Node(format!("convolution size {v} exceeds cuDNN's")))
}

impl Convolutions {
    /// cuDNN on `stream`, or `None` when its library is not installed.
    ///
    /// # Errors
    /// cuDNN present but failing to start.
    pub fn new(stream: &Arc<CudaStream>) -> R<Option<Convolutions>> {
        if !super::libs::Lib::Cudnn.loadable() {
            return Ok(None);
        }
        let handle = Cudnn::new(stream.clone()).map_err(fail("cannot start"))?;
        Ok(Some(Convolutions {
            handle,
            stream: stream.clone(),
            chosen: Mutex::default(),
            workspace: Mutex::default(),
        }))
    }

    /// The descriptors of `g`, or `None` when cuDNN cannot express it.
    fn describe(&self, g: &Conv2d) -> R<Option<Descriptors>> {
        let [top, left, bottom, right] = g.padding;
        if top != bottom || left != right || g.groups == 0 {
            return Ok(None);
        }
        let (oh, ow) = g.output();
        let nchw = cudnnTensorFormat_t::CUDNN_TENSOR_NCHW;
        let tensor = |c: usize, (h, w): (usize, usize)| -> R<TensorDescriptor<f32>> {
            self.handle
                .create_4d_tensor(nchw, [int(g.batch)?, int(c)?, int(h)?, int(w)?])
                .map_err(fail("tensor descriptor"))
        };
        let mut conv = self
            .handle
            .create_conv2d(
                [int(top)?, int(left)?],
                [int(g.stride.0)?, int(g.stride.1)?],
                [int(g.dilation.0)?, int(g.dilation.1)?],
                cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
            )
            .map_err(fail("convolution descriptor"))?;
        conv.set_group_count(int(g.groups)?)
            .map_err(fail("group count"))?;
        conv.set_math_type(cudnnMathType_t::CUDNN_FMA_MATH)
            .map_err(fail("math type"))?;
        let w = self
            .handle
            .create_4d_filter(
                nchw,
                [
                    int(g.out_channels)?,
                    int(g.in_channels / g.groups)?,
                    int(g.kernel.0)?,
                    int(g.kernel.1)?,
                ],
            )
            .map_err(fail("filter descriptor"))?;
        Ok(Some(Descriptors {
            conv,
            x: tensor(g.in_channels, g.input)?,
            w,
            y: tensor(g.out_channels, (oh, ow))?,
        }))
    }

    fn chosen(&self) -> R<std::sync::MutexGuard<'_, Chosen>> {
        self.chosen.lock().map_err(|_| {
            DeviceError::Inconsistent("cuDNN: a thread failed while choosing an algorithm".into())
        })
    }

    /// Grows the workspace to at least `bytes`; `false` when that does not fit in the
    /// GPU's memory.
    ///
    /// # Errors
    /// A thread panicked holding the workspace.
    fn reserve(&self, bytes: usize) -> R<bool> {
        let mut space = self.workspace()?;
        if space.as_ref().is_none_or(|s| s.len() < bytes) {
            // SAFETY: scratch space, written by cuDNN before it is read.
            match unsafe { self.stream.alloc::<u8>(bytes.max(1)) } {
                Ok(grown) => *space = Some(grown),
                Err(_) => return Ok(false),
            }
        }
        Ok(true)
    }

    fn workspace(&self) -> R<std::sync::MutexGuard<'_, Option<CudaSlice<u8>>>> {
        self.workspace.lock().map_err(|_| {
            DeviceError::Inconsistent("cuDNN: a thread failed during a convolution".into())
        })
    }

    /// Runs `launch` with a workspace of at least `bytes`.
    ///
    /// # Errors
    /// The workspace does not fit in memory, or `launch` fails.
    fn with_workspace<T>(
        &self,
        bytes: usize,
        launch: impl FnOnce(&mut CudaSlice<u8>) -> R<T>,
    ) -> R<T> {
        if !self.reserve(bytes)? {
            return Err(unsupported(format!(
                "cuDNN: a workspace of {bytes} bytes does not fit in the GPU's memory"
            )));
        }
        match self.workspace()?.as_mut() {
            Some(space) => launch(space),
            None => Err(DeviceError::Inconsistent("cuDNN: no workspace".into())),
        }
    }

    /// The fastest of `candidates` on this GPU (PyTorch's `cudnn.benchmark`): each that
    /// cuDNN supports within [`WORKSPACE_LIMIT`] runs once to warm up, then the faster of
    /// two runs between events counts. `None` when none runs.
    ///
    /// # Errors
    /// The events failing (an algorithm failing only takes it out of the race).
    fn fastest<A: Copy>(
        &self,
        candidates: &[A],
        bytes: impl Fn(A) -> Option<usize>,
        mut run: impl FnMut(A, &mut CudaSlice<u8>) -> R<()>,
    ) -> R<Option<(A, usize)>> {
        let timing = Some(CUevent_flags::CU_EVENT_DEFAULT);
        let mut best: Option<(f32, A, usize)> = None;
        for &algo in candidates {
            // One whose workspace is over the limit, or does not fit, drops out.
            let Some(need) = bytes(algo).filter(|&b| b <= WORKSPACE_LIMIT) else {
                continue;
            };
            if !self.reserve(need)? {
                continue;
            }
            let timed = self.with_workspace(need, |space| {
                if run(algo, space).is_err() {
                    return Ok(None);
                }
                let mut fastest = f32::INFINITY;
                for _ in 0..2 {
                    let start = self.stream.record_event(timing).map_err(fail("event"))?;
                    run(algo, space)?;
                    let end = self.stream.record_event(timing).map_err(fail("event"))?;
                    fastest = fastest.min(start.elapsed_ms(&end).map_err(fail("timing"))?);
                }
                Ok(Some(fastest))
            });
            let timed = timed?;
            if let Some(ms) = timed {
                if best.is_none_or(|(fastest, ..)| ms < fastest) {
                    best = Some((ms, algo, need));
                }
            }
        }
        Ok(best.map(|(_, algo, need)| (algo, need)))
    }

    /// The fastest of `candidates` ([`Self::fastest`]) with its workspace bytes, or, when
    /// none runs, the algorithm cuDNN's heuristics rank first (`ranked`).
    ///
    /// # Errors
    /// The events failing, or cuDNN failing to rank or size an algorithm.
    fn pick<A: Copy>(
        &self,
        candidates: &[A],
        bytes: impl Fn(A) -> Result<usize, CudnnError>,
        run: impl FnMut(A, &mut CudaSlice<u8>) -> R<()>,
        ranked: impl FnOnce() -> Result<A, CudnnError>,
        what: &'static str,
    ) -> R<(A, usize)> {
        if let Some(picked) = self.fastest(candidates, |a| bytes(a).ok(), run)? {
            return Ok(picked);
        }
        let algo = ranked().map_err(fail(what))?;
        Ok((algo, bytes(algo).map_err(fail(what))?))
    }

    /// Scratch floats for timing an algorithm without touching the caller's buffers.
    fn scratch(&self, len: usize) -> R<CudaSlice<f32>> {
        // SAFETY: written by the convolution timed into it, never read.
        unsafe { self.stream.alloc::<f32>(len.max(1)) }.map_err(fail("scratch"))
    }

    /// `y = conv(x, w)`; `Ok(false)` when cuDNN cannot express `g`.
    ///
    /// # Errors
    /// cuDNN failing.
    pub fn forward(
        &self,
        g: &Conv2d,
        x: &CudaSlice<f32>,
        w: &CudaSlice<f32>,
        y: &mut CudaSlice<f32>,
    ) -> R<bool> {
        let Some(d) = self.describe(g)? else {
            return Ok(false);
        };
        let op = ConvForward {
            conv: &d.conv,
            x: &d.x,
            w: &d.w,
            y: &d.y,
        };
        let (algo, bytes) = choose(&mut self.chosen()?.forward, g, || {
            let run = |algo, space: &mut CudaSlice<u8>| {
                // SAFETY: as below; `y` is overwritten by the chosen algorithm after.
                unsafe { op.launch(algo, Some(space), (1.0, 0.0), x, w, &mut *y) }
                    .map_err(fail("forward"))
            };
            let bytes = |algo| op.get_workspace_size(algo);
            self.pick(
                &FORWARD,
                bytes,
                run,
                || op.pick_algorithm(),
                "forward algorithm",
            )
        })?;
        self.with_workspace(bytes, |space| {
            // SAFETY: the buffers hold the described NCHW fp32 tensors (their lengths
            // are checked by the caller against the geometry).
            unsafe { op.launch(algo, Some(space), (1.0, 0.0), x, w, y) }.map_err(fail("forward"))
        })?;
        Ok(true)
    }

    /// `dx = ∂conv/∂x · dy` and `dw = ∂conv/∂w · dy`, both overwritten (accumulating
    /// costs some algorithms an extra pass); `Ok(false)` when cuDNN cannot express `g`.
    ///
    /// # Errors
    /// cuDNN failing.
    #[allow(
        clippy::too_many_arguments,
        reason = "a convolution's three tensors and their gradients"
    )]
    pub fn backward(
        &self,
        g: &Conv2d,
        x: &CudaSlice<f32>,
        w: &CudaSlice<f32>,
        dy: &CudaSlice<f32>,
        dx: &mut CudaSlice<f32>,
        dw: &mut CudaSlice<f32>,
    ) -> R<bool> {
        let Some(d) = self.describe(g)? else {
            return Ok(false);
        };
        let data = ConvBackwardData {
            conv: &d.conv,
            dx: &d.x,
            w: &d.w,
            dy: &d.y,
        };
        let (algo, bytes) = choose(&mut self.chosen()?.data, g, || {
            let mut into = self.scratch(dx.len())?;
            let run = |algo, space: &mut CudaSlice<u8>| {
                // SAFETY: as below, into scratch space of `dx`'s size.
                unsafe { data.launch(algo, Some(space), (1.0, 0.0), &mut into, w, dy) }
                    .map_err(fail("backward data"))
            };
            let bytes = |algo| data.get_workspace_size(algo);
            self.pick(
                &DATA,
                bytes,
                run,
                || data.pick_algorithm(),
                "data algorithm",
            )
        })?;
        self.with_workspace(bytes, |space| {
            // SAFETY: as in `forward`.
            unsafe { data.launch(algo, Some(space), (1.0, 0.0), dx, w, dy) }
                .map_err(fail("backward data"))
        })?;
        let filter = ConvBackwardFilter {
            conv: &d.conv,
            x: &d.x,
            dw: &d.w,
            dy: &d.y,
        };
        let (algo, bytes) = choose(&mut self.chosen()?.filter, g, || {
            let mut into = self.scratch(dw.len())?;
            let run = |algo, space: &mut CudaSlice<u8>| {
                // SAFETY: as below, into scratch space of `dw`'s size.
                unsafe { filter.launch(algo, Some(space), (1.0, 0.0), x, &mut into, dy) }
                    .map_err(fail("backward filter"))
            };
            let bytes = |algo| filter.get_workspace_size(algo);
            self.pick(
                &FILTER,
                bytes,
                run,
                || filter.pick_algorithm(),
                "filter algorithm",
            )
        })?;
        self.with_workspace(bytes, |space| {
            // SAFETY: as in `forward`.
            unsafe { filter.launch(algo, Some(space), (1.0, 0.0), x, dw, dy) }
                .map_err(fail("backward filter"))
        })?;
        Ok(true)
    }
}
