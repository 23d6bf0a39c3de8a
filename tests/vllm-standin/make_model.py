#!/usr/bin/env python3
"""Makes a model folder for the vLLM stand-in: config.json and weights.bin.

    python3 tests/vllm-standin/make_model.py DIR [--size-mb N] [--seed S]

weights.bin is N MiB (default 4) of SHAKE-256 output keyed by the seed (default 0),
so the same arguments give the same bytes. The stand-in answers with a function of
sha256(weights.bin) and the prompt: change a byte of the file and the canary changes.
Standard library only; the folder is created if missing, its two files replaced
atomically.
"""

import argparse
import hashlib
import json
import os
import sys


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir")
    parser.add_argument("--size-mb", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.size_mb < 1:
        parser.error("--size-mb must be at least 1")
    os.makedirs(args.dir, exist_ok=True)
    size = args.size_mb << 20
    stream = hashlib.shake_256(f"vsnap-standin-weights:{args.seed}".encode())
    data = stream.digest(size)
    config = {
        "architectures": ["VsnapStandinForCausalLM"],
        "model_type": "vsnap-standin",
        "max_position_embeddings": 2048,
        "vocab_size": 32000,
        "weights": "weights.bin",
        "weights_bytes": size,
        "weights_seed": args.seed,
        "weights_sha256": hashlib.sha256(data).hexdigest(),
    }
    for name, payload in (
        ("weights.bin", data),
        ("config.json", (json.dumps(config, indent=2, sort_keys=True) + "\n").encode()),
    ):
        path = os.path.join(args.dir, name)
        temporary = f"{path}.tmp.{os.getpid()}"
        with open(temporary, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    print(os.path.abspath(args.dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
