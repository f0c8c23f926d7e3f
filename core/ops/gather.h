// Row gathers: BERT's masked-LM head runs on the masked positions only, and its pooler on
// the [CLS] rows; the query-key LayerNorm (--qk-layernorm) on the q and k rows of a QKV output.
#pragma once

#include "core/tensor/tensor.h"

namespace megabatch::ops {

// out(m, C) = in[rows[r]] for r < m; rows i32 (m) on the same device.
void gather_rows(const Tensor& out, const Tensor& in, const Tensor& rows);
// dst[rows[r]] += src(m, C) row r. rows must be distinct (each destination row has one writer).
void scatter_add_rows(const Tensor& dst, const Tensor& src, const Tensor& rows);
// dst[rows[r]] = src(m, C) row r, the other rows of dst as they were. rows must be distinct.
void scatter_rows(const Tensor& dst, const Tensor& src, const Tensor& rows);

}  // namespace megabatch::ops
