#include "src/train/pipeline.hpp"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <deque>
#include <iomanip>
#include <limits>
#include <memory>
#include <sstream>

#include "src/core/check.hpp"
#include "src/core/comma_list.hpp"
#include "src/train/metrics.hpp"

namespace lockstep {

namespace {

constexpr int kTiedGradTag = 23;    // the last stage's head gradient of wte, to the first
constexpr int kTiedWeightTag = 24;  // wte, from the first stage to the last one's copy
// Stage s's input from stage s − 1, and the gradient of its output from stage s + 1: a tag per
// stage, since two ranks exchange messages of several stages pairs when they hold several chunks.
int activation_tag(int64_t stage) { return 1000 + static_cast<int>(stage); }
int gradient_tag(int64_t stage) { return 5000 + static_cast<int>(stage); }
// The pipeline rank holding stage s of pp ranks' (stage = chunk · pp + rank).
int stage_rank(int64_t stage, int64_t pp) { return static_cast<int>(stage % pp); }

bool tied_across_stages(const Model& model, const comm::Communicator& pp) {
  return pp.size() > 1 && model.config().tie_embeddings;
}

// An element whose exact sum spilled out of its double: its index and its accumulator's state.
constexpr size_t kSpillWords = 2 + SuperAccumulator::kDigits;  // index, flags, digits

// The last stage: its head gradient of wte to the first stage — fast mode the floats; canonical
// mode every element's double, then the spilled elements' accumulators.
void send_tied_grad(Model& model, comm::Communicator& pp) {
  const std::span<const float> grad = model.tied_copy_grad();
  const auto n = static_cast<int64_t>(grad.size());
  if (model.mode() == Mode::kFast) {
    pp.send(grad.data(), n, DType::kF32, 0, kTiedGradTag);
    return;
  }
  const ExactAccumulator& e = model.tied_copy_exact();
  pp.send(e.partial_sums(), n, DType::kF64, 0, kTiedGradTag);
  std::vector<int64_t> spills;
  for (int64_t i = 0; i < n; ++i) {
    if (!e.spilled(static_cast<size_t>(i))) continue;
    const SuperAccumulator& acc = e.spill(static_cast<size_t>(i));
    spills.push_back(i);
    spills.push_back(acc.flags());
    spills.insert(spills.end(), acc.digits(), acc.digits() + SuperAccumulator::kDigits);
  }
  const auto words = static_cast<int64_t>(spills.size());
  pp.send(&words, 1, DType::kI64, 0, kTiedGradTag);
  if (words > 0) pp.send(spills.data(), words, DType::kI64, 0, kTiedGradTag);
}

// The first stage: receives that gradient and has the embedding add it to wte's (n elements).
void receive_tied_grad(Model& model, comm::Communicator& pp, int64_t n) {
  const int last = pp.size() - 1;
  if (model.mode() == Mode::kFast) {
    auto grad = std::make_shared<std::vector<float>>(static_cast<size_t>(n));
    pp.recv(grad->data(), n, DType::kF32, last, kTiedGradTag);
    model.add_to_tied_grad([grad](const GradSink& sink) {
      for (size_t i = 0; i < grad->size(); ++i) sink.f32[i] += (*grad)[i];
    });
    return;
  }
  auto sums = std::make_shared<std::vector<double>>(static_cast<size_t>(n));
  pp.recv(sums->data(), n, DType::kF64, last, kTiedGradTag);
  int64_t words = 0;
  pp.recv(&words, 1, DType::kI64, last, kTiedGradTag);
  auto spills = std::make_shared<std::vector<int64_t>>(static_cast<size_t>(words));
  if (words > 0) pp.recv(spills->data(), words, DType::kI64, last, kTiedGradTag);
  model.add_to_tied_grad([sums, spills](const GradSink& sink) {
    std::vector<uint8_t> spilled(sums->size(), 0);
    for (size_t w = 0; w < spills->size(); w += kSpillWords) {
      const auto i = static_cast<size_t>((*spills)[w]);
      spilled[i] = 1;
      sink.exact->add(static_cast<size_t>(sink.offset) + i,
                      SuperAccumulator::from_digits(spills->data() + w + 2, static_cast<uint8_t>((*spills)[w + 1])));
    }
    for (size_t i = 0; i < sums->size(); ++i) {
      if (!spilled[i]) sink.exact->add(static_cast<size_t>(sink.offset) + i, (*sums)[i]);
    }
  });
}

// Contiguous ranges of `cost` over `parts` that minimise the largest range's sum (dynamic
// programming; ties to the earliest cut, so the result is the same on every rank).
std::vector<StageLayers> balanced_ranges(const std::vector<double>& cost, int64_t parts) {
  const size_t n = cost.size(), p = static_cast<size_t>(parts);
  std::vector<double> prefix(n + 1, 0);
  for (size_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + cost[i];
  constexpr double kInf = std::numeric_limits<double>::infinity();
  // best[k][i]: the smallest largest sum splitting the first i layers into k ranges; cut[k][i]
  // where the last of them starts.
  std::vector<std::vector<double>> best(p + 1, std::vector<double>(n + 1, kInf));
  std::vector<std::vector<size_t>> cut(p + 1, std::vector<size_t>(n + 1, 0));
  best[0][0] = 0;
  for (size_t k = 1; k <= p; ++k) {
    for (size_t i = k; i <= n; ++i) {
      for (size_t j = k - 1; j < i; ++j) {
        const double v = std::max(best[k - 1][j], prefix[i] - prefix[j]);
        if (v < best[k][i]) {
          best[k][i] = v;
          cut[k][i] = j;
        }
      }
    }
  }
  std::vector<StageLayers> out(p);
  size_t end = n;
  for (size_t k = p; k >= 1; --k) {
    out[k - 1] = {cut[k][end], end};
    end = cut[k][end];
  }
  return out;
}

}  // namespace

std::vector<StageLayers> plan_stages(const ModelDesc& desc, int64_t stages, const std::string& by_hand,
                                     const std::string& where) {
  const size_t n = desc.layers.size();
  LS_REQUIRE(stages >= 1 && static_cast<size_t>(stages) <= n, where, ": pp x virtual_stages = ", stages,
             " stages need a layer each; the model has ", n, " layers (embedding, ", desc.n_blocks(),
             " x attention and MLP, final norm, head)");
  if (by_hand.empty()) {
    std::vector<double> cost;
    for (const LayerDesc& l : desc.layers) cost.push_back(layer_flops_per_token(l));
    return balanced_ranges(cost, stages);
  }
  const std::vector<std::string_view> items = split_commas(by_hand);
  LS_REQUIRE(static_cast<int64_t>(items.size()) == stages, where, ": stage_layers \"", by_hand, "\" gives ",
             items.size(), " stages; pp x virtual_stages is ", stages);
  std::vector<StageLayers> out;
  size_t at = 0;
  for (std::string_view item : items) {
    size_t count = 0;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), count);
    LS_REQUIRE(ec == std::errc() && end == item.data() + item.size() && count >= 1, where, ": stage_layers \"",
               by_hand, "\": '", item, "' is not a number of layers >= 1");
    out.push_back({at, at + count});
    at += count;
  }
  LS_REQUIRE(at == n, where, ": stage_layers \"", by_hand, "\" adds up to ", at, " layers; the model has ", n,
             " (embedding, ", desc.n_blocks(), " x attention and MLP, final norm, head)");
  return out;
}

std::string zero_bubble_problem(Recompute recompute, Precision precision) {
  if (recompute != Recompute::kNone) {
    return str_cat("with recompute \"", recompute_name(recompute),
                   "\": a weight-gradient pass reads the layers' inputs after their recomputed activations are gone");
  }
  if (precision == Precision::kFp8) {
    return "with fp8 linears is not run yet: they record their gradient statistics in one backward pass";
  }
  return {};
}

std::string stage_text(const ModelDesc& desc, const StageLayers& s) {
  const auto name = [&](size_t l) {
    const LayerDesc& d = desc.layers[l];
    return str_cat(d.prefix, layer_kind_name(d.kind));
  };
  return s.end - s.first == 1 ? name(s.first) : str_cat(name(s.first), "..", name(s.end - 1));
}

Pipeline plan_pipeline(const RunConfig& cfg, int64_t rank, int64_t pp, int64_t micro_batches) {
  const ModelDesc desc = describe_model(cfg.model);
  Pipeline out;
  out.chunks = {LayerChunk{}};
  out.stages = {{0, desc.layers.size()}};
  if (pp == 1) return out;
  const std::string& src = cfg.source;
  const parallel::ScheduleKind kind = parallel::parse_schedule_kind(cfg.parallel.schedule, src + ": [parallel] schedule");
  if (kind == parallel::ScheduleKind::kZeroBubble) {
    const std::string why =
        zero_bubble_problem(parse_recompute(cfg.train.recompute, src + ": [train] recompute"), cfg.train.precision);
    LS_REQUIRE(why.empty(), src, ": [parallel] schedule \"zb\" ", why, " (schedule \"1f1b\" runs it)");
  }
  LS_REQUIRE(cfg.verify.buddy_every == 0, src, ": [verify] buddy_every with [parallel] pp > 1: buddy replay names ",
             "a faulty rank by the first tensor whose hashes differ within a dp group, which does not order tensors of ",
             "different pipeline stages; use [verify] replay_every (or pp = 1)");
  const parallel::PipelineSchedule schedule =
      parallel::make_schedule(kind, pp, micro_batches, cfg.parallel.virtual_stages, src + ": [parallel]");
  const std::vector<StageLayers> stages =
      plan_stages(desc, schedule.stages(), cfg.parallel.stage_layers, src + ": [parallel]");
  out.stages = stages;
  out.passes = schedule.ranks[static_cast<size_t>(rank)];
  out.split_backward = kind == parallel::ScheduleKind::kZeroBubble;
  // Each chunk's slots: the most of its micro-batches whose activations it holds at once.
  const std::vector<int64_t> peaks = parallel::chunk_peaks(out.passes, schedule.chunks);
  out.chunks.clear();
  for (size_t c = 0; c < peaks.size(); ++c) {
    const StageLayers& st = stages[static_cast<size_t>(schedule.stage(rank, static_cast<int>(c)))];
    out.chunks.push_back({st.first, st.end, static_cast<int>(peaks[c])});
  }
  const parallel::Timeline unit = parallel::simulate(schedule, parallel::PassCosts{});
  out.unit_bubble = unit.bubble;
  std::ostringstream line;
  line << "pipeline: pp " << pp << ", schedule " << parallel::schedule_name(kind);
  if (schedule.chunks > 1) line << " (" << schedule.chunks << " stages a rank)";
  line << ", " << micro_batches << " micro-batches a step; stages";
  for (size_t i = 0; i < stages.size(); ++i) {
    double flops = 0;
    for (size_t l = stages[i].first; l < stages[i].end; ++l) flops += layer_flops_per_token(desc.layers[l]);
    line << (i ? "; " : " ") << i << ": " << stage_text(desc, stages[i]) << " (" << std::fixed << std::setprecision(2)
         << flops / 1e6 << " MFLOP/token)";
  }
  line << "; bubble " << std::setprecision(1) << 100 * unit.bubble << "% on unit pass costs";
  out.description = line.str();
  return out;
}

StageTimes run_stage_passes(Model& model, comm::Communicator& pp, const std::vector<parallel::Pass>& passes,
                            const StageBatch& batch, float dloss, ChunkCombiner& loss_sum) {
  using Clock = std::chrono::steady_clock;
  const auto started = Clock::now();
  StageTimes times;
  const auto timed = [&](auto&& compute) {
    const auto t0 = Clock::now();
    compute();
    times.compute_s += std::chrono::duration<double>(Clock::now() - t0).count();
  };
  const int64_t p = pp.size(), r = pp.rank();
  const int64_t stages = p * static_cast<int64_t>(model.num_chunks());
  const bool first = r == 0, last = r == p - 1;
  const int64_t T = model.config().seq_len;
  const int64_t floats = model.stream_tokens(batch.micro) * model.config().d_model;
  std::deque<std::vector<float>> outbox;  // a deque: the sends' buffers stay where they are
  std::vector<comm::Handle> sends;
  const auto send = [&](const float* data, int64_t stage, int tag) {
    outbox.emplace_back(data, data + floats);
    sends.push_back(pp.isend(outbox.back().data(), floats, DType::kF32, stage_rank(stage, p), tag));
  };
  const bool tied = tied_across_stages(model, pp);
  // Each chunk's last pass of input gradients (B or Bi) and of weight gradients (B or W): the
  // gradients they compute are final there (grad-ready hook). The rank's last input-gradient pass
  // is chunk 0's: on the first rank the embedding's, whose wte takes the head's gradient then;
  // the last rank's last weight-gradient pass completes the head's.
  using parallel::PassKind;
  const parallel::FinalPasses finals = parallel::final_passes(passes, static_cast<int64_t>(model.num_chunks()));
  const size_t final_input = finals.last_input(), final_weight = finals.last_weight();
  for (size_t i = 0; i < passes.size(); ++i) {
    const parallel::Pass& pass = passes[i];
    LS_CHECK(static_cast<size_t>(pass.chunk) < model.num_chunks() && pass.micro < batch.count, "pass of chunk ",
             pass.chunk, ", micro-batch ", pass.micro);
    const auto chunk = static_cast<size_t>(pass.chunk);
    const int64_t stage = pass.chunk * p + r;
    const int64_t at = pass.micro * batch.micro * T;
    if (pass.kind == PassKind::kForward) {
      if (stage > 0) {
        pp.recv(model.stage_input(pass.micro, chunk), floats, DType::kF32, stage_rank(stage - 1, p), activation_tag(stage));
      }
      timed([&] {
        model.forward(pass.micro, {batch.inputs + at, batch.targets + at, batch.micro, batch.first_token + at}, chunk);
      });
      if (stage + 1 < stages) send(model.stage_output(pass.micro, chunk), stage + 1, activation_tag(stage + 1));
    } else if (pass.kind == PassKind::kBackwardWeight) {
      timed([&] { model.backward_weight(pass.micro, i == finals.weight[chunk], chunk); });
    } else {
      if (stage + 1 < stages) {
        pp.recv(model.stage_output_grad(), floats, DType::kF32, stage_rank(stage + 1, p), gradient_tag(stage));
      }
      // The last stage has run all its weight gradients: its head gradient of wte is complete.
      if (first && tied && i == final_input) receive_tied_grad(model, pp, model.param("wte").numel);
      timed([&] { model.backward(pass.micro, dloss, loss_sum, i == finals.input[chunk], chunk); });
      if (stage > 0) send(model.stage_input_grad(), stage - 1, gradient_tag(stage - 1));
    }
    if (last && tied && i == final_weight) send_tied_grad(model, pp);
  }
  for (comm::Handle& h : sends) h.wait();
  times.total_s = std::chrono::duration<double>(Clock::now() - started).count();
  return times;
}

void sync_tied_copy(Model& model, comm::Communicator& pp) {
  if (!tied_across_stages(model, pp)) return;
  if (pp.rank() == 0) {
    const ParamTensor& wte = model.param("wte");
    pp.send(model.params() + wte.offset, wte.numel, DType::kF32, pp.size() - 1, kTiedWeightTag);
  } else if (pp.rank() == pp.size() - 1) {
    const std::span<float> copy = model.tied_copy();
    pp.recv(copy.data(), static_cast<int64_t>(copy.size()), DType::kF32, 0, kTiedWeightTag);
  }
}

std::string measured_bubble(comm::Communicator& world, int64_t pp, int64_t tp, double unit_bubble, double compute_s,
                            double stage_s) {
  const std::vector<double> compute = world.all_gather(compute_s), total = world.all_gather(stage_s);
  const std::vector<double> memory = world.all_gather(peak_memory_mib());
  std::vector<double> rank_compute(static_cast<size_t>(pp), 0), rank_total(static_cast<size_t>(pp), 0),
      rank_memory(static_cast<size_t>(pp), 0);
  for (size_t w = 0; w < compute.size(); ++w) {
    const auto r = static_cast<size_t>((static_cast<int64_t>(w) / tp) % pp);  // mesh order: tp fastest, then pp
    rank_compute[r] += compute[w];
    rank_total[r] += total[w];
    rank_memory[r] = std::max(rank_memory[r], memory[w]);
  }
  std::ostringstream s;
  s << std::fixed << std::setprecision(1) << "pipeline: measured bubble by pipeline rank";
  double all_compute = 0, all_total = 0;
  for (size_t i = 0; i < rank_compute.size(); ++i) {
    s << (i ? ", " : " ") << 100 * (rank_total[i] > 0 ? 1 - rank_compute[i] / rank_total[i] : 0) << "%";
    all_compute += rank_compute[i];
    all_total += rank_total[i];
  }
  s << " (mean " << 100 * (all_total > 0 ? 1 - all_compute / all_total : 0)
    << "%: the share of the passes' time spent waiting for a neighbour, steps after the first); the schedule's "
    << 100 * unit_bubble << "% on unit pass costs; peak memory by pipeline rank";
  for (size_t i = 0; i < rank_memory.size(); ++i) s << (i ? ", " : " ") << std::setprecision(0) << rank_memory[i] << " MiB";
  return s.str();
}

void eval_through_stages(Model& model, comm::Communicator& pp, const MicroBatch& batch, ChunkCombiner& loss_sum) {
  const int64_t p = pp.size(), stages = p * static_cast<int64_t>(model.num_chunks());
  const int64_t floats = model.stream_tokens(batch.B) * model.config().d_model;
  for (size_t chunk = 0; chunk < model.num_chunks(); ++chunk) {
    const int64_t stage = static_cast<int64_t>(chunk) * p + pp.rank();
    if (stage > 0) {
      pp.recv(model.stage_input(0, chunk), floats, DType::kF32, stage_rank(stage - 1, p), activation_tag(stage));
    }
    const float* out = model.eval_forward(0, batch, loss_sum, chunk);
    if (stage + 1 < stages) pp.send(out, floats, DType::kF32, stage_rank(stage + 1, p), activation_tag(stage + 1));
  }
}

}  // namespace lockstep
