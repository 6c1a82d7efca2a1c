// The fused LSTM/GRU cells ATen picks for PrivateUse1 (PRIVATEUSE1_NOTES
// pitfall 10). CPU has no kernel for them, so the device composes them from
// elementwise ATen ops, which are recorded and fused like any others.
#pragma once

#include <optional>
#include <tuple>

#include <ATen/core/Tensor.h>

namespace tpu_eager {

// gates = input_gates + hidden_gates (+ biases), chunks (i, f, g, o) along
// dim 1: cy = sigmoid(f) * cx + sigmoid(i) * tanh(g), hy = sigmoid(o) * tanh(cy).
// Returns (hy, cy, workspace = the four activated gates, concatenated).
std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_lstm_cell(const at::Tensor& input_gates,
                                                               const at::Tensor& hidden_gates, const at::Tensor& cx,
                                                               const std::optional<at::Tensor>& input_bias,
                                                               const std::optional<at::Tensor>& hidden_bias);
// Returns (grad_gates, grad_cx, grad_bias) from the forward's workspace.
std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_lstm_cell_backward(const std::optional<at::Tensor>& grad_hy,
                                                                        const std::optional<at::Tensor>& grad_cy,
                                                                        const at::Tensor& cx, const at::Tensor& cy,
                                                                        const at::Tensor& workspace, bool has_bias);
// Chunks (r, z, n): r = sigmoid(ir + hr), z = sigmoid(iz + hz),
// n = tanh(in + r * hn), hy = n + z * (hx - n). Returns (hy, workspace =
// r, z, n, hx, hn concatenated).
std::tuple<at::Tensor, at::Tensor> fused_gru_cell(const at::Tensor& input_gates, const at::Tensor& hidden_gates,
                                                  const at::Tensor& hx, const std::optional<at::Tensor>& input_bias,
                                                  const std::optional<at::Tensor>& hidden_bias);
// Returns (grad_input_gates, grad_hidden_gates, grad_hx, grad_input_bias, grad_hidden_bias).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> fused_gru_cell_backward(
    const at::Tensor& grad_hy, const at::Tensor& workspace, bool has_bias);

}  // namespace tpu_eager
