// Each elementwise op is defined once (expr/ops.hpp), with two forms of its
// semantics side by side: eval() on Eigen expressions, which the CPU kernels
// run (primitive and fused), and apply() on values, which every GPU kernel
// runs. This checks, for every op of ops::elementwise_ops and cast, over every
// dtype it has kernels for, that the CPU kernel's results are apply()'s
// element for element: so the CPU and the GPU cannot differ but where the
// math libraries do (a few ulps in exp, log, tanh and sigmoid). Inputs cover
// the edges an implementation gets wrong: ties, zeros of both signs, NaN,
// infinities, values either side of zero, and lengths past a packet's.
//
// The kernels checked are the registered ones (kernel_registry), which loom::kernels
// compiled once: the very code a program runs, and none of it instantiated again here
// (including kernels/cpu/elementwise.hpp cost this file 23 CPU-s of compiling).
#include <doctest/doctest.h>

#include <loom/expr/ops.hpp>
#include <loom/graph/node.hpp>
#include <loom/kernels/context.hpp>
#include <loom/kernels/cpu/parallel_for.hpp>
#include <loom/kernels/registry.hpp>
#include <loom/runtime/resource_manager.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using namespace loom;

// Eigen's vectorised max/min (maximum, minimum, relu, clip_by_value) do not
// promise which operand a NaN comparison returns, packet or scalar, so NaN is
// left out of those ops' inputs; every other op gets it.
// elu and softplus are built on max and min too.
template <class Op>
constexpr bool nan_defined =
    !std::is_same_v<Op, ops::maximum> && !std::is_same_v<Op, ops::minimum> &&
    !std::is_same_v<Op, ops::relu> && !std::is_same_v<Op, ops::clip_by_value> &&
    !std::is_same_v<Op, ops::elu> && !std::is_same_v<Op, ops::softplus>;

// Ops whose float results come from a math library on each side (rsqrt: Eigen's packet
// form may be a reciprocal of a square root rounded once or twice).
template <class Op>
constexpr bool transcendental =
    std::is_same_v<Op, ops::exp> || std::is_same_v<Op, ops::log> || std::is_same_v<Op, ops::tanh> ||
    std::is_same_v<Op, ops::sigmoid> || std::is_same_v<Op, ops::rsqrt> ||
    std::is_same_v<Op, ops::elu> || std::is_same_v<Op, ops::softplus> ||
    std::is_same_v<Op, ops::pow> || std::is_same_v<Op, ops::cos> || std::is_same_v<Op, ops::sin>;

// Operand k of op Op, 37 elements (past any packet, with a tail). Operand 1
// equals operand 0 at every third element, so binary ops see ties.
template <class Op, class T> std::vector<T> operand(int k) {
  std::vector<T> base;
  if constexpr (std::is_floating_point_v<T>) {
    base = {T(0),    T(-0.0), T(1),    T(-1), T(0.5), T(-2.5), T(3),     T(1e-30), T(-7.25),
            T(0.75), T(12),   T(-0.1), T(2),  T(-20), T(4.5),  T(-3.75), T(9),     T(0.001)};
    if constexpr (nan_defined<Op>)
      base.push_back(std::numeric_limits<T>::quiet_NaN());
    if constexpr (!transcendental<Op>) // exp(inf) and friends: library edge cases, not semantics
      base.push_back(std::numeric_limits<T>::infinity());
  } else {
    base = {T(0), T(1), T(-1), T(2), T(-3), T(7), T(-12), T(40), T(-100), T(1000), T(5), T(-6)};
    if constexpr (std::is_same_v<Op, ops::div>)
      if (k == 1) // integer division by zero is undefined
        for (T& v : base)
          v = v == T(0) ? T(3) : v;
  }
  std::vector<T> v(37);
  for (std::size_t i = 0; i < v.size(); ++i) {
    const std::size_t j = (k == 0 || i % 3 == 0) ? i : i * 5 + static_cast<std::size_t>(k);
    v[i] = base[j % base.size()];
  }
  return v;
}

template <class T> any_tensor tensor_of(const std::vector<T>& v) {
  any_tensor t(dtype_of<T>, shape{static_cast<std::int64_t>(v.size())});
  std::copy(v.begin(), v.end(), t.data<T>());
  return t;
}

template <class T> bool same_value(T got, T want, bool loose) {
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(want))
      return std::isnan(got);
    if (std::isinf(want) || !loose)
      return got == want;
    const T tol = std::is_same_v<T, float> ? T(4e-6) : T(1e-14);
    return std::abs(got - want) <= tol * std::max(T(1), std::abs(want));
  } else {
    return got == want;
  }
}

Eigen::ThreadPool& pool() {
  static Eigen::ThreadPool p(2);
  return p;
}

// Runs the CPU kernel registered for node n and input dtype t on `inputs`.
any_tensor run_registered(const node_def& n, dtype t, std::span<const any_tensor* const> inputs) {
  const kernels::kernel_fn kernel =
      kernels::kernel_registry::instance().find_for(n, t, kernels::device_cpu);
  kernels::cpu_device device(&pool(), 2);
  detail::resource_manager resources;
  kernels::kernel_context c{n, inputs, {}, device, resources, {}, 0, nullptr, nullptr};
  kernel(c);
  return std::move(c.output);
}

template <class Op, class T> void check_op() {
  constexpr int arity = Op::arity;
  using R = ops::result_for_t<Op, T>;
  constexpr bool is_select = std::is_same_v<Op, ops::select>;
  std::vector<any_tensor> in;
  for (int k = 0; k < arity; ++k) {
    if (is_select && k == 0) { // the condition: true at every third element
      any_tensor t(dtype::boolean, shape{37});
      for (std::size_t i = 0; i < 37; ++i)
        t.data<bool>()[i] = i % 3 == 0;
      in.push_back(std::move(t));
    } else {
      in.push_back(tensor_of(operand<Op, T>(k)));
    }
  }
  std::vector<const any_tensor*> ptrs;
  for (const any_tensor& t : in)
    ptrs.push_back(&t);
  node_def n;
  n.op = Op::id;
  n.name = "check";
  const any_tensor out = run_registered(n, dtype_of<T>, ptrs);
  REQUIRE(out.type() == dtype_of<R>);
  REQUIRE(out.num_elements() == 37);
  for (std::int64_t i = 0; i < 37; ++i) {
    R want;
    if constexpr (arity == 1)
      want = Op::apply(in[0].data<T>()[i]);
    else if constexpr (arity == 2)
      want = Op::apply(in[0].data<T>()[i], in[1].data<T>()[i]);
    else if constexpr (is_select)
      want = Op::apply(in[0].data<bool>()[i], in[1].data<T>()[i], in[2].data<T>()[i]);
    else
      want = Op::apply(in[0].data<T>()[i], in[1].data<T>()[i], in[2].data<T>()[i]);
    const R got = out.data<R>()[i];
    if (!same_value<R>(got, want, transcendental<Op>)) {
      std::string args;
      for (int k = 0; k < arity; ++k) {
        if (is_select && k == 0)
          args += in[0].data<bool>()[i] ? "true" : "false";
        else
          args += std::to_string(in[static_cast<std::size_t>(k)].data<T>()[i]);
        args += k + 1 < arity ? ", " : "";
      }
      FAIL_CHECK(std::string(Op::id)
                 << "<" << to_string(dtype_of<T>) << ">(" << args << "): Eigen form gives " << +got
                 << ", scalar form " << +want);
    }
  }
}

template <class Op, class... T> void check_op_types(type_list<T...>) {
  (check_op<Op, T>(), ...);
}

template <class... Op> void check_ops(type_list<Op...>) {
  (check_op_types<Op>(typename Op::types{}), ...);
}

// cast<U> from every T, over values every destination holds (a float that
// does not fit an integer has no defined conversion in C++).
template <class U, class T> void check_cast() {
  std::vector<T> v;
  for (int i = -18; i < 19; ++i)
    v.push_back(std::is_floating_point_v<T> ? T(i * 0.75) : T(i));
  if constexpr (std::is_same_v<T, bool>)
    for (std::size_t i = 0; i < v.size(); ++i)
      v[i] = i % 2 == 0;
  const any_tensor t = tensor_of(v);
  const any_tensor* p = &t;
  node_def n;
  n.op = "cast";
  n.name = "c";
  n.attrs["dst"] = dtype_of<U>;
  const any_tensor out = run_registered(n, dtype_of<T>, std::span<const any_tensor* const>(&p, 1));
  for (std::size_t i = 0; i < v.size(); ++i) {
    const U want = ops::cast<U>::apply(v[i]);
    if (out.data<U>()[i] != want)
      FAIL_CHECK("cast<" << to_string(dtype_of<U>) << ">(" << to_string(dtype_of<T>) << " " << +v[i]
                         << "): Eigen form gives " << +out.data<U>()[i] << ", scalar form "
                         << +want);
  }
}

template <class U, class... T> void check_casts_to(type_list<T...>) {
  (check_cast<U, T>(), ...);
}
template <class... U> void check_casts(type_list<U...>) {
  (check_casts_to<U>(all_types_but_string{}), ...);
}

} // namespace

TEST_CASE("elementwise ops: the Eigen form and the scalar form agree") {
  check_ops(ops::elementwise_ops{});
  check_casts(all_types_but_string{});
}

TEST_CASE("elementwise ops: the scalar form keeps Eigen's semantics at the edges") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  CHECK(std::isnan(ops::sign::apply(nan)));
  CHECK(ops::sign::apply(0.f) == 0.f);
  CHECK(ops::sign::apply(-0.5) == -1.0);
  CHECK(ops::sign::apply(std::int64_t{7}) == 1);
  CHECK(ops::relu::apply(-0.f) == 0.f);
  CHECK(ops::relu_grad::apply(3.f, 0.f) == 0.f);
  CHECK(ops::relu_grad::apply(3.f, 1e-30f) == 3.f);
  CHECK(ops::clip_by_value::apply(5, 0, 3) == 3);
  CHECK(ops::select::apply(false, 1.0, 2.0) == 2.0);
  CHECK(ops::cast<bool>::apply(0.5f) == true);
  CHECK(ops::cast<std::int32_t>::apply(-2.75) == -2);
}

// relu_grad's packet form (a mask and an and, kernels/cpu/eigen_tensor.hpp) at the edges,
// through the CPU kernel: 37 elements, so packets and a scalar tail both see each case.
// Zeros are compared by sign bit: == cannot tell -0 from +0.
TEST_CASE("relu_grad: dy where x > 0, +0 elsewhere, in the packets and the tail") {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> xs{inf, -inf, nan, -0.f, 0.f, 1e-30f, -1e-30f, 2.f};
  const std::vector<float> dys{3.f, -0.f, nan, -inf};
  std::vector<float> x(37), dy(37);
  for (std::size_t i = 0; i < 37; ++i) {
    x[i] = xs[i % xs.size()];
    dy[i] = dys[(i / xs.size()) % dys.size()];
  }
  const any_tensor tdy = tensor_of(dy), tx = tensor_of(x);
  const std::array<const any_tensor*, 2> in{&tdy, &tx};
  node_def n;
  n.op = "relu_grad";
  n.name = "relu_grad";
  const any_tensor out = run_registered(n, dtype::f32, in);
  for (std::size_t i = 0; i < 37; ++i) {
    INFO("x " << x[i] << ", dy " << dy[i]);
    const float got = out.data<float>()[i];
    if (x[i] > 0.f) {
      CHECK((std::isnan(dy[i]) ? std::isnan(got) : got == dy[i]));
      CHECK(std::signbit(got) == std::signbit(dy[i]));
    } else {
      CHECK(got == 0.f);
      CHECK_FALSE(std::signbit(got));
    }
  }
}

// elu below zero is exp(x) - 1, which cancels near zero: one last bit of exp(x) is a 2e-5
// relative error at x = -0.003. Both forms must keep expm1's accuracy there, or the CPU
// and GPU kernels (two exp()s) differ beyond the GPU kernel test's bound.
TEST_CASE("elu: both forms accurate to a few ulps near zero, where exp(x) - 1 cancels") {
  std::vector<float> x(37);
  for (std::size_t i = 0; i < x.size(); ++i)
    x[i] = -0.01f * static_cast<float>(i + 1) / 37.f;
  const any_tensor t = tensor_of(x);
  const any_tensor* p = &t;
  node_def n;
  n.op = "elu";
  n.name = "elu";
  const any_tensor out = run_registered(n, dtype::f32, std::span<const any_tensor* const>(&p, 1));
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double want = std::expm1(static_cast<double>(x[i]));
    INFO("x " << x[i]);
    CHECK(std::abs(out.data<float>()[i] - want) <= 4e-7 * std::abs(want));
    CHECK(std::abs(ops::elu::apply(x[i]) - want) <= 4e-7 * std::abs(want));
  }
}

TEST_CASE("elementwise ops: result dtypes come from the op (comparisons are bool)") {
  static_assert(std::is_same_v<ops::result_for_t<ops::less, float>, bool>);
  static_assert(std::is_same_v<ops::result_for_t<ops::not_equal, std::int64_t>, bool>);
  static_assert(std::is_same_v<ops::result_for_t<ops::add, double>, double>);
  static_assert(std::is_same_v<ops::result_for_t<ops::select, std::int32_t>, std::int32_t>);
  static_assert(std::is_same_v<ops::result_for_t<ops::cast<bool>, float>, bool>);
  graph g;
  auto x = g.add_node("placeholder", {}, {{"dtype", dtype::f32}, {"shape", shape{3}}}, "x");
  CHECK(g.node(g.add_node("greater_equal", {x, x})).type == dtype::boolean);
  CHECK(g.node(g.add_node("maximum", {x, x})).type == dtype::f32);
  CHECK(g.node(g.add_node("cast", {x}, {{"dst", dtype::i64}})).type == dtype::i64);
}
