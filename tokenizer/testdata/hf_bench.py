import json, os, sys, time, hashlib
os.environ["RAYON_NUM_THREADS"] = "1"; os.environ["TOKENIZERS_PARALLELISM"] = "false"
import tokenizers
from tokenizers import Tokenizer
out = os.environ["OUT"]
docs = json.load(open(".device-tok/corpus.json"))
edge = json.load(open(".device-tok/edge.json"))
nbytes = sum(len(d.encode()) for d in docs)
res = {"tokenizers_version": tokenizers.__version__, "corpus_bytes": nbytes, "docs": len(docs), "bench": {}, "edge": {}}
for name in ["deepseek_v3", "qwen3", "llama2"]:
    path = f".device-tok/golden/tokenizers/{name}/tokenizer.json"
    tok = Tokenizer.from_file(path)
    res["edge"][name] = {"sha256": hashlib.sha256(open(path, "rb").read()).hexdigest(),
        "cases": [{"text": t, "ids": tok.encode(t, add_special_tokens=False).ids,
                   "ids_with_special": tok.encode(t, add_special_tokens=True).ids} for t in edge]}
    for c in res["edge"][name]["cases"]:
        c["decoded"] = tok.decode(c["ids"], skip_special_tokens=False)
    times = []
    ids = None
    for rep in range(3):
        t0 = time.perf_counter()
        encs = [tok.encode(d, add_special_tokens=False).ids for d in docs]
        times.append(time.perf_counter() - t0)
        ids = encs
    flat = [i for e in ids for i in e]
    import array
    array.array("i", flat).tofile(open(f"{out}/{name}.ids", "wb"))
    res["bench"][name] = {"seconds": times, "best_MBps": nbytes / min(times) / 1e6, "tokens": len(flat)}
    print(name, res["bench"][name], flush=True)
json.dump(res, open(f"{out}/hf.json", "w"), ensure_ascii=False)
