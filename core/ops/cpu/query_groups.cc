// Grouped-query attention's layout change on the CPU: the reference (query_groups.h).
#include "core/ops/backends.h"
#include "core/ops/cpu/f32.h"

namespace megabatch::ops::cpu {

void expand_query_groups(const Tensor& qkv, const Tensor& grouped, const QueryGroupShape& s) {
  with_compute_type(grouped.dtype(), [&](auto zero) {
    using T = decltype(zero);
    In<T> gs(grouped);
    Out<T> qs(qkv, false);
    const T* g = gs;
    T* q = qs;
    const int64_t D = s.head_dim, per = s.heads / s.groups, row = 3 * s.heads * D,
                  grouped_row = (s.heads + 2 * s.groups) * D, rows = static_cast<int64_t>(qkv.numel()) / row;
#pragma omp parallel for schedule(static) if (rows > 64)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t h = 0; h < s.heads; ++h) {
        const T* group = g + r * grouped_row + (h / per) * (per + 2) * D;
        T* head = q + r * row + h * 3 * D;
        for (int64_t c = 0; c < D; ++c) {
          head[c] = group[(h % per) * D + c];
          head[D + c] = group[per * D + c];
          head[2 * D + c] = group[(per + 1) * D + c];
        }
      }
    qs.commit();
  });
}

void reduce_query_groups(const Tensor& dgrouped, const Tensor& dqkv, const QueryGroupShape& s) {
  with_compute_type(dqkv.dtype(), [&](auto zero) {
    using T = decltype(zero);
    In<T> qs(dqkv);
    Out<T> gs(dgrouped, false);
    const T* dq = qs;
    T* dg = gs;
    const int64_t D = s.head_dim, per = s.heads / s.groups, row = 3 * s.heads * D,
                  grouped_row = (s.heads + 2 * s.groups) * D, rows = static_cast<int64_t>(dqkv.numel()) / row;
#pragma omp parallel for schedule(static) if (rows > 64)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t gi = 0; gi < s.groups; ++gi) {
        T* group = dg + r * grouped_row + gi * (per + 2) * D;
        const T* heads = dq + r * row + gi * per * 3 * D;  // the group's first head
        for (int64_t c = 0; c < D; ++c) {
          T k = 0, v = 0;
          for (int64_t j = 0; j < per; ++j) {  // in head order
            group[j * D + c] = heads[j * 3 * D + c];
            k += heads[j * 3 * D + D + c];
            v += heads[j * 3 * D + 2 * D + c];
          }
          group[per * D + c] = k;
          group[(per + 1) * D + c] = v;
        }
      }
    gs.commit();
  });
}

}  // namespace megabatch::ops::cpu
