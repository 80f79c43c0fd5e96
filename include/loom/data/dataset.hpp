// Datasets in tf.data's model (DESIGN.md §6c). A dataset is a small immutable
// recipe, copied by value: a source (tfrecord_dataset, csv_dataset, range, ...)
// or a transformation holding its input recipe (map, batch, shuffle, ...), each
// one type in its own header. Its element type is in its type, so a pipeline
// of std::tuple<tensor<float, 1>, tensor<std::int64_t, 0>> is checked when it
// compiles; a parsed tf.Example is the runtime-typed `features`.
//
// make_iterator() starts one pass over the elements. An iterator's next()
// gives the next element, or std::nullopt at the end of input (TF's
// OutOfRange) and again on every later call; save()/restore() write and read
// its position (data/iterator_state.hpp). Transformations compose with `|`:
//
//   auto batches = data::tfrecord_dataset(files) | data::batch(256)
//                | data::map(data::example_parser(spec), 2) | data::prefetch(2);
//   for (auto& b : batches) ...
//
// Iterators move but need not be assignable (a recipe may hold a lambda).
//
// Threads: only the stages that say so start any (map with num_parallel_calls
// > 1, prefetch, a parallel interleave), each its own, started at the first
// next() and joined when its iterator is destroyed; never the kernels'
// intra-op pool. What each buffers is bounded and stated in its header.
#pragma once

#include <concepts>
#include <istream>
#include <memory>
#include <optional>
#include <ostream>
#include <type_traits>
#include <utility>

namespace loom::data {

template <class I, class E>
concept iterator_over = std::move_constructible<I> &&
    requires(I& it, std::ostream& out, std::istream& in) {
  { it.next() } -> std::same_as<std::optional<E>>;
  it.save(out);
  it.restore(in);
};

template <class D>
concept dataset_recipe = std::copy_constructible<D> && requires(const D& d) {
  typename D::element_type;
  { d.make_iterator() } -> iterator_over<typename D::element_type>;
};

template <dataset_recipe D> using element_of = typename D::element_type;
template <dataset_recipe D> using iterator_of = decltype(std::declval<const D&>().make_iterator());

// A transformation not yet given its input: `input | data::batch(32)` calls
// batch's apply(input).
template <class A, class D>
concept transformation_of = requires(const A& a, D d) {
  { a.apply(std::move(d)) } -> dataset_recipe;
};

template <dataset_recipe D, transformation_of<D> A> auto operator|(D input, const A& stage) {
  return stage.apply(std::move(input));
}

// Range-for over a dataset: one pass, one iterator.
struct end_of_input {};

template <dataset_recipe D> class element_cursor {
public:
  explicit element_cursor(const D& d) : it_(d.make_iterator()) { current_ = it_.next(); }
  element_of<D>& operator*() { return *current_; }
  element_cursor& operator++() {
    current_ = it_.next();
    return *this;
  }
  bool operator==(end_of_input) const noexcept { return !current_; }

private:
  iterator_of<D> it_;
  std::optional<element_of<D>> current_;
};

template <dataset_recipe D> element_cursor<D> begin(const D& d) {
  return element_cursor<D>(d);
}
template <dataset_recipe D> end_of_input end(const D&) {
  return {};
}

// An iterator of elements E whose pipeline's type is hidden: what a program
// keeps in a member or passes across a library boundary.
template <class E> class any_iterator {
public:
  // The self check comes first: it keeps the concept from asking whether
  // any_iterator itself is an iterator while it is being copied.
  template <class I>
  requires(!std::is_same_v<std::remove_cvref_t<I>, any_iterator> && iterator_over<I, E>)
      any_iterator(I it)
      : impl_(std::make_unique<model<I>>(std::move(it))) {}

  std::optional<E> next() { return impl_->next(); }
  void save(std::ostream& out) { impl_->save(out); }
  void restore(std::istream& in) { impl_->restore(in); }

private:
  struct base {
    virtual ~base() = default;
    virtual std::optional<E> next() = 0;
    virtual void save(std::ostream&) = 0;
    virtual void restore(std::istream&) = 0;
  };
  template <class I> struct model final : base {
    explicit model(I i) : it(std::move(i)) {}
    std::optional<E> next() override { return it.next(); }
    void save(std::ostream& out) override { it.save(out); }
    void restore(std::istream& in) override { it.restore(in); }
    I it;
  };
  std::unique_ptr<base> impl_;
};

template <class E> class any_dataset {
public:
  using element_type = E;

  template <class D>
  requires(!std::is_same_v<std::remove_cvref_t<D>, any_dataset> && dataset_recipe<D> &&
           std::is_same_v<element_of<D>, E>) any_dataset(D d)
      : impl_(std::make_shared<model<D>>(std::move(d))) {}

  any_iterator<E> make_iterator() const { return impl_->make_iterator(); }

private:
  struct base {
    virtual ~base() = default;
    virtual any_iterator<E> make_iterator() const = 0;
  };
  template <class D> struct model final : base {
    explicit model(D d) : recipe(std::move(d)) {}
    any_iterator<E> make_iterator() const override { return recipe.make_iterator(); }
    D recipe;
  };
  std::shared_ptr<const base> impl_;
};

} // namespace loom::data
