// Flash attention: the self-attention of attention.h without the (B, H, T, T)
// probabilities. The forward walks the keys in tiles with an online softmax and saves, per
// query row, lse (B, H, T) f32: the natural log of the softmax denominator over the scaled
// scores (+inf for a row whose keys are all masked, whose output and gradient are 0). The
// backward recomputes the probabilities from q, k and lse, and reads `out` for the row sums
// of the softmax gradient (dout . out). Layouts, masks, dropout (the same Philox element
// of the full (B, total heads, T, T) tensor, so the same masks) and tensor-parallel head
// offsets are attention_forward's (the backward takes the forward's masks, documents
// included, as it recomputes the probabilities), and so is the bias: (H, T, T) in qkv's dtype, added to the
// scaled scores (T5's relative position bias), its gradient dbias (H, T, T) in f32 (f64 for
// f64) summed over the batch in batch order. The cross-attention pair is
// cross_attention_forward's (q, kv, a key mask over the encoder positions, no causal mask,
// no bias) in the same way, lse (B, H, Tq).
//
// CUDA: bf16 and fp16 with f32 accumulation on tensor cores (sm_80 and later), head size
// 64 or 128; on sm_75 (T4) fp16 at head size 64 (flash_attention_supported says which). f32
// stays on the explicit attention, which is also the reference. The CPU computes each row in
// f64 (the kernels' reference).
#pragma once

#include "core/ops/attention.h"
#include "core/ops/write.h"

namespace megabatch::ops {

// Whether the flash kernels take this device, dtype and head size (on the CPU: always).
bool flash_attention_supported(Device d, DType t, int64_t head_size);

// How the CUDA backward finds dQ; a process-wide choice (the CPU computes each row whole).
// - kSeparate: a kernel of its own per block of queries walks the key tiles again, after the
//   dK/dV kernel, recomputing S and dP: seven tile products in all.
// - kOrdered: the dK/dV kernel adds each key block's share (dS K) into an f32 sum per query
//   tile, the key blocks of a tile taking turns in a fixed order (a block waits for the one
//   before it): five tile products, and the same bits every run. It takes self-attention
//   shapes without a bias, causal ones of any length and others whose key blocks of one
//   (batch row, head) fit on the GPU at once; the others use kSeparate.
// The two differ in the last bits of dQ (the sums are grouped differently). The ordered kernel
// is sm_80 code (A100, H100 and later); flash_dq_ordered_supported says where it runs.
// The environment may set the starting choice, as tests/gpu/run.sh does to run the trainer's
// GPU tests under both: MEGABATCH_FLASH_DQ=separate|ordered (default separate), and below
// MEGABATCH_FLASH_FORWARD_ROWS=16|32 (default 16); another value is an error naming it.
enum class FlashDq { kSeparate, kOrdered };
bool flash_dq_ordered_supported(Device d);
void set_flash_dq(FlashDq how);
FlashDq flash_dq();
// Backward calls that have taken the ordered path in this process (the tests check it ran).
int64_t flash_dq_ordered_calls();
void count_flash_dq_ordered_call();  // (the CUDA backend's)

// How many query rows a warp of the CUDA forward computes; a process-wide choice (the same
// results either way, bit for bit).
// - k16: at head size 64, blocks of 64 queries (three blocks an SM); at 128, blocks of 128
//   (one an SM); a warp per 16, its queries' fragments in registers.
// - k32: blocks of 128 queries, a warp per 32 as two 16-row products that share each key
//   and value fragment loaded from shared memory: half the shared-memory loads a product.
//   More registers a thread (two blocks an SM). At head size 128 the queries' fragments do
//   not fit beside the output's: they are loaded from shared memory where they multiply
//   (102 KiB a block: a GPU that gives a block less, such as a T4 or an sm_86, runs k16; an
//   A100 holds one such block an SM, an H100 two).
//   Opt-in until a GPU has timed it (attention_bench prints both).
enum class FlashForwardRows { k16, k32 };
void set_flash_forward_rows(FlashForwardRows rows);
FlashForwardRows flash_forward_rows();

// out (B, T, H, D) and lse (B, H, T) f32 written. bias and documents may be undefined.
void flash_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, const Tensor& key_mask,
                             const AttentionShape& s, const DropoutKey* dropout, const Tensor& bias = {},
                             const Tensor& documents = {});
// dqkv += the gradient with respect to qkv (= with kSet); with the forward's bias, dbias
// (when defined) += the gradient with respect to it, whatever w says.
void flash_attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                              const Tensor& lse, const Tensor& key_mask, const AttentionShape& s,
                              const DropoutKey* dropout, Write w = Write::kAdd, const Tensor& bias = {},
                              const Tensor& dbias = {}, const Tensor& documents = {});

// Cross-attention: out (B, Tq, H, D) and lse (B, H, Tq) f32 written.
void flash_cross_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& kv,
                                   const Tensor& key_mask, const CrossAttentionShape& s, const DropoutKey* dropout);
// dq += dL/dq and dkv += dL/dkv (= with kSet).
void flash_cross_attention_backward(const Tensor& dq, const Tensor& dkv, const Tensor& dout, const Tensor& q,
                                    const Tensor& kv, const Tensor& out, const Tensor& lse, const Tensor& key_mask,
                                    const CrossAttentionShape& s, const DropoutKey* dropout, Write w = Write::kAdd);

}  // namespace megabatch::ops
