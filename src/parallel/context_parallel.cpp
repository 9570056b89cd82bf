// Context parallelism: its checks, blocks and attention (see context_parallel.hpp).
#include "src/parallel/context_parallel.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <span>

#include "kernels/ops/canonical.hpp"
#include "src/core/check.hpp"
#include "src/parallel/exact_reduce.hpp"

namespace lockstep::parallel {

void check_cp_layout(const ModelConfig& model, int64_t cp, const CpRun& run, const std::string& source) {
  if (cp == 1) return;
  const std::string head = source + ": [parallel] cp = " + std::to_string(cp);
  const int64_t unit = 2 * cp * kCanonicalChunk;
  LS_REQUIRE(model.seq_len % unit == 0, head, " needs [model] seq_len (", model.seq_len, ") to be a multiple of 2 x cp x ",
             kCanonicalChunk, " = ", unit, ": each sequence is cut into 2 x cp blocks of whole ", kCanonicalChunk,
             "-position chunks");
  const auto not_yet = [&](bool used, const char* what) {
    LS_REQUIRE(!used, head, " does not run with ", what, " yet");
  };
  not_yet(run.precision.linears == Precision::kFp8, "fp8 linears ([train] precision = \"fp8\")");
  not_yet(run.pp > 1, "pipeline parallelism ([parallel] pp)");
  not_yet(run.buddy, "buddy replays ([verify] buddy_every)");
  not_yet(run.sp_dump, "dumps under sequence parallelism ([dump] dir with [parallel] sp)");
  not_yet(run.reference, "the reference check ([verify] reference_every)");
}

CpComm parse_cp_comm(const std::string& name, const std::string& source) {
  if (name == "all_gather") return CpComm::kAllGather;
  LS_REQUIRE(name == "p2p", source, ": [parallel] cp_comm must be \"all_gather\" or \"p2p\" (got \"", name, "\")");
  return CpComm::kP2p;
}

const char* cp_comm_name(bool ring) { return ring ? "p2p" : "all_gather"; }

std::vector<SeqBlock> zigzag_blocks(int64_t T, int64_t cp, int64_t rank) {
  const int64_t c = T / (2 * cp);
  return {{rank * c, c}, {(2 * cp - 1 - rank) * c, c}};
}

uint64_t cp_min_bytes(const ModelConfig& model, int64_t cp, int64_t tp, int64_t sequences, int64_t attention_layers) {
  if (cp == 1) return 0;
  const auto kv = static_cast<uint64_t>(2 * model.n_kv_heads * model.head_size() / tp);
  const auto p = static_cast<uint64_t>(cp);
  const uint64_t floats = static_cast<uint64_t>(sequences * model.seq_len) * kv * static_cast<uint64_t>(attention_layers);
  return 3 * 4 * floats * (p - 1) / p;
}

std::vector<std::vector<SeqBlock>> every_rank_blocks(int64_t T, int64_t cp) {
  std::vector<std::vector<SeqBlock>> all;
  for (int64_t r = 0; r < cp; ++r) all.push_back(zigzag_blocks(T, cp, r));
  return all;
}

struct CpBuffers {
  // Rank `rank`'s blocks of [0, T) under cp ranks (kept for the last T asked).
  const std::vector<SeqBlock>& blocks_of(int64_t T, int64_t cp, int64_t rank) {
    if (blocks.empty() || this->T != T) {
      this->T = T;
      blocks = every_rank_blocks(T, cp);
    }
    return blocks[static_cast<size_t>(rank)];
  }

  // n zeroed sums of key gradients: exact (canonical) or fp32.
  KeyGrads key_grads(Mode mode, int64_t n) {
    if (mode != Mode::kCanonical) {
      partial.assign(static_cast<size_t>(n), 0.0f);
      return {.partial = partial.data()};
    }
    if (static_cast<int64_t>(exact.size()) != n) exact.reset(static_cast<size_t>(n));
    exact.zero();
    return {.exact = &exact};
  }

  int64_t T = 0;
  std::vector<std::vector<SeqBlock>> blocks;  // every cp rank's, for T
  std::vector<float> send, recv, all, partial, summed, shard;
  ExactAccumulator exact;
  ShardPlan shards;
  std::vector<int64_t> counts, displs;
  // The ring's: every rank's k and v by rank, and each query block's running sums.
  std::vector<float> ring;
  struct QuerySums {
    std::vector<float> delta, sums;
    ExactAccumulator exact;
  };
  QuerySums query_sums[2];
};

namespace {

// This rank's tokens' k and v (B·T/cp rows of qkv) to dst, rows of 2·NKV·HS: what it sends.
void copy_keys_values(AttentionShape s, int64_t tokens, const float* qkv, float* dst) {
  const int64_t W = (s.NH + 2 * s.NKV) * s.HS, Q = s.NH * s.HS, KV = 2 * s.NKV * s.HS;
  for (int64_t i = 0; i < tokens; ++i) std::copy_n(qkv + i * W + Q, KV, dst + i * KV);
}

// A token's rows of dk (times the scale, after the sum's rounding) and dv in its qkv row r, key/value
// head g's at dk[g·stride], dv[g·stride].
void put_key_grads(AttentionShape s, float* r, const float* dk, const float* dv, int64_t stride, float scale) {
  for (int64_t g = 0; g < s.NKV; ++g) {
    for (int64_t d = 0; d < s.HS; ++d) {
      r[(s.NH + g) * s.HS + d] = dk[g * stride + d] * scale;
      r[(s.NH + s.NKV + g) * s.HS + d] = dv[g * stride + d];
    }
  }
}

class ContextParallelAttention final : public AttentionOp {
 public:
  ContextParallelAttention(comm::Communicator& cp, CpBuffers& buffers) : cp_(cp), b_(buffers) {}

  void forward(Backend& be, Mode mode, AttentionShape s, float* out, float* att, const float* qkv) override {
    const float* all = gather(s, qkv);
    int64_t row = 0;
    for (const SeqBlock& k : blocks(s.T, cp_.rank())) {
      be.attention_forward_rows(mode, s, {k.position, k.length}, out + row * s.NH * s.HS, att + row * s.NH * s.T, all);
      row += s.B * k.length;
    }
  }

  void backward(Backend& be, Mode mode, AttentionShape s, float* dqkv, float* scratch, const float* dout,
                const float* qkv, const float* att) override {
    const float* all = gather(s, qkv);
    const int64_t W = (s.NH + 2 * s.NKV) * s.HS, n = 2 * s.B * s.NKV * s.T * s.HS;
    const KeyGrads keys = b_.key_grads(mode, n);
    int64_t row = 0;
    for (const SeqBlock& k : blocks(s.T, cp_.rank())) {
      be.attention_backward_rows(mode, s, {k.position, k.length}, dqkv + row * W, keys, scratch + row * s.NH * s.T,
                                 dout + row * s.NH * s.HS, all, att + row * s.NH * s.T);
      row += s.B * k.length;
    }
    reduce(mode, n);
    // Every key's dk (scaled after the rounding, as the whole op) and dv into this rank's rows.
    const float scale = attention_scale(s.HS);
    const float* dk = b_.summed.data();
    const float* dv = dk + n / 2;
    for_each_token(blocks(s.T, cp_.rank()), s.B, [&](int64_t i, int64_t b, int64_t position) {
      const int64_t at = (b * s.NKV * s.T + position) * s.HS;
      put_key_grads(s, dqkv + i * W, dk + at, dv + at, s.T * s.HS, scale);
    });
  }

 private:
  const std::vector<SeqBlock>& blocks(int64_t T, int64_t rank) { return b_.blocks_of(T, cp_.size(), rank); }

  // b_.all (B, T, width): every position's k and v from the ranks that hold it, q at this rank's.
  const float* gather(AttentionShape s, const float* qkv) {
    const int64_t W = (s.NH + 2 * s.NKV) * s.HS, Q = s.NH * s.HS, KV = 2 * s.NKV * s.HS;
    const int64_t local = s.B * s.T / cp_.size();
    b_.send.resize(static_cast<size_t>(local * KV));
    b_.recv.resize(static_cast<size_t>(local * KV * cp_.size()));
    b_.all.resize(static_cast<size_t>(s.B * s.T * W));
    float* all = b_.all.data();
    copy_keys_values(s, local, qkv, b_.send.data());
    cp_.all_gather(b_.send.data(), b_.recv.data(), local * KV, DType::kF32);
    for (int r = 0; r < cp_.size(); ++r) {
      const float* from = b_.recv.data() + r * local * KV;
      for_each_token(blocks(s.T, r), s.B, [&](int64_t i, int64_t b, int64_t position) {
        std::copy_n(from + i * KV, KV, all + (b * s.T + position) * W + Q);
      });
    }
    for_each_token(blocks(s.T, cp_.rank()), s.B, [&](int64_t i, int64_t b, int64_t position) {
      std::copy_n(qkv + i * W, Q, all + (b * s.T + position) * W);
    });
    return all;
  }

  // b_.summed (n) = the sum over the cp ranks of their dk and dv: exact and rounded once (an exact
  // reduce-scatter of even shards, then an all-gather), or fp32.
  void reduce(Mode mode, int64_t n) {
    b_.summed.resize(static_cast<size_t>(n));
    if (mode != Mode::kCanonical) {
      cp_.all_reduce(b_.partial.data(), b_.summed.data(), n, DType::kF32, comm::ReduceOp::kSum);
      return;
    }
    const int p = cp_.size();
    if (b_.shards.begin.empty() || b_.shards.begin.back() != n) {
      b_.shards.begin.clear();
      for (int r = 0; r <= p; ++r) b_.shards.begin.push_back(n * r / p);
      b_.counts = b_.shards.sizes();
      b_.displs = b_.shards.firsts();
    }
    b_.shard.resize(static_cast<size_t>(b_.shards.size(cp_.rank())));
    exact_reduce_scatter(b_.exact, b_.shards, cp_, b_.shard.data());
    cp_.all_gatherv(b_.shard.data(), b_.summed.data(), b_.counts, b_.displs, DType::kF32);
  }

  comm::Communicator& cp_;
  CpBuffers& b_;
};

// The ring ([parallel] cp_comm = "p2p", context_parallel.hpp): the blockwise attention over every
// rank's key blocks, which travel around the cp ranks.
class RingAttention final : public AttentionOp {
 public:
  RingAttention(comm::Communicator& cp, CpBuffers& buffers) : cp_(cp), b_(buffers) {}

  int64_t kept_floats(const LayerDims& m) const override { return 2 * m.NH; }  // max and Z a head
  int64_t scratch_floats(const LayerDims&) const override { return 0; }
  bool keeps_probabilities() const override { return false; }

  void forward(Backend& be, Mode mode, AttentionShape s, float* out, float* att, const float* qkv) override {
    const QueryBlocks qs = queries(s, mode, att, qkv, nullptr);
    for (const Queries& q : qs) {
      std::fill_n(q.stats.max, q.n, -INFINITY);
      if (mode == Mode::kFast) std::fill_n(q.stats.denom, q.n, 0.0f);  // a running sum there
    }
    ring(s, qkv, [&](const KeyBlock& k) {
      for (const Queries& q : qs) {
        if (sees(q, k)) be.attention_blocks_forward(mode, s, BlockPass::kMax, q.rows, k, q.stats, q.q);
      }
    });
    static constexpr BlockPass kCanonicalPasses[] = {BlockPass::kSum, BlockPass::kValues};
    const std::span<const BlockPass> passes(kCanonicalPasses, mode == Mode::kCanonical ? 2 : 1);
    for (BlockPass pass : passes) {
      every_block(s, [&](const KeyBlock& k) {
        for (const Queries& q : qs) {
          if (sees(q, k)) be.attention_blocks_forward(mode, s, pass, q.rows, k, q.stats, q.q);
        }
      });
      for (const Queries& q : qs) be.attention_blocks_end(mode, s, pass, q.rows, q.stats, out + q.row * s.NH * s.HS);
    }
  }

  void backward(Backend& be, Mode mode, AttentionShape s, float* dqkv, float*, const float* dout, const float* qkv,
                const float* att) override {
    // The backward passes read the kept max and Z only (BlockSoftmax holds them writable for the forward).
    const QueryBlocks qs = queries(s, mode, const_cast<float*>(att), qkv, dout);
    for (const Queries& q : qs) std::fill_n(q.stats.delta, q.n, 0.0f);
    const int64_t n = 2 * s.B * s.NKV * s.T * s.HS;
    const KeyGrads grads = b_.key_grads(mode, n);
    ring(s, qkv, [&](const KeyBlock& k) {
      for (const Queries& q : qs) {
        if (sees(q, k)) be.attention_blocks_backward(mode, s, BlockPass::kDelta, q.rows, k, q.stats, grads, q.dout, q.q);
      }
    });
    const int64_t W = (s.NH + 2 * s.NKV) * s.HS;
    for (const Queries& q : qs) be.attention_blocks_end(mode, s, BlockPass::kDelta, q.rows, q.stats, nullptr);
    every_block(s, [&](const KeyBlock& k) {
      for (const Queries& q : qs) {
        if (sees(q, k)) be.attention_blocks_backward(mode, s, BlockPass::kGrads, q.rows, k, q.stats, grads, q.dout, q.q);
      }
    });
    for (const Queries& q : qs) be.attention_blocks_end(mode, s, BlockPass::kGrads, q.rows, q.stats, dqkv + q.row * W);
    owners_keys(s, mode, dqkv);
  }

 private:
  // One of this rank's query blocks: its rows, first local token, q (and dout) rows, statistics
  // (max and Z in the layer's kept floats) and how many rows of statistics (B·NH·rows).
  struct Queries {
    QueryRows rows;
    int64_t row = 0, n = 0;
    const float *q = nullptr, *dout = nullptr;
    BlockSoftmax stats;
  };

  // The zig-zag's two blocks of this rank.
  using QueryBlocks = std::array<Queries, 2>;

  const std::vector<SeqBlock>& blocks(int64_t T, int rank) { return b_.blocks_of(T, cp_.size(), rank); }

  // The running sums start zero and every pass's end leaves them zero: they are set up (zeroed)
  // only when their size changes.
  QueryBlocks queries(AttentionShape s, Mode mode, float* kept, const float* qkv, const float* dout) {
    const int64_t W = (s.NH + 2 * s.NKV) * s.HS;
    QueryBlocks qs;
    int64_t row = 0;
    for (size_t i = 0; i < qs.size(); ++i) {
      const SeqBlock& k = blocks(s.T, cp_.rank())[i];
      CpBuffers::QuerySums& sums = b_.query_sums[i];
      const int64_t n = s.B * s.NH * k.length;
      const auto elements = static_cast<size_t>(n * s.HS);
      sums.delta.resize(static_cast<size_t>(n));
      if (mode == Mode::kCanonical && sums.exact.size() != elements) sums.exact.reset(elements);
      if (mode == Mode::kFast && sums.sums.size() != elements) sums.sums.assign(elements, 0.0f);
      float* max = kept + 2 * s.NH * row;
      qs[i] = {.rows = {k.position, k.length},
               .row = row,
               .n = n,
               .q = qkv + row * W,
               .dout = dout != nullptr ? dout + row * s.NH * s.HS : nullptr,
               .stats = {max, max + n, sums.delta.data(), &sums.exact, sums.sums.data()}};
      row += s.B * k.length;
    }
    return qs;
  }

  // Whether a query block sees any key of a key block (causal: a key before its last row).
  static bool sees(const Queries& q, const KeyBlock& k) { return k.first < q.rows.first + q.rows.count; }

  // Rank r's i-th block in b_.ring, and where its key gradients lie: by owner, then block.
  KeyBlock key_block(AttentionShape s, int r, size_t i) {
    const SeqBlock& k = blocks(s.T, r)[i];
    const int64_t KV = 2 * s.NKV * s.HS, local = s.B * s.T / cp_.size();
    const int64_t grads = 2 * s.B * s.NKV * k.length * s.HS;
    return {k.position, k.length, b_.ring.data() + (r * local + static_cast<int64_t>(i) * s.B * k.length) * KV,
            (2 * r + static_cast<int64_t>(i)) * grads};
  }

  template <class F>
  void every_block(AttentionShape s, F&& f) {
    for (int r = 0; r < cp_.size(); ++r) {
      for (size_t i = 0; i < 2; ++i) f(key_block(s, r, i));
    }
  }

  // Every rank's k and v into b_.ring around the ring: step i holds rank (me − i)'s, sends it on to
  // me + 1 and receives (me − i − 1)'s from me − 1 while `arrived` runs on its blocks.
  template <class F>
  void ring(AttentionShape s, const float* qkv, F&& arrived) {
    const int p = cp_.size(), me = cp_.rank();
    const int64_t local = s.B * s.T / p, n = local * 2 * s.NKV * s.HS;
    b_.ring.resize(static_cast<size_t>(p * n));
    copy_keys_values(s, local, qkv, b_.ring.data() + me * n);
    for (int step = 0; step < p; ++step) {
      const int held = (me - step + p) % p;
      comm::Handle sent, received;
      if (step + 1 < p) {
        const int next = (held - 1 + p) % p;
        sent = cp_.isend(b_.ring.data() + held * n, n, DType::kF32, (me + 1) % p, kRingTag);
        received = cp_.irecv(b_.ring.data() + next * n, n, DType::kF32, (me - 1 + p) % p, kRingTag);
      }
      for (size_t i = 0; i < 2; ++i) arrived(key_block(s, held, i));
      sent.wait();
      received.wait();
    }
  }

  // The key gradients summed over the cp ranks into their owners' rows of dqkv: an exact (fp32)
  // reduce-scatter of the owner-ordered sums, then dk (scaled after the rounding) and dv in place.
  void owners_keys(AttentionShape s, Mode mode, float* dqkv) {
    const int p = cp_.size();
    const int64_t n = 2 * s.B * s.NKV * s.T * s.HS, per_rank = n / p;
    if (b_.shards.begin.empty() || b_.shards.begin.back() != n) {
      b_.shards.begin.clear();
      for (int r = 0; r <= p; ++r) b_.shards.begin.push_back(per_rank * r);
      b_.counts = b_.shards.sizes();
    }
    b_.shard.resize(static_cast<size_t>(per_rank));
    if (mode == Mode::kCanonical) {
      exact_reduce_scatter(b_.exact, b_.shards, cp_, b_.shard.data());
    } else {
      cp_.reduce_scatter(b_.partial.data(), b_.shard.data(), b_.counts, DType::kF32, comm::ReduceOp::kSum);
    }
    const float scale = attention_scale(s.HS);
    const int64_t W = (s.NH + 2 * s.NKV) * s.HS;
    int64_t row = 0, at = 0;
    for (const SeqBlock& k : blocks(s.T, cp_.rank())) {
      const float* dk = b_.shard.data() + at;
      const float* dv = dk + s.B * s.NKV * k.length * s.HS;
      for (int64_t b = 0; b < s.B; ++b) {
        for (int64_t t = 0; t < k.length; ++t) {
          const int64_t from = (b * s.NKV * k.length + t) * s.HS;
          put_key_grads(s, dqkv + (row + b * k.length + t) * W, dk + from, dv + from, k.length * s.HS, scale);
        }
      }
      row += s.B * k.length;
      at += 2 * s.B * s.NKV * k.length * s.HS;
    }
  }

  static constexpr int kRingTag = 7100;
  comm::Communicator& cp_;
  CpBuffers& b_;
};

}  // namespace

ContextParallelPlan::ContextParallelPlan(const ModelPlan& inner, comm::Communicator& cp, CpComm comm)
    : ForwardingPlan(inner), cp_(cp), comm_(comm), buffers_(std::make_unique<CpBuffers>()) {}

ContextParallelPlan::~ContextParallelPlan() = default;

std::unique_ptr<AttentionOp> ContextParallelPlan::attention(const LayerDesc&) const {
  if (comm_ == CpComm::kP2p) return std::make_unique<RingAttention>(cp_, *buffers_);
  return std::make_unique<ContextParallelAttention>(cp_, *buffers_);
}

void ContextParallelPlan::gather_positions(const float* local, float* whole, int64_t B, int64_t T, int64_t width) const {
  CpBuffers& b = *buffers_;
  const int64_t n = B * T / cp_.size() * width;
  b.recv.resize(static_cast<size_t>(n * cp_.size()));
  cp_.all_gather(local, b.recv.data(), n, DType::kF32);
  for (int r = 0; r < cp_.size(); ++r) {
    const float* from = b.recv.data() + r * n;
    for_each_token(b.blocks_of(T, cp_.size(), r), B, [&](int64_t i, int64_t s, int64_t position) {
      std::copy_n(from + i * width, width, whole + (s * T + position) * width);
    });
  }
}

}  // namespace lockstep::parallel
