// Everything about clusters: cluster_spec, TF_CONFIG, the resolver of a program's
// cluster and task (flags, TF_CONFIG, Slurm, mpirun) and the cluster form of
// replica_device_setter.
#pragma once

#include <loom/cluster/cluster_resolver.hpp>
#include <loom/cluster/cluster_spec.hpp>
#include <loom/cluster/environment.hpp>
#include <loom/cluster/liveness_settings.hpp>
#include <loom/cluster/replica_device_setter.hpp>
#include <loom/cluster/slurm_lists.hpp>
#include <loom/cluster/tf_config.hpp>
#include <loom/cluster/tls_settings.hpp>
