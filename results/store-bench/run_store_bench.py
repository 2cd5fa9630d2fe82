"""Run :func:`nest_integrations.evaluation.store_bench.run_store_bench` from the command line
(what ``nest bench store`` will call).

Run from the repository root, e.g.:
``.venv/bin/python results/store-bench/run_store_bench.py --n 12 --out results/store-bench``
"""

from __future__ import annotations

import argparse
import logging

from nest_integrations.evaluation.store_bench import INTEGRATIONS, README_CHUNK_SIZE, README_MAX_NEW_TOKENS, run_store_bench


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results/store-bench", help="folder for store_bench.json and table.md")
    parser.add_argument("--n", type=int, default=12, help="questions drawn from markdown-docs (stratified by kind)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--integrations", nargs="+", default=list(INTEGRATIONS), choices=INTEGRATIONS)
    parser.add_argument("--chunk-size", type=int, default=README_CHUNK_SIZE)
    parser.add_argument("--max-new-tokens", type=int, default=README_MAX_NEW_TOKENS)
    parser.add_argument("--rag-max-new-tokens", type=int, default=None, help="default: --max-new-tokens")
    parser.add_argument("--store-dir", default=None, help="keep the saved stores here (default: a temporary folder)")
    parser.add_argument("--reuse-stores", action="store_true", help="load stores already saved in --store-dir")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    run_store_bench(
        out_dir=args.out, n=args.n, seed=args.seed, integrations=args.integrations, chunk_size=args.chunk_size,
        max_new_tokens=args.max_new_tokens, rag_max_new_tokens=args.rag_max_new_tokens, store_dir=args.store_dir,
        reuse_stores=args.reuse_stores,
    )


if __name__ == "__main__":
    main()
