// Everything for training: the optimizers, the global step, and the CPU
// kernels of the update ops (a program that builds graphs only, for another
// process to run, can include the optimizer headers alone).
#pragma once

#include <loom/kernels/cpu/training.hpp>
#include <loom/train/adagrad.hpp>
#include <loom/train/adam.hpp>
#include <loom/train/global_step.hpp>
#include <loom/train/gradient_descent.hpp>
#include <loom/train/momentum.hpp>
#include <loom/train/optimizer.hpp>
#include <loom/train/rmsprop.hpp>
