// Everything about placement: policies and combinators, ps strategies,
// replica_device_setter and the placer. Device scopes themselves are
// graph::device() and graph::on() (loom/graph/graph.hpp).
#pragma once

#include <loom/placement/placer.hpp>
#include <loom/placement/policy.hpp>
#include <loom/placement/replica_device_setter.hpp>
#include <loom/placement/strategies.hpp>
