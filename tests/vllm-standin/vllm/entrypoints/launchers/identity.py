"""vsnap stand-in: the activated process's own identity (vsnap's identity.json).

Every copy restored from one checkpoint starts from the donor's memory, so its userspace
generators (Python's ``random``, NumPy's, torch's) draw what every other copy draws. vsnap
hands each activation a fresh identity: in the barrier, as the release file's
``"identity"`` key (vLLM's ``ReleaseMarker`` ignores unknown keys), or as
``identity.json`` in the control dir beside it. ``build_and_serve`` applies it once the
released state is restored (vLLM's barrier runs no recovery canary of its own; the
capturer's HTTP canary is greedy and draws from none of these generators), before the
listener takes traffic. Only this process (PID 1, the API server) is reseeded.
"""

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

from vllm.logger import init_logger

logger = init_logger("vllm.entrypoints.launchers.identity")

# The identity applied to this process, if any.
_applied: dict | None = None


def _release_file(argv: list[str]) -> Path | None:
    """The release file, read from argv as vllm.snapshot.server reads it."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--release-file", type=Path)
    try:
        known, _ = parser.parse_known_args(argv)
    except SystemExit:
        return None
    return known.release_file


def _read_object(path: Path) -> dict | None:
    try:
        payload = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return payload if isinstance(payload, dict) else None


def find(argv: list[str] | None = None) -> dict | None:
    """The release file's identity, else the control dir's identity.json, else None."""
    release = _release_file(sys.argv[1:] if argv is None else argv)
    if release is None:
        return None
    identity = (_read_object(release) or {}).get("identity")
    if identity is None:
        identity = _read_object(release.parent / "identity.json")
    return identity


def _check(identity: Any) -> None:
    seed = identity.get("seed") if isinstance(identity, dict) else None
    if (
        not isinstance(seed, str)
        or len(seed) != 64
        or any(c not in "0123456789abcdef" for c in seed)
        or not isinstance(identity.get("hostname"), str)
        or not isinstance(identity.get("pod_ips"), list)
    ):
        raise ValueError("identity is invalid: needs hostname, pod_ips and a 64-hex seed")


def apply(identity: dict) -> None:
    """Reseeds random, and NumPy's and torch's generators where they are importable."""
    global _applied
    _check(identity)
    seed = int(identity["seed"], 16)
    random.seed(seed)
    try:
        import numpy

        numpy.random.seed([(seed >> (32 * i)) & 0xFFFFFFFF for i in range(8)])
    except ImportError:
        pass
    try:
        import torch

        torch.manual_seed(seed >> 192)  # the first 8 bytes; CUDA generators too
    except ImportError:
        pass
    _applied = identity
    logger.info("identity: hostname %s, seed applied", identity["hostname"])


def apply_found(argv: list[str] | None = None) -> None:
    identity = find(argv)
    if identity is not None:
        apply(identity)


def report() -> dict:
    """``GET /v1/identity``; every call draws from (advances) ``random``."""
    return {
        "hostname": _applied["hostname"] if _applied else None,
        "pod_ips": list(_applied["pod_ips"]) if _applied else [],
        "seed_applied": _applied is not None,
        "random": random.random(),
        "getrandbits": random.getrandbits(64),
    }
