// Fused LSTM/GRU cells as compositions of elementwise ATen ops on "tpu".
#include "ops/rnn_cells.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/zeros_like.h>

namespace tpu_eager {
namespace {

bool given(const std::optional<at::Tensor>& t) { return t.has_value() && t->defined(); }

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_lstm_cell(const at::Tensor& input_gates,
                                                               const at::Tensor& hidden_gates, const at::Tensor& cx,
                                                               const std::optional<at::Tensor>& input_bias,
                                                               const std::optional<at::Tensor>& hidden_bias) {
  at::Tensor gates = input_gates + hidden_gates;
  if (given(input_bias)) gates = gates + *input_bias;
  if (given(hidden_bias)) gates = gates + *hidden_bias;
  auto chunks = gates.chunk(4, 1);
  const at::Tensor i = chunks[0].sigmoid(), f = chunks[1].sigmoid(), g = chunks[2].tanh(), o = chunks[3].sigmoid();
  const at::Tensor cy = f * cx + i * g;
  const at::Tensor hy = o * cy.tanh();
  return {hy, cy, at::cat({i, f, g, o}, 1)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_lstm_cell_backward(const std::optional<at::Tensor>& grad_hy,
                                                                        const std::optional<at::Tensor>& grad_cy,
                                                                        const at::Tensor& cx, const at::Tensor& cy,
                                                                        const at::Tensor& workspace, bool has_bias) {
  auto w = workspace.chunk(4, 1);
  const at::Tensor &i = w[0], &f = w[1], &g = w[2], &o = w[3];
  const at::Tensor tanh_cy = cy.tanh();
  at::Tensor gcx = given(grad_cy) ? *grad_cy : at::zeros_like(cy);
  at::Tensor grad_o = at::zeros_like(o);
  if (given(grad_hy)) {
    gcx = gcx + *grad_hy * o * (1 - tanh_cy * tanh_cy);
    grad_o = *grad_hy * tanh_cy * o * (1 - o);
  }
  const at::Tensor grad_i = gcx * g * i * (1 - i);
  const at::Tensor grad_f = gcx * cx * f * (1 - f);
  const at::Tensor grad_g = gcx * i * (1 - g * g);
  at::Tensor grad_gates = at::cat({grad_i, grad_f, grad_g, grad_o}, 1);
  at::Tensor grad_bias = has_bias ? grad_gates.sum(0, /*keepdim=*/false) : at::Tensor();
  return {grad_gates, gcx * f, grad_bias};
}

std::tuple<at::Tensor, at::Tensor> fused_gru_cell(const at::Tensor& input_gates, const at::Tensor& hidden_gates,
                                                  const at::Tensor& hx, const std::optional<at::Tensor>& input_bias,
                                                  const std::optional<at::Tensor>& hidden_bias) {
  at::Tensor ig = given(input_bias) ? input_gates + *input_bias : input_gates;
  at::Tensor hg = given(hidden_bias) ? hidden_gates + *hidden_bias : hidden_gates;
  auto ic = ig.chunk(3, 1);
  auto hc = hg.chunk(3, 1);
  const at::Tensor r = (ic[0] + hc[0]).sigmoid();
  const at::Tensor z = (ic[1] + hc[1]).sigmoid();
  const at::Tensor n = (ic[2] + r * hc[2]).tanh();
  const at::Tensor hy = n + z * (hx - n);
  return {hy, at::cat({r, z, n, hx, hc[2]}, 1)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> fused_gru_cell_backward(
    const at::Tensor& grad_hy, const at::Tensor& workspace, bool has_bias) {
  auto w = workspace.chunk(5, 1);
  const at::Tensor &r = w[0], &z = w[1], &n = w[2], &hx = w[3], &hn = w[4];
  const at::Tensor grad_hx = grad_hy * z;
  const at::Tensor grad_n = grad_hy * (1 - z) * (1 - n * n);   // through tanh
  const at::Tensor grad_z = grad_hy * (hx - n) * z * (1 - z);  // through sigmoid
  const at::Tensor grad_r = grad_n * hn * r * (1 - r);
  at::Tensor grad_input_gates = at::cat({grad_r, grad_z, grad_n}, 1);
  at::Tensor grad_hidden_gates = at::cat({grad_r, grad_z, grad_n * r}, 1);
  at::Tensor grad_input_bias = has_bias ? grad_input_gates.sum(0, false) : at::Tensor();
  at::Tensor grad_hidden_bias = has_bias ? grad_hidden_gates.sum(0, false) : at::Tensor();
  return {grad_input_gates, grad_hidden_gates, grad_hx, grad_input_bias, grad_hidden_bias};
}

}  // namespace tpu_eager
