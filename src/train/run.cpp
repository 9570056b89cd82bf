#include "src/train/run.hpp"

#include "src/parallel/tensor_parallel.hpp"

namespace lockstep {

std::vector<float> TrainRun::gather(const float* local) const {
  return tensor_parallel() ? parallel::gather_global(cfg.model, model.param_layout(), local, tp)
                           : std::vector<float>(local, local + model.num_params());
}

}  // namespace lockstep
