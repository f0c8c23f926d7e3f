// How an op writes an output that backward functions usually accumulate into.
#pragma once

namespace megabatch::ops {

// kAdd: out += result (the default of every backward: gradient accumulation, and a residual
// branch's gradient added to the other's, come free). kSet: out = result, for a temporary
// the op writes whole, so it needs no zero-fill first; out's old contents are never read.
enum class Write { kAdd, kSet };

}  // namespace megabatch::ops
