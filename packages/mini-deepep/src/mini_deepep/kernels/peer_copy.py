"""A plain store-to-peer copy: the NVLink ceiling the dispatch/combine kernels are measured against."""

import triton
import triton.language as tl

from mini_deepep.kernels.signals import peer_offset


@triton.jit
def peer_copy_kernel(src, buf32, peer_offsets, peer, dst_offset, num_words, BLOCK: tl.constexpr):
    """Copy int32 words src[0:num_words] into `peer`'s symmetric buffer at dst_offset (persistent grid)."""
    dst = buf32 + peer_offset(peer_offsets, peer) + dst_offset
    for start in range(tl.program_id(0) * BLOCK, num_words, tl.num_programs(0) * BLOCK):
        cols = start + tl.arange(0, BLOCK)
        in_range = cols < num_words
        tl.store(dst + cols, tl.load(src + cols, mask=in_range), mask=in_range)
