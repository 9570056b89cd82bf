#include "src/plan/cost_model.hpp"

#include <functional>
#include <vector>

namespace lockstep::plan {

double all_reduce_time(double bytes, int64_t n, const Link& l) {
  if (n <= 1) return 0;
  const double k = static_cast<double>(n - 1);
  return 2 * k * l.latency + 2 * k / static_cast<double>(n) * bytes / l.bandwidth;
}

namespace {

// Linear between the two measured sizes around `bytes`, the smallest's time below them, and beyond
// the largest its time plus the rest as `model` prices it.
double interpolate(const std::vector<CollectiveSample>& s, double bytes, const std::function<double(double)>& model) {
  if (bytes <= s.front().bytes) return s.front().seconds;
  for (size_t i = 1; i < s.size(); ++i) {
    if (bytes <= s[i].bytes) {
      const double w = (bytes - s[i - 1].bytes) / (s[i].bytes - s[i - 1].bytes);
      return s[i - 1].seconds + w * (s[i].seconds - s[i - 1].seconds);
    }
  }
  return s.back().seconds + model(bytes) - model(s.back().bytes);
}

// A collective over n ranks: its `samples` where the measurement covers n ranks, else `model`.
double measured_or(const std::vector<CollectiveSample>& samples, double bytes, int64_t n,
                   const MeasuredAllReduce& measured, const std::function<double(double)>& model) {
  if (n != measured.ranks || samples.empty()) return model(bytes);
  return interpolate(samples, bytes, model);
}

}  // namespace

double all_reduce_time(double bytes, int64_t n, const Link& l, const MeasuredAllReduce& measured) {
  return measured_or(measured.fp32, bytes, n, measured, [&](double b) { return all_reduce_time(b, n, l); });
}

double all_gather_time(double bytes, int64_t n, const Link& l, const MeasuredAllReduce& measured) {
  if (n <= 1) return 0;
  return measured_or(measured.gather, bytes, n, measured, [&](double b) { return all_reduce_time(b, n, l) / 2; });
}

double layer_gather_time(double bytes, int64_t n, const Link& l, const MeasuredAllReduce& measured) {
  if (n <= 1) return 0;
  return measured_or(measured.layer_gather, bytes, n, measured,
                     [&](double b) { return all_gather_time(b, n, l, measured); });
}

double exact_all_reduce_time(double fp32_bytes, int64_t n, const Link& l, const MeasuredAllReduce& measured) {
  if (n <= 1) return 0;
  return measured_or(measured.exact, fp32_bytes, n, measured,
                     [&](double b) { return (all_reduce_time(2 * b, n, l) + all_reduce_time(b, n, l)) / 2; });
}

double exact_reduce_scatter_time(double fp32_bytes, int64_t n, const Link& l, const MeasuredAllReduce& measured,
                                 bool one_owner) {
  if (n <= 1) return 0;
  return measured_or(one_owner ? measured.exact_scatter_owned : measured.exact_scatter, fp32_bytes, n, measured,
                     [&](double b) { return exact_all_reduce_time(b, n, l, measured) * 2 / 3; });
}

double exact_fp32_reduce_scatter_time(double fp32_bytes, int64_t n, const Link& l, const MeasuredAllReduce& measured,
                                      bool one_owner) {
  if (n <= 1) return 0;
  return measured_or(one_owner ? measured.exact_fp32_scatter_owned : measured.exact_fp32_scatter, fp32_bytes, n,
                     measured, [&](double b) { return all_reduce_time(b, n, l, measured) / 2; });
}

double send_time(double bytes, const Link& l) { return l.latency + bytes / l.bandwidth; }

double all_to_all_time(double bytes, int64_t n, const Link& l) {
  if (n <= 1) return 0;
  const double k = static_cast<double>(n - 1);
  return k * l.latency + k / static_cast<double>(n) * bytes / l.bandwidth;
}

const Link& group_link(const Cluster& c, int64_t stride, int64_t n) {
  return stride * (n - 1) + 1 <= c.gpus_per_node && c.gpus_per_node % (stride * n) == 0 ? c.intra : c.inter;
}

}  // namespace lockstep::plan
