// Everything for training: the optimizers and the global step. Their update
// ops' CPU kernels come with <loom/kernels/cpu/cpu.hpp> (and <loom/loom.hpp>).
#pragma once

#include <loom/train/adagrad.hpp>
#include <loom/train/adam.hpp>
#include <loom/train/clip_ops.hpp>
#include <loom/train/ftrl.hpp>
#include <loom/train/global_step.hpp>
#include <loom/train/gradient_descent.hpp>
#include <loom/train/hooks.hpp>
#include <loom/train/incremental_saver.hpp>
#include <loom/train/init_from_checkpoint.hpp>
#include <loom/train/learning_rate_decay.hpp>
#include <loom/train/momentum.hpp>
#include <loom/train/monitored_session.hpp>
#include <loom/train/moving_averages.hpp>
#include <loom/train/optimizer.hpp>
#include <loom/train/rmsprop.hpp>
#include <loom/train/saver.hpp>
#include <loom/train/summary_saver_hook.hpp>
#include <loom/train/summary_writer.hpp>
#include <loom/train/sync_replicas_optimizer.hpp>
