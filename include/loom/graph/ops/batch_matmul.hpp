// Op definition of batch_matmul (TF's BatchMatMulV2, what tf.matmul is on tensors of rank 3
// or more): a matrix product per batch index, the batch dimensions broadcast, each operand
// optionally transposed (adj_x, adj_y). Kernels: kernels/cpu/batch_matmul.hpp and
// kernels/cuda/batch_matmul.cuh, over one batch_layout.
#pragma once

#include <loom/graph/builder.hpp>
#include <loom/graph/op_registry.hpp>
#include <loom/graph/ops/math.hpp>
#include <loom/graph/output.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace loom::detail {

// A batch_matmul's shapes: out [batch..., m, n] = op(a) [batch_a..., m, k] op(b)
// [batch_b..., k, n], the batch dimensions broadcast; per output batch index, which batch
// of a and of b it multiplies. A dimension known only when the step runs is -1 and leaves
// what depends on it unknown.
struct batch_layout {
  std::int64_t m = -1, n = -1, k = -1;
  std::vector<std::int64_t> batch;          // the output's batch dimensions
  std::vector<std::int64_t> a_step, b_step; // per batch dimension: the operand's batch
                                            // stride, 0 where it is broadcast
  std::int64_t batches() const {
    std::int64_t total = 1;
    for (std::int64_t d : batch)
      total *= d;
    return total;
  }
  loom::shape output_shape() const {
    std::vector<std::int64_t> d = batch;
    d.push_back(m);
    d.push_back(n);
    return loom::shape(std::move(d));
  }
  // The batch of a (which_a) or b multiplied at output batch index `at`.
  std::int64_t operand_batch(std::int64_t at, bool which_a) const {
    const auto& step = which_a ? a_step : b_step;
    std::int64_t index = 0;
    for (std::size_t d = batch.size(); d-- > 0;) {
      index += at % batch[d] * step[d];
      at /= batch[d];
    }
    return index;
  }
};

inline batch_layout batch_layout_of(const node_def& n, const loom::shape& a, const loom::shape& b,
                                    bool adj_x, bool adj_y) {
  auto fail = [&](const std::string& why) {
    return invalid_argument_error("node " + n.describe() + ": " + why + " (shapes " +
                                  a.to_string() + " and " + b.to_string() +
                                  (adj_x ? ", adj_x" : "") + (adj_y ? ", adj_y" : "") + ")");
  };
  if (a.rank() < 2 || b.rank() < 2)
    throw fail("batch_matmul needs operands of rank 2 or more");
  batch_layout l;
  const int ra = a.rank(), rb = b.rank();
  l.m = adj_x ? a[ra - 1] : a[ra - 2];
  l.k = adj_x ? a[ra - 2] : a[ra - 1];
  const std::int64_t kb = adj_y ? b[rb - 1] : b[rb - 2];
  l.n = adj_y ? b[rb - 2] : b[rb - 1];
  if (l.k >= 0 && kb >= 0 && l.k != kb)
    throw fail("the inner dimensions " + std::to_string(l.k) + " and " + std::to_string(kb) +
               " differ");
  if (l.k < 0)
    l.k = kb;
  const int batch_rank = std::max(ra, rb) - 2;
  std::int64_t a_stride = 1, b_stride = 1;
  l.batch.assign(static_cast<std::size_t>(batch_rank), 1);
  l.a_step.assign(static_cast<std::size_t>(batch_rank), 0);
  l.b_step.assign(static_cast<std::size_t>(batch_rank), 0);
  for (int d = batch_rank - 1; d >= 0; --d) {
    const int da = d - (batch_rank - (ra - 2)), db = d - (batch_rank - (rb - 2));
    const std::int64_t sa = da >= 0 ? a[da] : 1, sb = db >= 0 ? b[db] : 1;
    const auto ud = static_cast<std::size_t>(d);
    if (sa >= 0 && sb >= 0 && sa != sb && sa != 1 && sb != 1)
      throw fail("batch dimensions " + std::to_string(sa) + " and " + std::to_string(sb) +
                 " do not broadcast");
    l.batch[ud] = sa == 1 ? sb : sb == 1 ? sa : (sa < 0 ? sb : sa);
    l.a_step[ud] = sa == 1 ? 0 : a_stride;
    l.b_step[ud] = sb == 1 ? 0 : b_stride;
    a_stride *= sa;
    b_stride *= sb;
  }
  return l;
}

#ifndef LOOM_COMPILED_KERNELS
inline bool register_batch_matmul_op() {
  // Inputs (a, b), attrs adj_x, adj_y. The gradient (TF's): each operand's product with dy,
  // transposed as the forward product was, summed over the batch dimensions it was
  // broadcast along.
  op_registry::instance().add(
      {.name = "batch_matmul",
       .num_inputs = 2,
       .infer =
           [](node_def& n, const std::vector<const node_def*>& in) {
             if (in[0]->type != in[1]->type ||
                 (in[0]->type != dtype::f32 && in[0]->type != dtype::f64))
               throw invalid_argument_error("node " + n.describe() + ": " + in[0]->describe() +
                                            " and " + in[1]->describe() +
                                            " must be float or double, of one dtype");
             n.type = in[0]->type;
             n.shape =
                 batch_layout_of(n, in[0]->shape, in[1]->shape, n.attr_or<bool>("adj_x", false),
                                 n.attr_or<bool>("adj_y", false))
                     .output_shape();
           },
       .gradient =
           [](graph& g, const node_def& n, node_id dy) {
             const node_id a = n.inputs[0], b = n.inputs[1];
             const bool ax = n.attr_or<bool>("adj_x", false), ay = n.attr_or<bool>("adj_y", false);
             auto product = [&](node_id x, node_id y, bool tx, bool ty) {
               return g.add_node("batch_matmul", {x, y}, {{"adj_x", tx}, {"adj_y", ty}});
             };
             node_id da, db;
             if (!ax && !ay) {
               da = product(dy, b, false, true);
               db = product(a, dy, true, false);
             } else if (ax && !ay) {
               da = product(b, dy, false, true);
               db = product(a, dy, false, false);
             } else if (!ax && ay) {
               da = product(dy, b, false, false);
               db = product(dy, a, true, false);
             } else {
               da = product(b, dy, true, true);
               db = product(dy, a, true, true);
             }
             return std::vector{build::sum_to(g, da, a), build::sum_to(g, db, b)};
           }});
  return true;
}

inline const bool batch_matmul_op_registered = register_batch_matmul_op();
#endif

} // namespace loom::detail

namespace loom {

// op(a) op(b) for each batch index (tf.matmul on tensors of rank 3 or more, TF's
// BatchMatMulV2): [batch..., m, k] x [batch..., k, n], batch dimensions broadcast (a
// dimension of 1 or a missing one against any), adj_x / adj_y transposing the last two.
template <expression A, expression B>
output<value_type_of<A>, std::max(rank_of<A>, rank_of<B>)>
batch_matmul(const A& a, const B& b, bool adj_x = false, bool adj_y = false) {
  static_assert(rank_of<A> >= 2 && rank_of<B> >= 2,
                "loom::batch_matmul: both operands need rank 2 or more ([batch..., rows, cols])");
  static_assert(std::is_same_v<value_type_of<A>, value_type_of<B>> &&
                    floating_type<value_type_of<A>>,
                "loom::batch_matmul: the operands must be float or double, of one dtype");
  auto la = lower(a);
  auto lb = lower(b);
  graph g = detail::common_graph("batch_matmul", la, lb);
  return {g, g.add_node("batch_matmul", {la.id(), lb.id()}, {{"adj_x", adj_x}, {"adj_y", adj_y}})};
}

} // namespace loom
