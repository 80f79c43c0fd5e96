// The typed sources of a graph: placeholders, constants, variables with seeded
// initializers, get_variable with TF's variable-scope reuse rules,
// initializers for collections, group and the assign family.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/graph/builder.hpp>
#include <loom/graph/lower.hpp>
#include <loom/graph/ops/random.hpp>
#include <loom/graph/ops/state.hpp>
#include <loom/graph/output.hpp>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

namespace loom {

// -- placeholders and constants ---------------------------------------------

template <element_type T, int R> class placeholder : public output<T, R> {
public:
  // shape may hold -1 for dimensions known only when fed (TF's None).
  placeholder(graph& g, loom::shape s, std::string name = "placeholder")
      : output<T, R>(g, make(g, std::move(s), std::move(name))) {}

private:
  static node_id make(graph& g, loom::shape s, std::string name) {
    if (s.rank() != R)
      throw invalid_argument_error("placeholder '" + name + "' of rank " + std::to_string(R) +
                                   " cannot have shape " + s.to_string());
    return g.add_node("placeholder", {}, {{"dtype", dtype_of<T>}, {"shape", std::move(s)}},
                      std::move(name));
  }
};

template <element_type T, int R>
output<T, R> constant(graph& g, const tensor<T, R>& value, std::string name = {}) {
  return output<T, R>(g, detail::constant_node(g, value.value().clone(), std::move(name)));
}
template <element_type T> output<T, 0> constant(graph& g, T value, std::string name = {}) {
  return output<T, 0>(
      g, detail::constant_node(g, any_tensor::scalar<T>(std::move(value)), std::move(name)));
}
inline output<std::string, 0> constant(graph& g, const char* value, std::string name = {}) {
  return constant<std::string>(g, std::string(value), std::move(name));
}

// -- initializers ------------------------------------------------------------
// An initializer makes the node that computes a variable's initial value.

template <class I>
concept initializer = requires(const I& i, graph& g, dtype t, const loom::shape& s) {
  { i.make(g, t, s) } -> std::convertible_to<node_id>;
};

namespace detail {
// A tensor of shape s filled with v, made by a fill op where it is used: a
// variable's initial value is computed on the variable's task (it is
// colocated with it), never carried in the graph at the variable's size.
LOOM_COMPILED_ONCE node_id fill_node(graph& g, dtype t, const loom::shape& s, double v);
LOOM_COMPILED_ONCE node_id random_node(graph& g, const char* op, dtype t, const loom::shape& s,
                                       double a, double b, std::optional<std::int64_t> seed);
} // namespace detail

struct zeros_initializer {
  node_id make(graph& g, dtype t, const loom::shape& s) const {
    return detail::fill_node(g, t, s, 0);
  }
};
struct ones_initializer {
  node_id make(graph& g, dtype t, const loom::shape& s) const {
    return detail::fill_node(g, t, s, 1);
  }
};
struct constant_initializer {
  double value = 0;
  node_id make(graph& g, dtype t, const loom::shape& s) const {
    return detail::fill_node(g, t, s, value);
  }
};
struct random_uniform_initializer {
  double minval = 0, maxval = 1;
  std::optional<std::int64_t> seed{};
  node_id make(graph& g, dtype t, const loom::shape& s) const {
    return detail::random_node(g, "random_uniform", t, s, minval, maxval, seed);
  }
};
struct random_normal_initializer {
  double mean = 0, stddev = 1;
  std::optional<std::int64_t> seed{};
  node_id make(graph& g, dtype t, const loom::shape& s) const {
    return detail::random_node(g, "random_normal", t, s, mean, stddev, seed);
  }
};
struct truncated_normal_initializer {
  double mean = 0, stddev = 1;
  std::optional<std::int64_t> seed{};
  node_id make(graph& g, dtype t, const loom::shape& s) const {
    return detail::random_node(g, "truncated_normal", t, s, mean, stddev, seed);
  }
};
namespace detail {
// A variable's fans as TF computes them (its _compute_fans): a vector's length both ways;
// for rank >= 2 the last two dimensions times the product of the others (a filter's
// receptive field).
struct fans {
  double in = 1, out = 1;
};
LOOM_COMPILED_ONCE fans fans_of(const loom::shape& s);
} // namespace detail

// TF's VarianceScaling: variance scale / n, n the fan in, out or their mean; drawn from a
// normal truncated at two standard deviations (its stddev corrected for the truncation, as
// TF's), an untruncated normal, or a uniform. Each initializer here makes one shard `part`
// of a partitioned variable of shape `s` with the whole variable's fans, as TF's
// partition_info makes them.
struct variance_scaling_initializer {
  enum class fan_mode { fan_in, fan_out, fan_avg };
  enum class distribution_kind { truncated_normal, untruncated_normal, uniform };
  double scale = 1.0;
  fan_mode mode = fan_mode::fan_in;
  distribution_kind distribution = distribution_kind::truncated_normal;
  std::optional<std::int64_t> seed{};

  node_id make(graph& g, dtype t, const loom::shape& s) const { return make_part(g, t, s, s); }
  node_id make_part(graph& g, dtype t, const loom::shape& part, const loom::shape& s) const;
};

// Glorot/Xavier uniform: limit sqrt(6 / (fan_in + fan_out)) (TF's default for get_variable).
struct glorot_uniform_initializer {
  std::optional<std::int64_t> seed{};
  node_id make(graph& g, dtype t, const loom::shape& s) const { return make_part(g, t, s, s); }
  node_id make_part(graph& g, dtype t, const loom::shape& part, const loom::shape& s) const;
};
// Glorot normal (tf.glorot_normal_initializer): a truncated normal of variance 2 / (in + out).
struct glorot_normal_initializer {
  std::optional<std::int64_t> seed{};
  node_id make(graph& g, dtype t, const loom::shape& s) const { return make_part(g, t, s, s); }
  node_id make_part(graph& g, dtype t, const loom::shape& part, const loom::shape& s) const {
    using v = variance_scaling_initializer;
    return v{1.0, v::fan_mode::fan_avg, v::distribution_kind::truncated_normal, seed}.make_part(
        g, t, part, s);
  }
};
// He normal (tf.keras.initializers.he_normal): a truncated normal of variance 2 / fan_in.
struct he_normal_initializer {
  std::optional<std::int64_t> seed{};
  node_id make(graph& g, dtype t, const loom::shape& s) const { return make_part(g, t, s, s); }
  node_id make_part(graph& g, dtype t, const loom::shape& part, const loom::shape& s) const {
    using v = variance_scaling_initializer;
    return v{2.0, v::fan_mode::fan_in, v::distribution_kind::truncated_normal, seed}.make_part(
        g, t, part, s);
  }
};

// Typed random tensors (tf.random_uniform, tf.random_normal, tf.truncated_normal).
template <floating_type T, int R>
output<T, R> random_uniform(graph& g, loom::shape s, double minval = 0, double maxval = 1,
                            std::optional<std::int64_t> seed = {}) {
  return {g, random_uniform_initializer{minval, maxval, seed}.make(g, dtype_of<T>, s)};
}
template <floating_type T, int R>
output<T, R> random_normal(graph& g, loom::shape s, double mean = 0, double stddev = 1,
                           std::optional<std::int64_t> seed = {}) {
  return {g, random_normal_initializer{mean, stddev, seed}.make(g, dtype_of<T>, s)};
}
template <floating_type T, int R>
output<T, R> truncated_normal(graph& g, loom::shape s, double mean = 0, double stddev = 1,
                              std::optional<std::int64_t> seed = {}) {
  return {g, truncated_normal_initializer{mean, stddev, seed}.make(g, dtype_of<T>, s)};
}

// -- variables -----------------------------------------------------------------

struct variable_options {
  bool trainable = true;
  std::string container{}; // resource container on the owning task
  bool local = false;      // LOCAL_VARIABLES instead of GLOBAL_VARIABLES
};

template <element_type T, int R> class variable : public output<T, R> {
public:
  // A variable initialised by an initializer (TF's get_variable style).
  template <initializer I>
  variable(graph& g, std::string name, loom::shape s, const I& init, variable_options o = {})
      : output<T, R>(g, make_node(g, std::move(name), s, o)) {
    set_initializer(init.make(g, dtype_of<T>, this->shape()), o);
  }
  // A scalar variable initialised from a C++ number (tf.Variable(1.0)); the
  // number must be exactly a T, as TF refuses tf.Variable(1.5, dtype=tf.int32).
  template <class S>
  requires std::is_arithmetic_v<S> variable(graph& g, std::string name, S initial_value,
                                            variable_options o = {})
      : output<T, R>(g, make_node(g, exactly_a_T(name, initial_value), loom::shape{}, o)) {
    static_assert(R == 0, "loom::variable: a number initializes a scalar variable (rank 0) only; "
                          "for a tensor give its shape and an initializer, as in "
                          "variable<float, 1>(g, \"v\", loom::shape{3}, "
                          "loom::constant_initializer{1.0})");
    static_assert(std::is_arithmetic_v<T>, "loom::variable: a number cannot initialize a "
                                           "string variable");
    if constexpr (R == 0 && std::is_arithmetic_v<T>)
      set_initializer(loom::detail::scalar_node(g, static_cast<T>(initial_value)), o);
  }
  // A variable initialised from an expression (tf.Variable(initial_value)).
  template <expression E>
  variable(graph& g, std::string name, const E& initial_value, variable_options o = {})
      : output<T, R>(g, make_node(g, std::move(name), lower(initial_value).shape(), o)) {
    static_assert(std::is_same_v<value_type_of<E>, T>,
                  "loom::variable: the initial value's dtype differs from the variable's");
    static_assert(rank_of<E> == R,
                  "loom::variable: the initial value's rank differs from the variable's");
    set_initializer(lower(initial_value).id(), o);
  }

  // The op that assigns the initial value.
  operation initializer() const {
    return {this->graph(),
            this->node().template attr<std::int64_t>("initializer") >= 0
                ? static_cast<node_id>(this->node().template attr<std::int64_t>("initializer"))
                : no_node};
  }

  template <class E> output<T, R> assign(const E& value) const { return update("assign", value); }
  template <class E> output<T, R> assign_add(const E& value) const {
    return update("assign_add", value);
  }
  template <class E> output<T, R> assign_sub(const E& value) const {
    return update("assign_sub", value);
  }

  // A handle to an existing variable node (get_variable with reuse).
  static variable existing(graph& g, node_id id) { return variable(g, id); }

private:
  variable(graph& g, node_id id) : output<T, R>(g, id) {}

  // `name`, once `v` is known to be exactly a T (before the variable's node exists).
  template <class S> static std::string exactly_a_T(const std::string& name, S v) {
    if constexpr (std::is_arithmetic_v<T>)
      if (static_cast<S>(static_cast<T>(v)) != v)
        throw invalid_argument_error("variable '" + name + "': the initial value " +
                                     std::to_string(v) + " is not a " +
                                     std::string(to_string(dtype_of<T>)));
    return name;
  }

  static node_id make_node(graph& g, std::string name, const loom::shape& s,
                           const variable_options& o) {
    if (s.rank() != R)
      throw invalid_argument_error("variable '" + name + "' of rank " + std::to_string(R) +
                                   " cannot have shape " + s.to_string());
    return g.add_node("variable", {},
                      {{"dtype", dtype_of<T>},
                       {"shape", s},
                       {"container", o.container},
                       {"initializer", std::int64_t{-1}}},
                      std::move(name));
  }

  void set_initializer(node_id value, const variable_options& o) {
    graph& g = this->graph();
    // An initial value made from nothing (a fill, a random source) runs on
    // the variable's task, as TF colocates initializers with their variable.
    if (const node_def& v = g.node(value);
        v.inputs.empty() && v.op != "constant" && v.op != "placeholder")
      g.mutable_node(value).colocation_group = this->node().colocation();
    node_id init = g.add_node("assign", {this->id(), value});
    g.mutable_node(this->id()).attrs["initializer"] = std::int64_t{init};
    g.add_to_collection(o.local ? collection::local_variables : collection::global_variables,
                        this->id());
    if (o.trainable && !o.local)
      g.add_to_collection(collection::trainable_variables, this->id());
  }

  template <class E> output<T, R> update(const char* op, const E& value) const {
    node_id v;
    if constexpr (expression<E>) {
      static_assert(std::is_same_v<value_type_of<E>, T>,
                    "loom::variable::assign: the value's dtype differs from the variable's");
      static_assert(rank_of<E> <= R, "loom::variable::assign: the value's rank is larger than "
                                     "the variable's");
      v = lower(value).id();
    } else {
      static_assert(std::is_arithmetic_v<E>, "loom::variable::assign: not an expression or number");
      v = loom::detail::scalar_node(this->graph(), static_cast<T>(value));
    }
    return {this->graph(), this->graph().add_node(op, {this->id(), v})};
  }
};

// -- initialisation and grouping ------------------------------------------------

// An op that runs all of `ops` (TF's tf.group).
LOOM_COMPILED_ONCE operation group(graph& g, const std::vector<node_id>& ops,
                                   std::string name = {});
template <node_handle... H> operation group(graph& g, const H&... ops) {
  return group(g, std::vector<node_id>{ops.id()...});
}
inline operation no_op(graph& g, std::string name = {}) {
  return {g, g.add_node("no_op", {}, {}, name.empty() ? "no_op" : std::move(name))};
}

// The initializers of the given variable nodes.
LOOM_COMPILED_ONCE operation variables_initializer(graph& g, const std::vector<node_id>& vars,
                                                   std::string name = "init");
inline operation global_variables_initializer(graph& g) {
  return variables_initializer(g, g.collection(collection::global_variables));
}
inline operation local_variables_initializer(graph& g) {
  return variables_initializer(g, g.collection(collection::local_variables), "init_local");
}

// -- variable scopes and get_variable --------------------------------------------

// A variable scope prefixes the names of get_variable (and, like TF, opens a
// name scope). reuse=true makes get_variable return existing variables and
// fail for missing ones; reuse=false makes it fail for existing ones.
LOOM_COMPILED_ONCE scope_guard variable_scope(graph& g, const std::string& name,
                                              bool reuse = false);

namespace detail {
// `name` under the innermost variable scope.
inline std::string scoped_variable_name(graph& g, const std::string& name) {
  const auto& scopes = g.state().variable_scopes;
  return scopes.empty() ? name : scopes.back().name + "/" + name;
}
} // namespace detail

template <element_type T, int R, initializer I = glorot_uniform_initializer>
variable<T, R> get_variable(graph& g, const std::string& name, loom::shape s, const I& init = {},
                            variable_options o = {}) {
  auto& st = g.state();
  const std::string full = detail::scoped_variable_name(g, name);
  const bool reuse = !st.variable_scopes.empty() && st.variable_scopes.back().reuse;
  auto it = st.variable_store.find(full);
  if (it != st.variable_store.end()) {
    if (!reuse)
      throw already_exists_error("variable " + full +
                                 " already exists, disallowed. Did you mean to set reuse=true "
                                 "in variable_scope?");
    const node_def& n = g.node(it->second);
    if (n.type != dtype_of<T> || !(n.shape == s))
      throw invalid_argument_error("trying to share variable " + full + ", but it is " +
                                   std::string(to_string(n.type)) + n.shape.to_string() +
                                   " and was requested as " + std::string(to_string(dtype_of<T>)) +
                                   s.to_string());
    return variable<T, R>::existing(g, it->second);
  }
  if (reuse)
    throw not_found_error("variable " + full +
                          " does not exist, or was not created with get_variable(). Did you "
                          "mean to set reuse=false in variable_scope?");
  auto names = g.name_scope("");
  variable<T, R> v(g, full, std::move(s), init, o);
  st.variable_store.emplace(full, v.id());
  return v;
}

} // namespace loom

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::detail {

LOOM_COMPILED_ONCE node_id fill_node(graph& g, dtype t, const loom::shape& s, double v) {
  if (t == dtype::string)
    throw invalid_argument_error("a numeric initializer for a " + std::string(to_string(t)) +
                                 " variable");
  return g.add_node("fill", {}, {{"dtype", t}, {"shape", s}, {"value", v}});
}

LOOM_COMPILED_ONCE node_id random_node(graph& g, const char* op, dtype t, const loom::shape& s,
                                       double a, double b, std::optional<std::int64_t> seed) {
  if (t != dtype::f32 && t != dtype::f64)
    throw invalid_argument_error(std::string(op) + " initializer needs float or double, not " +
                                 std::string(to_string(t)));
  auto [s1, s2] = g.next_seeds(seed);
  return g.add_node(op, {},
                    {{"dtype", t}, {"shape", s}, {"seed", s1}, {"seed2", s2}, {"a", a}, {"b", b}});
}

LOOM_COMPILED_ONCE fans fans_of(const loom::shape& s) {
  fans f;
  if (s.rank() == 1)
    f.in = f.out = static_cast<double>(s[0]);
  else if (s.rank() >= 2) {
    double receptive = 1;
    for (int i = 0; i + 2 < s.rank(); ++i)
      receptive *= static_cast<double>(s[i]);
    f.in = static_cast<double>(s[s.rank() - 2]) * receptive;
    f.out = static_cast<double>(s[s.rank() - 1]) * receptive;
  }
  return f;
}
} // namespace loom::detail

namespace loom {

LOOM_COMPILED_ONCE auto variance_scaling_initializer::make_part(graph& g, dtype t,
                                                                const loom::shape& part,
                                                                const loom::shape& s) const
    -> node_id {
  if (!(scale > 0))
    throw invalid_argument_error("variance_scaling_initializer: scale " + std::to_string(scale) +
                                 " must be positive");
  const detail::fans f = detail::fans_of(s);
  const double n = mode == fan_mode::fan_in    ? f.in
                   : mode == fan_mode::fan_out ? f.out
                                               : (f.in + f.out) / 2;
  const double variance = scale / std::max(1.0, n);
  switch (distribution) {
  case distribution_kind::truncated_normal: // 0.8796...: the stddev of a unit normal cut at 2
    return detail::random_node(g, "truncated_normal", t, part, 0,
                               std::sqrt(variance) / 0.87962566103423978, seed);
  case distribution_kind::untruncated_normal:
    return detail::random_node(g, "random_normal", t, part, 0, std::sqrt(variance), seed);
  case distribution_kind::uniform: break;
  }
  const double limit = std::sqrt(3 * variance);
  return detail::random_node(g, "random_uniform", t, part, -limit, limit, seed);
}

LOOM_COMPILED_ONCE auto glorot_uniform_initializer::make_part(graph& g, dtype t,
                                                              const loom::shape& part,
                                                              const loom::shape& s) const
    -> node_id {
  const detail::fans f = detail::fans_of(s);
  const double limit = std::sqrt(6.0 / (f.in + f.out));
  return detail::random_node(g, "random_uniform", t, part, -limit, limit, seed);
}

LOOM_COMPILED_ONCE operation group(graph& g, const std::vector<node_id>& ops, std::string name) {
  auto deps = g.control_dependencies(ops);
  return {g, g.add_node("no_op", {}, {}, name.empty() ? "group" : std::move(name))};
}

LOOM_COMPILED_ONCE operation variables_initializer(graph& g, const std::vector<node_id>& vars,
                                                   std::string name) {
  std::vector<node_id> inits;
  for (node_id v : vars) {
    auto init = g.node(v).attr_or<std::int64_t>("initializer", -1);
    if (init >= 0)
      inits.push_back(static_cast<node_id>(init));
  }
  return group(g, inits, std::move(name));
}

LOOM_COMPILED_ONCE scope_guard variable_scope(graph& g, const std::string& name, bool reuse) {
  auto& st = g.state();
  const bool inherited = !st.variable_scopes.empty() && st.variable_scopes.back().reuse;
  std::string full =
      st.variable_scopes.empty() ? name : st.variable_scopes.back().name + "/" + name;
  st.variable_scopes.push_back({full, reuse || inherited});
  auto names = std::make_shared<scope_guard>(g.name_scope(full + "/"));
  return scope_guard([&st, names]() mutable {
    names.reset();
    st.variable_scopes.pop_back();
  });
}

} // namespace loom

#endif // LOOM_COMPILED_ONCE_DEFINITIONS
