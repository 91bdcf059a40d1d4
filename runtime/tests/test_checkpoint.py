"""The checkpoint format (V41_MODEL.md section 4): expected tensors, random generation, validating loader."""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from mini_deepgemm.reference import act_dequant, fp4_dequant, weight_dequant_fp8
from mini_deepinfer.models.deepseek_v41 import checkpoint as ckpt
from mini_deepinfer.models.deepseek_v41.checkpoint import (
    CheckpointMismatchError,
    build_random_weights,
    expected_tensors,
    generate_random_checkpoint,
    load_checkpoint,
    resolve_checkpoint,
)
from mini_deepinfer.models.deepseek_v41.config import V41Config, tiny_config

F8, E8, BF16, F32 = torch.float8_e4m3fn, torch.float8_e8m0fnu, torch.bfloat16, torch.float32
I8, U8 = torch.int8, torch.uint8


def _small_config() -> V41Config:
    """tiny_config with a small vocabulary and fewer experts: every layer kind, a checkpoint of ~2 MB."""
    return dataclasses.replace(tiny_config(), vocab_size=256, n_routed_experts=8)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """A view that torch.equal compares bit for bit (it has no FP8 kernels)."""
    return t.view(torch.uint8) if t.element_size() == 1 else t


def _assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert list(a) == list(b)
    for name in a:
        assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape, name
        assert torch.equal(_bits(a[name]), _bits(b[name])), name


def _rewrite(folder: Path, edit) -> None:
    """Reload every shard, apply edit(tensors) in place, write back as one shard with a fresh index."""
    tensors: dict[str, torch.Tensor] = {}
    for shard in sorted(folder.glob("model-*.safetensors")):
        tensors.update(load_file(shard))
        shard.unlink()
    edit(tensors)
    file = "model-00001-of-00001.safetensors"
    save_file(tensors, str(folder / file))
    index = {"metadata": {"total_size": 0}, "weight_map": {n: file for n in tensors}}
    (folder / ckpt.INDEX_FILE).write_text(json.dumps(index))


@pytest.fixture(scope="module")
def small_ckpt(tmp_path_factory) -> Path:
    return generate_random_checkpoint(_small_config(), tmp_path_factory.mktemp("small") / "ckpt", seed=3)


@pytest.fixture(scope="module")
def tiny_weights() -> dict[str, torch.Tensor]:
    return build_random_weights(tiny_config(), seed=ckpt.TINY_SEED)


@pytest.fixture
def small_copy(small_ckpt: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(small_ckpt, tmp_path / "ckpt"))


# --------------------------------------------------------------------------- expected tensors
def test_expected_tensors_match_the_real_header():
    """Shapes and dtypes of V41_MODEL.md section 4 for the real config, and its declared parameter counts."""
    e = expected_tensors(V41Config())
    spec = {
        "embed.weight": ([129280, 5120], BF16),
        "head.weight": ([129280, 5120], BF16),
        "norm.weight": ([5120], BF16),
        "layers.0.hc_attn_fn": ([24, 20480], F32),
        "layers.0.hc_ffn_base": ([24], F32),
        "layers.0.hc_ffn_scale": ([3], F32),
        "layers.0.attn.attn_sink": ([64], F32),
        "layers.0.attn.wq_a.weight": ([1280, 5120], F8),
        "layers.0.attn.wq_a.scale": ([40, 160], E8),
        "layers.0.attn.q_norm.weight": ([1280], BF16),
        "layers.0.attn.wq_b.weight": ([32768, 1280], F8),
        "layers.0.attn.wq_b.scale": ([1024, 40], E8),
        "layers.0.attn.wkv.scale": ([16, 160], E8),
        "layers.0.attn.kv_norm.weight": ([512], BF16),
        "layers.0.attn.wo_a.weight": ([8192, 4096], F8),
        "layers.0.attn.wo_a.scale": ([256, 128], E8),
        "layers.0.attn.wo_b.weight": ([5120, 8192], F8),
        "layers.0.attn.wo_b.scale": ([160, 256], E8),
        "layers.2.attn.compressor.wkv.weight": ([512, 5120], BF16),
        "layers.2.attn.compressor.wgate.weight": ([512, 5120], BF16),
        "layers.2.attn.compressor.norm.weight": ([512], BF16),
        "layers.2.attn.indexer.wq_b.weight": ([4096, 1280], F8),
        "layers.2.attn.indexer.wq_b.scale": ([128, 40], E8),
        "layers.2.attn.indexer.weights_proj.weight": ([32, 5120], BF16),
        "layers.2.attn.indexer.wk.weight": ([128, 512], BF16),
        "layers.2.attn.indexer.k_norm.weight": ([128], BF16),
        "layers.39.ffn.gate.weight": ([384, 5120], BF16),
        "layers.39.ffn.gate.bias": ([384], F32),
        "layers.39.ffn.gate.bias_vl": ([384], F32),
        "layers.39.ffn.shared_experts.w1.weight": ([2304, 5120], F8),
        "layers.39.ffn.shared_experts.w1.scale": ([72, 160], E8),
        "layers.39.ffn.shared_experts.w2.weight": ([5120, 2304], F8),
        "layers.39.ffn.shared_experts.w2.scale": ([160, 72], E8),
        "layers.39.ffn.experts.383.w1.weight": ([2304, 2560], I8),
        "layers.39.ffn.experts.383.w1.scale": ([2304, 160], E8),
        "layers.39.ffn.experts.383.w2.weight": ([5120, 1152], I8),
        "layers.39.ffn.experts.383.w2.scale": ([5120, 72], E8),
        "layers.1.engram.embed.weight": ([384006168, 256], F8),
        "layers.1.engram.embed.scale": ([384006168, 8], E8),
        "layers.14.engram.embed.weight": ([384016682, 256], F8),
        "layers.14.engram.wkv.weight": ([25600, 6144], F8),
        "layers.14.engram.wkv.scale": ([800, 192], E8),
        "layers.14.engram.q_weight": ([4, 5120], BF16),
        "layers.14.engram.k_weight": ([4, 5120], BF16),
    }
    for name, (shape, dtype) in spec.items():
        assert e[name] == (tuple(shape), dtype), name

    # compressor / indexer tensors exactly where the layer roles (V41_MODEL.md 1.3) put them
    def layers_with(suffix: str) -> list[int]:
        return sorted(int(n.split(".")[1]) for n in e if n.startswith("layers.") and n.endswith(suffix))

    assert layers_with(".attn.compressor.wkv.weight") == [2, 8, 14, 20]
    assert layers_with(".attn.compressor.wgate.weight") == [2, 8, 14]
    assert layers_with(".attn.indexer.wk.weight") == [2, 8, 14, 20]
    assert layers_with(".attn.indexer.wq_b.weight") == [2, 8, 14, 20, 24, 28, 32, 36]
    assert layers_with(".engram.wkv.weight") == [1, 14]
    assert not any(n.startswith(ckpt.IGNORED_PREFIXES) for n in e)

    # the card's parameter counts: 196 B Engram (exact: the table rows x 256) and 552 B other backbone
    def params(name: str, shape: tuple[int, ...], dtype: torch.dtype) -> int:
        if name.endswith(".scale"):
            return 0
        return torch.Size(shape).numel() * (2 if dtype == I8 else 1)

    engram = sum(params(n, *v) for n, v in e.items() if ".engram.embed." in n)
    rest = sum(params(n, *v) for n, v in e.items() if ".engram.embed." not in n)
    assert engram == (384006168 + 384016682) * 256
    assert round(rest / 1e9) == 552


def test_expected_tensors_follow_the_tiny_widths():
    cfg = tiny_config()
    e = expected_tensors(cfg)
    assert e["layers.0.attn.wq_b.weight"] == ((4 * 512, 128), F8)
    assert e["layers.0.attn.wo_a.weight"] == ((2 * 128, 4 * 512 // 2), F8)
    assert e["layers.0.attn.wo_b.scale"] == ((128 // 32, 256 // 32), E8)
    assert e["layers.6.attn.indexer.wq_b.weight"] == ((4 * 128, 128), F8)
    assert "layers.6.attn.indexer.wk.weight" not in e  # REINDEX: no index keys of its own
    assert "layers.4.attn.compressor.wgate.weight" not in e  # ratio 1: no gate
    assert e["layers.1.engram.embed.weight"] == ((6748, 64), F8)
    assert e["layers.3.engram.embed.scale"] == ((7592, 2), E8)
    assert e["layers.3.engram.wkv.weight"] == ((4 * 128 + 128, 3 * 4 * 64), F8)
    assert sum(n.endswith(".w2.weight") and ".experts." in n for n in e) == 8 * 32


# --------------------------------------------------------------------------- random weights
def test_generate_then_load_equals_build(tmp_path, tiny_weights):
    cfg = tiny_config()
    path = generate_random_checkpoint(cfg, tmp_path / "ckpt", seed=ckpt.TINY_SEED, max_shard_bytes=16 << 20)
    shards = sorted(p.name for p in path.glob("*.safetensors"))
    n = len(shards)
    assert n > 1 and shards == [f"model-{k:05d}-of-{n:05d}.safetensors" for k in range(1, n + 1)]
    loaded_cfg, loaded = load_checkpoint(path)
    assert loaded_cfg == cfg
    _assert_same_weights(loaded, tiny_weights)
    assert {n: (tuple(t.shape), t.dtype) for n, t in loaded.items()} == expected_tensors(cfg)
    index = json.loads((path / ckpt.INDEX_FILE).read_text())
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in loaded.values())
    assert json.loads((path / ckpt.CONFIG_FILE).read_text()) == json.loads(json.dumps(cfg.to_hf_dict()))


def test_values_do_not_depend_on_the_shard_split(small_ckpt, tmp_path):
    many = generate_random_checkpoint(_small_config(), tmp_path / "many", seed=3, max_shard_bytes=64 << 10)
    assert len(list(many.glob("*.safetensors"))) > 10 and len(list(small_ckpt.glob("*.safetensors"))) == 1
    _assert_same_weights(load_checkpoint(many)[1], load_checkpoint(small_ckpt)[1])


def test_random_weights_are_deterministic_per_tensor_name():
    cfg = _small_config()
    a = build_random_weights(cfg, seed=0)
    _assert_same_weights(a, build_random_weights(cfg, seed=0))
    b = build_random_weights(cfg, seed=1)
    for name in (p.name for p in ckpt._params(cfg) if p.std is not None):  # scales may coincide across seeds
        assert not torch.equal(_bits(a[name]), _bits(b[name])), name
    # more experts: the shared tensors keep their values (one generator per name, not one stream)
    more = build_random_weights(dataclasses.replace(cfg, n_routed_experts=16), seed=0)
    for name in ("layers.7.ffn.experts.5.w1.weight", "layers.7.ffn.shared_experts.w2.scale", "head.weight"):
        assert torch.equal(_bits(a[name]), _bits(more[name])), name


def test_initial_scales(tiny_weights):
    """Weights ~ N(0, 1/fan_in) after dequantization, norms 1, the hc / gate / engram rules of the brief."""
    w = tiny_weights
    assert all(torch.isfinite(t.float()).all() for t in w.values())

    def std(x: torch.Tensor) -> float:
        return x.float().std().item()

    def fp8_std(name: str) -> float:
        return std(weight_dequant_fp8(w[f"{name}.weight"], w[f"{name}.scale"]))

    assert fp8_std("layers.2.attn.wq_b") * 128**0.5 == pytest.approx(1, rel=0.05)
    assert fp8_std("layers.0.attn.wo_a") * 1024**0.5 == pytest.approx(1, rel=0.05)
    fp4 = fp4_dequant(w["layers.5.ffn.experts.3.w2.weight"], w["layers.5.ffn.experts.3.w2.scale"])
    assert fp4.shape == (128, 256) and std(fp4) * 256**0.5 == pytest.approx(1, rel=0.05)
    table = act_dequant(w["layers.1.engram.embed.weight"], w["layers.1.engram.embed.scale"])
    assert std(table) == pytest.approx(1, rel=0.05)
    assert std(w["embed.weight"]) == pytest.approx(1, rel=0.02)
    assert std(w["head.weight"]) * 128**0.5 == pytest.approx(1, rel=0.02)
    assert std(w["layers.3.ffn.gate.weight"]) * 128**0.5 == pytest.approx(1, rel=0.05)
    assert std(w["layers.0.hc_attn_fn"]) == pytest.approx(0.5 / (4 * 128) ** 0.5, rel=0.05)
    assert std(w["layers.0.ffn.gate.bias"]) == pytest.approx(0.01, rel=0.5)
    for name in ("norm.weight", "layers.4.attn.kv_norm.weight", "layers.3.engram.q_weight", "layers.0.hc_ffn_scale"):
        assert torch.all(w[name] == 1), name
    assert torch.all(w["layers.0.hc_attn_base"] == 0)


# --------------------------------------------------------------------------- loader errors
def test_missing_extra_wrong_shape_and_dtype_are_all_listed(small_copy):
    def corrupt(t: dict[str, torch.Tensor]) -> None:
        del t["layers.0.attn_norm.weight"]
        del t["layers.6.attn.indexer.wq_b.scale"]
        t["layers.0.attn.bogus.weight"] = torch.ones(3)
        t["layers.2.attn.wkv.weight"] = t["layers.2.attn.wkv.weight"][:-32]
        t["layers.0.ffn.gate.bias"] = t["layers.0.ffn.gate.bias"].to(BF16)

    _rewrite(small_copy, corrupt)
    with pytest.raises(CheckpointMismatchError) as err:
        load_checkpoint(small_copy)
    msg = str(err.value)
    assert "missing tensors (2):" in msg
    assert "layers.0.attn_norm.weight" in msg and "layers.6.attn.indexer.wq_b.scale" in msg
    assert "unexpected tensors (1):\n  layers.0.attn.bogus.weight" in msg
    assert "wrong shapes (1):\n  layers.2.attn.wkv.weight: expected [512, 128], found [480, 128]" in msg
    assert "wrong dtypes (1):\n  layers.0.ffn.gate.bias: expected F32, found BF16" in msg


@pytest.mark.parametrize(
    "edit, expected",
    [
        (lambda t: t.pop("head.weight"), "missing tensors (1):\n  head.weight"),
        (lambda t: t.update({"layers.99.attn_norm.weight": torch.ones(128, dtype=BF16)}),
         "unexpected tensors (1):\n  layers.99.attn_norm.weight"),
        (lambda t: t.update({"norm.weight": torch.ones(64, dtype=BF16)}),
         "wrong shapes (1):\n  norm.weight: expected [128], found [64]"),
        (lambda t: t.update({"layers.7.ffn.experts.0.w1.weight": t["layers.7.ffn.experts.0.w1.weight"].view(U8)}),
         "wrong dtypes (1):\n  layers.7.ffn.experts.0.w1.weight: expected I8, found U8"),
    ],
    ids=["missing", "extra", "shape", "dtype"],
)
def test_one_problem_gives_a_clear_error(small_copy, edit, expected):
    _rewrite(small_copy, edit)
    with pytest.raises(CheckpointMismatchError, match="does not match its config.json") as err:
        load_checkpoint(small_copy)
    assert expected in str(err.value)


def test_config_that_does_not_match_the_weights(small_copy):
    """config.json with 4 experts for weights made with 8: the extra experts and the gate shapes are reported."""
    cfg = dataclasses.replace(_small_config(), n_routed_experts=4)
    (small_copy / ckpt.CONFIG_FILE).write_text(json.dumps(cfg.to_hf_dict()))
    with pytest.raises(CheckpointMismatchError) as err:
        load_checkpoint(small_copy)
    msg = str(err.value)
    assert f"unexpected tensors ({8 * 4 * 6}):" in msg  # 8 layers x experts 4..7 x (w1, w2, w3) x (weight, scale)
    assert "layers.0.ffn.gate.weight: expected [4, 128], found [8, 128]" in msg
    assert "missing tensors" not in msg


def test_tensor_listed_in_index_but_absent_from_its_shard(small_copy):
    _rewrite(small_copy, lambda t: t.pop("layers.5.attn.wo_b.scale"))
    index = json.loads((small_copy / ckpt.INDEX_FILE).read_text())
    index["weight_map"]["layers.5.attn.wo_b.scale"] = "model-00001-of-00001.safetensors"
    (small_copy / ckpt.INDEX_FILE).write_text(json.dumps(index))
    with pytest.raises(CheckpointMismatchError, match="absent from their shard"):
        load_checkpoint(small_copy)


@pytest.mark.parametrize("file", [ckpt.INDEX_FILE, ckpt.CONFIG_FILE, "model-00001-of-00001.safetensors"])
def test_missing_file_is_named(small_copy, file):
    (small_copy / file).unlink()
    with pytest.raises(FileNotFoundError, match=file.replace(".", r"\.")):
        load_checkpoint(small_copy)


def test_unknown_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="no-such-ckpt"):
        load_checkpoint(tmp_path / "no-such-ckpt")


def test_mtp_and_vision_tensors_are_skipped_with_a_notice(small_copy, caplog):
    def add_optional(t: dict[str, torch.Tensor]) -> None:
        t["mtp.0.main_proj.weight"] = torch.zeros(4, 4)
        t["mtp.2.norm.weight"] = torch.ones(4, dtype=BF16)
        t["vision.blocks.0.weight"] = torch.zeros(2)
        t["aligner.proj.weight"] = torch.zeros(2)
        t["image_newline"] = torch.zeros(128, dtype=BF16)

    _rewrite(small_copy, add_optional)
    with caplog.at_level(logging.WARNING, logger=ckpt.__name__):
        cfg, weights = load_checkpoint(small_copy)
    assert list(weights) == list(expected_tensors(cfg))
    notices = [r.getMessage() for r in caplog.records]
    assert len(notices) == 1 and "skipping 5 MTP/vision tensors" in notices[0]


def test_generate_refuses_a_non_empty_folder(small_ckpt):
    with pytest.raises(FileExistsError):
        generate_random_checkpoint(_small_config(), small_ckpt)


# --------------------------------------------------------------------------- named checkpoints
def test_resolve_existing_folder_and_unknown_name(small_ckpt, tmp_path, monkeypatch):
    monkeypatch.setenv("MINI_DEEPINFER_CACHE", str(tmp_path / "cache"))
    assert resolve_checkpoint(small_ckpt) == small_ckpt
    assert resolve_checkpoint(str(small_ckpt)) == small_ckpt
    with pytest.raises(FileNotFoundError, match="deepseek-ai/DeepSeek-V4.1-Flash"):
        resolve_checkpoint("deepseek-ai/DeepSeek-V4.1-Flash")
    assert not (tmp_path / "cache").exists()


def test_resolve_tiny_generates_once_into_the_cache(tmp_path, monkeypatch, tiny_weights):
    cache = tmp_path / "cache"
    monkeypatch.setenv("MINI_DEEPINFER_CACHE", str(cache))
    path = resolve_checkpoint("tiny-random/deepseek-v4.1-flash-1017")
    assert path == cache / "tiny-random-deepseek-v4.1-flash-1017"
    assert sorted(p.name for p in cache.iterdir()) == [path.name]  # no temporary folder left behind
    cfg, weights = load_checkpoint(path)
    assert cfg == tiny_config()
    _assert_same_weights(weights, tiny_weights)
    stamp = (path / ckpt.INDEX_FILE).stat().st_mtime_ns
    assert resolve_checkpoint("tiny") == path
    assert (path / ckpt.INDEX_FILE).stat().st_mtime_ns == stamp  # reused, not regenerated


def test_resolve_tiny_replaces_an_outdated_checkpoint(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("MINI_DEEPINFER_CACHE", str(cache))
    monkeypatch.setattr(ckpt, "tiny_config", _small_config)  # same logic, a smaller checkpoint
    path = resolve_checkpoint("tiny")
    (path / ckpt.RANDOM_INIT_FILE).write_text(json.dumps({"seed": ckpt.TINY_SEED, "init_version": 0}))
    (path / "leftover.txt").write_text("from the old checkpoint")
    assert resolve_checkpoint("tiny") == path
    assert json.loads((path / ckpt.RANDOM_INIT_FILE).read_text())["init_version"] == ckpt.RANDOM_INIT_VERSION
    assert not (path / "leftover.txt").exists()
    assert sorted(p.name for p in cache.iterdir()) == [path.name]


def test_a_checkpoint_finished_by_another_process_meanwhile_is_kept(tmp_path, monkeypatch):
    """Two processes generate the tiny checkpoint at once (test workers on a fresh machine): the one that finishes
    second must keep the first one's folder, not move it aside, since a process that resolved it may already be
    reading its files (session 73: two workers' loads failed with FileNotFoundError)."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("MINI_DEEPINFER_CACHE", str(cache))
    monkeypatch.setattr(ckpt, "tiny_config", _small_config)
    target = cache / ckpt.TINY_CACHE_DIR
    real_generate = ckpt.generate_random_checkpoint

    others = []

    def another_process_finishes_first(config, folder, seed):
        real_generate(config, folder, seed)
        if not others:  # the other process's generation lands while this one's is still in its tmp folder
            others.append(folder)
            ckpt._generate_atomically(config, target, seed)
            (target / "being-read.txt").write_text("a reader holds this folder")

    monkeypatch.setattr(ckpt, "generate_random_checkpoint", another_process_finishes_first)
    assert resolve_checkpoint("tiny") == target
    assert (target / "being-read.txt").exists(), "the first process's folder was replaced"
    assert sorted(p.name for p in cache.iterdir()) == [target.name]


def test_resolve_tiny_never_leaves_a_half_checkpoint(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("MINI_DEEPINFER_CACHE", str(cache))
    real_save = ckpt.save_file
    calls = []

    def crash_on_second_shard(tensors, filename, metadata=None):
        calls.append(filename)
        if len(calls) == 2:
            raise OSError("disk full (simulated)")
        real_save(tensors, filename, metadata=metadata)

    monkeypatch.setattr(ckpt, "save_file", crash_on_second_shard)
    monkeypatch.setattr(ckpt, "tiny_config", _small_config)
    monkeypatch.setattr(ckpt, "_shard_plan", lambda cfg, _: [[p] for p in ckpt._params(cfg)])  # many shards
    with pytest.raises(OSError, match="simulated"):
        resolve_checkpoint("tiny")
    assert list(cache.iterdir()) == []
