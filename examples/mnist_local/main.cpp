// The model of the seed's distributed MNIST program (784 -> hidden -> 10, relu,
// softmax, cross entropy, Adam), trained in one process on Fashion-MNIST.
//
//   mnist_local --data_dir /usr/share/datasets/fashion-mnist --epochs 3
#include <loom/data/batcher.hpp>
#include <loom/data/mnist.hpp>
#include <loom/loom.hpp>

#include "../common/seed_mlp.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>

int main(int argc, char** argv) try {
  loom::flags flags("Trains the seed's MLP on Fashion-MNIST in one process.");
  flags
      .define_string("data_dir", std::string(loom::data::default_fashion_mnist_dir),
                     "Directory with the (Fashion-)MNIST IDX files")
      .define_int("hidden_units", 100, "Number of units in the hidden layer of the NN")
      .define_int("batch_size", 100, "Training batch size")
      .define_float("learning_rate", 0.001, "Learning rate of Adam")
      .define_int("epochs", 3, "Passes over the training set")
      .define_int("log_every", 100, "Print progress every this many steps")
      .define_int("seed", 1, "Graph-level random seed (initial weights, shuffling)");
  if (!flags.parse(argc, argv))
    return 0;

  const auto hidden = flags.get_int("hidden_units");
  const auto batch_size = flags.get_int("batch_size");
  const auto seed = flags.get_int("seed");

  const auto mnist = loom::data::read_mnist(flags.get_string("data_dir"));
  std::printf("data: %lld train, %lld validation, %lld test examples\n",
              static_cast<long long>(mnist.train.size()),
              static_cast<long long>(mnist.validation.size()),
              static_cast<long long>(mnist.test.size()));

  loom::graph g;
  g.set_random_seed(seed);
  auto global_step = loom::create_global_step(g);
  loom::examples::seed_mlp model(g, hidden);
  auto& x = model.x;
  auto& y_ = model.y_;
  auto& cross_entropy = model.cross_entropy;
  auto& accuracy = model.accuracy;

  loom::adam_optimizer opt{flags.get_float("learning_rate")};
  auto train_step = opt.minimize(cross_entropy, global_step);

  loom::session sess(g);
  sess.run(loom::global_variables_initializer(g));

  loom::data::batcher batches(mnist.train, batch_size, static_cast<std::uint64_t>(seed));
  const auto steps = flags.get_int("epochs") * mnist.train.size() / batch_size;
  const auto log_every = flags.get_int("log_every");
  using clock = std::chrono::steady_clock;
  const auto begin = clock::now();
  auto window = begin;
  for (std::int64_t local_step = 1; local_step <= steps; ++local_step) {
    auto b = batches.next_batch();
    auto [_, loss, step] = sess.run(loom::fetches(train_step, cross_entropy, global_step),
                                    {{x, b.images}, {y_, b.labels_one_hot}});
    if (local_step % log_every == 0 || local_step == steps) {
      const auto now = clock::now();
      const double secs = std::chrono::duration<double>(now - window).count();
      const auto n = local_step % log_every == 0 ? log_every : local_step % log_every;
      std::printf("step %6lld  epoch %lld  loss %9.3f  %8.0f examples/s\n",
                  static_cast<long long>(static_cast<std::int64_t>(step)),
                  static_cast<long long>(batches.epochs_completed()), static_cast<double>(loss),
                  static_cast<double>(n * batch_size) / secs);
      window = now;
    }
  }
  const double train_secs = std::chrono::duration<double>(clock::now() - begin).count();
  std::printf("training: %lld steps in %.1f s\n", static_cast<long long>(steps), train_secs);

  auto val_xent = sess.run(cross_entropy, {{x, mnist.validation.images},
                                           {y_, loom::data::one_hot(mnist.validation.labels, 10)}});
  std::printf("validation cross entropy = %g\n", static_cast<double>(static_cast<float>(val_xent)));
  auto test_acc = sess.run(
      accuracy, {{x, mnist.test.images}, {y_, loom::data::one_hot(mnist.test.labels, 10)}});
  std::printf("test accuracy = %.4f\n", static_cast<double>(static_cast<float>(test_acc)));
  return 0;
} catch (const loom::error& e) {
  std::cerr << "mnist_local: " << e.what() << "\n";
  return 1;
}
