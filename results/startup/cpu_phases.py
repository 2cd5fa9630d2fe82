"""CPU time (and wall time) per phase of what `nest generate PROMPT` does over the default index, up to its first token, for comparing code versions on a loaded machine (PYTHONPATH picks which): `OMP_NUM_THREADS=1 PYTHONPATH=ROOT python results/startup/cpu_phases.py`; prints {phase: [cpu s, wall s]}."""
import json
import time

P = time.process_time
W = time.perf_counter


def main() -> None:
    out = {}
    c, w = P(), W()

    def mark(name):
        nonlocal c, w
        out[name] = (round(P() - c, 2), round(W() - w, 2))
        c, w = P(), W()

    import nest_integrations.cli; mark("cli")
    import torch, transformers.modeling_utils; mark("torch+modeling_utils")
    from nest_integrations.retrieval import load_embedder
    load_embedder(); mark("embedder")
    from nest_integrations import load_lm
    lm = load_lm("default"); mark("lm")
    from nest_integrations import NestIndex
    from nest_integrations.cli.common import default_index_path
    idx = NestIndex.load(default_index_path(), lm); mark("index")
    dec = idx.decoder()
    for ch in dec.stream("Tell me a bio of Marie Curie.", max_new_tokens=128):
        if ch.text: break
    mark("to first token")
    out["total cpu"] = round(P(), 2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
