// Everything about clusters: cluster_spec, TF_CONFIG and the cluster form of
// replica_device_setter.
#pragma once

#include <loom/cluster/cluster_spec.hpp>
#include <loom/cluster/replica_device_setter.hpp>
#include <loom/cluster/tf_config.hpp>
