"""Run a fixed sequence of general-path steps (multi-sequence prefill chunks, mixed contexts, decode rows on the
general path, bounded replay) and save logits + cache state."""
import sys, torch
from mini_deepinfer.models.deepseek_v41 import load_model
from mini_deepinfer.models.deepseek_v41.cache import V41Cache
from mini_deepinfer.worker.forward_batch import ForwardBatch
out = sys.argv[1]
model = load_model("tiny-random/deepseek-v4.1-flash-1017", "cpu")
cfg = model.config
g = torch.Generator().manual_seed(3)
lens = [5, 130, 1, 64, 257, 3]
seqs = [torch.randint(3, cfg.vocab_size, (n + 40,), generator=g).tolist() for n in lens]
tables = [[1 + 4 * i + j for j in range(4)] for i in range(len(seqs))]
slots = [2, 5, 1, 6, 3, 4]
done = [0] * len(seqs)
res = {}
def step(name, chunks, keep=None):
    if keep is not None:
        model.prefill_keep_tokens = keep
    ids, q, c, tb, sl, sr = [], [], [], [], [], []
    for i, n in chunks:
        ids += seqs[i][done[i]: done[i] + n]; q.append(n); c.append(done[i]); tb.append(tables[i]); sl.append(slots[i])
        sr.append(sum(q) - 1)
    carry = model.decode_carry; model.decode_carry = None
    try:
        res[name] = model(ForwardBatch(torch.tensor(ids), q, c, tb, sl, sr), cache)
    finally:
        model.decode_carry = carry
        model.prefill_keep_tokens = None
    for i, n in chunks: done[i] += n
cache = V41Cache(cfg, 4 * len(seqs) + 1, 7, "cpu")
step("s1", [(0, 5), (1, 77), (2, 1), (3, 33), (4, 100)])
step("s2", [(1, 53), (3, 31), (4, 157), (5, 3)])
step("s3", [(0, 1), (1, 1), (2, 1), (3, 1), (5, 1)])          # decode rows, general path
step("s4", [(0, 7), (2, 6), (4, 2), (5, 4)])
cache2 = cache
step("s5", [(1, 30), (3, 9), (0, 20)], keep=cfg.sliding_window)  # bounded replay
state = {"res": res}
for name in ("window", "compressed_kv", "index_k", "comp_kv_state", "comp_score_state"):
    for lid, tns in getattr(cache, name).items(): state[f"{name}{lid}"] = tns
state["engram_history"] = cache.engram_history
state["publisher"] = torch.tensor(cache.index_k_publisher)
torch.save(state, out)
print("saved", out)
