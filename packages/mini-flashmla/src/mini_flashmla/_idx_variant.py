import triton
import triton.language as tl
from mini_flashmla.indexer_kernel import _dequant_keys, _score_tile


@triton.jit
def _q_tile(q_ptr, stride_q_s, stride_q_h, w_ptr, stride_w_s, q0, q_end, H: tl.constexpr, D: tl.constexpr,
            BLOCK_Q: tl.constexpr):
    col = tl.arange(0, BLOCK_Q * H)
    col_q = q0 + col // H
    col_ok = col_q < q_end
    q = tl.load(q_ptr + tl.minimum(col_q, q_end - 1)[:, None] * stride_q_s + (col % H)[:, None] * stride_q_h
                + tl.arange(0, D)[None, :])
    w = tl.load(w_ptr + col_q * stride_w_s + col % H, mask=col_ok, other=0.0).to(tl.float32)
    return q, w


@triton.jit
def indexer_scores_kernel(
    q_ptr, stride_q_s, stride_q_h,
    w_ptr, stride_w_s,
    cache_ptr, num_rows,
    key_rows_ptr, stride_key_rows_s,
    visible_ptr,
    out_ptr, stride_out_s,
    s_q, n_keys, queries_per_program,
    H: tl.constexpr, D: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr,
):
    t = tl.program_id(0) * BLOCK_K + tl.arange(0, BLOCK_K)
    q_begin = tl.program_id(1) * queries_per_program
    t_ok = t < n_keys
    rows = tl.load(key_rows_ptr + q_begin * stride_key_rows_s + t, mask=t_ok, other=-1)
    k, row_ok = _dequant_keys(cache_ptr, num_rows, rows, D, False)
    q_end = tl.minimum(q_begin + queries_per_program, s_q)
    for q0 in tl.range(q_begin, q_end, BLOCK_Q, num_stages=STAGES):
        q, w = _q_tile(q_ptr, stride_q_s, stride_q_h, w_ptr, stride_w_s, q0, q_end, H, D, BLOCK_Q)
        score = _score_tile(k, q, w, BLOCK_Q, H)
        qi = q0 + tl.arange(0, BLOCK_Q)
        qi_ok = qi < q_end
        visible = tl.load(visible_ptr + qi, mask=qi_ok, other=0)
        seen = row_ok[:, None] & (t[:, None] < visible[None, :])
        score = tl.where(seen, score, float("-inf"))
        tl.store(out_ptr + qi[None, :].to(tl.int64) * stride_out_s + t[:, None], score,
                 mask=t_ok[:, None] & qi_ok[None, :])
