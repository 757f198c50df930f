"""One line a result of cmd/bench's JSON output (-o json), for the device runs.

    python3 dev/benchjson.py [--bench] FILE

--bench: dev/v4/run.sh's lines (BENCH, the layer count, the best rate, the
load time); without it dev/realshape/run.sh's. A file rather than a
here-document in dev/lib.sh: the runs' stages are bash -c children, and bash
cannot export a function that holds a here-document.
"""
import json
import sys

args = sys.argv[1:]
bench = args[:1] == ["--bench"]
if bench:
    args = args[1:]
for r in json.load(open(args[0])):
    if bench:
        line = (f"BENCH {r.get('model')} {r.get('layers')}L {r.get('test')}: {r.get('tok_s', 0):.2f} tok/s "
                f"(best {r.get('tok_s_best', 0):.2f}), load {r.get('load_s', 0):.1f}s")
    else:
        line = f"{r.get('model')} {r.get('test')}: {r.get('tok_s', 0):.1f} tok/s"
    if r.get("floor_tok_s"):
        line += (f", floor {r['floor_tok_s']:.1f} tok/s (bytes/token {r['bytes_per_token'] / 1e6:.1f} MB, copy "
                 f"{r['copy_bytes_per_s'] / 1e9:.0f} GB/s), of floor {r['of_floor']:.3f}; {r.get('routed_experts', '')}")
    print(line)
