// Exact reduce-scatter and scalar combination across ranks (see exact_reduce.hpp).
#include "src/parallel/exact_reduce.hpp"

#include <bit>
#include <cmath>

#include "src/core/check.hpp"

namespace lockstep::parallel {

namespace {

constexpr int kTerms = 3;  // floats per element on the wire: enough for any double-exact sum

// Extras travel as one uint64 each: shard-local index in the high half, the float's bits below.
uint64_t pack_extra(int64_t local_index, float term) {
  return (static_cast<uint64_t>(local_index) << 32) | std::bit_cast<uint32_t>(term);
}

// Receiving side, shared by both sources: adds every rank's terms of my shard and rounds once.
void add_terms_and_round(const std::vector<float>& recv, int terms, int64_t shard, int parts,
                         const std::vector<uint64_t>& extras, float* out) {
  ExactAccumulator acc(static_cast<size_t>(shard));
  for (int q = 0; q < parts; ++q) {
    const float* block = recv.data() + static_cast<size_t>(q) * static_cast<size_t>(shard * terms);
    for (int64_t i = 0; i < shard; ++i) {
      for (int k = 0; k < terms; ++k) {
        const float t = block[i * terms + k];
        if (t != 0.0f) acc.add(static_cast<size_t>(i), t);
      }
    }
  }
  for (uint64_t e : extras) {
    const auto i = static_cast<size_t>(e >> 32);
    LS_CHECK(i < static_cast<size_t>(shard), "extra term index ", i, " outside the shard of ", shard);
    acc.add(i, std::bit_cast<float>(static_cast<uint32_t>(e & 0xffffffffu)));
  }
  acc.round_to(out);
}

std::vector<int64_t> scaled(const std::vector<int64_t>& v, int64_t k) {
  std::vector<int64_t> out(v);
  for (auto& x : out) x *= k;
  return out;
}

}  // namespace

std::vector<int64_t> ShardPlan::sizes() const {
  std::vector<int64_t> s(static_cast<size_t>(parts()));
  for (int r = 0; r < parts(); ++r) s[static_cast<size_t>(r)] = size(r);
  return s;
}

std::vector<int64_t> ShardPlan::firsts() const { return {begin.begin(), begin.end() - 1}; }

ShardPlan make_shard_plan(const std::vector<ParamTensor>& layout, int parts) {
  LS_CHECK(parts >= 1 && !layout.empty());
  const int64_t n = layout.back().offset + layout.back().numel;
  // The first valid cut at or after x: a chunk start inside the tensor holding x, else its end.
  auto snap = [&](int64_t x) {
    for (const auto& p : layout) {
      if (x >= p.offset && x < p.offset + p.numel) {
        const int64_t c = p.offset + (x - p.offset + kCanonicalChunk - 1) / kCanonicalChunk * kCanonicalChunk;
        return std::min(c, p.offset + p.numel);
      }
    }
    return n;
  };
  ShardPlan plan;
  plan.begin.resize(static_cast<size_t>(parts) + 1);
  for (int r = 0; r <= parts; ++r) {
    plan.begin[static_cast<size_t>(r)] = r == parts ? n : snap(n * r / parts);
  }
  return plan;
}

void exact_reduce_scatter(ExactAccumulator& local, const ShardPlan& plan, comm::Communicator& comm,
                          float* out) {
  const int parts = comm.size(), me = comm.rank();
  LS_CHECK(plan.parts() == parts && local.size() == static_cast<size_t>(plan.end(parts - 1)));
  const int64_t n = plan.end(parts - 1);
  // 1. Peel each element's exact local sum into t1 + t2 + t3 (+ extras): t = RN(rest), rest -= t.
  std::vector<float> send(static_cast<size_t>(n * kTerms), 0.0f);
  std::vector<std::vector<uint64_t>> extras(static_cast<size_t>(parts));
  for (int q = 0; q < parts; ++q) {
    LS_CHECK(plan.size(q) < (int64_t{1} << 32), "shard of ", plan.size(q), " elements");
    for (int64_t i = plan.first(q); i < plan.end(q); ++i) {
      const auto e = static_cast<size_t>(i);
      for (int k = 0;; ++k) {
        const float t = local.round(e);
        if (t == 0.0f) break;  // the rest is a multiple of 2^-149 that rounds to 0: exactly 0
        if (k < kTerms) {
          send[e * kTerms + static_cast<size_t>(k)] = t;
        } else {
          extras[static_cast<size_t>(q)].push_back(pack_extra(i - plan.first(q), t));
        }
        if (!std::isfinite(t)) break;  // ±inf or NaN: sent as is, nothing left to peel
        local.add(e, -static_cast<double>(t));  // exact: the accumulator holds the exact rest
      }
    }
  }
  local.zero();

  // 2. Every rank receives the terms of its shard from every rank.
  const std::vector<int64_t> sizes = plan.sizes();
  const std::vector<int64_t> firsts = plan.firsts();
  const int64_t shard = plan.size(me);
  std::vector<int64_t> recv_counts(static_cast<size_t>(parts), shard * kTerms), recv_displs(static_cast<size_t>(parts));
  for (int q = 0; q < parts; ++q) recv_displs[static_cast<size_t>(q)] = q * shard * kTerms;
  std::vector<float> recv(static_cast<size_t>(parts * shard * kTerms));
  comm::Handle terms = comm.iall_to_allv(send.data(), scaled(sizes, kTerms), scaled(firsts, kTerms), recv.data(),
                                         recv_counts, recv_displs, comm::DataType::kF32);

  std::vector<int64_t> extra_send_counts(static_cast<size_t>(parts)), extra_recv_counts(static_cast<size_t>(parts));
  for (int q = 0; q < parts; ++q) {
    extra_send_counts[static_cast<size_t>(q)] = static_cast<int64_t>(extras[static_cast<size_t>(q)].size());
  }
  comm.all_to_all(extra_send_counts.data(), extra_recv_counts.data(), 1, comm::DataType::kI64);
  std::vector<uint64_t> extra_send, extra_recv;
  std::vector<int64_t> extra_send_displs(static_cast<size_t>(parts)), extra_recv_displs(static_cast<size_t>(parts));
  int64_t recv_total = 0;
  for (int q = 0; q < parts; ++q) {
    extra_send_displs[static_cast<size_t>(q)] = static_cast<int64_t>(extra_send.size());
    extra_send.insert(extra_send.end(), extras[static_cast<size_t>(q)].begin(), extras[static_cast<size_t>(q)].end());
    extra_recv_displs[static_cast<size_t>(q)] = recv_total;
    recv_total += extra_recv_counts[static_cast<size_t>(q)];
  }
  extra_recv.resize(static_cast<size_t>(recv_total));
  comm.all_to_allv(extra_send.data(), extra_send_counts, extra_send_displs, extra_recv.data(), extra_recv_counts,
                   extra_recv_displs, comm::DataType::kU64);
  terms.wait();

  // 3. Exact sum of everything received, rounded once.
  add_terms_and_round(recv, kTerms, shard, parts, extra_recv, out);
}

void exact_reduce_scatter(const float* local, const ShardPlan& plan, comm::Communicator& comm, float* out) {
  const int parts = comm.size(), me = comm.rank();
  LS_CHECK(plan.parts() == parts);
  const int64_t shard = plan.size(me);
  std::vector<int64_t> recv_counts(static_cast<size_t>(parts), shard), recv_displs(static_cast<size_t>(parts));
  for (int q = 0; q < parts; ++q) recv_displs[static_cast<size_t>(q)] = q * shard;
  std::vector<float> recv(static_cast<size_t>(parts * shard));
  comm.all_to_allv(local, plan.sizes(), plan.firsts(), recv.data(), recv_counts, recv_displs, comm::DataType::kF32);
  add_terms_and_round(recv, 1, shard, parts, {}, out);
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

float combine_exact(const ChunkCombiner& local, comm::Communicator& comm) {
  float mine[kCombinerTerms];
  combiner_terms(local, mine);
  std::vector<float> all(static_cast<size_t>(comm.size() * kCombinerTerms));
  comm.all_gather(mine, all.data(), kCombinerTerms, comm::DataType::kF32);
  SuperAccumulator total;
  for (float t : all) total.add(static_cast<double>(t));
  return total.round_to_float();
}

}  // namespace lockstep::parallel
