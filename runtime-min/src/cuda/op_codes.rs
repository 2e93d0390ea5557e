// The operation codes of the `unary`, `unary_backward` and `binary` kernels, declared
// once. `kernels.rs` expands each table into its Rust enum ([`UnaryOp`], [`BinaryOp`]) and
// into the C `#define`s that precede `kernels.cu` wherever it is compiled: NVRTC at run
// time, and the host compiler through cuda-host's build script, which includes this file as
// it is. `kernels.cu` names the codes (`case UNARY_MISH:`), never their numbers, so a code
// cannot drift between the two languages.
//
// Plain `macro_rules!` only (no `//!` docs, no `use`): the build script includes it too.
//
// Each row: doc, Rust name = code, C name, and for unary ops whether `unary_backward` takes
// the forward's output (else its input).

/// Calls `$m!` with every operation of the `unary` and `unary_backward` kernels (`alpha`,
/// `beta` where noted).
macro_rules! foreach_unary_op {
    ($m:ident) => {
        $m! {
            /// max(x, 0)
            Relu = 0, UNARY_RELU, output;
            /// 1 / (1 + e^-x)
            Sigmoid = 1, UNARY_SIGMOID, output;
            /// tanh
            Tanh = 2, UNARY_TANH, output;
            /// x·Φ(x), exact
            Gelu = 3, UNARY_GELU, input;
            /// e^x
            Exp = 4, UNARY_EXP, output;
            /// ln x
            Log = 5, UNARY_LOG, input;
            /// √x
            Sqrt = 6, UNARY_SQRT, output;
            /// -x
            Neg = 7, UNARY_NEG, input;
            /// |x|
            Abs = 8, UNARY_ABS, input;
            /// x, or alpha·x below 0
            LeakyRelu = 9, UNARY_LEAKY_RELU, input;
            /// x clipped to alpha..beta
            Clip = 10, UNARY_CLIP, input;
            /// clip(alpha·x + beta, 0, 1)
            HardSigmoid = 11, UNARY_HARD_SIGMOID, input;
            /// x·sigmoid(x)
            Silu = 12, UNARY_SILU, input;
            /// 1 / x
            Reciprocal = 13, UNARY_RECIPROCAL, output;
            /// x, or alpha·(e^x - 1) below 0
            Elu = 14, UNARY_ELU, input;
            /// erf
            Erf = 15, UNARY_ERF, input;
            /// alpha·x
            Scale = 16, UNARY_SCALE, input;
            /// GELU, tanh approximation
            GeluTanh = 17, UNARY_GELU_TANH, input;
            /// ln(1 + e^x)
            Softplus = 18, UNARY_SOFTPLUS, input;
            /// x / (1 + |x|)
            Softsign = 19, UNARY_SOFTSIGN, input;
            /// x·tanh(softplus(x))
            Mish = 20, UNARY_MISH, input;
            /// beta·(x, or alpha·(e^x - 1) below 0)
            Selu = 21, UNARY_SELU, input;
            /// max(x, 0) + min(0, alpha·(e^(x/alpha) - 1))
            Celu = 22, UNARY_CELU, input;
            /// x·clip(x/6 + 1/2, 0, 1)
            HardSwish = 23, UNARY_HARD_SWISH, input;
        }
    };
}

/// Calls `$m!` with every operation of the `binary` kernel.
macro_rules! foreach_binary_op {
    ($m:ident) => {
        $m! {
            /// a + b
            Add = 0, BINARY_ADD;
            /// a - b
            Sub = 1, BINARY_SUB;
            /// a * b
            Mul = 2, BINARY_MUL;
            /// a / b
            Div = 3, BINARY_DIV;
            /// a ^ b
            Pow = 4, BINARY_POW;
            /// max(a, b)
            Max = 5, BINARY_MAX;
            /// min(a, b)
            Min = 6, BINARY_MIN;
        }
    };
}

/// The C `#define`s of a table's codes, as one string literal.
macro_rules! c_op_codes {
    ($($(#[$doc:meta])* $name:ident = $code:literal, $c:ident $(, $reads:ident)?;)*) => {
        concat!($("#define ", stringify!($c), " ", stringify!($code), "\n",)*)
    };
}

/// The C declarations of every code, as one string literal.
macro_rules! c_op_code_header {
    () => {
        concat!(
            "// Generated from runtime-min/src/cuda/op_codes.rs: the kernels' operation codes.\n",
            foreach_unary_op!(c_op_codes),
            foreach_binary_op!(c_op_codes),
        )
    };
}
