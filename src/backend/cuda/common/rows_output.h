// rows_output.h: where the rows of a fused matrix's product go ([qkv; z; b; a], [q; k; v]): each
// part of the output to its own buffer, so that one launch serves the fused matrix. Taken by the
// few-row GEMVs (gemv/gemv_rows.h) and the prefill GEMM (gemm/gemm_w4_wgmma.h).
#pragma once

namespace lily::cuda {

// Where output row r of token t goes: the part p with parts[p].first_row <= r < the next part's
// first_row writes parts[p].y[t * parts[p].ld + r - parts[p].first_row]. Parts in row order,
// the first at row 0.
struct RowsOutput {
  static constexpr int kMaxParts = 4;
  struct Part {
    float* y = nullptr;
    int first_row = 0;
    int ld = 0;  // floats from one token's row of the part to the next
  };
  Part parts[kMaxParts];
  int count = 0;

  // One buffer y [T, rows].
  static RowsOutput whole(float* y, int rows) {
    RowsOutput o;
    o.parts[0] = {y, 0, rows};
    o.count = 1;
    return o;
  }
  RowsOutput& then(float* y, int first_row, int ld) {
    parts[count++] = {y, first_row, ld};
    return *this;
  }
};

}  // namespace lily::cuda
