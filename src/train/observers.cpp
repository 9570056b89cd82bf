#include "src/train/observers.hpp"

#include <algorithm>
#include <iomanip>

#include "src/comm/mpi_communicator.hpp"
#include "src/core/check.hpp"
#include "src/core/hash.hpp"
#include "src/parallel/exact_reduce.hpp"
#include "src/train/pipeline.hpp"

namespace lockstep {

void Progress::end_step(const StepRecord& r) {
  const RunConfig& cfg = run_.cfg;
  std::ostream& out = run_.out;
  const int64_t done = r.done();
  if (run_.world.size() > 1 && first_) {
    out << "parallel: step " << done << " sent " << r.comm_bytes << " bytes from rank 0 (" << std::fixed
        << std::setprecision(2)
        << (costs_.min_bytes > 0 ? static_cast<double>(r.comm_bytes) / static_cast<double>(costs_.min_bytes) : 0.0)
        << " x the minimum)";
    if (r.overlap.transfers > 0) {
      out << "; " << r.overlap.transfers << " gradient buckets, " << std::setprecision(0)
          << 100 * r.overlap.hidden_share() << "% of their communication hidden behind the backward";
    }
    if (r.gathers.transfers > 0) {
      out << "; " << r.gathers.transfers << " ZeRO-3 layer gathers, " << std::setprecision(0)
          << 100 * r.gathers.hidden_share() << "% of their time hidden behind the passes";
    }
    // After a step: ZeRO-2's staging pool fills as the backward needs it.
    out << "; gradient storage " << run_.ddp.grad_bytes() << " bytes per rank (full buffers: "
        << costs_.full_grad_bytes << ")\n";
  }
  first_ = false;
  const double tokens_per_s = static_cast<double>(run_.B * run_.T) / r.seconds;
  // The peak is one rank's (measured with its own threads); the job's is world.size() of them.
  const double mfu = tokens_per_s * costs_.flops_per_token /
                     (costs_.peak_gflops * 1e9 * static_cast<double>(run_.world.size()));
  const double mem = peak_memory_mib();
  if (done % cfg.log.every == 0 || r.last) {
    out << "step " << std::setw(6) << done << "/" << cfg.train.steps << " | loss " << std::fixed
        << std::setprecision(4) << r.loss << " | lr " << std::scientific << std::setprecision(3) << r.lr
        << std::fixed << " | grad norm " << std::setprecision(3) << r.grad_norm << " | " << std::setprecision(0)
        << tokens_per_s << " tok/s | MFU " << std::setprecision(1) << 100 * mfu << "% | " << std::setprecision(0)
        << mem << " MiB\n"
        << std::flush;
  }
  nlohmann::json record = {{"step", done}, {"loss", r.loss}, {"lr", r.lr}, {"grad_norm", r.grad_norm},
                           {"tokens_per_s", tokens_per_s}, {"mfu", mfu}, {"step_ms", r.seconds * 1e3},
                           {"peak_mem_mib", mem}};
  if (run_.world.size() > 1) {
    record["comm_bytes"] = r.comm_bytes;
    record["optimizer_state_bytes"] = run_.ddp.optimizer_state_bytes();
    record["grad_bytes"] = run_.ddp.grad_bytes();
    record["grad_buckets"] = r.overlap.transfers;
    record["grad_comm_ms"] = 1e3 * r.overlap.comm_s;
    record["grad_exposed_ms"] = 1e3 * r.overlap.exposed_s;
    record["grad_hidden"] = r.overlap.hidden_share();
    if (r.gathers.transfers > 0) {
      record["param_gathers"] = r.gathers.transfers;
      record["param_gather_ms"] = 1e3 * r.gathers.comm_s;
      record["param_gather_exposed_ms"] = 1e3 * r.gathers.exposed_s;
      record["param_bytes"] = run_.ddp.sharded_params()->bytes();
    }
  }
  metrics_.write(record);
}

Evaluation::Evaluation(TrainRun& run, MetricsWriter& metrics, data::EvalReader* val)
    : run_(run), metrics_(metrics), val_(val), inputs_(static_cast<size_t>(run.MBL * run.T)), targets_(inputs_.size()) {}

// The first dp replica evaluates (replicas are equal; its tp ranks together, and its stages one
// after the other) — under ZeRO-3 every replica, since each layer's parameters are gathered from
// all of them; the same windows as one process, MBL at a time. Under expert parallelism the
// replica's ep ranks take the windows in turn (their MoE layers exchange rows, so every one runs as
// many forwards as the others: windows left over run on all of them, counted by ep rank 0), and
// their losses combine exactly — the same bits as one process. Under context parallelism its cp
// ranks evaluate every window together, each its positions, and their losses combine exactly.
float Evaluation::evaluate() {
  const RunConfig& cfg = run_.cfg;
  if (run_.pipelined()) sync_tied_copy(run_.model, *run_.pp);  // the head's copy of wte, as updated
  const int64_t ep = run_.expert_parallel() ? run_.ep->size() : 1, me = ep > 1 ? run_.ep->rank() : 0;
  const int64_t windows = (cfg.eval.batches * run_.MB + run_.MBL - 1) / run_.MBL;
  const int64_t shared = windows - windows % ep;  // windows from here run on every ep rank
  ChunkCombiner loss_sum, uncounted;
  for (int64_t w = 0; w < windows; ++w) {
    if (w < shared && w % ep != me) continue;
    ChunkCombiner& sum = w < shared || me == 0 ? loss_sum : uncounted;
    val_->fill(w * run_.MBL, run_.MBL, inputs_.data(), targets_.data());
    if (run_.pipelined()) {
      eval_through_stages(run_.model, *run_.pp, {inputs_.data(), targets_.data(), run_.MBL, 0}, sum);
    } else {
      run_.model.eval_loss(inputs_.data(), targets_.data(), run_.MBL, sum);
    }
  }
  const float total = ep > 1                     ? parallel::combine_exact(loss_sum, *run_.ep)
                      : run_.context_parallel() ? parallel::combine_exact(loss_sum, *run_.cp)
                                                : loss_sum.finish();
  float loss = total / static_cast<float>(cfg.eval.batches * run_.MB * run_.T);
  if (run_.pipelined()) run_.pp->broadcast(&loss, 1, DType::kF32, run_.pp->size() - 1);  // the last stage's
  return loss;
}

void Evaluation::end_step(const StepRecord& r) {
  const EvalConfig& e = run_.cfg.eval;
  const bool due = (e.every > 0 && r.done() % e.every == 0) || r.last;
  if (val_ == nullptr || !due) return;
  if (!run_.first_replica() && run_.ddp.sharded_params() == nullptr) return;
  last_ = evaluate();
  if (run_.dp.rank() != 0) return;
  run_.out << "eval step " << r.done() << " | val loss " << std::fixed << std::setprecision(4) << last_ << "\n";
  metrics_.write({{"step", r.done()}, {"val_loss", last_}});
}

void DumpSteps::dump_params(int64_t step, const std::string& prefix, const float* local, bool dp_sharded) {
  std::vector<std::string> names;
  for (const auto& p : run_.global_layout) names.push_back(prefix + p.name);
  if (!dump_.wants_any(step, names)) return;
  const std::vector<float> global = run_.gather(local, dp_sharded);
  for (size_t i = 0; i < run_.global_layout.size(); ++i) {
    dump_.add(names[i], global.data() + run_.global_layout[i].offset, run_.global_layout[i].shape);
  }
}

void DumpSteps::after_reduce(int64_t step, float loss) {
  dump_.add("loss", &loss, {});
  // Reduced, before clipping.
  const bool sharded = run_.ddp.grads_sharded();
  dump_params(step, "grad/param/", sharded ? run_.ddp.grad_shard() : run_.model.grads(), sharded);
}

void DumpSteps::after_update(int64_t step) {
  // Under ZeRO-3 the parameters are sharded over dp as a ZeRO-2 gradient is.
  dump_params(step, "param/", run_.held_params().data(), run_.ddp.sharded_params() != nullptr);
  dump_.end_step();
}

}  // namespace lockstep
