// CPU kernels of the exact AUC's state (graph/ops/exact_auc.hpp): the pairs seen, a host
// resource beside the anchor variable. The value sorts the predictions once and sums the
// positives' ranks (the Mann-Whitney statistic; tied predictions share their mean rank, so
// a tie between a positive and a negative counts half): O(n log n) per evaluation, 9 bytes
// per pair kept.
#pragma once

#include <loom/graph/ops/exact_auc.hpp>
#include <loom/kernels/checks/state.hpp>
#include <loom/kernels/cpu/sync.hpp>
#include <loom/kernels/registry.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <numeric>
#include <string>
#include <vector>

namespace loom::kernels {

struct auc_pairs : resource_base {
  std::mutex mu;
  std::vector<double> predictions;
  std::vector<std::uint8_t> positive;
};

// The area under the ROC curve of the pairs: 0 until both a positive and a negative were
// seen (as the thresholded form's safe division gives 0 where it cannot divide).
inline double exact_roc_auc(const std::vector<double>& predictions,
                            const std::vector<std::uint8_t>& positive) {
  const std::size_t n = predictions.size();
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::sort(order.begin(), order.end(),
            [&](std::size_t a, std::size_t b) { return predictions[a] < predictions[b]; });
  double positives = 0, rank_sum = 0;
  for (std::size_t first = 0; first < n;) {
    std::size_t last = first; // [first, last]: one prediction value
    while (last + 1 < n && predictions[order[last + 1]] == predictions[order[first]])
      ++last;
    const double mean_rank = (static_cast<double>(first + last) + 2) / 2; // ranks from 1
    for (std::size_t i = first; i <= last; ++i)
      if (positive[order[i]]) {
        positives += 1;
        rank_sum += mean_rank;
      }
    first = last + 1;
  }
  const double negatives = static_cast<double>(n) - positives;
  if (positives == 0 || negatives == 0)
    return 0;
  return (rank_sum - positives * (positives + 1) / 2) / (positives * negatives);
}

// The anchor variable holds the number of pairs: the pairs belong to the metric while it
// is not 0, so initializing the metric's local variables (to 0) forgets them too, as it
// resets TF's metrics. Locks: the variable's, then the pairs'.
template <class T> struct exact_auc_cpu {
  static void run(kernel_context& c) {
    variable_resource& count = *c.refs[0];
    auto pairs = attached_resource<auc_pairs>(c);
    std::lock_guard count_lock(count.mu);
    const bool reset = c.node.op == "exact_auc_reset";
    if (!reset)
      check_variable_initialized(c.node, count);
    std::lock_guard pairs_lock(pairs->mu);
    const bool empty = reset || *count.value.data<double>() == 0;
    if (empty) {
      pairs->predictions = {};
      pairs->positive = {};
    }
    if (c.node.op == "exact_auc_update") {
      const any_tensor& labels = c.input(1);
      const any_tensor& predictions = c.input(2);
      if (labels.shape() != predictions.shape())
        throw invalid_argument_error("node " + c.node.describe() + ": labels of shape " +
                                     labels.shape().to_string() + " and predictions of shape " +
                                     predictions.shape().to_string() + " differ");
      const double* p = predictions.data<double>();
      const double* l = labels.data<double>();
      const std::int64_t n = predictions.num_elements();
      for (std::int64_t i = 0; i < n; ++i)
        if (std::isnan(p[i]))
          throw invalid_argument_error("node " + c.node.describe() + ": prediction " +
                                       std::to_string(i) + " is NaN");
      pairs->predictions.insert(pairs->predictions.end(), p, p + n);
      for (std::int64_t i = 0; i < n; ++i)
        pairs->positive.push_back(l[i] > 0.5 ? 1 : 0);
    }
    if (c.node.op == "exact_auc")
      c.output = any_tensor::scalar<double>(exact_roc_auc(pairs->predictions, pairs->positive));
    else {
      count.value = any_tensor::scalar<double>(static_cast<double>(pairs->predictions.size()));
      count.initialized = true;
    }
  }
};

// In a program that links loom::kernels, registered in its unit only (kernels/registry.hpp).
#ifndef LOOM_COMPILED_KERNELS
inline bool register_exact_auc_kernels() {
  for (const char* op : {"exact_auc_update", "exact_auc", "exact_auc_reset"})
    register_kernels<exact_auc_cpu>(op, type_list<double>{});
  return true;
}

inline const bool exact_auc_kernels_registered = register_exact_auc_kernels();
#endif

} // namespace loom::kernels
