// The speculative decode tail's conv and state recurrence on CPU, each in one pass over the
// step's rows (cpu_kernels.py builds and loads them): the effects of cpu.py's PyTorch conv and
// recurrence, which take about ten tensor ops a layer each where a step's few rows make each
// op's fixed cost the whole cost.
//
// speculative_conv. Per row: its conv state's columns (vLLM's speculative layout: width - 2 + K columns), the
// window of width - 1 columns its previous step accepted (from column accepted - 1), then
// its K tokens. Token k's taps: the window's columns and the row's earlier tokens as the
// state stores them, the token itself as it arrives; silu of the fp32 sum. The rolled state:
// the window but its first column, then the tokens; a padded token's column (k >= the row's
// token count) keeps its value.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace {

template <typename state_t>
void conv_rows(const at::Tensor& xbc, const at::Tensor& by_slot, const float* taps_by_channel,
               const float* bias, const int64_t* slots, const int64_t* counts, float* out,
               int64_t width) {
  const int64_t n = xbc.size(0), K = xbc.size(1), dim = xbc.size(2);
  const int64_t columns = by_slot.size(1);
  const int64_t xs0 = xbc.stride(0), xs1 = xbc.stride(1), xs2 = xbc.stride(2);
  const int64_t ss0 = by_slot.stride(0), ss1 = by_slot.stride(1), ss2 = by_slot.stride(2);
  const float* x = xbc.data_ptr<float>();
  state_t* state = by_slot.data_ptr<state_t>();
  const int64_t* accepted = counts;
  const int64_t* lens = counts + n;
  // a step's few rows on the calling thread (a second thread costs more than it saves)
  const int64_t grain = std::max<int64_t>(1, 32768 / (dim * (K + columns)));
  at::parallel_for(0, n, grain, [&](int64_t begin, int64_t end) {
    // a row's state columns, then its tokens as stored (fp32); its tokens as they arrive;
    // its rolled state
    std::vector<float> stored((columns + K) * dim), arriving(K * dim), rolled(columns * dim);
    for (int64_t i = begin; i < end; ++i) {
      state_t* row = state + slots[i] * ss0;
      for (int64_t c = 0; c < columns; ++c) {
        const state_t* src = row + c * ss1;
        float* dst = &stored[c * dim];
        if (ss2 == 1) {
          for (int64_t d = 0; d < dim; ++d) dst[d] = static_cast<float>(src[d]);
        } else {
          for (int64_t d = 0; d < dim; ++d) dst[d] = static_cast<float>(src[d * ss2]);
        }
      }
      const float* xi = x + i * xs0;
      for (int64_t k = 0; k < K; ++k) {
        const float* src = xi + k * xs1;
        float* a = &arriving[k * dim];
        float* s = &stored[(columns + k) * dim];
        if (xs2 == 1) {
          for (int64_t d = 0; d < dim; ++d) a[d] = src[d];
        } else {
          for (int64_t d = 0; d < dim; ++d) a[d] = src[d * xs2];
        }
        for (int64_t d = 0; d < dim; ++d) s[d] = static_cast<float>(static_cast<state_t>(a[d]));
      }
      // the row's history: j < width - 1 the window's column j, then its tokens as stored
      const int64_t first = accepted[i] - 1;
      auto history = [&](int64_t j) -> const float* {
        return j < width - 1 ? &stored[(first + j) * dim] : &stored[(columns + j - (width - 1)) * dim];
      };
      float* oi = out + i * K * dim;
      const float* last_tap = taps_by_channel + (width - 1) * dim;
      for (int64_t k = 0; k < K; ++k) {
        float* o = oi + k * dim;
        for (int64_t d = 0; d < dim; ++d) o[d] = bias ? bias[d] : 0.f;
        for (int64_t tap = 0; tap < width - 1; ++tap) {
          const float* h = history(k + tap);
          const float* w = taps_by_channel + tap * dim;
          for (int64_t d = 0; d < dim; ++d) o[d] += h[d] * w[d];
        }
        const float* a = &arriving[k * dim];
        for (int64_t d = 0; d < dim; ++d) o[d] += a[d] * last_tap[d];
      }
      // every read of the row's state is done: the rolled state goes back in place
      for (int64_t c = 0; c < columns; ++c) {
        const bool kept = c < width - 2 || c - (width - 2) < lens[i];
        const float* src = kept ? history(c + 1) : &stored[c * dim];
        std::copy(src, src + dim, &rolled[c * dim]);
      }
      for (int64_t c = 0; c < columns; ++c) {
        state_t* dst = row + c * ss1;
        const float* src = &rolled[c * dim];
        if (ss2 == 1) {
          for (int64_t d = 0; d < dim; ++d) dst[d] = static_cast<state_t>(src[d]);
        } else {
          for (int64_t d = 0; d < dim; ++d) dst[d * ss2] = static_cast<state_t>(src[d]);
        }
      }
    }
  });
}

// xbc (rows, K, channels): each row's tokens; conv_state (slots, channels, width - 2 + K);
// weight (channels, width); bias (channels) or none; slots (rows,): each row's conv state
// slot; counts (2, rows): the tokens each row accepted at its previous step, then its tokens
// now. Returns silu(conv) (rows, K, channels) in xbc's dtype; rolls the rows' states in place.
at::Tensor speculative_conv(const at::Tensor& xbc, const at::Tensor& conv_state,
                            const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                            const at::Tensor& slots, const at::Tensor& counts) {
  TORCH_CHECK(xbc.dim() == 3, "speculative_conv: xbc must be (rows, tokens, channels), got ",
              xbc.sizes());
  TORCH_CHECK(conv_state.dim() == 3 && weight.dim() == 2,
              "speculative_conv: conv_state must be (slots, channels, columns) and weight "
              "(channels, width), got ", conv_state.sizes(), " and ", weight.sizes());
  const int64_t n = xbc.size(0), K = xbc.size(1), dim = xbc.size(2), width = weight.size(1);
  const int64_t num_slots = conv_state.size(0), columns = conv_state.size(2);
  TORCH_CHECK(conv_state.size(1) == dim && weight.size(0) == dim,
              "speculative_conv: ", dim, " channels in xbc, ", conv_state.size(1),
              " in conv_state, ", weight.size(0), " in weight");
  TORCH_CHECK(width >= 2 && columns == width - 2 + K,
              "speculative_conv: a conv of width ", width, " over ", K,
              " tokens a row needs a conv state of ", width - 2 + K, " columns, got ", columns);
  TORCH_CHECK(!bias.has_value() || (bias->dim() == 1 && bias->size(0) == dim),
              "speculative_conv: bias must have ", dim, " channels");
  TORCH_CHECK(slots.dim() == 1 && slots.size(0) == n && counts.dim() == 2 &&
                  counts.size(0) == 2 && counts.size(1) == n,
              "speculative_conv: slots must be (", n, ",) and counts (2, ", n, "), got ",
              slots.sizes(), " and ", counts.sizes());
  auto slot_list = slots.to(at::kLong).contiguous();
  auto count_list = counts.to(at::kLong).contiguous();
  const int64_t* s = slot_list.data_ptr<int64_t>();
  const int64_t* c = count_list.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK(s[i] >= 0 && s[i] < num_slots, "speculative_conv: row ", i, "'s slot ", s[i],
                " is outside the conv state's ", num_slots, " slots");
    TORCH_CHECK(c[i] >= 1 && c[i] <= K && c[n + i] >= 1 && c[n + i] <= K,
                "speculative_conv: row ", i, " accepted ", c[i], " and has ", c[n + i],
                " tokens; each must be 1 to ", K);
  }
  auto x = xbc.to(at::kFloat);
  auto taps_by_channel = weight.to(at::kFloat).t().contiguous();  // (width, channels)
  at::Tensor b;
  if (bias.has_value()) b = bias->to(at::kFloat).contiguous();
  auto out = at::empty({n, K, dim}, xbc.options().dtype(at::kFloat));
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, conv_state.scalar_type(), "speculative_conv", [&] {
        conv_rows<scalar_t>(x, conv_state.transpose(1, 2), taps_by_channel.data_ptr<float>(),
                            b.defined() ? b.data_ptr<float>() : nullptr, s, c,
                            out.data_ptr<float>(), width);
      });
  at::silu_(out);
  return out.scalar_type() == xbc.scalar_type() ? out : out.to(xbc.scalar_type());
}


// speculative_state_update. Per row and head: the state read from the row's source slot (in
// fp32), advanced over the row's tokens: dt = softplus(dt + dt_bias), s = s * exp(A dt) +
// dt x B, y = s . C + D x, gated by silu(z) where z is given; after each token the state is
// stored to the token's slot (not the null slot) in the state's dtype, and the next token
// goes on from the value stored.
template <typename state_t>
void recurrence_rows(const at::Tensor& conv, const float* dt, const float* A, const float* D,
                     const float* dt_bias, const float* z, state_t* state, int64_t per_slot,
                     const int64_t* table, int64_t null_slot, float* y, int64_t nheads,
                     int64_t head_dim, int64_t d_state, int64_t ngroups) {
  const int64_t n = conv.size(0), K = conv.size(1), conv_dim = conv.size(2);
  const int64_t inner = nheads * head_dim;
  const int64_t heads_per_group = nheads / ngroups;
  const float* c = conv.data_ptr<float>();
  const int64_t per_item = K * head_dim * d_state;
  // a step's few rows on the calling thread (a second thread costs more than it saves)
  const int64_t grain = std::max<int64_t>(1, 262144 / per_item);
  at::parallel_for(0, n * nheads, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> s(head_dim * d_state);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t i = item / nheads, h = item % nheads, g = h / heads_per_group;
      const int64_t* row = table + i * (3 + K);  // first token, tokens, source slot, slots
      const int64_t first = row[0], tokens = row[1];
      const state_t* src = state + row[2] * per_slot + h * head_dim * d_state;
      for (int64_t e = 0; e < head_dim * d_state; ++e) s[e] = static_cast<float>(src[e]);
      for (int64_t k = 0; k < tokens; ++k) {
        const int64_t t = first + k;
        const float raw = dt[t * nheads + h] + dt_bias[h];
        const float step = raw > 20.f ? raw : std::log1p(std::exp(raw));
        const float decay = std::exp(A[h] * step);
        const float* xk = c + (i * K + k) * conv_dim + h * head_dim;
        const float* Bk = c + (i * K + k) * conv_dim + inner + g * d_state;
        const float* Ck = Bk + ngroups * d_state;
        const int64_t slot = row[3 + k];
        state_t* dst = slot == null_slot ? nullptr : state + slot * per_slot + h * head_dim * d_state;
        for (int64_t p = 0; p < head_dim; ++p) {
          float* sp = &s[p * d_state];
          const float dtx = step * xk[p];
          float acc = 0.f;
          if (dst != nullptr) {  // stored, and the next token goes on from the value stored
            state_t* dp = dst + p * d_state;
#pragma omp simd reduction(+ : acc)
            for (int64_t m = 0; m < d_state; ++m) {
              const float v = sp[m] * decay + dtx * Bk[m];
              acc += v * Ck[m];
              dp[m] = static_cast<state_t>(v);
              sp[m] = static_cast<float>(dp[m]);
            }
          } else {  // not stored: the next token still goes on from the state's format
#pragma omp simd reduction(+ : acc)
            for (int64_t m = 0; m < d_state; ++m) {
              const float v = sp[m] * decay + dtx * Bk[m];
              acc += v * Ck[m];
              sp[m] = static_cast<float>(static_cast<state_t>(v));
            }
          }
          float out = acc + D[h] * xk[p];
          if (z != nullptr) {
            const float zv = z[t * inner + h * head_dim + p];
            out *= zv / (1.f + std::exp(-zv));
          }
          y[t * inner + h * head_dim + p] = out;
        }
      }
    }
  });
}

// conv (rows, K, conv_dim): speculative_conv's output (x, B, C per token); dt (tokens,
// nheads) before dt_bias; A, D, dt_bias (nheads); z (tokens, nheads * head_dim) or none;
// state (slots, nheads, head_dim, d_state); table (rows, 3 + K): each row's first token, its
// tokens, the slot its state is read from, then each token's slot (null_slot: not stored);
// out (tokens, nheads * head_dim): each row's tokens' y (other rows left as they are).
void speculative_state_update(const at::Tensor& conv, const at::Tensor& dt, const at::Tensor& A,
                              const at::Tensor& D, const at::Tensor& dt_bias,
                              const std::optional<at::Tensor>& z, const at::Tensor& state,
                              const at::Tensor& table, int64_t null_slot, int64_t ngroups,
                              const at::Tensor& out) {
  TORCH_CHECK(conv.dim() == 3 && state.dim() == 4,
              "speculative_state_update: conv must be (rows, tokens, channels) and state "
              "(slots, nheads, head_dim, d_state), got ", conv.sizes(), " and ", state.sizes());
  const int64_t n = conv.size(0), K = conv.size(1), num_slots = state.size(0);
  const int64_t nheads = state.size(1), head_dim = state.size(2), d_state = state.size(3);
  const int64_t inner = nheads * head_dim;
  TORCH_CHECK(ngroups >= 1 && nheads % ngroups == 0 &&
                  conv.size(2) == inner + 2 * ngroups * d_state,
              "speculative_state_update: ", conv.size(2), " conv channels; ", nheads, " heads of ",
              head_dim, " and ", ngroups, " groups of ", d_state, " need ",
              inner + 2 * ngroups * d_state);
  const int64_t tokens = dt.size(0);
  TORCH_CHECK(dt.dim() == 2 && dt.size(1) == nheads && out.dim() == 2 && out.size(0) == tokens &&
                  out.size(1) == inner && (!z.has_value() || z->sizes() == out.sizes()),
              "speculative_state_update: dt must be (tokens, ", nheads, "), out and z (tokens, ",
              inner, "), got ", dt.sizes(), ", ", out.sizes(),
              z.has_value() ? " and " : "", z.has_value() ? z->sizes() : at::IntArrayRef{});
  for (const auto* v : {&A, &D, &dt_bias})
    TORCH_CHECK(v->numel() == nheads, "speculative_state_update: A, D and dt_bias need ", nheads,
                " values, got ", v->numel());
  // vLLM's state caches are views into a shared buffer: a slot's stride may exceed its size
  TORCH_CHECK(state.stride(3) == 1 && state.stride(2) == d_state &&
                  state.stride(1) == head_dim * d_state && state.stride(0) >= inner * d_state,
              "speculative_state_update: each slot of the state must be contiguous, got strides ",
              state.strides());
  TORCH_CHECK(table.dim() == 2 && table.size(0) == n && table.size(1) == 3 + K,
              "speculative_state_update: table must be (", n, ", ", 3 + K, "), got ", table.sizes());
  auto rows = table.to(at::kLong).contiguous();
  const int64_t* r = rows.data_ptr<int64_t>();
  std::vector<int64_t> sources(n);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t* row = r + i * (3 + K);
    TORCH_CHECK(row[1] >= 1 && row[1] <= K && row[0] >= 0 && row[0] + row[1] <= tokens,
                "speculative_state_update: row ", i, "'s tokens ", row[0], " .. ",
                row[0] + row[1], " must be 1 to ", K, " of the ", tokens, " tokens");
    for (int64_t k = 2; k < 3 + K; ++k)
      TORCH_CHECK(row[k] >= 0 && row[k] < num_slots, "speculative_state_update: row ", i,
                  "'s slot ", row[k], " is outside the state's ", num_slots, " slots");
    sources[i] = row[2];
  }
  // rows run in parallel: no row may store to another row's source slot
  std::vector<int64_t> sorted = sources;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < r[i * (3 + K) + 1]; ++k) {
      const int64_t slot = r[i * (3 + K) + 3 + k];
      TORCH_CHECK(slot == null_slot || slot == sources[i] ||
                      !std::binary_search(sorted.begin(), sorted.end(), slot),
                  "speculative_state_update: row ", i, " stores to slot ", slot,
                  ", which another row reads");
    }
  auto c = conv.to(at::kFloat).contiguous();
  auto dtf = dt.to(at::kFloat).contiguous();
  auto Af = A.to(at::kFloat).contiguous(), Df = D.to(at::kFloat).contiguous();
  auto biasf = dt_bias.to(at::kFloat).contiguous();
  at::Tensor zf;
  if (z.has_value()) zf = z->to(at::kFloat).contiguous();
  const bool direct = out.scalar_type() == at::kFloat && out.is_contiguous();
  at::Tensor y = direct ? out : out.to(at::kFloat).contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, state.scalar_type(), "speculative_state_update", [&] {
        recurrence_rows<scalar_t>(c, dtf.data_ptr<float>(), Af.data_ptr<float>(),
                                  Df.data_ptr<float>(), biasf.data_ptr<float>(),
                                  zf.defined() ? zf.data_ptr<float>() : nullptr,
                                  state.data_ptr<scalar_t>(), state.stride(0), r, null_slot,
                                  y.data_ptr<float>(),
                                  nheads, head_dim, d_state, ngroups);
      });
  if (!direct) out.copy_(y);
}

}  // namespace

TORCH_LIBRARY(vllm_nemotron_h, m) {
  m.def(
      "speculative_conv(Tensor xbc, Tensor(a!) conv_state, Tensor weight, Tensor? bias, "
      "Tensor slots, Tensor counts) -> Tensor");
  m.def(
      "speculative_state_update(Tensor conv, Tensor dt, Tensor A, Tensor D, Tensor dt_bias, "
      "Tensor? z, Tensor(a!) state, Tensor table, int null_slot, int ngroups, Tensor(b!) out) "
      "-> ()");
}

TORCH_LIBRARY_IMPL(vllm_nemotron_h, CPU, m) {
  m.impl("speculative_conv", speculative_conv);
  m.impl("speculative_state_update", speculative_state_update);
}
