// Every part of the input pipeline (DESIGN.md §6c, docs/input-pipelines.md), and
// string_to_hash_bucket_fast for its categorical features.
#pragma once

#include <loom/core/fingerprint.hpp>
#include <loom/data/batch.hpp>
#include <loom/data/cache.hpp>
#include <loom/data/csv_dataset.hpp>
#include <loom/data/dataset.hpp>
#include <loom/data/decode_csv.hpp>
#include <loom/data/example.hpp>
#include <loom/data/example_builder.hpp>
#include <loom/data/features.hpp>
#include <loom/data/file_io.hpp>
#include <loom/data/filter.hpp>
#include <loom/data/from_tensor_slices.hpp>
#include <loom/data/ignore_errors.hpp>
#include <loom/data/interleave.hpp>
#include <loom/data/iterator_state.hpp>
#include <loom/data/list_files.hpp>
#include <loom/data/map.hpp>
#include <loom/data/padded_batch.hpp>
#include <loom/data/prefetch.hpp>
#include <loom/data/range.hpp>
#include <loom/data/repeat.hpp>
#include <loom/data/shard.hpp>
#include <loom/data/shuffle.hpp>
#include <loom/data/skip.hpp>
#include <loom/data/take.hpp>
#include <loom/data/text_line_dataset.hpp>
#include <loom/data/tfrecord_dataset.hpp>
#include <loom/data/tfrecord_writer.hpp>
