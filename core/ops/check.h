// Argument checks shared by the dispatching op functions (the dispatch: op_dispatch.h).
#pragma once

#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "core/ops/accepts.h"
#include "core/ops/backends.h"
#include "core/util/error.h"

namespace megabatch::ops::detail {

// The accumulator dtype of an activation dtype: f64 for f64, else f32.
constexpr DType acc_type(DType activations) { return activations == DType::kF64 ? DType::kF64 : DType::kF32; }

// The device of the defined tensors, which must all be on it (an Error naming the op).
Device common_device(const char* op, std::initializer_list<const Tensor*> tensors);

// An argument whose dtype the caller chooses, checked against its row of the table
// (core/ops/accepts.inc) for the device the op runs on: an Error naming the op and the
// argument, "sum: out must be f32 or f64, got ...", or, where the CPU takes the dtype and
// CUDA does not, "ce_loss: losses is f64, which the CUDA kernels do not take (f32): <why>".
void expect_accepted(const Accepts& row, const Tensor& t, Device d);

// Errors naming the op and the argument (for arguments whose dtype follows another's).
void expect_dtype(const char* op, const char* name, const Tensor& t, DType d);
void expect_dtype(const char* op, const char* name, const Tensor& t, std::initializer_list<DType> allowed);
void expect_numel(const char* op, const char* name, const Tensor& t, size_t n);
void expect_same(const char* op, const char* a_name, const Tensor& a, const char* b_name, const Tensor& b);  // dtype and numel
// Element ranges [begin, end) of the flat x, each within it.
void expect_segments(const char* op, const Tensor& x, const std::vector<std::pair<size_t, size_t>>& segments);
// The growth base `prev` of a flat f32 x: f32, as long as x, and not x itself.
void expect_growth_base(const char* op, const Tensor& x, const Tensor& prev);

// Rows (all leading dimensions) and columns (the last dimension).
int64_t rows(const Tensor& t);
int64_t cols(const Tensor& t);

}  // namespace megabatch::ops::detail
