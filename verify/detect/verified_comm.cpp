#include "verify/detect/verified_comm.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <bit>
#include <limits>
#include <map>

#include "src/core/check.hpp"
#include "verify/core/bounds.hpp"
#include "verify/detect/agreed.hpp"
#include "verify/detect/checksum.hpp"

namespace lockstep::detect {

namespace {

constexpr int kCompanionTag = 1 << 14;  // send/recv: the hash travels with this added to the tag

// The operations by a number, for the detector's fixed-size records.
constexpr const char* kOps[] = {"all_reduce", "reduce_scatter", "all_gatherv", "all_to_allv", "broadcast", "send/recv"};

int op_code(const std::string& op) {
  for (int i = 0; i < static_cast<int>(std::size(kOps)); ++i) {
    if (op == kOps[i]) return i;
  }
  return -1;
}

const char* byte_ptr(const void* p, int64_t elements, DType t) {
  return static_cast<const char*>(p) + static_cast<size_t>(elements) * dtype_size(t);
}

uint64_t hash_of(const void* p, int64_t first, int64_t count, DType t) {
  return block_hash(byte_ptr(p, first, t), static_cast<size_t>(count) * dtype_size(t));
}

// The blocks a v-collective receives from this rank's peers (`me`'s own is a local copy).
std::vector<ReceivedBytes> peer_blocks(void* recv, std::span<const int64_t> counts, std::span<const int64_t> displs,
                                       DType t, int me) {
  std::vector<ReceivedBytes> b;
  for (size_t q = 0; q < counts.size(); ++q) {
    if (static_cast<int>(q) == me || counts[q] == 0) continue;
    b.push_back({const_cast<char*>(byte_ptr(recv, displs[q], t)), counts[q] * static_cast<int64_t>(dtype_size(t))});
  }
  return b;
}

std::vector<ReceivedBytes> whole(void* recv, int64_t count, DType t) {
  if (recv == nullptr || count == 0) return {};
  return {{recv, count * static_cast<int64_t>(dtype_size(t))}};
}

bool is_float(DType t) { return t == DType::kF32 || t == DType::kF64; }
bool is_integer(DType t) { return t == DType::kI32 || t == DType::kI64 || t == DType::kU64; }

// Σ x and Σ |x| in double of floats.
struct FloatSum {
  double sum = 0, mag = 0;
};

FloatSum float_sum(const void* p, int64_t first, int64_t count, DType t) {
  double s = 0, m = 0;
  if (t == DType::kF32) {
    const float* x = reinterpret_cast<const float*>(byte_ptr(p, first, t));
#pragma omp parallel for reduction(+ : s, m) schedule(static) if (count > (int64_t{1} << 16))
    for (int64_t i = 0; i < count; ++i) {
      s += static_cast<double>(x[i]);
      m += std::fabs(static_cast<double>(x[i]));
    }
  } else {
    const double* x = reinterpret_cast<const double*>(byte_ptr(p, first, t));
#pragma omp parallel for reduction(+ : s, m) schedule(static) if (count > (int64_t{1} << 16))
    for (int64_t i = 0; i < count; ++i) {
      s += x[i];
      m += std::fabs(x[i]);
    }
  }
  return {s, m};
}

// Σ of the elements modulo 2^64 (integers).
uint64_t integer_sum(const void* p, int64_t first, int64_t count, DType t) {
  uint64_t s = 0;
  const char* b = byte_ptr(p, first, t);
  for (int64_t i = 0; i < count; ++i) {
    if (t == DType::kI32) {
      int32_t v;
      std::memcpy(&v, b + 4 * i, 4);
      s += static_cast<uint64_t>(static_cast<int64_t>(v));
    } else {
      uint64_t v;
      std::memcpy(&v, b + 8 * i, 8);
      s += v;
    }
  }
  return s;
}

// Whether the sum of a reduced block matches the ranks' checksums: within p − 1 roundings per
// element in the format reduced (floats), plus the checksums' own rounding in double and underflow.
bool float_sum_fits(const FloatSum& result, const std::vector<FloatSum>& ranks, int64_t count, DType t,
                    double& diff, double& bound) {
  double expected = 0, mag = 0;
  for (const FloatSum& r : ranks) expected += r.sum, mag += r.mag;
  const auto p = static_cast<int64_t>(ranks.size());
  const double u = t == DType::kF32 ? bounds::kUnitF32 : bounds::kUnitF64;
  // An underflowing rounding errs by at most half the smallest subnormal.
  const double tiny = t == DType::kF32 ? bounds::kHalfMinSubnormalF32 : std::numeric_limits<double>::denorm_min() / 2;
  diff = std::fabs(result.sum - expected);
  bound = bounds::gamma(p - 1, u) * mag + bounds::gamma(count + p + 2, bounds::kUnitF64) * (2 * mag + result.mag) +
          static_cast<double>(count * p) * tiny;
  if (!std::isfinite(expected) || !std::isfinite(bound)) return true;  // non-finite data: nothing to compare
  return std::isfinite(diff) && diff <= bound;
}

// The combined handle: the operation, its companion, then the check.
class VerifiedHandle final : public comm::Handle::Impl {
 public:
  VerifiedHandle(comm::Handle op, comm::Handle companion, std::function<void()> check)
      : op_(std::move(op)), companion_(std::move(companion)), check_(std::move(check)) {}
  void wait() override {
    op_.wait();
    companion_.wait();
    if (check_) std::exchange(check_, {})();
  }

 private:
  comm::Handle op_, companion_;
  std::function<void()> check_;
};

}  // namespace

void CollectiveLog::record(CollectiveFault f) {
  std::lock_guard<std::mutex> lock(mutex_);
  faults_.push_back(std::move(f));
}

std::vector<CollectiveFault> CollectiveLog::take() {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::exchange(faults_, {});
}

void CollectiveLog::count_checked() {
  std::lock_guard<std::mutex> lock(mutex_);
  ++checked_;
}

int64_t CollectiveLog::checked() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return checked_;
}

VerifiedCommunicator::VerifiedCommunicator(comm::Communicator& inner, CollectiveLog& log, bool check,
                                           ReceiveHook hook)
    : inner_(&inner), log_(log), check_(check), hook_(std::move(hook)) {}

VerifiedCommunicator::VerifiedCommunicator(std::unique_ptr<comm::Communicator> owned, CollectiveLog& log,
                                           bool check, ReceiveHook hook)
    : owned_(std::move(owned)), inner_(owned_.get()), log_(log), check_(check), hook_(std::move(hook)) {}

std::unique_ptr<comm::Communicator> VerifiedCommunicator::split(int color, int key, const std::string& name) {
  return std::unique_ptr<comm::Communicator>(
      new VerifiedCommunicator(inner_->split(color, key, name), log_, check_, hook_));
}

comm::Handle VerifiedCommunicator::unchecked(comm::Handle op, const char* name, std::vector<ReceivedBytes> blocks) {
  if (!hook_) return op;
  return verified(std::move(op), comm::Handle(), [this, name, blocks] { received(name, blocks); });
}

comm::Handle VerifiedCommunicator::verified(comm::Handle op, comm::Handle companion, std::function<void()> check) {
  return comm::Handle(std::make_unique<VerifiedHandle>(std::move(op), std::move(companion), std::move(check)));
}

void VerifiedCommunicator::count_bytes(const comm::CommStats& before) {
  const comm::CommStats& now = inner_->stats();
  stats_.all_reduce += now.all_reduce - before.all_reduce;
  stats_.reduce_scatter += now.reduce_scatter - before.reduce_scatter;
  stats_.all_gather += now.all_gather - before.all_gather;
  stats_.all_to_all += now.all_to_all - before.all_to_all;
  stats_.broadcast += now.broadcast - before.broadcast;
  stats_.send += now.send - before.send;
}

void VerifiedCommunicator::fault(const char* op, int sender_group_rank, double magnitude, double bound) {
  log_.record({.op = op, .group = name(), .receiver = world_ranks()[static_cast<size_t>(rank())],
               .sender = sender_group_rank < 0 ? -1 : world_ranks()[static_cast<size_t>(sender_group_rank)],
               .magnitude = magnitude, .bound = bound});
}

void VerifiedCommunicator::received(const char* op, const std::vector<ReceivedBytes>& blocks) const {
  if (hook_ && !blocks.empty()) hook_(name(), op, blocks);
}

comm::Handle VerifiedCommunicator::iall_reduce(const void* send, void* recv, int64_t count, DType t,
                                               comm::ReduceOp op) {
  if (!check_ || op != comm::ReduceOp::kSum || !(is_float(t) || is_integer(t))) {
    return unchecked(inner_->iall_reduce(send, recv, count, t, op), "all_reduce", whole(recv, count, t));
  }
  const comm::CommStats before = inner_->stats();
  const int p = size();
  if (is_integer(t)) {
    auto sums = std::make_shared<uint64_t>(integer_sum(send, 0, count, t));
    comm::Handle h = inner_->iall_reduce(send, recv, count, t, op);
    comm::Handle c = inner_->iall_reduce(sums.get(), sums.get(), 1, DType::kU64, comm::ReduceOp::kSum);
    count_bytes(before);
    return verified(std::move(h), std::move(c), [this, sums, recv, count, t] {
      received("all_reduce", whole(recv, count, t));
      log_.count_checked();
      if (integer_sum(recv, 0, count, t) != *sums) fault("all_reduce", -1);
    });
  }
  auto mine = std::make_shared<std::vector<FloatSum>>(static_cast<size_t>(p) + 1);
  (*mine)[static_cast<size_t>(p)] = float_sum(send, 0, count, t);
  comm::Handle h = inner_->iall_reduce(send, recv, count, t, op);
  comm::Handle c = inner_->iall_gather(&(*mine)[static_cast<size_t>(p)], mine->data(), 2, DType::kF64);
  count_bytes(before);
  return verified(std::move(h), std::move(c), [this, mine, recv, count, t, p] {
    received("all_reduce", whole(recv, count, t));
    log_.count_checked();
    mine->resize(static_cast<size_t>(p));
    double diff = 0, bound = 0;
    if (!float_sum_fits(float_sum(recv, 0, count, t), *mine, count, t, diff, bound)) fault("all_reduce", -1, diff, bound);
  });
}

comm::Handle VerifiedCommunicator::ireduce_scatter(const void* send, void* recv, std::span<const int64_t> recv_counts,
                                                   DType t, comm::ReduceOp op) {
  if (!check_ || op != comm::ReduceOp::kSum || !is_float(t)) {
    return unchecked(inner_->ireduce_scatter(send, recv, recv_counts, t, op), "reduce_scatter",
                     whole(recv, recv_counts[static_cast<size_t>(rank())], t));
  }
  const comm::CommStats before = inner_->stats();
  const int p = size(), me = rank();
  // Each rank's checksum of the block it sends to each rank, and what each rank sent me.
  auto mine = std::make_shared<std::vector<FloatSum>>(static_cast<size_t>(p));
  auto theirs = std::make_shared<std::vector<FloatSum>>(static_cast<size_t>(p));
  int64_t first = 0;
  for (int q = 0; q < p; ++q) {
    (*mine)[static_cast<size_t>(q)] = float_sum(send, first, recv_counts[static_cast<size_t>(q)], t);
    first += recv_counts[static_cast<size_t>(q)];
  }
  const int64_t count = recv_counts[static_cast<size_t>(me)];
  comm::Handle h = inner_->ireduce_scatter(send, recv, recv_counts, t, op);
  comm::Handle c = inner_->iall_to_all(mine->data(), theirs->data(), 2, DType::kF64);
  count_bytes(before);
  return verified(std::move(h), std::move(c), [this, mine, theirs, recv, count, t] {
    received("reduce_scatter", whole(recv, count, t));
    log_.count_checked();
    double diff = 0, bound = 0;
    if (!float_sum_fits(float_sum(recv, 0, count, t), *theirs, count, t, diff, bound)) {
      fault("reduce_scatter", -1, diff, bound);
    }
  });
}

comm::Handle VerifiedCommunicator::iall_gatherv(const void* send, void* recv, std::span<const int64_t> counts,
                                                std::span<const int64_t> displs, DType t) {
  std::vector<ReceivedBytes> peers = peer_blocks(recv, counts, displs, t, rank());
  if (!check_) return unchecked(inner_->iall_gatherv(send, recv, counts, displs, t), "all_gatherv", std::move(peers));
  const comm::CommStats before = inner_->stats();
  const int p = size(), me = rank();
  auto hashes = std::make_shared<std::vector<uint64_t>>(static_cast<size_t>(p) + 1);
  (*hashes)[static_cast<size_t>(p)] = hash_of(send, 0, counts[static_cast<size_t>(me)], t);
  comm::Handle h = inner_->iall_gatherv(send, recv, counts, displs, t);
  comm::Handle c = inner_->iall_gather(&(*hashes)[static_cast<size_t>(p)], hashes->data(), 1, DType::kU64);
  count_bytes(before);
  std::vector<int64_t> n(counts.begin(), counts.end()), d(displs.begin(), displs.end());
  return verified(std::move(h), std::move(c), [this, hashes, recv, n, d, t, p, peers] {
    received("all_gatherv", peers);
    log_.count_checked();
    for (int q = 0; q < p; ++q) {
      const auto i = static_cast<size_t>(q);
      if (q != rank() && hash_of(recv, d[i], n[i], t) != (*hashes)[i]) fault("all_gatherv", q);
    }
  });
}

comm::Handle VerifiedCommunicator::iall_to_allv(const void* send, std::span<const int64_t> send_counts,
                                                std::span<const int64_t> send_displs, void* recv,
                                                std::span<const int64_t> recv_counts,
                                                std::span<const int64_t> recv_displs, DType t) {
  std::vector<ReceivedBytes> peers = peer_blocks(recv, recv_counts, recv_displs, t, rank());
  if (!check_) {
    return unchecked(inner_->iall_to_allv(send, send_counts, send_displs, recv, recv_counts, recv_displs, t),
                     "all_to_allv", std::move(peers));
  }
  const comm::CommStats before = inner_->stats();
  const int p = size();
  auto out = std::make_shared<std::vector<uint64_t>>(static_cast<size_t>(p));
  auto in = std::make_shared<std::vector<uint64_t>>(static_cast<size_t>(p));
  for (int q = 0; q < p; ++q) {  // this rank's own block is a local copy, not a message
    const auto i = static_cast<size_t>(q);
    if (q != rank()) (*out)[i] = hash_of(send, send_displs[i], send_counts[i], t);
  }
  comm::Handle h = inner_->iall_to_allv(send, send_counts, send_displs, recv, recv_counts, recv_displs, t);
  comm::Handle c = inner_->iall_to_all(out->data(), in->data(), 1, DType::kU64);
  count_bytes(before);
  std::vector<int64_t> n(recv_counts.begin(), recv_counts.end()), d(recv_displs.begin(), recv_displs.end());
  return verified(std::move(h), std::move(c), [this, out, in, recv, n, d, t, p, peers] {
    received("all_to_allv", peers);
    log_.count_checked();
    for (int q = 0; q < p; ++q) {
      const auto i = static_cast<size_t>(q);
      if (q != rank() && hash_of(recv, d[i], n[i], t) != (*in)[i]) fault("all_to_allv", q);
    }
  });
}

comm::Handle VerifiedCommunicator::ibroadcast(void* buf, int64_t count, DType t, int root) {
  if (!check_) {
    return unchecked(inner_->ibroadcast(buf, count, t, root), "broadcast", whole(rank() == root ? nullptr : buf, count, t));
  }
  const comm::CommStats before = inner_->stats();
  auto hash = std::make_shared<uint64_t>(rank() == root ? hash_of(buf, 0, count, t) : 0);
  comm::Handle h = inner_->ibroadcast(buf, count, t, root);
  comm::Handle c = inner_->ibroadcast(hash.get(), 1, DType::kU64, root);
  count_bytes(before);
  return verified(std::move(h), std::move(c), [this, hash, buf, count, t, root] {
    log_.count_checked();
    if (rank() == root) return;
    received("broadcast", whole(buf, count, t));
    if (hash_of(buf, 0, count, t) != *hash) fault("broadcast", root);
  });
}

comm::Handle VerifiedCommunicator::isend(const void* buf, int64_t count, DType t, int dest, int tag) {
  if (!check_) return inner_->isend(buf, count, t, dest, tag);
  LS_CHECK(tag >= 0 && tag < kCompanionTag, "tag ", tag, " collides with the verified companion's");
  const comm::CommStats before = inner_->stats();
  auto hash = std::make_shared<uint64_t>(hash_of(buf, 0, count, t));
  comm::Handle h = inner_->isend(buf, count, t, dest, tag);
  comm::Handle c = inner_->isend(hash.get(), 1, DType::kU64, dest, tag + kCompanionTag);
  count_bytes(before);
  return verified(std::move(h), std::move(c), [hash] {});
}

comm::Handle VerifiedCommunicator::irecv(void* buf, int64_t count, DType t, int source, int tag) {
  if (!check_) {
    return unchecked(inner_->irecv(buf, count, t, source, tag), "send/recv", whole(buf, count, t));
  }
  LS_CHECK(tag >= 0 && tag < kCompanionTag, "tag ", tag, " collides with the verified companion's");
  auto hash = std::make_shared<uint64_t>(0);
  comm::Handle h = inner_->irecv(buf, count, t, source, tag);
  comm::Handle c = inner_->irecv(hash.get(), 1, DType::kU64, source, tag + kCompanionTag);
  return verified(std::move(h), std::move(c), [this, hash, buf, count, t, source] {
    received("send/recv", whole(buf, count, t));
    log_.count_checked();
    if (hash_of(buf, 0, count, t) != *hash) fault("send/recv", source);
  });
}

void CollectiveDetector::after_reduce(int64_t step, float) { report(step); }

void CollectiveDetector::report(int64_t step) {
  const std::vector<CollectiveFault> mine = log_.take();
  // Per rank: how many failed, and the first: its operation, its group (8 bytes of the name), its
  // sender, its magnitude and bound. Agreed on by every rank (agreed.hpp), so that all of them
  // reach the same finding even when this gather is the message that was corrupted.
  uint64_t record[6] = {mine.size(), 0, 0, 0, 0, 0};
  if (!mine.empty()) {
    const CollectiveFault& f = mine.front();
    record[1] = static_cast<uint64_t>(op_code(f.op) + 1);
    std::memcpy(&record[2], f.group.data(), std::min<size_t>(8, f.group.size()));
    record[3] = static_cast<uint64_t>(static_cast<int64_t>(f.sender));
    record[4] = std::bit_cast<uint64_t>(f.magnitude);
    record[5] = std::bit_cast<uint64_t>(f.bound);
  }
  const std::vector<uint64_t> all = agreed_all_gather(world_, record);
  // One finding per operation and group: the receivers, and the senders their blocks came from.
  std::map<std::pair<uint64_t, uint64_t>, std::vector<int>> receivers;
  for (int r = 0; r < world_.size(); ++r) {
    const uint64_t* rec = all.data() + 6 * static_cast<size_t>(r);
    if (rec[0] != 0) receivers[{rec[1], rec[2]}].push_back(r);
  }
  for (const auto& [key, ranks] : receivers) {
    const uint64_t* first = all.data() + 6 * static_cast<size_t>(ranks.front());
    char group[9] = {};
    std::memcpy(group, &first[2], 8);
    const int code = static_cast<int>(key.first) - 1;
    const std::string op = code >= 0 && code < static_cast<int>(std::size(kOps)) ? kOps[code] : "?";
    std::vector<int> senders;
    for (int r : ranks) {
      const auto s = static_cast<int64_t>(all[6 * static_cast<size_t>(r) + 3]);
      if (s >= 0 && std::find(senders.begin(), senders.end(), s) == senders.end()) senders.push_back(static_cast<int>(s));
    }
    const std::string from = ranks_text(senders);
    const double magnitude = std::bit_cast<double>(first[4]), bound = std::bit_cast<double>(first[5]);
    int64_t messages = 0;
    for (int r : ranks) messages += static_cast<int64_t>(all[6 * static_cast<size_t>(r)]);
    findings_.report(
        {.step = step + 1, .ranks = ranks, .detector = "collectives", .site = str_cat(op, " on ", group),
         .magnitude = bound > 0 ? magnitude : static_cast<double>(messages), .bound = bound,
         .unit = bound > 0 ? "|sum - checksums|" : "messages",
         .classification = "corruption",
         .detail = senders.empty()
                       ? str_cat("the reduced result's sum is not the ranks' checksums' (", messages,
                                 " failed check(s) on the receiving ranks)")
                       : str_cat("received blocks from world rank(s) ", from, " do not match the sender's hash (",
                                 messages, " failed check(s) on the receiving ranks)")},
        action_, kExitCorruption, "on_fault");
  }
}

}  // namespace lockstep::detect
