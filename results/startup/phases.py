"""In-process breakdown of what `nest generate PROMPT` does over the default index, timed the same way for the code before and after the start-up changes (PYTHONPATH picks which): `OMP_NUM_THREADS=1 PYTHONPATH=ROOT python results/startup/phases.py $(date +%s.%N)`."""
import json
import sys
import time


def main() -> None:
    t0 = float(sys.argv[1]); out = {}
    def at(): return time.time() - t0
    import nest_integrations.cli
    out["cli imported"] = at()
    s = time.perf_counter(); import torch, transformers; from transformers import AutoModelForCausalLM; out["torch+transformers import"] = time.perf_counter() - s
    import nest_integrations
    # The module that defines load_lm, whichever code version PYTHONPATH picks (nest_integrations.model.lm;
    # nest_integrations.lm before the package's layers): its names are what the index's load calls.
    L = sys.modules[nest_integrations.load_lm.__module__]
    orig_load, orig_fp = L.load_lm, L.model_fingerprint
    acc = {"lm": 0.0, "fingerprint": 0.0}
    def load_lm(*a, **k):
        s = time.perf_counter(); r = orig_load(*a, **k); acc["lm"] += time.perf_counter() - s; return r
    def model_fingerprint(*a, **k):
        s = time.perf_counter(); r = orig_fp(*a, **k); acc["fingerprint"] += time.perf_counter() - s; return r
    L.load_lm, L.model_fingerprint = load_lm, model_fingerprint
    from nest_integrations.retrieval import load_embedder
    s = time.perf_counter(); load_embedder(); out["embedder (sentence-transformers + MiniLM)"] = time.perf_counter() - s
    from nest_integrations import NestIndex
    from nest_integrations.cli.common import default_index_path
    s = time.perf_counter(); index = NestIndex.load(default_index_path()); total_index = time.perf_counter() - s
    dec = index.decoder(); total_index = time.perf_counter() - s
    out["LM load"] = acc["lm"]; out["LM fingerprint"] = acc["fingerprint"]; out["index (rest)"] = total_index - acc["lm"] - acc["fingerprint"]
    first = None; gen_start = time.perf_counter()
    for ch in dec.stream("Tell me a bio of Marie Curie.", max_new_tokens=128):
        if first is None and ch.text:
            first = at(); out["generation to first token"] = time.perf_counter() - gen_start
        o = ch.output
    out["first token (since start)"] = first
    out["rest of generation"] = time.perf_counter() - gen_start - out["generation to first token"]
    out["total (since start)"] = at()
    out["text"] = o.text[:60]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
