#include "src/train/init_from.hpp"

#include <algorithm>
#include <cstring>
#include <map>
#include <sstream>
#include <vector>

#include "src/ckpt/safetensors.hpp"
#include "src/core/check.hpp"
#include "src/core/formats.hpp"
#include "src/parallel/tensor_parallel.hpp"

namespace lockstep {

namespace {

// Element i of a stored tensor as fp32 (exact for every dtype accepted).
float element(const ckpt::StoredTensor& t, int64_t i) {
  switch (t.dtype) {
    case DType::kF32: {
      float v;
      std::memcpy(&v, t.bytes.data() + i * 4, 4);
      return v;
    }
    case DType::kBF16:
    case DType::kF16: {
      uint16_t c;
      std::memcpy(&c, t.bytes.data() + i * 2, 2);
      return t.dtype == DType::kBF16 ? bf16_to_f32(c) : f16_to_f32(c);
    }
    default: throw InternalError("element: unexpected dtype");
  }
}

}  // namespace

std::string init_parameters_from(TrainRun& run, const std::string& path) {
  std::map<std::string, std::string> metadata;
  const std::vector<ckpt::StoredTensor> stored = ckpt::load_safetensors(path, &metadata);
  // Each stored tensor under the Lockstep name it gives, and whether it is transposed.
  struct Found {
    const ckpt::StoredTensor* t;
    bool transposed;
  };
  std::map<std::string, Found> by_name;
  bool hf = false;
  for (const ckpt::StoredTensor& t : stored) {
    const ckpt::ImportedName hf_name = ckpt::hf_gpt2_name(t.name);
    if (!hf_name.name.empty()) hf = true;
    const std::string name = hf_name.name.empty() ? t.name : hf_name.name;
    by_name[name] = {&t, hf_name.transposed};
  }
  const std::vector<ParamTensor>& global = run.global_layout;
  std::vector<float> w(static_cast<size_t>(global.back().offset + global.back().numel));
  std::vector<std::string> used;
  for (const ParamTensor& p : global) {
    const auto it = by_name.find(p.name);
    LS_REQUIRE_DATA(it != by_name.end(), path, ": no tensor for the model's parameter '", p.name, "' ",
                         ckpt::shape_text(p.shape), (hf ? " (read with Hugging Face GPT-2 names)" : ""));
    const ckpt::StoredTensor& t = *it->second.t;
    const bool tr = it->second.transposed;
    std::vector<int64_t> want = p.shape;
    if (tr) std::swap(want[0], want[1]);
    LS_REQUIRE_DATA(t.shape == want, path, ": tensor '", t.name, "' is ", ckpt::shape_text(t.shape), ", the model's '",
                         p.name, "' needs ", ckpt::shape_text(want), tr ? " (GPT-2's Conv1D layout, transposed)" : "");
    LS_REQUIRE_DATA(t.dtype == DType::kF32 || t.dtype == DType::kBF16 || t.dtype == DType::kF16, path,
                         ": tensor '", t.name, "' is ", dtype_name(t.dtype), "; expected F32, BF16 or F16");
    float* dst = w.data() + p.offset;
    if (!tr) {
      for (int64_t i = 0; i < p.numel; ++i) dst[i] = element(t, i);
    } else {
      const int64_t rows = p.shape[0], cols = p.shape[1];  // Lockstep's (out, in); stored (in, out)
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) dst[r * cols + c] = element(t, c * rows + r);
    }
    if (run.cfg.train.precision_recipe().bf16_params()) {
      for (int64_t i = 0; i < p.numel; ++i) dst[i] = bf16_to_f32(bf16_from_f32(dst[i]));
    }
    used.push_back(t.name);
  }
  // This rank's tensors (a pipeline stage's run of them) from the whole buffer.
  const std::string& first = run.model.param_layout().front().name;
  const auto stage = std::find_if(global.begin(), global.end(), [&](const ParamTensor& p) { return p.name == first; });
  parallel::take_local(run.cfg.model, run.model.param_layout(), w.data() + stage->offset, run.model.params());
  std::vector<std::string> ignored;
  for (const ckpt::StoredTensor& t : stored) {
    if (std::find(used.begin(), used.end(), t.name) == used.end()) ignored.push_back(t.name);
  }
  std::ostringstream line;
  line << "initial parameters from " << path << ": " << used.size() << " tensors"
       << (hf ? " (Hugging Face GPT-2 names)" : "");
  if (!ignored.empty()) {
    line << "; not used: " << ignored.size() << " (";
    for (size_t i = 0; i < ignored.size() && i < 4; ++i) line << (i ? ", " : "") << ignored[i];
    line << (ignored.size() > 4 ? ", ...)" : ")");
  }
  return line.str();
}

}  // namespace lockstep
