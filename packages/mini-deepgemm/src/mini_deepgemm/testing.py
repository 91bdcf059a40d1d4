"""Helpers shared by the tests and the benchmarks: the diff metric and random quantized operands."""

from __future__ import annotations

import os
import subprocess
import sys

import torch

from . import reference


def run_interpreted(args: list[str], timeout: float, expect: str) -> str:
    """`python ARGS` in a fresh process under Triton's interpreter (TRITON_INTERPRET=1 is read when the kernels are
    defined, so a test that wants it for a few kernels runs them in a child), one OpenMP thread. Asserts that it
    exited 0 and printed `expect` (the output's tails in the message otherwise); returns its stdout."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0 and expect in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def run_finishes(code: str, seconds: float, what: str) -> None:
    """Runs `code` in a fresh Python process and raises AssertionError if it does not finish within `seconds` (a
    warp-specialized kernel's handover mistake hangs rather than fails) or exits with an error."""
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=seconds)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{what} did not finish in {seconds} s: a hang") from None
    assert done.returncode == 0, done.stderr[-2000:]


def prmt(a: int, b: int, selector: int) -> int:
    """PTX prmt.b32 (default mode): byte i of the result is byte (nibble i of the selector) of {b, a}, or that
    byte's sign replicated when the nibble's bit 3 is set."""
    source = [(a >> (8 * i)) & 0xFF for i in range(4)] + [(b >> (8 * i)) & 0xFF for i in range(4)]
    out = 0
    for i in range(4):
        nibble = (selector >> (4 * i)) & 0xF
        byte = source[nibble & 7]
        out |= ((0xFF if byte & 0x80 else 0) if nibble & 8 else byte) << (8 * i)
    return out


def _bf16x2_mul(a: int, b: int) -> int:
    """PTX mul.rn.bf16x2 on two words: each half's product rounded to nearest even (the float32 product of two bf16
    values is exact, subnormals kept)."""
    halves = torch.tensor([a & 0xFFFF, a >> 16, b & 0xFFFF, b >> 16], dtype=torch.int32).to(torch.int16)
    x = halves.view(torch.bfloat16).float()
    product = (x[:2] * x[2:]).to(torch.bfloat16).view(torch.int16).to(torch.int32) & 0xFFFF
    return int(product[0]) | int(product[1]) << 16


def bf16_bits(values: torch.Tensor) -> list[int]:
    """The bf16 bit patterns (0 .. 0xFFFF) of `values`, rounded to bf16 first."""
    return [int(v) & 0xFFFF for v in values.flatten().to(torch.bfloat16).view(torch.int16)]


def bf16_halves(words: list[int]) -> list[int]:
    """The bf16 bit patterns held in 32-bit bf16x2 words, the low half first (run_inline_ptx's results)."""
    return [w >> (16 * h) & 0xFFFF for w in words for h in (0, 1)]


def finite_e4m3_codes() -> torch.Tensor:
    """uint8 [254]: every e4m3 byte but the two NaN codes (magnitude 0x7F)."""
    return torch.tensor([c for c in range(256) if c & 0x7F != 0x7F], dtype=torch.uint8)


def run_inline_ptx(ptx: str, inputs: list[int], outputs: int) -> list[int]:
    """The kernels' inline PTX blocks, interpreted on the CPU: a straight-line block of the 32-bit integer
    instructions they use and mul.rn.bf16x2, with Triton's operand numbering ($0 .. $outputs-1 the results, then
    `inputs`). CPU tests run the exact text a kernel compiles, so a wrong edit of it fails without a GPU. An
    instruction outside that set raises ValueError."""
    mask = 0xFFFFFFFF
    regs = {f"${outputs + i}": v & mask for i, v in enumerate(inputs)}

    def value(operand: str) -> int:
        return regs[operand] if operand in regs else int(operand, 0) & mask

    for statement in ptx.replace("{", ";").replace("}", ";").split(";"):
        words = statement.split(None, 1)
        if not words or words[0] == ".reg":
            continue
        op, operands = words[0], [o.strip() for o in words[1].split(",")]
        x = [value(o) for o in operands[1:]]
        if op == "mov.b32":
            r = x[0]
        elif op == "cvt.u32.u16":
            r = x[0] & 0xFFFF
        elif op == "and.b32":
            r = x[0] & x[1]
        elif op == "or.b32":
            r = x[0] | x[1]
        elif op == "add.u32":
            r = x[0] + x[1]
        elif op == "shl.b32":
            r = x[0] << x[1]
        elif op in ("shr.b32", "shr.u32"):
            r = x[0] >> x[1]
        elif op == "shr.s32":
            r = (x[0] - (x[0] >> 31 << 32)) >> x[1]
        elif op == "mul.lo.u32":
            r = x[0] * x[1]
        elif op == "mad.lo.u32":
            r = x[0] * x[1] + x[2]
        elif op == "mul.hi.u32":
            r = x[0] * x[1] >> 32
        elif op == "prmt.b32":
            r = prmt(x[0], x[1], x[2])
        elif op == "lop3.b32":  # result bit = bit (4 a + 2 b + c) of the table
            r = sum(((x[3] >> ((x[0] >> i & 1) * 4 + (x[1] >> i & 1) * 2 + (x[2] >> i & 1))) & 1) << i
                    for i in range(32))
        elif op == "mul.rn.bf16x2":
            r = _bf16x2_mul(x[0], x[1])
        else:
            raise ValueError(f"run_inline_ptx does not model {op!r}")
        regs[operands[0]] = r & mask
    return [regs[f"${i}"] for i in range(outputs)]


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """DeepGEMM's similarity metric 1 - 2*sum(x*y) / sum(x*x + y*y), in fp64: 0 for identical tensors,
    scale-free, so one threshold fits every shape (FP8 x FP8 GEMMs: < 1e-3)."""
    x, y = x.double(), y.double()
    denom = (x * x + y * y).sum()
    if denom == 0:
        return 0.0
    return float(1 - 2 * (x * y).sum() / denom)


def random_bf16(
    *shape: int, row_block: int = 1, device: str | torch.device = "cpu", generator: torch.Generator | None = None,
    max_exponent: int = 4,
) -> torch.Tensor:
    """Gaussian values whose magnitude varies per row_block x 32 block over 2^-max_exponent..2^max_exponent, so
    neighbouring scale groups get different scales (a kernel that mixes them up fails). row_block: the rows sharing
    one scale (1 for activations and FP4 weights, the block size for FP8 block-scaled weights)."""
    *lead, rows, cols = shape
    x = torch.randn(*shape, generator=generator)
    exps = torch.randint(-max_exponent, max_exponent + 1, (*lead, -(-rows // row_block), cols // 32),
                         generator=generator).float()
    spread = torch.exp2(exps).repeat_interleave(row_block, -2)[..., :rows, :].repeat_interleave(32, -1)
    return (x * spread).to(torch.bfloat16).to(device)


def random_fp8_weights(
    *lead: int, N: int, K: int, block: int, scale_fmt: str, device: str | torch.device = "cpu",
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(w bf16 [*lead, N, K], q e4m3, scale [*lead, N/block, K/block]) via reference.weight_quant_fp8."""
    w = random_bf16(*lead, N, K, row_block=block, generator=generator).to(device)
    flat = w.reshape(-1, N, K)
    qs = [reference.weight_quant_fp8(t, block, scale_fmt) for t in flat]
    q = torch.stack([p[0] for p in qs]).reshape(*lead, N, K)
    s = torch.stack([p[1] for p in qs]).reshape(*lead, *qs[0][1].shape)
    return w, q, s


def block_scaled_operands(
    M: int, N: int, K: int, block: int, scale_fmt: str, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(aq, sa, bq, sb) of a dense GEMM: a [M, K] quantized per 1 x block, b [N, K] per block x block (quantized with
    N rounded up to the block, then cut to N rows: a partial last block keeps its scale row). scale_fmt as
    reference.act_quant: "ue8m0" (V4.1, block 32) or "fp32" (V3, block 128)."""
    aq, sa = reference.act_quant(random_bf16(M, K, generator=generator), block, scale_fmt)
    _, bq, sb = random_fp8_weights(N=-(-N // block) * block, K=K, block=block, scale_fmt=scale_fmt, generator=generator)
    return aq, sa, bq[:N].contiguous(), sb


def random_fp4_weights(
    *lead: int, N: int, K: int, device: str | torch.device = "cpu", generator: torch.Generator | None = None,
    max_exponent: int = 4,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(w bf16 [*lead, N, K], packed e2m1 uint8 [*lead, N, K/2], UE8M0 scale [*lead, N, K/32]); max_exponent: as
    random_bf16's."""
    w = random_bf16(*lead, N, K, generator=generator, max_exponent=max_exponent).to(device)
    q, s = reference.fp4_quant(w, 32, "ue8m0")
    return w, q, s


def contiguous_layout(rows_per_group: list[int], alignment: int, spare_blocks: list[int] | None = None) -> torch.Tensor:
    """int32 grouped_layout for the contiguous grouped GEMM: group g's rows, then -1 up to the alignment, then
    spare_blocks[g] whole blocks of -1 (a fixed-capacity layout's unused rows)."""
    ids = []
    for g, m in enumerate(rows_per_group):
        padded = -(-m // alignment) * alignment + alignment * (spare_blocks[g] if spare_blocks else 0)
        ids += [g] * m + [-1] * (padded - m)
    return torch.tensor(ids, dtype=torch.int32)


def foldable_fp4_weights(G: int, N: int, K: int, gen: torch.Generator, device: str = "cpu"
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed FP4 weights [G, N, K/2] and UE8M0 scales whose per-32 magnitudes vary over 2^-3..2^3 (a row's scale
    bytes then span at most ~8, inside the FP8-MMA route's 11: gemm.fold_fp4_weights folds them)."""
    _, q, s = random_fp4_weights(G, N=N, K=K, device=device, generator=gen, max_exponent=3)
    return q, s


def fp8_activations(x: torch.Tensor, form: str) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., K] quantized per 32 (form "per_32": UE8M0 scales) or folded per 128 ("per_128": float32 scales
    [..., K / 128], the engine's form for the FP8-MMA route)."""
    q, s = reference.act_quant(x, 32, "ue8m0")
    return (q, s) if form == "per_32" else reference.fold_ue8m0_to_128(q, s, 1)


def route_word_cases():
    """(offset, position, word, want, zero) for the FP8-MMA route's e2m1 -> e4m3 conversions: every e2m1 code at each
    of the 8 positions of a route-order word (reference.fp4_to_fp8_mma_order; the word's only nonzero value) and every
    offset 0..11, with the e4m3 byte torch gives e2m1 x 2^(offset - 5) and whether the code is +0 or -0 (either byte
    is right then)."""
    for offset in range(12):
        for code in range(16):
            for pos in range(8):
                # a K step whose only nonzero value is value `pos` of the route's first word: k = pos or 16 + pos - 4
                k_value = pos if pos < 4 else 12 + pos
                natural = torch.zeros(1, 64, dtype=torch.uint8)
                natural[0, k_value // 2] = code << (4 * (k_value % 2))
                word = int(reference.fp4_to_fp8_mma_order(natural).view(torch.int32)[0, 0]) & 0xFFFFFFFF
                value = (-1.0 if code & 8 else 1.0) * reference.E2M1_VALUES[code & 7] * 2.0 ** (offset - 5)
                want = torch.tensor([value]).to(torch.float8_e4m3fn).view(torch.uint8).item()
                yield offset, pos, word, want, code & 7 == 0
