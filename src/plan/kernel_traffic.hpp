// The memory traffic of the kernels other than GEMMs, which the planner prices on a declared
// cluster at the HBM's streaming rate (cost_model.hpp). On a GPU a norm, a softmax, an activation or
// a residual add reads its inputs from HBM and writes its outputs back, and takes as long as those
// bytes take; per token its bytes grow with the model's width (and the softmax's with the sequence)
// while a GEMM's FLOPs grow with the width squared over tp, so the narrower a rank's GEMMs, the
// larger the share of the step these kernels take.
//
// Counted as the trainer's ops run, each on its own (no fusion): the residual stream and its
// gradient in fp32, the attention's scores and probabilities in fp32 (T a head a token), the
// tensors a linear reads or writes in the run's precision (2 bytes in bf16 and fp8, 4 in fp32); the
// statistics of norms and softmax rows are a few floats a row and are left out; a linear's bias is
// its GEMM's epilogue.
//   norm          forward: reads the stream, writes its output; backward: reads its input and its
//                 output's gradient, writes its input's gradient
//   residual add  forward: reads the stream and the branch's output, writes the stream; backward:
//                 the stream's gradient and the branch's input gradient, summed (fp32)
//   softmax       forward: reads the scores, writes the probabilities; backward: reads the
//                 probabilities and their gradient, writes the scores' gradient
//   RoPE          reads and writes q and k, forward and backward
//   activation    forward: reads the first linear's output, writes the hidden activations (SwiGLU
//                 reads two); backward: reads the input and the activations' gradient, writes the
//                 input's gradient
//   MoE           each of a token's top_k choices: its row copied to the expert and its output
//                 back (read and write each way), and the expert's activation; on the busiest
//                 expert-parallel rank `routed_load` times that (PlanRequest::moe_load)
//   embedding     reads the token's row of wte (and wpe), writes the stream; backward adds the
//                 gradient into those rows
//   loss          reads the logits twice (the row's max, then the sum of exponentials); backward
//                 reads them once more and writes their gradient
// Sequence parallelism runs the stream's ops (norms, residual adds) on 1/tp of the tokens.
#pragma once

#include <cstdint>

#include "src/model/layer_list.hpp"
#include "src/model/precision.hpp"

namespace lockstep::plan {

struct Traffic {
  double forward = 0, backward = 0;  // bytes
};

// Bytes a token of layer `l` moves through the kernels other than GEMMs on one of `tp` ranks.
Traffic layer_traffic(const LayerDesc& l, int64_t tp, bool sp, Precision precision, double routed_load = 1);

// Bytes one optimizer step moves: zeroing the `gradients` a rank holds and reading them for their
// norm; AdamW over the `updated` parameters it owns, reading the parameter, gradient, m and v and
// writing the parameter, m and v (fp32), and in bf16 and fp8 the copies of the `updated_matmul`
// linears' weights among them written.
double update_traffic(double gradients, double updated, double updated_matmul, Precision precision);

}  // namespace lockstep::plan
