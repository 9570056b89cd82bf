#include "verify/detect/replicas.hpp"

#include <algorithm>
#include <map>
#include <vector>

#include "src/core/check.hpp"
#include "src/core/hash.hpp"
#include "verify/detect/agreed.hpp"
#include "verify/detect/checksum.hpp"

namespace lockstep::detect {

namespace {

// What one rank contributes: its two hashes.
struct RankHashes {
  uint64_t params, replicated, group;
};

// Hash of the tensors this rank holds whole although tensor parallelism splits the model.
uint64_t tp_replicated_hash(const Model& model) {
  uint64_t h = 0;
  for (const auto& p : model.param_layout()) {
    if (p.replicated()) h = xxh64(model.params() + p.offset, static_cast<size_t>(p.numel) * sizeof(float), h);
  }
  return h;
}

// The ranks of one group (world rank, hash) that differ from its most common hash, and that hash.
struct Odd {
  std::vector<int> ranks;
  std::string detail;
};
Odd odd_members(const std::vector<std::pair<int, uint64_t>>& members, const char* what) {
  // Counted in one pass: a group may hold thousands of ranks.
  std::map<uint64_t, int64_t> count;
  for (const auto& m : members) ++count[m.second];
  uint64_t ref = members[0].second;
  int64_t best = 0;
  for (const auto& [rank, h] : members) {
    if (count[h] > best) best = count[h], ref = h;
  }
  Odd odd;
  for (const auto& [rank, h] : members) {
    if (h == ref) continue;
    odd.ranks.push_back(rank);
    odd.detail += str_cat(odd.detail.empty() ? "" : "; ", "world rank ", rank, " has ", what, " hash ", hex64(h));
  }
  if (!odd.ranks.empty()) odd.detail += str_cat(", the other ", best, " ", hex64(ref));
  return odd;
}

}  // namespace

ReplicaDetector::ReplicaDetector(const Model& model, comm::Communicator& world, comm::Communicator& dp,
                                 comm::Communicator& tp, FindingLog& log, FaultAction action,
                                 const StateAtRestDetector* at_rest)
    : model_(model), world_(world), dp_(dp), tp_(tp), log_(log), action_(action), at_rest_(at_rest) {
  const std::vector<int> members = dp_.all_gather(world_.rank());
  replica_group_ = static_cast<uint64_t>(*std::min_element(members.begin(), members.end()));
}

void ReplicaDetector::end_step(const StepRecord& r) {
  const bool tp = tp_.size() > 1;
  if (dp_.size() == 1 && !tp) return;
  uint64_t params = 0;
  if (dp_.size() > 1) {
    const std::optional<uint64_t> taken = at_rest_ ? at_rest_->hash_after_update(r.step, "parameters") : std::nullopt;
    params = taken ? *taken : block_hash(model_.params(), static_cast<size_t>(model_.num_params()) * sizeof(float));
  }
  const uint64_t mine[3] = {params, tp ? tp_replicated_hash(model_) : 0, replica_group_};
  const std::vector<uint64_t> gathered = agreed_all_gather(world_, mine);
  std::vector<RankHashes> all(static_cast<size_t>(world_.size()));
  for (size_t w = 0; w < all.size(); ++w) all[w] = {gathered[3 * w], gathered[3 * w + 1], gathered[3 * w + 2]};

  // Groups: a replica group by its lowest world rank; the members of one tp group differ only in
  // their tp coordinate (the fastest axis of the world's ranks: src/parallel/mesh.hpp).
  std::map<uint64_t, std::vector<std::pair<int, uint64_t>>> replicas, tp_groups;
  for (size_t w = 0; w < all.size(); ++w) {
    replicas[all[w].group].push_back({static_cast<int>(w), all[w].params});
    tp_groups[w / static_cast<uint64_t>(tp_.size())].push_back({static_cast<int>(w), all[w].replicated});
  }
  // One finding per kind of replica, naming the odd ranks of every group: a fault reaches other
  // groups through the reductions, and the finding must not stop at the first.
  const auto check = [&](const auto& groups, const char* what, const char* site, const char* index) {
    Finding f{.step = r.done(), .detector = "replicas", .unit = "ranks", .classification = "corruption"};
    std::vector<int> odd_groups;
    for (const auto& [g, members] : groups) {
      const Odd odd = odd_members(members, what);
      if (odd.ranks.empty()) continue;
      odd_groups.push_back(static_cast<int>(g));
      f.ranks.insert(f.ranks.end(), odd.ranks.begin(), odd.ranks.end());
      f.detail += str_cat(f.detail.empty() ? "" : "; ", odd.detail);
    }
    if (odd_groups.empty()) return;
    f.site = str_cat(site, " (", index, odd_groups.size() > 1 ? "s " : " ", ranks_text(odd_groups), ")");
    f.magnitude = static_cast<double>(f.ranks.size());
    log_.report(f, action_, kExitCorruption, "on_fault");
  };
  const bool dp_tp = static_cast<int>(all.size()) == dp_.size() * tp_.size();  // no other axis
  if (dp_.size() > 1) {
    check(replicas, "parameter", "parameters of the dp replicas", dp_tp ? "tp rank" : "replica group at world rank");
  }
  if (tp) check(tp_groups, "replicated-tensor", "tensors every tp rank holds whole", dp_tp ? "dp rank" : "tp group");
}

}  // namespace lockstep::detect
