// Exact reduce-scatter and scalar combination across ranks (see exact_reduce.hpp).
#include "src/parallel/exact_reduce.hpp"

#include <algorithm>
#include <cmath>

#include "src/core/check.hpp"
#include "src/core/majority.hpp"

namespace lockstep::parallel {

namespace {

// A spilled element on the wire: its shard-local index, its SuperAccumulator's flags and digits.
constexpr int kSpillWords = 2 + SuperAccumulator::kDigits;

// Adds every rank's block of exact sums for my shard (recv holds `parts` blocks of `shard`).
void add_blocks(const std::vector<double>& recv, int64_t shard, int parts, ExactAccumulator& acc, int64_t acc_offset) {
  for (int q = 0; q < parts; ++q) {
    const double* block = recv.data() + static_cast<size_t>(q) * static_cast<size_t>(shard);
    for (int64_t i = 0; i < shard; ++i) {
      if (block[i] != 0.0) acc.add(static_cast<size_t>(acc_offset + i), block[i]);
    }
  }
}

// The fp32 values' version (fast-mode gradients), rounded into out: a run of kRun elements at a
// time, in an accumulator of one run that stays in cache, through add_run, which adds a run whose
// double additions are all exact in one vectorised loop, so an inexact addition (a wide exponent
// range) sends only its own run element by element. Adding a zero changes no exact sum, so unlike
// add_blocks nothing is skipped.
void sum_float_blocks(const std::vector<float>& recv, int64_t shard, int parts, float* out) {
  constexpr int64_t kRun = 1024;
  thread_local ExactAccumulator run;
  for (int64_t i = 0; i < shard; i += kRun) {
    const auto n = static_cast<size_t>(std::min(kRun, shard - i));
    run.reset(n);
    for (int q = 0; q < parts; ++q) run.add_run(0, recv.data() + static_cast<size_t>(q) * static_cast<size_t>(shard) + i, n);
    run.round_to(out + i);
  }
}

// The receive buffer of an exchange (at least n elements), reused across calls: fresh pages for a
// bucket's tens of MiB cost more than the exchange itself (measured over 2 ranks: the exact
// all-reduce of 16 MiB took 150-190 ms with new buffers a call, 32 ms with reused ones). One per
// thread: the gradient buckets' worker and the step's thread reduce at the same time.
template <class T>
std::vector<T>& receive_buffer(size_t n) {
  thread_local std::vector<T> buffer;
  if (buffer.size() < n) buffer.resize(n);
  return buffer;
}

// The exact sums of a shard (all zero), reused across calls like receive_buffer.
ExactAccumulator& shard_sums(int64_t shard) {
  thread_local ExactAccumulator sums;
  sums.reset(static_cast<size_t>(shard));
  return sums;
}

std::vector<int64_t> block_displs(int parts, int64_t block) {
  std::vector<int64_t> d(static_cast<size_t>(parts));
  for (int q = 0; q < parts; ++q) d[static_cast<size_t>(q)] = q * block;
  return d;
}

}  // namespace

std::vector<int64_t> ShardPlan::sizes() const {
  std::vector<int64_t> s(static_cast<size_t>(parts()));
  for (int r = 0; r < parts(); ++r) s[static_cast<size_t>(r)] = size(r);
  return s;
}

std::vector<int64_t> ShardPlan::firsts() const { return {begin.begin(), begin.end() - 1}; }

ShardPlan ShardPlan::window(int64_t first, int64_t end) const {
  ShardPlan w;
  for (int64_t b : begin) w.begin.push_back(std::clamp(b, first, end) - first);
  return w;
}

int64_t first_valid_cut(const std::vector<ParamTensor>& layout, int64_t x) {
  for (const auto& p : layout) {
    if (x >= p.offset && x < p.offset + p.numel) {
      const int64_t c = p.offset + (x - p.offset + kCanonicalChunk - 1) / kCanonicalChunk * kCanonicalChunk;
      return std::min(c, p.offset + p.numel);
    }
  }
  return layout.back().offset + layout.back().numel;
}

ShardPlan make_shard_plan(const std::vector<ParamTensor>& layout, int parts) {
  LS_CHECK(parts >= 1 && !layout.empty());
  const int64_t n = layout.back().offset + layout.back().numel;
  ShardPlan plan;
  plan.begin.resize(static_cast<size_t>(parts) + 1);
  for (int r = 0; r <= parts; ++r) {
    plan.begin[static_cast<size_t>(r)] = r == parts ? n : first_valid_cut(layout, n * r / parts);
  }
  return plan;
}

void exact_reduce_scatter(const ExactAccumulator& local, const ShardPlan& plan, comm::Communicator& comm,
                          float* out, int64_t offset) {
  ExactAccumulator& sum = shard_sums(plan.size(comm.rank()));
  exact_reduce_scatter_add(local, plan, comm, sum, 0, offset);
  sum.round_to(out);
}

void exact_reduce_scatter_add(const ExactAccumulator& local, const ShardPlan& plan, comm::Communicator& comm,
                              ExactAccumulator& sum, int64_t sum_offset, int64_t offset) {
  const int parts = comm.size(), me = comm.rank();
  const auto np = static_cast<size_t>(parts);
  LS_CHECK(plan.parts() == parts && offset >= 0 &&
           static_cast<size_t>(offset + plan.end(parts - 1)) <= local.size());
  const int64_t shard = plan.size(me);
  LS_CHECK(sum_offset >= 0 && static_cast<size_t>(sum_offset + shard) <= sum.size());

  // 1. Every rank's exact double of each element of my shard (stale where spilled; see 3).
  const std::vector<int64_t> sizes = plan.sizes(), firsts = plan.firsts(), blocks(np, shard),
                             block_firsts = block_displs(parts, shard);
  std::vector<double>& recv = receive_buffer<double>(np * static_cast<size_t>(shard));
  comm::Handle doubles = comm.iall_to_allv(local.partial_sums() + offset, sizes, firsts, recv.data(), blocks,
                                           block_firsts, DType::kF64);

  // 2. Spilled elements, grouped by owner: counts, then the records.
  std::vector<int64_t> spill_send, send_counts(np), send_displs(np), recv_counts(np), recv_displs(np);
  for (int q = 0; q < parts; ++q) {
    send_displs[static_cast<size_t>(q)] = static_cast<int64_t>(spill_send.size());
    for (int64_t i = plan.first(q); i < plan.end(q); ++i) {
      if (!local.spilled(static_cast<size_t>(offset + i))) continue;
      const SuperAccumulator& acc = local.spill(static_cast<size_t>(offset + i));
      spill_send.push_back(i - plan.first(q));
      spill_send.push_back(acc.flags());
      spill_send.insert(spill_send.end(), acc.digits(), acc.digits() + SuperAccumulator::kDigits);
    }
    send_counts[static_cast<size_t>(q)] = static_cast<int64_t>(spill_send.size()) - send_displs[static_cast<size_t>(q)];
  }
  // The counts decide the next message's sizes, which every pair of ranks must agree on: each goes
  // three times and the receiver takes the bitwise majority, so that a corrupted count can neither
  // hang the exchange nor make it overrun (a corrupted record is refused below).
  std::vector<int64_t> counts3(3 * np), recv3(3 * np);
  for (size_t q = 0; q < np; ++q) std::fill_n(counts3.begin() + static_cast<std::ptrdiff_t>(3 * q), 3, send_counts[q]);
  comm.all_to_all(counts3.data(), recv3.data(), 3, DType::kI64);
  for (size_t q = 0; q < np; ++q) {
    const auto c = [&](size_t k) { return static_cast<uint64_t>(recv3[3 * q + k]); };
    recv_counts[q] = static_cast<int64_t>(majority(c(0), c(1), c(2)));
  }
  int64_t recv_total = 0;
  for (int q = 0; q < parts; ++q) {
    recv_displs[static_cast<size_t>(q)] = recv_total;
    recv_total += recv_counts[static_cast<size_t>(q)];
  }
  std::vector<int64_t> spill_recv(static_cast<size_t>(recv_total));
  comm.all_to_allv(spill_send.data(), send_counts, send_displs, spill_recv.data(), recv_counts, recv_displs,
                   DType::kI64);
  doubles.wait();

  // 3. A spilled element's double is already in its SuperAccumulator: drop it, add the rest exactly
  //    (any order).
  for (int q = 0; q < parts; ++q) {
    const int64_t first = recv_displs[static_cast<size_t>(q)], end = first + recv_counts[static_cast<size_t>(q)];
    for (int64_t r = first; r + kSpillWords <= end; r += kSpillWords) {
      const int64_t* rec = spill_recv.data() + r;
      // Only a corrupted message holds a record outside the shard (verified collectives name it).
      if (rec[0] < 0 || rec[0] >= shard) continue;
      const auto i = static_cast<size_t>(rec[0]);
      recv[static_cast<size_t>(q) * static_cast<size_t>(shard) + i] = 0.0;
      sum.add(static_cast<size_t>(sum_offset) + i, SuperAccumulator::from_digits(rec + 2, static_cast<uint8_t>(rec[1])));
    }
  }
  add_blocks(recv, shard, parts, sum, sum_offset);
}

void exact_reduce_scatter(const float* local, const ShardPlan& plan, comm::Communicator& comm, float* out) {
  const int parts = comm.size(), me = comm.rank();
  LS_CHECK(plan.parts() == parts);
  const int64_t shard = plan.size(me);
  const std::vector<int64_t> blocks(static_cast<size_t>(parts), shard);
  std::vector<float>& recv = receive_buffer<float>(static_cast<size_t>(parts) * static_cast<size_t>(shard));
  comm.all_to_allv(local, plan.sizes(), plan.firsts(), recv.data(), blocks, block_displs(parts, shard),
                   DType::kF32);
  sum_float_blocks(recv, shard, parts, out);
}

void combiner_terms(ChunkCombiner c, float* terms) {
  for (int k = 0; k < kCombinerTerms; ++k) terms[k] = 0.0f;
  for (int k = 0; k < kCombinerTerms; ++k) {
    const float t = c.finish();
    if (t == 0.0f) return;
    terms[k] = t;
    if (!std::isfinite(t)) return;
    c.add(-t);
  }
  LS_CHECK(c.finish() == 0.0f, "a combiner needed more than ", kCombinerTerms, " terms");
}

float combine_exact(const ChunkCombiner& local, comm::Communicator& comm,
                    std::initializer_list<comm::Communicator*> outers) {
  float mine[kCombinerTerms];
  combiner_terms(local, mine);
  std::vector<float> all(static_cast<size_t>(comm.size() * kCombinerTerms));
  comm.all_gather(mine, all.data(), kCombinerTerms, DType::kF32);
  for (comm::Communicator* outer : outers) {
    if (outer == nullptr) continue;
    // Every group's terms, not their rounded sums: the exact sum of all of them is one rounding.
    std::vector<float> groups(all.size() * static_cast<size_t>(outer->size()));
    outer->all_gather(all.data(), groups.data(), static_cast<int64_t>(all.size()), DType::kF32);
    all = std::move(groups);
  }
  SuperAccumulator total;
  for (float t : all) total.add(static_cast<double>(t));
  return total.round_to_float();
}

}  // namespace lockstep::parallel
