// loom::metrics, TF 1.x's tf.metrics: each metric is a value and an update op over local
// variables (in the "local_variables" and "metric_variables" collections, so a saver
// leaves them out and local_variables_initializer() starts them), and a reset op. The
// update accumulates a batch; the value reads the totals so far. Placed by the device
// scope like any variable: under a replica_device_setter they live on a ps, and every
// worker's updates add to the same totals.
#pragma once

#include <loom/graph/graph.hpp>
#include <loom/graph/lower.hpp>
#include <loom/graph/ops/exact_auc.hpp>
#include <loom/graph/ops/math.hpp>
#include <loom/graph/ops/strided.hpp>
#include <loom/graph/variables.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace loom::metrics {

// A metric's value (float64), the op that adds a batch to it, and the op that zeroes it.
struct metric {
  output<double, 0> value;
  operation update;
  operation reset;
};

namespace detail {
// A local variable of the metric's scope, zeroed.
template <int R>
variable<double, R> local_total(graph& g, const std::string& name, const loom::shape& s) {
  variable<double, R> v(g, name, s, zeros_initializer{},
                        variable_options{.trainable = false, .local = true});
  g.add_to_collection(collection::metric_variables, v.id());
  return v;
}

// num / den, 0 where den is 0 (TF's _safe_div).
template <expression N, expression D> auto safe_div(const N& num, const D& den) {
  return where(greater(den, 0.0), num / maximum(den, 1e-300), num * 0.0);
}

// Zeroes the totals; reads none of them, so it also starts them (before any update).
template <class... V> operation reset_of(graph& g, const V&... vars) {
  return group(g, std::vector<node_id>{
                      vars.assign(output<double, V::rank>(
                                      g, loom::detail::fill_node(g, dtype::f64, vars.shape(), 0)))
                          .id()...});
}

template <expression E> void check_same_shape(const char* fn, const E& a, const loom::shape& b) {
  if (!lower(a).shape().compatible_with(b))
    throw invalid_argument_error(std::string("loom::metrics::") + fn + ": the shapes " +
                                 lower(a).shape().to_string() + " and " + b.to_string() +
                                 " do not match");
}
} // namespace detail

// The mean of `values` over every batch so far (tf.metrics.mean).
template <expression V> metric mean(const V& values, const std::string& name = "mean") {
  static_assert(numeric_type<value_type_of<V>>, "loom::metrics::mean: needs numbers");
  auto lv = lower(cast<double>(values));
  graph g = lv.graph();
  auto scope = g.name_scope(name + "/");
  auto total = detail::local_total<0>(g, "total", loom::shape{});
  auto count = detail::local_total<0>(g, "count", loom::shape{});
  auto add_total = total.assign_add(reduce_sum(lv));
  auto add_count = count.assign_add(reduce_sum(lv * 0.0 + 1.0));
  return {lower(detail::safe_div(total, count)), group(g, add_total, add_count),
          detail::reset_of(g, total, count)};
}

// The fraction of predictions equal to their labels (tf.metrics.accuracy).
template <expression L, expression P>
metric accuracy(const L& labels, const P& predictions, const std::string& name = "accuracy") {
  static_assert(std::is_same_v<value_type_of<L>, value_type_of<P>>,
                "loom::metrics::accuracy: the labels and the predictions must have one dtype "
                "(cast one: an argmax is int64)");
  detail::check_same_shape("accuracy", labels, lower(predictions).shape());
  return mean(cast<double>(equal(labels, predictions)), name);
}

namespace detail {
// tp, fp and fn of bool labels and predictions, as the totals precision and recall read.
template <expression L, expression P>
metric ratio_of_counts(const L& labels, const P& predictions, const std::string& name,
                       bool precision) {
  static_assert(std::is_same_v<value_type_of<L>, bool> && std::is_same_v<value_type_of<P>, bool>,
                "loom::metrics::precision and recall: labels and predictions are bool");
  check_same_shape(precision ? "precision" : "recall", labels, lower(predictions).shape());
  auto l = lower(cast<double>(labels));
  auto p = lower(cast<double>(predictions));
  graph g = l.graph();
  auto scope = g.name_scope(name + "/");
  auto true_positives = local_total<0>(g, "true_positives", loom::shape{});
  auto misses = local_total<0>(g, precision ? "false_positives" : "false_negatives", loom::shape{});
  auto add_tp = true_positives.assign_add(reduce_sum(l * p));
  auto add_miss =
      misses.assign_add(precision ? reduce_sum((1.0 - l) * p) : reduce_sum(l * (1.0 - p)));
  return {lower(safe_div(true_positives, true_positives + misses)), group(g, add_tp, add_miss),
          reset_of(g, true_positives, misses)};
}
} // namespace detail

// tp / (tp + fp) of bool labels and predictions (tf.metrics.precision).
template <expression L, expression P>
metric precision(const L& labels, const P& predictions, const std::string& name = "precision") {
  return detail::ratio_of_counts(labels, predictions, name, true);
}
// tp / (tp + fn) (tf.metrics.recall).
template <expression L, expression P>
metric recall(const L& labels, const P& predictions, const std::string& name = "recall") {
  return detail::ratio_of_counts(labels, predictions, name, false);
}

enum class curve { roc, pr };

// The area under the ROC or precision-recall curve from confusion counts at num_thresholds
// thresholds evenly spread over [0, 1] (tf.metrics.auc, its trapezoidal sum): labels bool,
// predictions probabilities in [0, 1] of one shape.
template <expression L, expression P>
metric auc(const L& labels, const P& predictions, std::int64_t num_thresholds = 200,
           curve kind = curve::roc, const std::string& name = "auc") {
  static_assert(std::is_same_v<value_type_of<L>, bool>, "loom::metrics::auc: bool labels");
  static_assert(floating_type<value_type_of<P>>,
                "loom::metrics::auc: the predictions are float or double probabilities");
  if (num_thresholds < 2)
    throw invalid_argument_error("loom::metrics::auc: num_thresholds " +
                                 std::to_string(num_thresholds) + " must be 2 or more");
  detail::check_same_shape("auc", labels, lower(predictions).shape());
  auto l = reshape(cast<double>(labels), std::array<std::int64_t, 2>{-1, 1});
  auto p = reshape(cast<double>(predictions), std::array<std::int64_t, 2>{-1, 1});
  graph g = l.graph();
  auto scope = g.name_scope(name + "/");
  // TF's thresholds: just below 0, (i + 1) / (n - 1) between, just above 1.
  constexpr double epsilon = 1e-7;
  std::vector<double> t(static_cast<std::size_t>(num_thresholds));
  for (std::int64_t i = 0; i < num_thresholds; ++i)
    t[static_cast<std::size_t>(i)] =
        static_cast<double>(i) / static_cast<double>(num_thresholds - 1);
  t.front() = -epsilon;
  t.back() = 1 + epsilon;
  auto thresholds = constant(g, tensor<double, 2>(loom::shape{1, num_thresholds}, t));
  const loom::shape n{num_thresholds};
  auto tp = detail::local_total<1>(g, "true_positives", n);
  auto fn = detail::local_total<1>(g, "false_negatives", n);
  auto tn = detail::local_total<1>(g, "true_negatives", n);
  auto fp = detail::local_total<1>(g, "false_positives", n);
  auto above = lower(cast<double>(greater(p, thresholds))); // [batch, thresholds]
  auto count = [&](const auto& e) { return reduce_sum(e, 0); };
  auto update = group(g, tp.assign_add(count(l * above)), fn.assign_add(count(l * (1.0 - above))),
                      tn.assign_add(count((1.0 - l) * (1.0 - above))),
                      fp.assign_add(count((1.0 - l) * above)));
  // Trapezoids between consecutive thresholds: x falls as the threshold rises.
  constexpr double smoothing = 1e-6; // TF's compute_auc
  auto tpr = lower((tp + smoothing) / (tp + fn + smoothing));
  auto x = kind == curve::roc ? lower(fp / (fp + tn + smoothing)) : tpr;
  auto y = kind == curve::roc ? tpr : lower((tp + smoothing) / (tp + fp + smoothing));
  auto head = [&](const output<double, 1>& v) {
    return strided_slice(v, {0}, {num_thresholds - 1}, {1});
  };
  auto tail = [&](const output<double, 1>& v) {
    return strided_slice(v, {1}, {num_thresholds}, {1});
  };
  auto value = reduce_sum((head(x) - tail(x)) * (head(y) + tail(y)) * 0.5);
  return {value, update, detail::reset_of(g, tp, fn, tn, fp)};
}

// The exact area under the ROC curve of every (label, prediction) pair so far: the
// Mann-Whitney statistic, a positive and a negative of one prediction counting half
// (scikit-learn's roc_auc_score; TF 1.x has only the thresholded form above). 0 until both
// classes were seen. It keeps every pair, 9 bytes an example, in a host resource beside its
// local variable NAME/pairs (which counts them, so where the device setter places that
// variable every worker's updates reach one list, and initializing the local variables
// forgets the pairs too). Evaluating sorts them: O(n log n).
template <expression L, expression P>
metric exact_auc(const L& labels, const P& predictions, const std::string& name = "exact_auc") {
  static_assert(std::is_same_v<value_type_of<L>, bool>, "loom::metrics::exact_auc: bool labels");
  static_assert(floating_type<value_type_of<P>>,
                "loom::metrics::exact_auc: the predictions are float or double scores");
  detail::check_same_shape("exact_auc", labels, lower(predictions).shape());
  auto l = lower(cast<double>(labels));
  auto p = lower(cast<double>(predictions));
  graph g = l.graph();
  auto scope = g.name_scope(name + "/");
  auto pairs = detail::local_total<0>(g, "pairs", loom::shape{});
  const operation update{g, g.add_node("exact_auc_update", {pairs.id(), l.id(), p.id()})};
  const output<double, 0> value{g, g.add_node("exact_auc", {pairs.id()})};
  const operation reset{g, g.add_node("exact_auc_reset", {pairs.id()})};
  return {value, update, reset};
}

} // namespace loom::metrics
