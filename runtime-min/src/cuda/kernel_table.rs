// Every kernel of `kernels.cu`, declared once: its name, its parameters in order with their
// kinds, and its launch shape. Each row expands into
//
// * the C prototypes put before `kernels.cu` wherever it is compiled (NVRTC through
//   `kernels::SOURCE`, the host compiler through cuda-host's build script), so a kernel
//   whose definition has other parameter types or another count than its row does not
//   compile ("conflicting declaration"); two parameters of one type swapped still do, so
//   the row names them as the definition does;
// * `launch::Kernel` (the names the GPU loads) and one typed constructor of
//   `launch::Launch` per kernel, which the executor's checked calls
//   (`calls::Kernels`) build and every device runs through `Backend::launch`;
// * cuda-host's `extern "C"` declarations and its dispatch of a `Launch` to them.
//
// Adding a kernel: its function in `kernels.cu`, its row here, and its checked call in
// `calls.rs`. No device implements it by hand.
//
// Plain `macro_rules!` only (no `//!` docs, no `use`): cuda-host includes this file too.
//
// Parameter kinds: `out` (float*), `input` (const float*), `optional` (const float*, null
// when absent), `out_index` (long long*), `index` (const long long*), `i64` (long long),
// `i32` (int), `f32` (float), `Strides` and `Window` (by value). A launch is `over
// elements` (a grid-stride loop over that many outputs) or `over rows` (one block per row,
// reducing in shared memory).

/// Calls `$m!` with every kernel of `kernels.cu`, in the source's order.
macro_rules! foreach_kernel {
    ($m:ident) => {
        $m! {
            /// `out = a op b` over `n` outputs, `s` broadcasting `a` and `b` (`op` a
            /// `BinaryOp`).
            binary(out: out, a: input, b: input, s: Strides, n: i64, op: i32) over elements;
            /// `dst = src` read through the view `s` from `src_offset`.
            gather_strided(dst: out, src: input, s: Strides, src_offset: i64, n: i64)
                over elements;
            /// `src` written (or added, `accumulate`) into `dst` through the view `s` from
            /// `dst_offset`.
            scatter_strided(
                dst: out, src: input, s: Strides, dst_offset: i64, n: i64, accumulate: i32
            ) over elements;
            /// `out = op(x)` (`op` a `UnaryOp`).
            unary(out: out, x: input, n: i64, op: i32, alpha: f32, beta: f32) over elements;
            /// `dx` of `op` from `dy` and the forward's input or output (`saved`).
            unary_backward(
                dx: out, dy: input, saved: input, n: i64, op: i32, alpha: f32, beta: f32
            ) over elements;
            /// `out = value`.
            fill(out: out, n: i64, value: f32) over elements;
            /// `out = alpha·x + beta·out`.
            axpby(out: out, x: input, n: i64, alpha: f32, beta: f32) over elements;
            /// The sum (or mean) of `x` `[outer, n, inner]` over its middle axis.
            reduce_axis(out: out, x: input, outer: i64, n: i64, inner: i64, mean: i32)
                over elements;
            /// Softmax (or log-softmax) of each row.
            softmax_rows(y: out, x: input, rows: i64, n: i64, log_space: i32) over rows;
            /// Its input gradient.
            softmax_rows_backward(
                dx: out, dy: input, y: input, rows: i64, n: i64, log_space: i32
            ) over rows;
            /// Softmax cross-entropy per row and the logits' gradient.
            cross_entropy(
                loss: out, dlogits: out, logits: input, labels: index,
                rows: i64, n: i64, total_rows: i64
            ) over rows;
            /// Per row of a class piece: max, sum of `exp(x − max)`, label logit.
            class_stats(
                stats: out, logits: input, labels: index, rows: i64, n: i64, first: i64
            ) over rows;
            /// A class piece's logits gradient from each row's log-sum-exp.
            class_piece_grad(
                dlogits: out, logits: input, lse: input, labels: index,
                rows: i64, n: i64, first: i64, scale: f32
            ) over elements;
            /// Squared error per element and its gradient.
            mse(loss: out, dx: out, x: input, target: input, n: i64, total: i64)
                over elements;
            /// Layer norm of each row; saves the rows' mean and 1/std.
            layer_norm(
                y: out, mean_out: out, rstd_out: out, x: input, gamma: optional,
                beta: optional, rows: i64, n: i64, eps: f32
            ) over rows;
            /// Its input gradient.
            layer_norm_backward(
                dx: out, dy: input, x: input, gamma: optional, mean: input, rstd: input,
                rows: i64, n: i64
            ) over rows;
            /// Per-channel mean and 1/std of `x` `[batch, channels, spatial]`.
            channel_stats(
                mean_out: out, rstd_out: out, x: input, batch: i64, channels: i64,
                spatial: i64, eps: f32
            ) over rows;
            /// `y = (x - mean)·rstd·gamma + beta` per channel.
            channel_affine(
                y: out, x: input, mean: input, rstd: input, gamma: input, beta: input,
                channels: i64, spatial: i64, n: i64, rstd_is_var: i32, eps: f32
            ) over elements;
            /// Batch norm's gradients.
            batch_norm_backward(
                dx: out, dgamma: out, dbeta: out, dy: input, x: input, mean: input,
                rstd: input, gamma: input, batch: i64, channels: i64, spatial: i64
            ) over rows;
            /// Max pooling; `argmax` receives each maximum's input index.
            max_pool(y: out, argmax: out_index, x: input, g: Window) over elements;
            /// Its input gradient.
            max_pool_backward(dx: out, dy: input, argmax: index, g: Window) over elements;
            /// Average pooling.
            avg_pool(y: out, x: input, g: Window, count_pad: i32) over elements;
            /// Its input gradient.
            avg_pool_backward(dx: out, dy: input, g: Window, count_pad: i32) over elements;
            /// im2col of `images` images from `offset` in `image`.
            im2col(cols: out, images_at: input, offset: i64, g: Window, images: i64)
                over elements;
            /// col2im of `images` images' columns, added from `offset` in `image`.
            col2im(images_at: out, offset: i64, cols: input, g: Window, images: i64)
                over elements;
            /// SGD with momentum.
            sgd_momentum(
                w: out, velocity: out, grad: input, n: i64, lr: f32, momentum: f32
            ) over elements;
        }
    };
}

/// A parameter kind's C type.
macro_rules! c_kernel_type {
    (out) => { "float*" };
    (input) => { "const float*" };
    (optional) => { "const float*" };
    (out_index) => { "long long*" };
    (index) => { "const long long*" };
    (i64) => { "long long" };
    (i32) => { "int" };
    (f32) => { "float" };
    (Strides) => { "Strides" };
    (Window) => { "Window" };
}

/// A kernel's C parameter list, as one string literal.
macro_rules! c_kernel_params {
    ($arg:ident : $kind:ident $(, $rest:ident : $rest_kind:ident)*) => {
        concat!(
            c_kernel_type!($kind), " ", stringify!($arg),
            $(", ", c_kernel_type!($rest_kind), " ", stringify!($rest),)*
        )
    };
}

/// The C prototypes of a table's kernels, as one string literal.
macro_rules! c_kernel_prototypes {
    ($(
        $(#[$doc:meta])*
        $name:ident ( $($arg:ident : $kind:ident),* $(,)? ) over $grid:ident;
    )*) => {
        concat!(
            "// Generated from runtime-min/src/cuda/kernel_table.rs: every kernel's ",
            "parameters.\nstruct Strides;\nstruct Window;\n",
            $(
                "extern \"C\" __global__ void ", stringify!($name), "(",
                c_kernel_params!($($arg: $kind),*), ");\n",
            )*
        )
    };
}

/// The C declarations the kernels' source needs before it: the operation codes and the
/// kernels' prototypes, as one string literal.
macro_rules! c_kernel_header {
    () => {
        concat!(c_op_code_header!(), foreach_kernel!(c_kernel_prototypes))
    };
}
