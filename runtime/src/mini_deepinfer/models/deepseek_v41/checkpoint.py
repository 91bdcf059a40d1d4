"""The DeepSeek-V4.1 checkpoint format: expected tensors, a random generator, a validating loader.

Format (V41_MODEL.md section 4): a folder with `config.json` (HF style, nested `text_config`),
`model.safetensors.index.json` (`{"metadata": {"total_size"}, "weight_map": {name: shard}}`) and shards
`model-0000N-of-0000M.safetensors`. Tensor names are the native reference names (`embed.weight`,
`layers.L.attn.wq_a.weight`, ...). Storage formats:

- FP8 linear: `<name>.weight` float8_e4m3fn [out, in] + `<name>.scale` float8_e8m0fnu [out/32, in/32]
  (one power-of-two scale per 32 x 32 block). `attn.wo_a` is stored this way too, as in the real header;
  the model dequantizes it to bf16 at load (spec U3).
- FP4 routed expert: `<name>.weight` int8 [out, in/2] (two e2m1 codes per byte, low nibble = even column) +
  `<name>.scale` float8_e8m0fnu [out, in/32].
- Engram table: `engram.embed.weight` float8_e4m3fn [rows, head_dim] + `.scale` float8_e8m0fnu [rows, head_dim/32].
- Everything else BF16 (norms, embed, head, gate, compressor, indexer wk / weights_proj) or F32 (hc_*, attn_sink,
  gate biases).

Only safetensors is read (never pickle). MTP (`mtp.*`) and vision (`vision.*`, `aligner.*`, `image_*`) tensors
are not used by the backbone: they may be absent, and are skipped with a one-line notice when present.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from mini_deepgemm.reference import act_quant, fp4_quant, weight_quant_fp8
from mini_deepinfer.models.deepseek_v41.config import V41Config, tiny_config

logger = logging.getLogger(__name__)

INDEX_FILE = "model.safetensors.index.json"
CONFIG_FILE = "config.json"
# Optional: the tokenizer (Engram's compressed token map, text prompts in entrypoints/llm.py).
TOKENIZER_FILE = "tokenizer.json"
# Written next to a generated checkpoint; resolve_checkpoint regenerates a cached one whose record differs.
RANDOM_INIT_FILE = "random_init.json"
# Bump when the random initialisation changes, so cached tiny checkpoints are regenerated.
RANDOM_INIT_VERSION = 1

TINY_NAMES = ("tiny-random/deepseek-v4.1-flash-1017", "tiny")
TINY_CACHE_DIR = "tiny-random-deepseek-v4.1-flash-1017"
TINY_SEED = 1017

IGNORED_PREFIXES = ("mtp.", "vision.", "aligner.", "image_")

# safetensors header dtype names of the dtypes the format uses
_SAFETENSORS_DTYPE = {
    torch.bfloat16: "BF16",
    torch.float32: "F32",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e8m0fnu: "F8_E8M0",
    torch.int8: "I8",
}

# Random tensors are drawn and quantized in row chunks of about this many fp32 elements, so a huge tensor never
# has a full fp32 copy. The chunking depends only on the shape, which keeps the values deterministic.
_CHUNK_ELEMENTS = 1 << 24


class CheckpointMismatchError(ValueError):
    """A checkpoint folder does not hold the tensors its config requires (every problem listed)."""


@dataclass(frozen=True)
class _Param:
    """One parameter of the model and how the random generator fills it.

    fmt: "bf16" / "f32" (stored as is), "fp8" (e4m3 + 32x32 UE8M0 `.scale`), "fp4" (packed e2m1 + UE8M0 per 32
    along the input dim), "fp8_rows" (e4m3 + UE8M0 per 32 along each row: the Engram tables).
    Values are N(0, std^2) when std is set, else the constant `fill`.
    """

    name: str  # the stored name of the value tensor; a quantized one ends in ".weight"
    shape: tuple[int, ...]
    fmt: str
    std: float | None = None
    fill: float = 0.0

    @property
    def scale_name(self) -> str:
        return self.name.removesuffix(".weight") + ".scale"


def _linear(name: str, out_features: int, in_features: int, fmt: str) -> _Param:
    """A linear layer's weight, N(0, 1/in_features) so that it preserves the activation scale."""
    return _Param(f"{name}.weight", (out_features, in_features), fmt, std=in_features**-0.5)


def _ones(name: str, size: int) -> _Param:
    return _Param(name, (size,), "bf16", fill=1.0)


def _params(cfg: V41Config) -> list[_Param]:
    """Every backbone parameter of `cfg`, in checkpoint order."""
    dim, bs = cfg.hidden_size, cfg.weight_block_size
    heads_dim = cfg.num_attention_heads * cfg.head_dim
    hc_dim = cfg.hc_mult * dim
    out: list[_Param] = [
        _Param("embed.weight", (cfg.vocab_size, dim), "bf16", std=1.0),
        _Param("head.weight", (cfg.vocab_size, dim), "bf16", std=dim**-0.5),
        _ones("norm.weight", dim),
    ]
    for lid in range(cfg.num_hidden_layers):
        role = cfg.layer_role(lid)
        p = f"layers.{lid}."
        out += [_ones(p + "attn_norm.weight", dim), _ones(p + "ffn_norm.weight", dim)]
        for sub in ("attn", "ffn"):
            out += [
                _Param(f"{p}hc_{sub}_fn", (cfg.hc_mix_dim, hc_dim), "f32", std=0.5 / hc_dim**0.5),
                _Param(f"{p}hc_{sub}_base", (cfg.hc_mix_dim,), "f32", fill=0.0),
                _Param(f"{p}hc_{sub}_scale", (3,), "f32", fill=1.0),
            ]
        a = p + "attn."
        out += [
            _Param(a + "attn_sink", (cfg.num_attention_heads,), "f32", std=0.5),
            _linear(a + "wq_a", cfg.q_lora_rank, dim, "fp8"),
            _ones(a + "q_norm.weight", cfg.q_lora_rank),
            _linear(a + "wq_b", heads_dim, cfg.q_lora_rank, "fp8"),
            _linear(a + "wkv", cfg.head_dim, dim, "fp8"),
            _ones(a + "kv_norm.weight", cfg.head_dim),
            _linear(a + "wo_a", cfg.o_groups * cfg.o_lora_rank, heads_dim // cfg.o_groups, "fp8"),
            _linear(a + "wo_b", dim, cfg.o_groups * cfg.o_lora_rank, "fp8"),
        ]
        is_kv_source = lid in cfg.kv_source_layer_ids
        if is_kv_source:
            c = a + "compressor."
            out.append(_linear(c + "wkv", cfg.head_dim, dim, "bf16"))
            if role.ratio == 2:
                out.append(_linear(c + "wgate", cfg.head_dim, dim, "bf16"))
            out.append(_ones(c + "norm.weight", cfg.head_dim))
        if lid in cfg.index_source_layer_ids:
            i = a + "indexer."
            out += [
                _linear(i + "wq_b", cfg.index_n_heads * cfg.index_head_dim, cfg.q_lora_rank, "fp8"),
                _linear(i + "weights_proj", cfg.index_n_heads, dim, "bf16"),
            ]
            if is_kv_source:
                out += [
                    _linear(i + "wk", cfg.index_head_dim, cfg.head_dim, "bf16"),
                    _ones(i + "k_norm.weight", cfg.index_head_dim),
                ]
        f = p + "ffn."
        n_exp, inter = cfg.n_routed_experts, cfg.moe_intermediate_size
        shared_inter = inter * cfg.n_shared_experts
        out += [
            _Param(f + "gate.weight", (n_exp, dim), "bf16", std=dim**-0.5),
            _Param(f + "gate.bias", (n_exp,), "f32", std=0.01),
            _Param(f + "gate.bias_vl", (n_exp,), "f32", std=0.01),
            _linear(f + "shared_experts.w1", shared_inter, dim, "fp8"),
            _linear(f + "shared_experts.w2", dim, shared_inter, "fp8"),
            _linear(f + "shared_experts.w3", shared_inter, dim, "fp8"),
        ]
        for e in range(n_exp):
            x = f"{f}experts.{e}."
            out += [_linear(x + "w1", inter, dim, "fp4"), _linear(x + "w2", dim, inter, "fp4"),
                    _linear(x + "w3", inter, dim, "fp4")]
        if role.has_engram:
            g = p + "engram."
            rows = cfg.engram_num_embeddings[cfg.engram_layer_ids.index(lid)]
            out += [
                _Param(g + "embed.weight", (rows, cfg.engram_head_dim), "fp8_rows", std=1.0),
                _linear(g + "wkv", hc_dim + dim, cfg.engram_dim, "fp8"),
                _Param(g + "q_weight", (cfg.hc_mult, dim), "bf16", fill=1.0),
                _Param(g + "k_weight", (cfg.hc_mult, dim), "bf16", fill=1.0),
            ]
    for prm in out:
        if prm.fmt in ("fp8", "fp4", "fp8_rows") and any(d % bs for d in _blocked_dims(prm)):
            raise ValueError(f"{prm.name}: shape {prm.shape} is not a multiple of the weight block {bs}")
    return out


def _blocked_dims(prm: _Param) -> tuple[int, ...]:
    """The dims a quantized parameter splits into blocks of 32 (both for FP8 blocks, the last one otherwise)."""
    return prm.shape if prm.fmt == "fp8" else prm.shape[-1:]


def _stored(prm: _Param, block: int) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    """(name, shape, dtype) of the one or two tensors a parameter is stored as."""
    rows, cols = prm.shape[0], prm.shape[-1]
    if prm.fmt == "bf16":
        return [(prm.name, prm.shape, torch.bfloat16)]
    if prm.fmt == "f32":
        return [(prm.name, prm.shape, torch.float32)]
    if prm.fmt == "fp8":
        return [(prm.name, prm.shape, torch.float8_e4m3fn),
                (prm.scale_name, (rows // block, cols // block), torch.float8_e8m0fnu)]
    if prm.fmt == "fp4":
        return [(prm.name, (rows, cols // 2), torch.int8),
                (prm.scale_name, (rows, cols // block), torch.float8_e8m0fnu)]
    if prm.fmt == "fp8_rows":
        return [(prm.name, prm.shape, torch.float8_e4m3fn),
                (prm.scale_name, (rows, cols // block), torch.float8_e8m0fnu)]
    raise ValueError(f"unknown storage format {prm.fmt!r}")


def expected_tensors(config: V41Config) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Every backbone tensor a checkpoint of `config` holds: name -> (shape, dtype), in checkpoint order.

    MTP and vision tensors are not included (the backbone does not use them).
    """
    bs = config.weight_block_size
    return {name: (shape, dtype) for prm in _params(config) for name, shape, dtype in _stored(prm, bs)}


# --------------------------------------------------------------------------- random weights
def _name_seed(seed: int, name: str) -> int:
    """A 63-bit seed per (seed, tensor name): a tensor's values do not depend on which other tensors exist."""
    digest = hashlib.sha256(f"{seed}/{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def _random_param(prm: _Param, seed: int, device: torch.device, block: int) -> dict[str, torch.Tensor]:
    """The stored tensor(s) of one parameter, drawn and quantized chunk by chunk along the rows."""
    stored = _stored(prm, block)
    outs = [torch.empty(shape, dtype=dtype, device=device) for _, shape, dtype in stored]
    if prm.std is None:
        outs[0].fill_(prm.fill)  # only bf16 / f32 parameters are constant
        return {stored[0][0]: outs[0]}
    gen = torch.Generator(device=device)
    gen.manual_seed(_name_seed(seed, prm.name))
    rows = prm.shape[0]
    row_elements = prm.shape[-1] if len(prm.shape) > 1 else 1
    chunk = max(block, _CHUNK_ELEMENTS // row_elements // block * block)
    for r0 in range(0, rows, chunk):
        r1 = min(rows, r0 + chunk)
        w = torch.randn((r1 - r0, *prm.shape[1:]), generator=gen, device=device, dtype=torch.float32) * prm.std
        if prm.fmt in ("bf16", "f32"):
            outs[0][r0:r1] = w
            continue
        if prm.fmt == "fp8":
            q, s = weight_quant_fp8(w, block, "ue8m0")
            outs[1][r0 // block: -(-r1 // block)] = s
        elif prm.fmt == "fp4":
            q, s = fp4_quant(w, block, "ue8m0")
            q = q.view(torch.int8)
            outs[1][r0:r1] = s
        else:  # fp8_rows
            q, s = act_quant(w, block, "ue8m0")
            outs[1][r0:r1] = s
        outs[0][r0:r1] = q
    return {name: t for (name, _, _), t in zip(stored, outs)}


def build_random_weights(config: V41Config, seed: int = 0,
                         device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """Random weights of `config` in checkpoint format, built in memory on `device` (no files).

    Deterministic from `seed`: each tensor has its own torch.Generator on `device`, seeded from (seed, name).
    On CPU the result equals `load_checkpoint(generate_random_checkpoint(config, path, seed))`; on another
    device type the generator is that device's, so the values differ from the CPU ones (same distributions).
    Initial scales (weights ~ N(0, 1/fan_in) before quantization, norms 1, small hc mixing) are chosen so that
    activations stay finite and logits are not degenerate through all layers.
    """
    device = torch.device(device)
    out: dict[str, torch.Tensor] = {}
    for prm in _params(config):
        out.update(_random_param(prm, seed, device, config.weight_block_size))
    return out


def _shard_plan(config: V41Config, max_shard_bytes: int) -> list[list[_Param]]:
    """Parameters grouped into shards of at most max_shard_bytes (a larger single parameter gets its own)."""
    shards: list[list[_Param]] = [[]]
    size = 0
    for prm in _params(config):
        n = sum(_nbytes(shape, dtype) for _, shape, dtype in _stored(prm, config.weight_block_size))
        if shards[-1] and size + n > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(prm)
        size += n
    return shards


def _nbytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    n = dtype.itemsize
    for d in shape:
        n *= d
    return n


def generate_random_checkpoint(config: V41Config, path: str | Path, seed: int = 0,
                               max_shard_bytes: int = 1 << 30) -> Path:
    """Write a random checkpoint of `config` into the folder `path` (created; must be empty or absent).

    Writes `config.json` (config.to_hf_dict()), the shards, `model.safetensors.index.json` and
    `random_init.json` (seed and generator version). The weights equal `build_random_weights(config, seed)`
    whatever `max_shard_bytes` is; shards are generated one at a time, so memory stays near one shard.
    """
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    if any(root.iterdir()):
        raise FileExistsError(f"refusing to write a checkpoint into the non-empty folder {root}")
    plan = _shard_plan(config, max_shard_bytes)
    weight_map: dict[str, str] = {}
    total = 0
    cpu = torch.device("cpu")
    for k, shard in enumerate(plan, start=1):
        file = f"model-{k:05d}-of-{len(plan):05d}.safetensors"
        tensors: dict[str, torch.Tensor] = {}
        for prm in shard:
            tensors.update(_random_param(prm, seed, cpu, config.weight_block_size))
        save_file(tensors, str(root / file), metadata={"format": "pt"})
        for name, t in tensors.items():
            weight_map[name] = file
            total += t.numel() * t.element_size()
    _write_json(root / INDEX_FILE, {"metadata": {"total_size": total}, "weight_map": weight_map})
    _write_json(root / CONFIG_FILE, config.to_hf_dict())
    _write_json(root / RANDOM_INIT_FILE, {"seed": seed, "init_version": RANDOM_INIT_VERSION})
    return root


def _write_json(path: Path, obj: dict) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")


# --------------------------------------------------------------------------- loading
def _require_file(path: Path) -> Path:
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint file not found: {path}")
    return path


def _read_headers(root: Path, weight_map: dict[str, str]) -> dict[str, tuple[tuple[int, ...], str, str]]:
    """name -> (shape, safetensors dtype name, shard file) for every tensor present in the listed shards."""
    found: dict[str, tuple[tuple[int, ...], str, str]] = {}
    for file in sorted(set(weight_map.values())):
        with safe_open(str(_require_file(root / file)), framework="pt") as f:
            for name in f.keys():
                sl = f.get_slice(name)
                found[name] = (tuple(sl.get_shape()), sl.get_dtype(), file)
    return found


def _problems(expected: dict[str, tuple[tuple[int, ...], torch.dtype]], weight_map: dict[str, str],
              found: dict[str, tuple[tuple[int, ...], str, str]]) -> list[str]:
    """Every mismatch between the expected tensors and the checkpoint, one line each."""
    missing = [n for n in expected if n not in weight_map]
    not_in_shard = [n for n in expected if n in weight_map and (n not in found or found[n][2] != weight_map[n])]
    unexpected = [n for n in weight_map if n not in expected and not n.startswith(IGNORED_PREFIXES)]
    lines: list[str] = []
    if missing:
        lines.append(f"missing tensors ({len(missing)}):")
        lines += [f"  {n}" for n in missing]
    if not_in_shard:
        lines.append(f"tensors listed in {INDEX_FILE} but absent from their shard ({len(not_in_shard)}):")
        lines += [f"  {n} (shard {weight_map[n]})" for n in not_in_shard]
    if unexpected:
        lines.append(f"unexpected tensors ({len(unexpected)}):")
        lines += [f"  {n}" for n in unexpected]
    shapes, dtypes = [], []
    for name, (shape, dtype) in expected.items():
        if name not in found or name in not_in_shard:
            continue
        got_shape, got_dtype, _ = found[name]
        if got_shape != tuple(shape):
            shapes.append(f"  {name}: expected {list(shape)}, found {list(got_shape)}")
        if got_dtype != _SAFETENSORS_DTYPE[dtype]:
            dtypes.append(f"  {name}: expected {_SAFETENSORS_DTYPE[dtype]}, found {got_dtype}")
    if shapes:
        lines.append(f"wrong shapes ({len(shapes)}):")
        lines += shapes
    if dtypes:
        lines.append(f"wrong dtypes ({len(dtypes)}):")
        lines += dtypes
    return lines


def load_checkpoint(path: str | Path, device: torch.device | str = "cpu") -> tuple[V41Config, dict[str, torch.Tensor]]:
    """Load a V4.1 checkpoint folder (safetensors only) onto `device`.

    Reads config.json, model.safetensors.index.json and the shards it names; checks every backbone tensor
    against `expected_tensors(config)` first and raises one CheckpointMismatchError listing all missing,
    unexpected, wrong-shape and wrong-dtype tensors. MTP / vision tensors are skipped (one logged notice).
    Returns (config, {name: tensor}) with the stored dtypes (FP8 / FP4 / scales unchanged).
    Raises FileNotFoundError naming the folder or file when something is absent.
    """
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"checkpoint folder not found: {root}")
    config = V41Config.from_json(_require_file(root / CONFIG_FILE))
    with open(_require_file(root / INDEX_FILE)) as f:
        weight_map: dict[str, str] = json.load(f)["weight_map"]
    expected = expected_tensors(config)
    found = _read_headers(root, weight_map)
    problems = _problems(expected, weight_map, found)
    if problems:
        raise CheckpointMismatchError(f"checkpoint {root} does not match its config.json:\n" + "\n".join(problems))
    ignored = [n for n in weight_map if n.startswith(IGNORED_PREFIXES)]
    if ignored:
        logger.warning("load_checkpoint: skipping %d MTP/vision tensors (mtp.*, vision.*, aligner.*, image_*): "
                       "the backbone reference does not use them", len(ignored))
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:  # safetensors reads a bare "cuda" as cuda:0
        device = torch.device("cuda", torch.cuda.current_device())
    tensors: dict[str, torch.Tensor] = {}
    by_file: dict[str, list[str]] = {}
    for name in expected:
        by_file.setdefault(weight_map[name], []).append(name)
    for file, names in by_file.items():
        with safe_open(str(root / file), framework="pt", device=str(device)) as f:
            for name in names:
                tensors[name] = f.get_tensor(name)
    return config, {name: tensors[name] for name in expected}


# --------------------------------------------------------------------------- named checkpoints
def cache_root() -> Path:
    """Where generated checkpoints live: $MINI_DEEPINFER_CACHE, else ~/.cache/mini-deepinfer."""
    env = os.environ.get("MINI_DEEPINFER_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "mini-deepinfer"


def _is_current(folder: Path, seed: int) -> bool:
    try:
        with open(folder / RANDOM_INIT_FILE) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return False
    return record == {"seed": seed, "init_version": RANDOM_INIT_VERSION}


def _generate_atomically(config: V41Config, target: Path, seed: int) -> None:
    """Generate into a temporary sibling folder and rename it into place, so `target` is never half written.

    A concurrent generator may win the rename; then its (identical) checkpoint is kept. An outdated target is
    moved aside first and deleted afterwards; a target that became current while this one generated (another
    process's) is kept as it is, since processes that resolved it may be reading it (session 73: 16 test workers on a
    fresh GPU machine, two of them lost the files to a late generator that moved the winner's folder aside).
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        generate_random_checkpoint(config, tmp, seed)
        if _is_current(target, seed):
            return
        stale = None
        if target.exists():
            stale = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
            os.rename(target, stale / target.name)
        try:
            os.rename(tmp, target)
        except OSError:
            if not _is_current(target, seed):
                raise
        if stale is not None:
            shutil.rmtree(stale, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def resolve_checkpoint(name_or_path: str | Path) -> Path:
    """A checkpoint folder for a path or a known name.

    - an existing folder: returned as is (not validated here; load_checkpoint does that);
    - "tiny-random/deepseek-v4.1-flash-1017" or "tiny": the tiny random checkpoint (tiny_config(), seed 1017)
      in cache_root()/tiny-random-deepseek-v4.1-flash-1017, generated on first use (nothing is downloaded) and
      regenerated when it was made by a different generator version;
    - anything else: FileNotFoundError.
    """
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    if str(name_or_path) in TINY_NAMES:
        target = cache_root() / TINY_CACHE_DIR
        if not _is_current(target, TINY_SEED):
            logger.warning("generating the tiny random checkpoint in %s", target)
            _generate_atomically(tiny_config(), target, TINY_SEED)
        return target
    raise FileNotFoundError(
        f"no checkpoint folder {str(name_or_path)!r}, and it is not a known name (known: {', '.join(TINY_NAMES)}); "
        "nothing is downloaded: pass a local folder"
    )

