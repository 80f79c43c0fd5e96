// TensorFlow's V2 checkpoint format, the tensor bundle (TF's
// util/tensor_bundle/tensor_bundle.cc), read and written, so that checkpoints move
// between loom and TensorFlow both ways. A checkpoint PREFIX is
//
//   PREFIX.index                   a LevelDB table (core/leveldb_table.hpp): key "" holds
//                                  a BundleHeaderProto (the number of data files, their
//                                  byte order, the format version), and each tensor's
//                                  name its BundleEntryProto (dtype, shape, data file,
//                                  offset, size, masked CRC-32C of the data)
//   PREFIX.data-00000-of-00002     the tensors' bytes, row-major, little-endian: bool one
//   PREFIX.data-00001-of-00002     byte; strings as a varint64 length of each, a u32
//                                  masked CRC-32C of those lengths (each as a u32, or a
//                                  u64 where it does not fit), then their bytes
//
// A partitioned variable is one entry under its full name, with its full dtype and
// shape and one TensorSliceProto per part (and no data), and each part an entry of its
// own under the key TF's checkpoint::EncodeTensorNameSlice makes of the name and the
// slice (OrderedCode: a 0, the name, the rank, each start and length), so a restore
// into any other partitioning reads the parts it overlaps (read_slice).
//
// The protocol buffers (five messages, a dozen fields) are hand-encoded with
// core/protobuf_wire.hpp, as TF serializes them (fields in number order, proto3
// defaults left out): an index loom writes is byte-identical to TF's for the same
// tensors. Each data file, then the index, is written durably (core/durable_file.hpp):
// the index last, so a reader never sees an index naming data that is not there yet.
#pragma once

#include <loom/core/tensor_bundle_reader.hpp>
#include <loom/core/tensor_bundle_writer.hpp>
