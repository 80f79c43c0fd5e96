// Placement policies: TF's device functions as C++ values.
//
// A placement policy is any copyable type callable as
//   device_spec p(const node_def& node, const device_spec& current)
// (the concept loom::placement_policy, declared next to graph::device() so
// that a graph scope can take one). `node` is the node being created, named
// and typed; `current` is what the device scopes inside the policy's own
// scope requested (TF applies device functions from the innermost scope
// outwards). The result becomes the node's device for the enclosing scopes.
//
// This header gives the building blocks:
//   pin{"/job:ps/task:0"}        TF's merge_device: the pinned fields, with
//                                `current` winning where it sets a field
//   is_variable, op_is, name_matches   predicates on a node
//   when<Pred, P>{pred, p}        p for nodes that satisfy pred; declines others
//   first_match<P...>{p...}       the first policy that does not decline
// A *declining* policy models partial_placement_policy: besides operator()
// it has try_place(node, current) -> std::optional<device_spec>, nullopt
// meaning "not mine". Called as a plain policy, a declining one returns
// `current` unchanged.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/core/device_spec.hpp>
#include <loom/graph/graph.hpp>
#include <loom/graph/node.hpp>

#include <concepts>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace loom {

// Fails with a readable message when P is not a placement policy; for code
// that takes a policy as a template parameter.
template <class P> constexpr bool assert_placement_policy() {
  static_assert(placement_policy<P>,
                "loom: this type is not a placement policy: it needs operator()(const "
                "loom::node_def&, const loom::device_spec&) returning loom::device_spec");
  return true;
}

// A policy that may decline a node (see the header comment).
template <class P>
concept partial_placement_policy = placement_policy<P> &&
    requires(std::decay_t<P>& p, const node_def& n, const device_spec& d) {
  { p.try_place(n, d) } -> std::convertible_to<std::optional<device_spec>>;
};

// A predicate on nodes: bool(const node_def&).
// clang-format off
template <class F>
concept node_predicate = std::copy_constructible<std::decay_t<F>> &&
                         std::predicate<std::decay_t<F>&, const node_def&>;
// clang-format on

// -- pin ----------------------------------------------------------------------

// Places nodes on `device`, like a device string scope: fields set in
// `current` (from scopes inside this one) win, as in TF's merge_device.
struct pin {
  device_spec device;

  pin(device_spec d) : device(std::move(d)) {}
  pin(std::string_view spec) : device(device_spec::from_string(spec)) {}
  pin(const char* spec) : device(device_spec::from_string(spec)) {}
  pin(const std::string& spec) : device(device_spec::from_string(spec)) {}

  device_spec operator()(const node_def&, const device_spec& current) const {
    return device_spec::merged(device, current);
  }
};

// -- predicates -------------------------------------------------------------------

namespace detail {
// The op ids of loom's variables (graph/ops/state.hpp registers "variable";
// optimizer slots are variables too). The default ps_ops of
// replica_device_setter.
inline const std::vector<std::string>& variable_op_ids() {
  static const std::vector<std::string> ids{"variable"};
  return ids;
}
} // namespace detail

struct is_variable {
  bool operator()(const node_def& n) const {
    for (const std::string& id : detail::variable_op_ids())
      if (n.op == id)
        return true;
    return false;
  }
};

// True for nodes whose op id is one of `ops`.
struct op_is {
  std::vector<std::string> ops;

  op_is(std::initializer_list<std::string> o) : ops(o) {}
  explicit op_is(std::vector<std::string> o) : ops(std::move(o)) {}
  op_is(std::string_view op) : ops{std::string(op)} {}
  op_is(const char* op) : ops{std::string(op)} {}

  bool operator()(const node_def& n) const {
    for (const std::string& o : ops)
      if (n.op == o)
        return true;
    return false;
  }
};

namespace detail {
// A std::regex behind a pointer: <regex> and its templates are compiled once per
// program (core/compiled_once.hpp), not in every unit that includes the API.
struct compiled_regex;
// Throws invalid_argument_error naming the pattern when it is not an ECMAScript regex.
LOOM_COMPILED_ONCE std::shared_ptr<const compiled_regex> compile_regex(const std::string& pattern);
LOOM_COMPILED_ONCE bool regex_matches_whole(const compiled_regex& regex, const std::string& text);
} // namespace detail

// True for nodes whose full name (with its name scope) matches: the whole
// name against a std::regex (ECMAScript), or a plain prefix via
// name_matches::prefix("layer1/").
class name_matches {
public:
  explicit name_matches(const std::string& pattern)
      : pattern_(pattern), regex_(detail::compile_regex(pattern)) {}
  explicit name_matches(const char* pattern) : name_matches(std::string(pattern)) {}

  static name_matches prefix(std::string p) { return name_matches(std::move(p), prefix_tag{}); }

  bool operator()(const node_def& n) const {
    if (!regex_)
      return std::string_view(n.name).starts_with(pattern_);
    return detail::regex_matches_whole(*regex_, n.name);
  }
  const std::string& pattern() const noexcept { return pattern_; }

private:
  struct prefix_tag {};
  name_matches(std::string p, prefix_tag) : pattern_(std::move(p)) {}

  std::string pattern_;
  std::shared_ptr<const detail::compiled_regex> regex_; // null for a prefix
};

// -- when -------------------------------------------------------------------------

// `policy` for the nodes that satisfy `pred`; declines the others (which then
// keep `current` when `when` is used on its own).
template <class Pred, class P> struct when {
  static_assert(node_predicate<Pred>,
                "loom::when<Pred, P>: Pred must be callable as bool(const loom::node_def&)");
  static_assert(assert_placement_policy<P>());

  Pred pred;
  P policy;

  std::optional<device_spec> try_place(const node_def& n, const device_spec& current) {
    if (!pred(n))
      return std::nullopt;
    return device_spec(policy(n, current));
  }
  device_spec operator()(const node_def& n, const device_spec& current) {
    auto d = try_place(n, current);
    return d ? *std::move(d) : current;
  }
};
template <class Pred, class P> when(Pred, P) -> when<Pred, P>;

// -- first_match ----------------------------------------------------------------

// Asks its policies in order; a declining policy (partial_placement_policy)
// that returns nullopt passes the node on, any other policy decides. If all
// decline, first_match declines too (and returns `current` when used on its
// own). `first_match{when{is_variable{}, pin{"/job:ps"}}, pin{"/job:worker"}}`
// is a two-line replica setter without round robin.
template <class... P> struct first_match {
  static_assert(sizeof...(P) > 0, "loom::first_match needs at least one policy");
  static_assert((assert_placement_policy<P>() && ...));

  std::tuple<P...> policies;

  first_match(P... p) : policies(std::move(p)...) {}

  std::optional<device_spec> try_place(const node_def& n, const device_spec& current) {
    std::optional<device_spec> out;
    std::apply([&](auto&... p) { (ask(p, n, current, out) || ...); }, policies);
    return out;
  }
  device_spec operator()(const node_def& n, const device_spec& current) {
    auto d = try_place(n, current);
    return d ? *std::move(d) : current;
  }

private:
  template <class Q>
  static bool ask(Q& p, const node_def& n, const device_spec& current,
                  std::optional<device_spec>& out) {
    if constexpr (partial_placement_policy<Q>) {
      if (auto d = p.try_place(n, current)) {
        out = *std::move(d);
        return true;
      }
      return false;
    } else {
      out = device_spec(p(n, current));
      return true;
    }
  }
};
template <class... P> first_match(P...) -> first_match<P...>;

} // namespace loom

#if LOOM_COMPILED_ONCE_DEFINITIONS
#include <loom/core/error.hpp>

#include <regex>

namespace loom::detail {

struct compiled_regex {
  std::regex regex;
};

LOOM_COMPILED_ONCE std::shared_ptr<const compiled_regex> compile_regex(const std::string& pattern) {
  try {
    return std::make_shared<const compiled_regex>(compiled_regex{std::regex(pattern)});
  } catch (const std::regex_error& e) {
    throw invalid_argument_error("loom::name_matches: '" + pattern +
                                 "' is not a valid regular expression (ECMAScript): " + e.what());
  }
}

LOOM_COMPILED_ONCE bool regex_matches_whole(const compiled_regex& regex, const std::string& text) {
  return std::regex_match(text, regex.regex);
}

} // namespace loom::detail
#endif // LOOM_COMPILED_ONCE_DEFINITIONS
