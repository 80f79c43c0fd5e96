// An input pipeline read inside a step (TF 1.x's make_one_shot_iterator().get_next()):
// the iterator is a resource on the task that runs it, and get_next's nodes pull the
// next element into the step's own tensors, so session::run(train_op) trains on the
// next batch without a feed. The end of input fails the step with out_of_range, which
// monitored_training_session takes for a clean stop (TF's should_stop()).
//
//   auto batches = data::tfrecord_dataset(files) | data::batch(256)
//                | data::map(parse_to_tuple, 2) | data::prefetch(2);
//   auto it = loom::make_one_shot_iterator(g, batches);
//   auto [x, y] = it.get_next();          // output<float, 2>, output<std::int64_t, 1>
//
// A dataset is C++ (lambdas, file handles), not a graph a server could rebuild, so it
// stays in the process that made it: make_one_shot_iterator registers it there
// (dataset_registry), and the iterator's nodes must run on that process's task (a
// replica_device_setter's worker_device; elsewhere the step fails saying so).
//
// Several components, one pull: every node has one output (graph/node.hpp), so the
// iterator is one pulling node, iterator_get_next, whose output is the pulled
// element's number (a "ticket"), and one iterator_component node per tensor of the
// element, each taking its tensor of that ticket's element from the resource. The
// components depend on the pull by a data edge, so one step pulls once however many
// of them it runs, and each tensor moves from the pipeline into the step without a
// copy. (The alternative, a multi-output node, would change the node, the executor,
// the partitioner and the wire format for this one op.)
//
// Element types and what get_next() gives (dtype and rank from the element type):
//   tensor<T, R>               -> output<T, R>
//   data::sparse_value<T>      -> sparse_tensor<T> (three components)
//   std::tuple<E...>           -> std::tuple<what each E gives...>
// Map a parsed tf.Example (data::features) to a tuple in the pipeline to read it here.
//
// make_initializable_iterator (TF's dataset.make_initializable_iterator()) gives an
// iterator whose pass starts when its initializer() runs, and again at each run: an
// epoch of a validation set, or a dataset made from fed tensors (TF's placeholders in
// a dataset, such as a list of file names) by a C++ function of them:
//
//   auto files = loom::placeholder<std::string, 1>(g, loom::shape{-1}, "files");
//   auto it = loom::make_initializable_iterator(g, [](const loom::tensor<std::string, 1>& f) {
//     return data::tfrecord_dataset({f.flat().begin(), f.flat().end()}) | data::batch(256);
//   }, std::tuple{files});
//   s.run(it.initializer(), {{files, train_files}});
//
// A pull before the first initializer run fails with failed_precondition, as in TF.
//
// The iterator's position saves with the checkpoint (one-shot iterators only: an
// initializable iterator's pass is the initializer's, as TF's are not saved unless
// asked): the saver saves the state of each
// iterator of its graph's "iterators" collection (iterator_save) and a restore puts it
// back (iterator_restore) before the next pull (train/saver.hpp).
#pragma once

#include <loom/core/error.hpp>
#include <loom/core/tensor.hpp>
#include <loom/data/dataset.hpp>
#include <loom/data/features.hpp>
#include <loom/graph/graph.hpp>
#include <loom/graph/op_registry.hpp>
#include <loom/graph/output.hpp>
#include <loom/graph/sparse_tensor.hpp>

#include <atomic>
#include <concepts>
#include <cstdint>
#include <functional>
#include <istream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <ostream>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace loom {

namespace collection {
// The get_next nodes of the graph's iterators, whose positions a saver saves.
inline constexpr std::string_view iterators = "iterators";
} // namespace collection

namespace detail {

// A pass over a dataset whose elements are flattened into their tensors, in order.
class component_iterator {
public:
  virtual ~component_iterator() = default;
  // The next element's tensors, or nullopt at the end of input.
  virtual std::optional<std::vector<any_tensor>> next() = 0;
  virtual void save(std::ostream& out) = 0;
  virtual void restore(std::istream& in) = 0;
};

// Makes a pass from the arguments an initializer was run with (none for a one-shot
// iterator, whose pass is made at its first pull or restore).
using component_iterator_factory =
    std::function<std::unique_ptr<component_iterator>(const std::vector<any_tensor>& args)>;

// The datasets of this process's iterators, by the key their get_next node names
// (attr "dataset"). Keys are unique in the process, so two graphs' iterators of one
// name never share a resource.
class dataset_registry {
public:
  static dataset_registry& instance() {
    static dataset_registry r;
    return r;
  }
  std::string add(const std::string& iterator_name, component_iterator_factory make) {
    std::lock_guard lock(mu_);
    std::string key = iterator_name + "#" + std::to_string(++serial_);
    factories_.emplace(key, std::move(make));
    return key;
  }
  // The factory for `key`, or an error saying where the iterator must run.
  component_iterator_factory find(const std::string& key, const node_def& n) const {
    std::lock_guard lock(mu_);
    if (const auto it = factories_.find(key); it != factories_.end())
      return it->second;
    throw failed_precondition_error(
        "iterator " + n.describe() +
        ": its dataset was made by a program in another process; "
        "an iterator runs on the task of the program that made it (its worker_device under a "
        "replica_device_setter), not on " +
        (n.assigned_device.empty() ? std::string("this task") : n.assigned_device));
  }

private:
  mutable std::mutex mu_;
  std::uint64_t serial_ = 0;
  std::map<std::string, component_iterator_factory> factories_;
};

// How an element type flattens into tensors and which handles get_next gives.
template <class E> struct element_parts {
  static_assert(sizeof(E) == 0,
                "loom::make_one_shot_iterator: an element must be tensor<T, R>, "
                "data::sparse_value<T> or a std::tuple of them (map a data::features element "
                "to a tuple in the pipeline)");
};
template <element_type T, int R> struct element_parts<tensor<T, R>> {
  static constexpr std::size_t count = 1;
  using handles = output<T, R>;
  static void flatten(tensor<T, R>&& e, std::vector<any_tensor>& out) {
    out.push_back(std::move(e).value());
  }
  template <class Make> static handles make(Make& component) {
    return component.template operator()<T, R>();
  }
};
template <element_type T> struct element_parts<data::sparse_value<T>> {
  static constexpr std::size_t count = 3;
  using handles = sparse_tensor<T>;
  static void flatten(data::sparse_value<T>&& e, std::vector<any_tensor>& out) {
    out.push_back(std::move(e.indices).value());
    out.push_back(std::move(e.values).value());
    out.push_back(std::move(e.dense_shape).value());
  }
  template <class Make> static handles make(Make& component) {
    // Braces: in order, as flatten wrote them.
    return handles{component.template operator()<std::int64_t, 2>(),
                   component.template operator()<T, 1>(),
                   component.template operator()<std::int64_t, 1>()};
  }
};
template <class... E> struct element_parts<std::tuple<E...>> {
  static constexpr std::size_t count = (element_parts<E>::count + ... + 0);
  using handles = std::tuple<typename element_parts<E>::handles...>;
  static void flatten(std::tuple<E...>&& e, std::vector<any_tensor>& out) {
    std::apply([&](auto&&... part) { (element_parts<E>::flatten(std::move(part), out), ...); },
               std::move(e));
  }
  template <class Make> static handles make(Make& component) {
    return handles{element_parts<E>::make(component)...};
  }
};

template <data::dataset_recipe D> class flattening_iterator final : public component_iterator {
public:
  explicit flattening_iterator(const D& d) : it_(d.make_iterator()) {}
  std::optional<std::vector<any_tensor>> next() override {
    auto e = it_.next();
    if (!e)
      return std::nullopt;
    std::vector<any_tensor> parts;
    parts.reserve(element_parts<data::element_of<D>>::count);
    element_parts<data::element_of<D>>::flatten(std::move(*e), parts);
    return parts;
  }
  void save(std::ostream& out) override { it_.save(out); }
  void restore(std::istream& in) override { it_.restore(in); }

private:
  data::iterator_of<D> it_;
};

// The registration, its shape functions and gradients: once per program where it
// links loom::kernels, in that library's unit only (op_registry.hpp says why).
#ifndef LOOM_COMPILED_KERNELS
inline bool register_iterator_ops() {
  auto& r = op_registry::instance();
  // No input; attr dataset (the dataset_registry key). Pulls the next element into
  // the resource; output: its ticket, an int64 scalar. Fails with out_of_range at the
  // end of input. Not blocking (op_def::blocking): it waits for its own pipeline,
  // never for another step, and a pipeline that ends in prefetch answers at once.
  r.add({.name = "iterator_get_next",
         .num_inputs = 0,
         .infer =
             [](node_def& n, const std::vector<const node_def*>&) {
               n.type = dtype::i64;
               n.shape = loom::shape{};
             },
         .stateful = true,
         .type_input = -1});
  // Inputs: the arguments of the dataset's function (any number, of any type); attr
  // dataset. Starts a new pass over the dataset made from them; no output.
  r.add({.name = "iterator_init",
         .num_inputs = -1,
         .infer =
             [](node_def& n, const std::vector<const node_def*>&) {
               n.type = dtype::i64;
               n.shape = loom::shape{};
             },
         .stateful = true,
         .no_output = true,
         .type_input = -1});
  // Input: a get_next's ticket; attrs dataset, index, dtype, shape. Output: tensor
  // `index` of that ticket's element.
  r.add({.name = "iterator_component",
         .num_inputs = 1,
         .infer =
             [](node_def& n, const std::vector<const node_def*>& in) {
               if (in[0]->op != "iterator_get_next")
                 throw invalid_argument_error("node " + n.describe() +
                                              ": its input must be an iterator_get_next, not " +
                                              in[0]->describe());
               n.type = n.attr<dtype>("dtype");
               n.shape = n.attr<loom::shape>("shape");
             },
         .stateful = true,
         .type_input = -1});
  // Input: a get_next's ticket; attr dataset. Output: the milliseconds that pull
  // waited for its element, a float scalar (the summary input_wait_ms).
  r.add({.name = "iterator_wait_ms",
         .num_inputs = 1,
         .infer =
             [](node_def& n, const std::vector<const node_def*>&) {
               n.type = dtype::f32;
               n.shape = loom::shape{};
             },
         .stateful = true,
         .type_input = -1});
  // No input; attr dataset. Output: the iterator's position, a string scalar
  // (data/iterator_state.hpp's bytes).
  r.add({.name = "iterator_save",
         .num_inputs = 0,
         .infer =
             [](node_def& n, const std::vector<const node_def*>&) {
               n.type = dtype::string;
               n.shape = loom::shape{};
             },
         .stateful = true,
         .type_input = -1});
  // Input: a position iterator_save gave, a string scalar; attr dataset. Starts the
  // iterator over from that position; no output.
  r.add({.name = "iterator_restore",
         .num_inputs = 1,
         .infer =
             [](node_def& n, const std::vector<const node_def*>& in) {
               if (in[0]->type != dtype::string || in[0]->shape.rank() != 0)
                 throw invalid_argument_error("node " + n.describe() +
                                              ": restores from a string scalar, not " +
                                              in[0]->describe());
               n.shape = loom::shape{};
             },
         .stateful = true,
         .no_output = true});
  return true;
}

inline const bool iterator_ops_registered = register_iterator_ops();
#endif

} // namespace detail

// The nodes of one iterator over elements E (make_one_shot_iterator).
template <class E> class dataset_iterator {
public:
  using element_type = E;
  using handles = typename detail::element_parts<E>::handles;

  dataset_iterator(output<std::int64_t, 0> pull, handles next)
      : pull_(std::move(pull)), next_(std::move(next)) {}

  // The next element's tensors: the same nodes at every call, so a step that runs any
  // of them pulls one element (TF pulls once per get_next() call; here, once per step).
  const handles& get_next() const noexcept { return next_; }
  // The milliseconds this step's pull waited for its element (input_wait_ms).
  output<float, 0> wait_ms() const {
    graph g = pull_.graph();
    const node_def& p = pull_.node();
    const node_id id =
        g.add_node("iterator_wait_ms", {pull_.id()}, {{"dataset", p.attr<std::string>("dataset")}},
                   p.name + "/wait_ms");
    g.mutable_node(id).colocation_group = p.colocation();
    return {g, id};
  }
  // The pulling node (the iterator's name: its checkpoint key's prefix).
  const output<std::int64_t, 0>& pull() const noexcept { return pull_; }

private:
  output<std::int64_t, 0> pull_;
  handles next_;
};

// An iterator whose pass starts at each run of its initializer()
// (make_initializable_iterator).
template <class E> class initializable_iterator : public dataset_iterator<E> {
public:
  initializable_iterator(dataset_iterator<E> nodes, operation init)
      : dataset_iterator<E>(std::move(nodes)), init_(std::move(init)) {}
  // Starts a new pass (TF's iterator.initializer): run it before the first pull, and
  // again for each new pass; where the dataset is made from tensors, feed them here.
  const operation& initializer() const noexcept { return init_; }

private:
  operation init_;
};

namespace detail {

// The nodes of an iterator over `make`'s passes, named `name`: its pull and one
// component per tensor of E. An initializable iterator's pull fails until an
// initializer ran; a one-shot iterator's position is saved with the checkpoint.
template <class E>
dataset_iterator<E> iterator_nodes(graph& g, component_iterator_factory make,
                                   const std::string& name, bool initializable) {
  const std::string key = dataset_registry::instance().add(name, std::move(make));
  attr_map pull_attrs{{"dataset", key}};
  if (initializable)
    pull_attrs.emplace("initializable", true);
  const node_id pull = g.add_node("iterator_get_next", {}, std::move(pull_attrs), name);
  if (!initializable)
    g.add_to_collection(collection::iterators, pull);
  const std::string group = g.node(pull).colocation();
  std::int64_t index = 0;
  auto component = [&]<element_type T, int R>() {
    const node_id id = g.add_node(
        "iterator_component", {pull},
        {{"dataset", key},
         {"index", index},
         {"dtype", dtype_of<T>},
         {"shape", loom::shape(std::vector<std::int64_t>(static_cast<std::size_t>(R), -1))}},
        name + "/component_" + std::to_string(index));
    ++index;
    g.mutable_node(id).colocation_group = group;
    return output<T, R>(g, id);
  };
  auto next = element_parts<E>::make(component);
  return {output<std::int64_t, 0>(g, pull), std::move(next)};
}

template <class E>
operation iterator_initializer(graph& g, const dataset_iterator<E>& it, std::vector<node_id> args) {
  const node_def& pull = it.pull().node();
  const node_id id =
      g.add_node("iterator_init", std::move(args), {{"dataset", pull.attr<std::string>("dataset")}},
                 pull.name + "/initializer");
  g.mutable_node(id).colocation_group = pull.colocation();
  return {g, id};
}

} // namespace detail

// An iterator over one pass of `dataset` (TF's dataset.make_one_shot_iterator()),
// named `name` (unique in the graph: its position's checkpoint key is
// "<name>/.iterator_state"). Its nodes take the current device scope; it must run on
// this process's task (see the top of this file).
template <data::dataset_recipe D>
dataset_iterator<data::element_of<D>> make_one_shot_iterator(graph& g, D dataset,
                                                             std::string name = "iterator") {
  return detail::iterator_nodes<data::element_of<D>>(
      g,
      [d = std::move(dataset)](
          const std::vector<any_tensor>&) -> std::unique_ptr<detail::component_iterator> {
        return std::make_unique<detail::flattening_iterator<D>>(d);
      },
      name, false);
}

// An iterator over `dataset` whose pass starts at each run of its initializer()
// (TF's dataset.make_initializable_iterator()).
template <data::dataset_recipe D>
initializable_iterator<data::element_of<D>>
make_initializable_iterator(graph& g, D dataset, std::string name = "iterator") {
  auto nodes = detail::iterator_nodes<data::element_of<D>>(
      g,
      [d = std::move(dataset)](
          const std::vector<any_tensor>&) -> std::unique_ptr<detail::component_iterator> {
        return std::make_unique<detail::flattening_iterator<D>>(d);
      },
      name, true);
  auto init = detail::iterator_initializer(g, nodes, {});
  return {std::move(nodes), std::move(init)};
}

namespace detail {
// An argument of a dataset function: an output or a placeholder, of T and rank R...
template <class H>
concept fed_handle = expression<H> && node_handle<H>;
// ...which the function takes as a tensor<T, R>, and returns a dataset.
template <class H> using fed_tensor = tensor<value_type_of<H>, rank_of<H>>;
template <class H> using fed_argument = const fed_tensor<H>&;
template <class F, class... Args>
concept dataset_function = std::invocable<const F&, fed_argument<Args>...> &&
    data::dataset_recipe<std::invoke_result_t<const F&, fed_argument<Args>...>>;
} // namespace detail

// An iterator over the dataset `make_dataset` makes from the values its initializer
// is run with: make_dataset takes a tensor<T, R> for each output or placeholder of T
// and rank R in `args` (placeholders, usually, fed at the initializer's run) and
// returns a dataset.
template <class F, detail::fed_handle... Args>
requires detail::dataset_function<F, Args...>
auto make_initializable_iterator(graph& g, F make_dataset, const std::tuple<Args...>& args,
                                 std::string name = "iterator") {
  using D = std::invoke_result_t<const F&, detail::fed_argument<Args>...>;
  using E = data::element_of<D>;
  auto make =
      [f = std::move(make_dataset),
       name](const std::vector<any_tensor>& values) -> std::unique_ptr<detail::component_iterator> {
    if (values.size() != sizeof...(Args))
      throw internal_error("iterator '" + name + "': its initializer ran with " +
                           std::to_string(values.size()) + " arguments, not " +
                           std::to_string(sizeof...(Args)));
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      const D dataset = f(detail::fed_tensor<Args>::from(
          values[I], "iterator '" + name + "': initializer argument " + std::to_string(I))...);
      return std::make_unique<detail::flattening_iterator<D>>(dataset);
    }
    (std::index_sequence_for<Args...>{});
  };
  auto nodes = detail::iterator_nodes<E>(g, std::move(make), name, true);
  std::vector<node_id> inputs;
  std::apply([&](const auto&... a) { (inputs.push_back(a.id()), ...); }, args);
  auto init = detail::iterator_initializer(g, nodes, std::move(inputs));
  return initializable_iterator<E>(std::move(nodes), std::move(init));
}

} // namespace loom
