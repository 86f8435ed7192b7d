// The speculative decode tail's conv on CPU in one pass over each row (cpu_conv.py builds and
// loads it): the effects of cpu.py's PyTorch conv, which takes about ten tensor ops a layer
// where a step's few rows make each op's fixed cost the whole cost.
//
// Per row: its conv state's columns (vLLM's speculative layout: width - 2 + K columns), the
// window of width - 1 columns its previous step accepted (from column accepted - 1), then
// its K tokens. Token k's taps: the window's columns and the row's earlier tokens as the
// state stores them, the token itself as it arrives; silu of the fp32 sum. The rolled state:
// the window but its first column, then the tokens; a padded token's column (k >= the row's
// token count) keeps its value.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
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

}  // namespace

TORCH_LIBRARY(vllm_nemotron_h, m) {
  m.def(
      "speculative_conv(Tensor xbc, Tensor(a!) conv_state, Tensor weight, Tensor? bias, "
      "Tensor slots, Tensor counts) -> Tensor");
}

TORCH_LIBRARY_IMPL(vllm_nemotron_h, CPU, m) { m.impl("speculative_conv", speculative_conv); }
