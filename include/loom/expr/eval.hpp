// Evaluation of elementwise ops on Eigen, on a thread-pool device.
//
// Two entry points share the op tags' eval():
//  - elementwise_kernel<Op, T>: one primitive op over runtime tensors, with
//    TF broadcasting (the kernel every process has);
//  - fused_kernel<E>: a whole typed tree as one Eigen expression, one pass over
//    memory (instantiated only where the user's code has that tree).
#pragma once

#include <loom/core/error.hpp>
#include <loom/core/tensor.hpp>
#include <loom/expr/expr.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace loom {

using cpu_device = Eigen::ThreadPoolDevice;

namespace detail {

// The shape all operands broadcast to; `what` names the op for the error.
inline loom::shape broadcast_all(std::span<const any_tensor* const> in, const std::string& what) {
  loom::shape s = in.empty() ? loom::shape{} : in[0]->shape();
  for (std::size_t i = 1; i < in.size(); ++i)
    s = broadcast_shapes(s, in[i]->shape(), what);
  return s;
}

// Elementwise work is split into contiguous chunks over the pool, and each
// chunk is one Eigen expression evaluated on the DefaultDevice (vectorised,
// single-threaded). That instantiates Eigen's light default executor once per
// expression instead of the ThreadPoolDevice executor with its tiling machinery:
// the same speed on these sizes at well under half the compile time.
template <class T>
using chunk_map = Eigen::TensorMap<Eigen::Tensor<T, 1, Eigen::RowMajor, Eigen::DenseIndex>>;

// A chunk [first, first + len) of a rank-1 operand that is either the tensor
// itself or, when the tensor holds one element, that element repeated.
// constant() reads only the dimensions of the map it is called on.
template <class T>
auto flat_operand(const any_tensor& t, Eigen::DenseIndex first, Eigen::DenseIndex len) {
  return chunk_map<const T>(t.data<T>() + first, len);
}
template <class T> auto repeated_operand(const any_tensor& t, Eigen::DenseIndex len) {
  return chunk_map<const T>(t.data<T>(), len).constant(*t.data<T>());
}

// Runs f(first, last) over blocks covering [0, n), on the calling thread and
// the pool's; `cost` is per element (Eigen's cost model picks how many threads
// the work is worth). Every CPU kernel splits its work through this.
//
// Why not Eigen's parallelFor: with more blocks than threads it hands even the
// first block to the pool and sleeps until the last is done, two thread
// switches that on a small machine cost tens of µs each, more than much of
// the work (a ps applying a step's update, whose pool was asleep). Here the
// caller starts on the blocks at once, taking them from a shared counter, and
// pool threads take what is left when they wake. One that wakes after the
// last block was taken touches nothing of the caller's.
template <class F>
void parallel_for(const cpu_device& d, Eigen::DenseIndex n, const Eigen::TensorOpCost& cost,
                  F&& f) {
  if (n <= 0)
    return;
  const int threads =
      Eigen::TensorCostModel<cpu_device>::numThreads(static_cast<double>(n), cost, d.numThreads());
  if (threads <= 1 || n == 1) {
    f(Eigen::DenseIndex{0}, n);
    return;
  }
  // About four blocks a thread, so a late thread still finds a share.
  struct shared_blocks {
    Eigen::DenseIndex n = 0, size = 0;
    int count = 0;
    std::atomic<int> next{0}, finished{0};
    void (*run)(void*, Eigen::DenseIndex, Eigen::DenseIndex) = nullptr;
    void* f = nullptr; // valid while blocks remain: the caller waits for them
    void take() {
      for (int b; (b = next.fetch_add(1)) < count;) {
        const Eigen::DenseIndex first = b * size;
        run(f, first, std::min(n, first + size));
        if (finished.fetch_add(1) + 1 == count)
          finished.notify_all();
      }
    }
  };
  auto blocks = std::make_shared<shared_blocks>();
  blocks->n = n;
  blocks->size = std::max<Eigen::DenseIndex>(1, (n + 4 * threads - 1) / (4 * threads));
  blocks->count = static_cast<int>((n + blocks->size - 1) / blocks->size);
  blocks->run = [](void* fn, Eigen::DenseIndex first, Eigen::DenseIndex last) {
    (*static_cast<std::remove_reference_t<F>*>(fn))(first, last);
  };
  blocks->f = const_cast<void*>(static_cast<const void*>(std::addressof(f)));
  for (int t = 1; t < std::min(threads, blocks->count); ++t)
    d.enqueueNoNotification([blocks] { blocks->take(); });
  blocks->take();
  for (int done = blocks->finished.load(); done < blocks->count; done = blocks->finished.load())
    blocks->finished.wait(done);
}

// Runs chunk(first, len) over [0, n) on the pool; `cost` is per element.
template <class F>
void parallel_chunks(const cpu_device& d, Eigen::DenseIndex n, const Eigen::TensorOpCost& cost,
                     F&& chunk) {
  parallel_for(d, n, cost, [&](Eigen::DenseIndex first, Eigen::DenseIndex last) {
    chunk(first, last - first);
  });
}

// Materialises t broadcast to `to` (TF semantics), for the general case.
template <class T>
any_tensor broadcast_to(const cpu_device& d, const any_tensor& t, const loom::shape& to) {
  constexpr int max_rank = 6;
  if (to.rank() > max_rank)
    throw unimplemented_error("broadcasting beyond rank 6 (shape " + to.to_string() + ")");
  any_tensor out(t.type(), to);
  Eigen::array<Eigen::DenseIndex, max_rank> in_dims{}, out_dims{}, factors{};
  const int pad = max_rank - to.rank(), in_pad = max_rank - t.rank();
  for (int i = 0; i < max_rank; ++i) {
    out_dims[static_cast<std::size_t>(i)] = i < pad ? 1 : to[i - pad];
    in_dims[static_cast<std::size_t>(i)] = i < in_pad ? 1 : t.shape()[i - in_pad];
    factors[static_cast<std::size_t>(i)] =
        in_dims[static_cast<std::size_t>(i)] == 1 ? out_dims[static_cast<std::size_t>(i)] : 1;
  }
  const_tensor_map<T, max_rank> src(t.data<T>(), in_dims);
  tensor_map<T, max_rank> dst(out.data<T>(), out_dims);
  dst.device(d) = src.broadcast(factors);
  return out;
}

// Calls f with one Eigen operand per input for the chunk [first, first + len),
// each the full tensor's chunk or its single element repeated, so `x * 2` and
// `x * y` both take one pass. When every operand is a single element the output
// has one element too, and the operands are read as tensors: no all-constant
// instantiation is needed.
template <class In, bool FirstIsBool, std::size_t I, std::size_t N, bool AnyTensor = false, class F,
          class... Operands>
void with_flat_operands(std::span<const any_tensor* const> in, Eigen::DenseIndex n,
                        Eigen::DenseIndex first, Eigen::DenseIndex len, F&& f,
                        const Operands&... ops) {
  if constexpr (I == N) {
    f(ops...);
  } else {
    const any_tensor& t = *in[I];
    using TI = std::conditional_t<I == 0 && FirstIsBool, bool, In>;
    // The last operand is read as a tensor if none before it was.
    constexpr bool may_repeat = AnyTensor || I + 1 < N;
    if constexpr (may_repeat) {
      if (t.num_elements() == 1 && n != 1) {
        with_flat_operands<In, FirstIsBool, I + 1, N, AnyTensor>(in, n, first, len, f, ops...,
                                                                 repeated_operand<TI>(t, len));
        return;
      }
    }
    with_flat_operands<In, FirstIsBool, I + 1, N, true>(in, n, first, len, f, ops...,
                                                        flat_operand<TI>(t, first, len));
  }
}

// Op's result type when all n_in operands have element type T (select's
// condition is given as T too: result<> ignores it).
template <class Op, class T, std::size_t N> struct result_of_n;
template <class Op, class T> struct result_of_n<Op, T, 1> {
  using type = typename Op::template result<T>;
};
template <class Op, class T> struct result_of_n<Op, T, 2> {
  using type = typename Op::template result<T, T>;
};
template <class Op, class T> struct result_of_n<Op, T, 3> {
  using type = typename Op::template result<T, T, T>;
};

} // namespace detail

// One elementwise op over runtime tensors. Operands that already have the
// output's shape, or hold a single element, are read in place; others are
// broadcast into a temporary first.
template <class Op, class T>
any_tensor elementwise_kernel(const cpu_device& d, std::span<const any_tensor* const> in,
                              const std::string& node_name) {
  constexpr std::size_t n_in = static_cast<std::size_t>(Op::arity);
  using Out = typename detail::result_of_n<Op, T, n_in>::type;

  const loom::shape out_shape = detail::broadcast_all(in, node_name);
  const Eigen::DenseIndex n = out_shape.num_elements();
  std::array<any_tensor, n_in> expanded;
  std::array<const any_tensor*, n_in> operands{};
  for (std::size_t i = 0; i < n_in; ++i) {
    const any_tensor& t = *in[i];
    if (t.num_elements() == 1 || t.shape() == out_shape)
      operands[i] = &t;
    else {
      expanded[i] = visit_dtype(t.type(), [&]<class E>() -> any_tensor {
        if constexpr (std::is_same_v<E, std::string>)
          throw invalid_argument_error(node_name + ": string operand");
        else
          return detail::broadcast_to<E>(d, t, out_shape);
      });
      operands[i] = &expanded[i];
    }
  }
  any_tensor out(dtype_of<Out>, out_shape);
  if (n == 0)
    return out;
  Out* dst = out.data<Out>();
  constexpr bool first_is_bool = std::is_same_v<Op, ops::select>; // select's condition
  const Eigen::TensorOpCost cost(static_cast<double>(n_in * sizeof(T)), sizeof(Out), 4.0);
  detail::parallel_chunks(d, n, cost, [&](Eigen::DenseIndex first, Eigen::DenseIndex len) {
    detail::with_flat_operands<T, first_is_bool, 0, n_in>(
        operands, n, first, len,
        [&](const auto&... ops) { detail::chunk_map<Out>(dst + first, len) = Op::eval(ops...); });
  });
  return out;
}

// -- fused regions ------------------------------------------------------------

namespace detail {

// Builds the Eigen expression of a typed tree. Leaves are read from `in` in
// depth-first order starting at Offset; rank-0 leaves become constants.
template <class E, std::size_t Offset>
auto fused_operand(std::span<const any_tensor* const> in, Eigen::DenseIndex first,
                   Eigen::DenseIndex len) {
  if constexpr (E::is_leaf) {
    using T = typename E::value_type;
    const any_tensor& t = *in[Offset];
    if constexpr (E::rank == 0)
      return repeated_operand<T>(t, len);
    else
      return flat_operand<T>(t, first, len);
  } else {
    return []<class Op, class... C>(std::type_identity<expr<Op, C...>>,
                                    std::span<const any_tensor* const> leaves,
                                    Eigen::DenseIndex begin, Eigen::DenseIndex size) {
      return [&]<std::size_t... I>(std::index_sequence<I...>) {
        constexpr auto at = child_leaf_offsets<E, Offset>();
        return Op::eval(fused_operand<C, at[I]>(leaves, begin, size)...);
      }
      (std::index_sequence_for<C...>{});
    }(std::type_identity<E>{}, in, first, len);
  }
}

template <class E, std::size_t Offset = 0>
bool leaves_have_shape(std::span<const any_tensor* const> in, const loom::shape& s) {
  if constexpr (E::is_leaf) {
    return E::rank == 0 ? in[Offset]->num_elements() == 1 : in[Offset]->shape() == s;
  } else {
    return
        []<class Op, class... C>(std::type_identity<expr<Op, C...>>,
                                 std::span<const any_tensor* const> leaves, const loom::shape& sh) {
          return [&]<std::size_t... I>(std::index_sequence<I...>) {
            constexpr auto at = child_leaf_offsets<E, Offset>();
            return (leaves_have_shape<C, at[I]>(leaves, sh) && ...);
          }
          (std::index_sequence_for<C...>{});
        }(std::type_identity<E>{}, in, s);
  }
}

} // namespace detail

// The kernel of a fused region: false when the operands' shapes need general
// broadcasting, and the caller then runs the region's primitive ops instead.
using fused_kernel_fn = bool (*)(const cpu_device&, std::span<const any_tensor* const> leaves,
                                 any_tensor& out, const std::string& node_name);

// The same on a GPU (kernels/cuda/fused.cuh): the leaves are on that GPU, the
// output is made there, and the kernel is queued on the GPU's stream.
struct gpu_context;
using gpu_fused_kernel_fn = bool (*)(const gpu_context&, std::span<const any_tensor* const> leaves,
                                     any_tensor& out, const std::string& node_name);

template <class E>
bool fused_kernel(const cpu_device& d, std::span<const any_tensor* const> leaves, any_tensor& out,
                  const std::string& node_name) {
  if (leaves.size() != leaf_count<E>())
    throw internal_error(node_name + ": fused region expects " + std::to_string(leaf_count<E>()) +
                         " inputs, got " + std::to_string(leaves.size()));
  const loom::shape s = detail::broadcast_all(leaves, node_name);
  if (!detail::leaves_have_shape<E>(leaves, s))
    return false;
  using T = typename E::value_type;
  out = any_tensor(dtype_of<T>, s);
  const Eigen::DenseIndex n = s.num_elements();
  if (n == 0)
    return true;
  T* dst = out.data<T>();
  const Eigen::TensorOpCost cost(static_cast<double>(leaf_count<E>() * sizeof(T)), sizeof(T),
                                 4.0 * static_cast<double>(op_count<E>()));
  detail::parallel_chunks(d, n, cost, [&](Eigen::DenseIndex first, Eigen::DenseIndex len) {
    detail::chunk_map<T>(dst + first, len) = detail::fused_operand<E, 0>(leaves, first, len);
  });
  return true;
}

} // namespace loom

namespace loom {

// The process's fused kernels, by the canonical key of their region. Lowering
// a typed tree registers its instantiation here: the CPU's always, the GPU's
// when the lowering translation unit is compiled by nvcc. A process that
// never saw the tree (a generic server) has no entry and runs the primitive
// ops instead.
class fused_kernel_registry {
public:
  static fused_kernel_registry& instance() {
    static fused_kernel_registry r;
    return r;
  }
  void add(const std::string& key, fused_kernel_fn fn) {
    std::lock_guard lock(mu_);
    kernels_[key].cpu = fn;
  }
  void add(const std::string& key, gpu_fused_kernel_fn fn) {
    std::lock_guard lock(mu_);
    kernels_[key].gpu = fn;
  }
  fused_kernel_fn find(const std::string& key) const {
    std::lock_guard lock(mu_);
    auto it = kernels_.find(key);
    return it == kernels_.end() ? nullptr : it->second.cpu;
  }
  gpu_fused_kernel_fn find_gpu(const std::string& key) const {
    std::lock_guard lock(mu_);
    auto it = kernels_.find(key);
    return it == kernels_.end() ? nullptr : it->second.gpu;
  }

private:
  struct kernels {
    fused_kernel_fn cpu = nullptr;
    gpu_fused_kernel_fn gpu = nullptr;
  };
  mutable std::mutex mu_;
  std::map<std::string, kernels, std::less<>> kernels_;
};

// The canonical key of a typed tree: op ids, cast targets, leaf dtypes and
// whether each leaf is a scalar, e.g. "mul(f32:t,log(clip_by_value(f32:t,f32:s,f32:s)))".
template <class E> std::string region_key() {
  if constexpr (E::is_leaf) {
    return std::string(to_string(dtype_of<typename E::value_type>)) + (E::rank == 0 ? ":s" : ":t");
  } else {
    return []<class Op, class... C>(std::type_identity<expr<Op, C...>>) {
      std::string k = Op::id;
      if constexpr (std::is_same_v<Op, ops::cast<typename E::value_type>>)
        k += std::string("<") + std::string(to_string(dtype_of<typename E::value_type>)) + ">";
      k += '(';
      bool first = true;
      ((k += (first ? "" : ","), k += region_key<C>(), first = false), ...);
      return k + ')';
    }(std::type_identity<E>{});
  }
}

} // namespace loom
