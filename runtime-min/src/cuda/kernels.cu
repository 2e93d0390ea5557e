// ralpc's CUDA kernels, compiled at run time with NVRTC for the device's architecture.
// GEMMs and convolutions go to cuBLAS and cuDNN; these are the rest of training: elementwise
// ops and their gradients, reductions, softmax and the loss, normalizations, pooling,
// im2col (convolution without cuDNN), resharding copies and the optimizer.
//
// Not compiled on its own: the UNARY_* and BINARY_* operation codes it names are
// `#define`s generated from runtime-min/src/cuda/op_codes.rs, and every kernel below is
// declared first by a prototype generated from runtime-min/src/cuda/kernel_table.rs (a
// definition whose parameter types or count differ from its row does not compile); both
// are put before it by kernels.rs for NVRTC and by cuda-host's build script for the host
// compiler.
//
// Conventions: f32 data, i64 labels and indices; sizes are long long; every kernel is a
// grid-stride loop over its outputs (any launch shape is correct), except the row kernels
// (softmax, layer norm, loss, channel statistics), which take one block per row and reduce
// with `block_sum` (blockDim.x a power of two, at most 1024).
//
// Kept in step with the CPU kernels (runtime-min/src/cpu/kernels.rs, ops.rs): GELU is the
// exact erf form, pooling follows ONNX's padding and count_include_pad, batch norm's
// variance is the biased one.

#define MAX_DIMS 6
// NVRTC has no <math.h>: -infinity by its bits.
#define NEG_INF (__int_as_float(0xff800000))

#define GRID_STRIDE(i, n) \
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
       i += (long long)blockDim.x * gridDim.x)

// Shapes and strides travel by value: launches pass this struct as one argument.
struct Strides {
  long long shape[MAX_DIMS];   // output shape (leading unused dims are 1)
  long long a[MAX_DIMS];       // element strides of operand a (0 where broadcast)
  long long b[MAX_DIMS];       // element strides of operand b (0 where broadcast)
};

// Offsets of output element `i` in a and b.
__device__ __forceinline__ void offsets(const Strides& s, long long i, long long* oa,
                                        long long* ob) {
  long long a = 0, b = 0;
  for (int d = MAX_DIMS - 1; d >= 0; --d) {
    long long n = s.shape[d];
    long long k = i % n;
    i /= n;
    a += k * s.a[d];
    b += k * s.b[d];
  }
  *oa = a;
  *ob = b;
}

// ---- elementwise, broadcasting ----------------------------------------------------------

// op: a BINARY_* code (op_codes.rs)
extern "C" __global__ void binary(float* out, const float* a, const float* b, Strides s,
                                  long long n, int op) {
  GRID_STRIDE(i, n) {
    long long oa, ob;
    offsets(s, i, &oa, &ob);
    float x = a[oa], y = b[ob], r;
    switch (op) {
      case BINARY_ADD: r = x + y; break;
      case BINARY_SUB: r = x - y; break;
      case BINARY_MUL: r = x * y; break;
      case BINARY_DIV: r = x / y; break;
      case BINARY_POW: r = powf(x, y); break;
      case BINARY_MAX: r = fmaxf(x, y); break;
      case BINARY_MIN: r = fminf(x, y); break;
      default: r = nanf(""); break;
    }
    out[i] = r;
  }
}

// Copies a strided view of `src` (strides in Strides::a) into contiguous `dst`: transposes,
// slices, the pieces of a resharding, broadcasts (stride 0).
extern "C" __global__ void gather_strided(float* dst, const float* src, Strides s,
                                          long long src_offset, long long n) {
  GRID_STRIDE(i, n) {
    long long oa, ob;
    offsets(s, i, &oa, &ob);
    dst[i] = src[src_offset + oa];
  }
}

// Writes contiguous `src` into a strided view of `dst` (strides in Strides::a); with
// `accumulate`, adds instead (the gradient of a broadcast or of overlapping reads).
extern "C" __global__ void scatter_strided(float* dst, const float* src, Strides s,
                                           long long dst_offset, long long n, int accumulate) {
  GRID_STRIDE(i, n) {
    long long oa, ob;
    offsets(s, i, &oa, &ob);
    if (accumulate) {
      atomicAdd(&dst[dst_offset + oa], src[i]);
    } else {
      dst[dst_offset + oa] = src[i];
    }
  }
}

__device__ __forceinline__ float gelu(float x) {
  return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
}

// GELU's tanh approximation: Φ(x) ≈ (1 + tanh(√(2/π)·(x + 0.044715·x³))) / 2.
__device__ __forceinline__ float gelu_tanh_cdf(float x, float* pdf) {
  const float k = 0.79788456080286536f;
  float u = k * (x + 0.044715f * x * x * x);
  float t = tanhf(u);
  *pdf = 0.5f * (1.0f - t * t) * k * (1.0f + 3.0f * 0.044715f * x * x);
  return 0.5f * (1.0f + t);
}

// ln(1 + e^x) without overflow for large x.
__device__ __forceinline__ float softplus(float x) {
  return fmaxf(x, 0.0f) + log1pf(expf(-fabsf(x)));
}

// op: a UNARY_* code (op_codes.rs, where each is defined)
extern "C" __global__ void unary(float* out, const float* x, long long n, int op, float alpha,
                                 float beta) {
  GRID_STRIDE(i, n) {
    float v = x[i], r;
    switch (op) {
      case UNARY_RELU: r = fmaxf(v, 0.0f); break;
      case UNARY_SIGMOID: r = 1.0f / (1.0f + expf(-v)); break;
      case UNARY_TANH: r = tanhf(v); break;
      case UNARY_GELU: r = gelu(v); break;
      case UNARY_EXP: r = expf(v); break;
      case UNARY_LOG: r = logf(v); break;
      case UNARY_SQRT: r = sqrtf(v); break;
      case UNARY_NEG: r = -v; break;
      case UNARY_ABS: r = fabsf(v); break;
      case UNARY_LEAKY_RELU: r = v >= 0.0f ? v : alpha * v; break;
      case UNARY_CLIP: r = fminf(fmaxf(v, alpha), beta); break;
      case UNARY_HARD_SIGMOID: r = fminf(fmaxf(alpha * v + beta, 0.0f), 1.0f); break;
      case UNARY_SILU: r = v / (1.0f + expf(-v)); break;
      case UNARY_RECIPROCAL: r = 1.0f / v; break;
      case UNARY_ELU: r = v >= 0.0f ? v : alpha * (expf(v) - 1.0f); break;
      case UNARY_ERF: r = erff(v); break;
      case UNARY_GELU_TANH: {
        float pdf;
        r = v * gelu_tanh_cdf(v, &pdf);
        break;
      }
      case UNARY_SCALE: r = alpha * v; break;
      case UNARY_SOFTPLUS: r = softplus(v); break;
      case UNARY_SOFTSIGN: r = v / (1.0f + fabsf(v)); break;
      case UNARY_MISH: r = v * tanhf(softplus(v)); break;
      case UNARY_SELU: r = beta * (v > 0.0f ? v : alpha * expm1f(v)); break;
      case UNARY_CELU: r = fmaxf(v, 0.0f) + fminf(alpha * expm1f(v / alpha), 0.0f); break;
      case UNARY_HARD_SWISH: r = v * fminf(fmaxf(v / 6.0f + 0.5f, 0.0f), 1.0f); break;
      default: r = nanf(""); break;
    }
    out[i] = r;
  }
}

// dx from dy and the forward's input x, or its output y for the codes op_codes.rs marks
// `output` (relu, sigmoid, tanh, exp, sqrt, reciprocal); the same codes as `unary`.
extern "C" __global__ void unary_backward(float* dx, const float* dy, const float* saved,
                                          long long n, int op, float alpha, float beta) {
  GRID_STRIDE(i, n) {
    float g = dy[i], v = saved[i], r;
    switch (op) {
      case UNARY_RELU: r = v > 0.0f ? g : 0.0f; break;
      case UNARY_SIGMOID: r = g * v * (1.0f - v); break;
      case UNARY_TANH: r = g * (1.0f - v * v); break;
      case UNARY_GELU: {
        float cdf = 0.5f * (1.0f + erff(v * 0.70710678118654752f));
        float pdf = 0.39894228040143268f * expf(-0.5f * v * v);
        r = g * (cdf + v * pdf);
        break;
      }
      case UNARY_EXP: r = g * v; break;
      case UNARY_LOG: r = g / v; break;
      case UNARY_SQRT: r = g * 0.5f / v; break;
      case UNARY_NEG: r = -g; break;
      case UNARY_ABS: r = v > 0.0f ? g : (v < 0.0f ? -g : 0.0f); break;
      case UNARY_LEAKY_RELU: r = v >= 0.0f ? g : alpha * g; break;
      case UNARY_CLIP: r = (v >= alpha && v <= beta) ? g : 0.0f; break;
      case UNARY_HARD_SIGMOID: {
        float t = alpha * v + beta;
        r = (t > 0.0f && t < 1.0f) ? alpha * g : 0.0f;
        break;
      }
      case UNARY_SILU: {
        float s = 1.0f / (1.0f + expf(-v));
        r = g * s * (1.0f + v * (1.0f - s));
        break;
      }
      case UNARY_RECIPROCAL: r = -g * v * v; break;
      case UNARY_ELU: r = v >= 0.0f ? g : g * alpha * expf(v); break;
      case UNARY_ERF: r = g * 1.12837916709551257f * expf(-v * v); break;
      case UNARY_GELU_TANH: {
        float pdf, cdf = gelu_tanh_cdf(v, &pdf);
        r = g * (cdf + v * pdf);
        break;
      }
      case UNARY_SCALE: r = alpha * g; break;
      case UNARY_SOFTPLUS: r = g / (1.0f + expf(-v)); break;
      case UNARY_SOFTSIGN: {
        float d = 1.0f + fabsf(v);
        r = g / (d * d);
        break;
      }
      case UNARY_MISH: {
        // d/dx x·tanh(sp(x)) = tanh(sp) + x·(1 − tanh²(sp))·sigmoid(x).
        float t = tanhf(softplus(v));
        r = g * (t + v * (1.0f - t * t) / (1.0f + expf(-v)));
        break;
      }
      case UNARY_SELU: r = g * beta * (v > 0.0f ? 1.0f : alpha * expf(v)); break;
      case UNARY_CELU: r = v > 0.0f ? g : g * expf(v / alpha); break;
      case UNARY_HARD_SWISH:
        r = v < -3.0f ? 0.0f : (v > 3.0f ? g : g * (2.0f * v + 3.0f) / 6.0f);
        break;
      default: r = nanf(""); break;
    }
    dx[i] = r;
  }
}

extern "C" __global__ void fill(float* out, long long n, float value) {
  GRID_STRIDE(i, n) { out[i] = value; }
}

// out = alpha * x + beta * out
extern "C" __global__ void axpby(float* out, const float* x, long long n, float alpha,
                                 float beta) {
  GRID_STRIDE(i, n) { out[i] = alpha * x[i] + beta * out[i]; }
}

// ---- reductions -------------------------------------------------------------------------

// Sum of `v` over the block, returned to every thread. `scratch` holds blockDim.x floats.
__device__ float block_sum(float v, float* scratch) {
  scratch[threadIdx.x] = v;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) scratch[threadIdx.x] += scratch[threadIdx.x + s];
    __syncthreads();
  }
  float total = scratch[0];
  __syncthreads();
  return total;
}

__device__ float block_max(float v, float* scratch) {
  scratch[threadIdx.x] = v;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) scratch[threadIdx.x] = fmaxf(scratch[threadIdx.x], scratch[threadIdx.x + s]);
    __syncthreads();
  }
  float m = scratch[0];
  __syncthreads();
  return m;
}

// x viewed as [outer, n, inner]: out[o, j] = sum (or mean) over the middle axis. One thread
// per output, summing in index order (deterministic).
extern "C" __global__ void reduce_axis(float* out, const float* x, long long outer, long long n,
                                       long long inner, int mean) {
  GRID_STRIDE(i, outer * inner) {
    long long o = i / inner, j = i % inner;
    const float* p = x + o * n * inner + j;
    float acc = 0.0f;
    for (long long k = 0; k < n; ++k) acc += p[k * inner];
    out[i] = mean ? acc / (float)n : acc;
  }
}

// ---- softmax and the loss ---------------------------------------------------------------

// A row's max `m` and sum of exp(x - m) over its `n` entries, to every thread of the block.
__device__ void row_max_sum_exp(const float* xr, long long n, float* scratch, float* m,
                                float* s) {
  float mx = NEG_INF;
  for (long long k = threadIdx.x; k < n; k += blockDim.x) mx = fmaxf(mx, xr[k]);
  mx = block_max(mx, scratch);
  float sum = 0.0f;
  for (long long k = threadIdx.x; k < n; k += blockDim.x) sum += expf(xr[k] - mx);
  *m = mx;
  *s = block_sum(sum, scratch);
}

// Row-wise softmax of x [rows, n]; one block per row; shared memory blockDim.x floats.
extern "C" __global__ void softmax_rows(float* y, const float* x, long long rows, long long n,
                                       int log_space) {
  extern __shared__ float scratch[];
  for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    float m, s;
    row_max_sum_exp(xr, n, scratch, &m, &s);
    float ls = logf(s);
    for (long long k = threadIdx.x; k < n; k += blockDim.x)
      yr[k] = log_space ? xr[k] - m - ls : expf(xr[k] - m) / s;
  }
}

// dx = y * (dy - sum(dy * y)) per row (softmax); for log-softmax dx = dy - exp(y) * sum(dy).
extern "C" __global__ void softmax_rows_backward(float* dx, const float* dy, const float* y,
                                                long long rows, long long n, int log_space) {
  extern __shared__ float scratch[];
  for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* g = dy + r * n;
    const float* yr = y + r * n;
    float s = 0.0f;
    for (long long k = threadIdx.x; k < n; k += blockDim.x) s += log_space ? g[k] : g[k] * yr[k];
    s = block_sum(s, scratch);
    for (long long k = threadIdx.x; k < n; k += blockDim.x)
      dx[r * n + k] = log_space ? g[k] - expf(yr[k]) * s : yr[k] * (g[k] - s);
  }
}

// Softmax cross-entropy of logits [rows, n] against class labels: loss[r] is row r's loss
// divided by `total_rows` (the global batch, so shares of a split batch add up), and
// dlogits = (softmax - onehot) / total_rows.
extern "C" __global__ void cross_entropy(float* loss, float* dlogits, const float* logits,
                                         const long long* labels, long long rows, long long n,
                                         long long total_rows) {
  extern __shared__ float scratch[];
  for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = logits + r * n;
    float m, s;
    row_max_sum_exp(xr, n, scratch, &m, &s);
    long long label = labels[r];
    float scale = 1.0f / (float)total_rows;
    for (long long k = threadIdx.x; k < n; k += blockDim.x)
      dlogits[r * n + k] = (expf(xr[k] - m) / s - (k == label ? 1.0f : 0.0f)) * scale;
    if (threadIdx.x == 0) {
      float picked = (label >= 0 && label < n) ? xr[label] : m;
      loss[r] = (m + logf(s) - picked) * scale;
    }
  }
}

// One class piece of logits [rows, n] (a vocabulary-parallel head's classes first..first+n):
// per row its max, the sum of exp(x - max) and the label's logit (0 when the label is another
// piece's), stats[3r..3r+3]: what every piece of the row exchanges for its loss.
extern "C" __global__ void class_stats(float* stats, const float* logits,
                                       const long long* labels, long long rows, long long n,
                                       long long first) {
  extern __shared__ float scratch[];
  for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = logits + r * n;
    float m, s;
    row_max_sum_exp(xr, n, scratch, &m, &s);
    if (threadIdx.x == 0) {
      long long j = labels[r] - first;
      stats[3 * r] = m;
      stats[3 * r + 1] = s;
      stats[3 * r + 2] = (j >= 0 && j < n) ? xr[j] : 0.0f;
    }
  }
}

// The logits gradient of one class piece from each row's log-sum-exp over every piece:
// dlogits = (exp(x - lse) - onehot) / scale.
extern "C" __global__ void class_piece_grad(float* dlogits, const float* logits,
                                            const float* lse, const long long* labels,
                                            long long rows, long long n, long long first,
                                            float scale) {
  GRID_STRIDE(i, rows * n) {
    long long r = i / n, k = i % n;
    float hot = (first + k == labels[r]) ? 1.0f : 0.0f;
    dlogits[i] = (expf(logits[i] - lse[r]) - hot) / scale;
  }
}

// Mean squared error over all elements of the global output (`total` of them):
// loss[i] = (x - t)^2 / total, dx = 2 (x - t) / total.
extern "C" __global__ void mse(float* loss, float* dx, const float* x, const float* target,
                               long long n, long long total) {
  GRID_STRIDE(i, n) {
    float d = x[i] - target[i];
    loss[i] = d * d / (float)total;
    dx[i] = 2.0f * d / (float)total;
  }
}

// ---- normalization ----------------------------------------------------------------------

// Layer norm over the last `n` elements of each of `rows` rows; saves mean and 1/std.
extern "C" __global__ void layer_norm(float* y, float* mean_out, float* rstd_out, const float* x,
                                      const float* gamma, const float* beta, long long rows,
                                      long long n, float eps) {
  extern __shared__ float scratch[];
  for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + r * n;
    float s = 0.0f;
    for (long long k = threadIdx.x; k < n; k += blockDim.x) s += xr[k];
    float mean = block_sum(s, scratch) / (float)n;
    float v = 0.0f;
    for (long long k = threadIdx.x; k < n; k += blockDim.x) {
      float d = xr[k] - mean;
      v += d * d;
    }
    float rstd = rsqrtf(block_sum(v, scratch) / (float)n + eps);
    for (long long k = threadIdx.x; k < n; k += blockDim.x) {
      float h = (xr[k] - mean) * rstd;
      y[r * n + k] = h * (gamma ? gamma[k] : 1.0f) + (beta ? beta[k] : 0.0f);
    }
    if (threadIdx.x == 0) {
      mean_out[r] = mean;
      rstd_out[r] = rstd;
    }
  }
}

// dx of layer norm (dgamma, dbeta come from reduce_axis over rows of dy*xhat and dy).
extern "C" __global__ void layer_norm_backward(float* dx, const float* dy, const float* x,
                                               const float* gamma, const float* mean,
                                               const float* rstd, long long rows, long long n) {
  extern __shared__ float scratch[];
  for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + r * n;
    const float* g = dy + r * n;
    float mu = mean[r], rs = rstd[r];
    float s1 = 0.0f, s2 = 0.0f;
    for (long long k = threadIdx.x; k < n; k += blockDim.x) {
      float gh = g[k] * (gamma ? gamma[k] : 1.0f);
      s1 += gh;
      s2 += gh * (xr[k] - mu) * rs;
    }
    s1 = block_sum(s1, scratch) / (float)n;
    s2 = block_sum(s2, scratch) / (float)n;
    for (long long k = threadIdx.x; k < n; k += blockDim.x) {
      float gh = g[k] * (gamma ? gamma[k] : 1.0f);
      float h = (xr[k] - mu) * rs;
      dx[r * n + k] = rs * (gh - s1 - h * s2);
    }
  }
}

// Per-channel mean and 1/std of x [batch, channels, spatial]; one block per channel.
extern "C" __global__ void channel_stats(float* mean_out, float* rstd_out, const float* x,
                                         long long batch, long long channels, long long spatial,
                                         float eps) {
  extern __shared__ float scratch[];
  long long count = batch * spatial;
  for (long long c = blockIdx.x; c < channels; c += gridDim.x) {
    float s = 0.0f;
    for (long long k = threadIdx.x; k < count; k += blockDim.x)
      s += x[(k / spatial) * channels * spatial + c * spatial + k % spatial];
    float mean = block_sum(s, scratch) / (float)count;
    float v = 0.0f;
    for (long long k = threadIdx.x; k < count; k += blockDim.x) {
      float d = x[(k / spatial) * channels * spatial + c * spatial + k % spatial] - mean;
      v += d * d;
    }
    float var = block_sum(v, scratch) / (float)count;
    if (threadIdx.x == 0) {
      mean_out[c] = mean;
      rstd_out[c] = rsqrtf(var + eps);
    }
  }
}

// y = (x - mean[c]) * rstd[c] * gamma[c] + beta[c] for x [batch, channels, spatial]. With
// `running_var`, rstd is 1/sqrt(running_var + eps) (inference mode).
extern "C" __global__ void channel_affine(float* y, const float* x, const float* mean,
                                          const float* rstd, const float* gamma,
                                          const float* beta, long long channels,
                                          long long spatial, long long n, int rstd_is_var,
                                          float eps) {
  GRID_STRIDE(i, n) {
    long long c = (i / spatial) % channels;
    float r = rstd_is_var ? rsqrtf(rstd[c] + eps) : rstd[c];
    y[i] = (x[i] - mean[c]) * r * gamma[c] + beta[c];
  }
}

// Batch norm (training) backward: per channel, dgamma = sum(dy * xhat), dbeta = sum(dy),
// dx = gamma * rstd / count * (count * dy - dbeta - xhat * dgamma). One block per channel.
extern "C" __global__ void batch_norm_backward(float* dx, float* dgamma, float* dbeta,
                                               const float* dy, const float* x,
                                               const float* mean, const float* rstd,
                                               const float* gamma, long long batch,
                                               long long channels, long long spatial) {
  extern __shared__ float scratch[];
  long long count = batch * spatial;
  for (long long c = blockIdx.x; c < channels; c += gridDim.x) {
    float mu = mean[c], rs = rstd[c];
    float sg = 0.0f, sgh = 0.0f;
    for (long long k = threadIdx.x; k < count; k += blockDim.x) {
      long long i = (k / spatial) * channels * spatial + c * spatial + k % spatial;
      sg += dy[i];
      sgh += dy[i] * (x[i] - mu) * rs;
    }
    sg = block_sum(sg, scratch);
    sgh = block_sum(sgh, scratch);
    for (long long k = threadIdx.x; k < count; k += blockDim.x) {
      long long i = (k / spatial) * channels * spatial + c * spatial + k % spatial;
      float h = (x[i] - mu) * rs;
      dx[i] = gamma[c] * rs / (float)count * ((float)count * dy[i] - sg - h * sgh);
    }
    if (threadIdx.x == 0) {
      dgamma[c] = sgh;
      dbeta[c] = sg;
    }
  }
}

// ---- pooling and im2col (2-d windows over planes = N*C, or one image's channels) --------

// The geometry of a window op, as the CPU backend's Pool2d.
struct Window {
  long long planes, h, w;         // input planes and size
  long long oh, ow;               // output size
  long long kh, kw, sh, sw;       // kernel, strides
  long long pt, pl, pb, pr;       // pads: top, left, bottom, right
  long long dh, dw;               // dilations
};

// Where a window tap lands on one axis: 0 an input element, 1 the declared padding, 2
// beyond it (a ceil-mode window overhanging the padded input).
__device__ __forceinline__ int tap(long long at, long long size, long long pad_end) {
  return (at >= 0 && at < size) ? 0 : (at < size + pad_end ? 1 : 2);
}

// Calls visit(input index or -1 for padding, is_input) for every tap of output `o` that is
// not beyond the padding.
#define FOR_EACH_TAP(g, o, body)                                                      \
  {                                                                                   \
    long long ox_ = (o) % (g).ow, oy_ = ((o) / (g).ow) % (g).oh;                      \
    long long plane_ = (o) / ((g).ow * (g).oh);                                       \
    for (long long ky_ = 0; ky_ < (g).kh; ++ky_) {                                    \
      long long iy_ = oy_ * (g).sh + ky_ * (g).dh - (g).pt;                           \
      int ty_ = tap(iy_, (g).h, (g).pb);                                              \
      for (long long kx_ = 0; kx_ < (g).kw; ++kx_) {                                  \
        long long ix_ = ox_ * (g).sw + kx_ * (g).dw - (g).pl;                         \
        int tx_ = tap(ix_, (g).w, (g).pr);                                            \
        if (ty_ == 2 || tx_ == 2) continue;                                           \
        bool inside = ty_ == 0 && tx_ == 0;                                           \
        long long at = inside ? (plane_ * (g).h + iy_) * (g).w + ix_ : -1;            \
        body                                                                          \
      }                                                                               \
    }                                                                                 \
  }

// Max pooling; saves the flat input index of each maximum (0 for a window of padding
// only, whose output is -infinity, as on the CPU).
extern "C" __global__ void max_pool(float* y, long long* argmax, const float* x, Window g) {
  GRID_STRIDE(i, g.planes * g.oh * g.ow) {
    float best = NEG_INF;
    long long best_at = 0;
    FOR_EACH_TAP(g, i, {
      if (inside && x[at] > best) {
        best = x[at];
        best_at = at;
      }
    })
    y[i] = best;
    argmax[i] = best_at;
  }
}

// Calls body with `o`, each output whose window reads input element `j` (plane, iy, ix):
// the inverse of FOR_EACH_TAP, visited in a fixed order so that sums are deterministic.
#define FOR_EACH_WINDOW_OF(g, j, body)                                                \
  {                                                                                   \
    long long ix_ = (j) % (g).w, iy_ = ((j) / (g).w) % (g).h;                         \
    long long plane_ = (j) / ((g).w * (g).h);                                         \
    for (long long ky_ = 0; ky_ < (g).kh; ++ky_) {                                    \
      long long ty_ = iy_ + (g).pt - ky_ * (g).dh;                                    \
      if (ty_ < 0 || ty_ % (g).sh != 0 || ty_ / (g).sh >= (g).oh) continue;          \
      for (long long kx_ = 0; kx_ < (g).kw; ++kx_) {                                  \
        long long tx_ = ix_ + (g).pl - kx_ * (g).dw;                                  \
        if (tx_ < 0 || tx_ % (g).sw != 0 || tx_ / (g).sw >= (g).ow) continue;        \
        long long o = (plane_ * (g).oh + ty_ / (g).sh) * (g).ow + tx_ / (g).sw;       \
        body                                                                          \
      }                                                                               \
    }                                                                                 \
  }

// Adds to each input the gradients of the outputs that took it as their maximum. Each
// input gathers its own sum (no atomics): deterministic.
extern "C" __global__ void max_pool_backward(float* dx, const float* dy, const long long* argmax,
                                             Window g) {
  GRID_STRIDE(j, g.planes * g.h * g.w) {
    float s = 0.0f;
    FOR_EACH_WINDOW_OF(g, j, {
      if (argmax[o] == j) s += dy[o];
    })
    dx[j] += s;
  }
}

// The average's divisor: input taps, plus padding taps when `count_pad` (ONNX
// count_include_pad); taps beyond the padding never count.
__device__ __forceinline__ float pool_divisor(const Window& g, long long o, int count_pad) {
  float d = 0.0f;
  FOR_EACH_TAP(g, o, {
    if (inside || count_pad) d += 1.0f;
    (void)at;
  })
  return fmaxf(d, 1.0f);
}

extern "C" __global__ void avg_pool(float* y, const float* x, Window g, int count_pad) {
  GRID_STRIDE(i, g.planes * g.oh * g.ow) {
    float s = 0.0f;
    FOR_EACH_TAP(g, i, {
      if (inside) s += x[at];
    })
    y[i] = s / pool_divisor(g, i, count_pad);
  }
}

// Adds to each input its share of every window that averaged it (gathered, deterministic).
extern "C" __global__ void avg_pool_backward(float* dx, const float* dy, Window g,
                                             int count_pad) {
  GRID_STRIDE(j, g.planes * g.h * g.w) {
    float s = 0.0f;
    FOR_EACH_WINDOW_OF(g, j, {
      s += dy[o] / pool_divisor(g, o, count_pad);
    })
    dx[j] += s;
  }
}

// im2col of `images` consecutive images ([g.planes channels, h, w] each, from `offset`) → cols
// [images, planes * kh * kw, oh * ow]: convolution as (batched) GEMM where cuDNN is absent.
extern "C" __global__ void im2col(float* cols, const float* images_at, long long offset, Window g,
                                  long long images) {
  const float* image = images_at + offset;
  long long spatial = g.oh * g.ow, rows = g.planes * g.kh * g.kw;
  GRID_STRIDE(i, images * rows * spatial) {
    long long p = i % spatial, row = (i / spatial) % rows, n = i / (spatial * rows);
    long long kx = row % g.kw, ky = (row / g.kw) % g.kh, c = row / (g.kw * g.kh);
    long long oy = p / g.ow, ox = p % g.ow;
    long long iy = oy * g.sh - g.pt + ky * g.dh, ix = ox * g.sw - g.pl + kx * g.dw;
    cols[i] = (iy >= 0 && iy < g.h && ix >= 0 && ix < g.w)
                  ? image[((n * g.planes + c) * g.h + iy) * g.w + ix]
                  : 0.0f;
  }
}

// The adjoint of im2col: adds cols back into the images' gradient, each pixel gathering
// its own sum (no atomics): deterministic.
extern "C" __global__ void col2im(float* images_at, long long offset, const float* cols, Window g,
                                  long long images) {
  float* image = images_at + offset;
  long long spatial = g.oh * g.ow, rows = g.planes * g.kh * g.kw;
  long long pixels = g.planes * g.h * g.w;
  GRID_STRIDE(i, images * pixels) {
    long long n = i / pixels, j = i % pixels, c = j / (g.h * g.w);
    const float* colsn = cols + n * rows * spatial;
    float s = 0.0f;
    FOR_EACH_WINDOW_OF(g, j, {
      long long row = (c * g.kh + ky_) * g.kw + kx_;
      s += colsn[row * spatial + (o % spatial)];
    })
    image[i] += s;
  }
}

// ---- the optimizer ----------------------------------------------------------------------

// SGD with momentum, as the CPU backend: v = momentum * v + g; w -= lr * v.
extern "C" __global__ void sgd_momentum(float* w, float* velocity, const float* grad, long long n,
                                        float lr, float momentum) {
  GRID_STRIDE(i, n) {
    float v = momentum * velocity[i] + grad[i];
    velocity[i] = v;
    w[i] -= lr * v;
  }
}
