"""The stand-in language model: a word vocabulary, a tokenizer and a scorer.

Not a neural network: the logits of the next token are drawn from a hash of the
loaded weights' sha256 and the context (prompt tokens plus the tokens generated so
far), so the answer is a pure function of the model folder's bytes and the prompt.
Log-probabilities are a genuine log-softmax over those logits (float64), greedy
decoding takes the argmax, sampling draws from softmax(logits / temperature).
"""

import hashlib
import math
import random
import re
import struct
import zlib

# Output tokens: ids FIRST_WORD_ID .. FIRST_WORD_ID + len(WORDS) - 1.
WORDS = (
    " Paris", " London", " Berlin", " Rome", " Madrid", " Lisbon", " Vienna", " Prague",
    " the", " a", " city", " capital", " of", " France", " is", " and",
    " in", " river", " north", " south", " east", " west", " old", " new",
    " large", " small", " famous", " beautiful", " known", " for", " its", " people",
    " food", " art", " music", " history", " bridge", " tower", " park", " street",
    " square", " market", " museum", " palace", " church", " garden", " station", " harbor",
    " hill", " lake", ",", ".", " also", " very", " many", " one",
    " two", " three", " first", " last",
)
FIRST_WORD_ID = 1000
# Prompt words outside WORDS hash into [HASHED_BASE, HASHED_BASE + HASHED_SPAN).
HASHED_BASE = 2000
HASHED_SPAN = 30000
VOCAB_SIZE = HASHED_BASE + HASHED_SPAN
LOGIT_SCALE = 10.0

_WORD_TO_ID = {w: FIRST_WORD_ID + i for i, w in enumerate(WORDS)}
_PIECE = re.compile(r"\s*[^\s,.]+|\s*[,.]")


def tokenize(text: str) -> list[int]:
    """Words (with their leading space) and punctuation; unknown words hash."""
    ids = []
    for piece in _PIECE.findall(text):
        word = piece.strip()
        tid = _WORD_TO_ID.get(piece) or _WORD_TO_ID.get(" " + word) or _WORD_TO_ID.get(word)
        if tid is None:
            tid = HASHED_BASE + zlib.crc32(word.encode("utf-8")) % HASHED_SPAN
        ids.append(tid)
    return ids


def decode_token(token_id: int) -> str:
    idx = token_id - FIRST_WORD_ID
    if 0 <= idx < len(WORDS):
        return WORDS[idx]
    return f"<tok_{token_id}>"


def decode(token_ids) -> str:
    return "".join(decode_token(t) for t in token_ids)


def weights_digest(buffer) -> bytes:
    return hashlib.sha256(buffer).digest()


def next_token_logprobs(digest: bytes, context: list[int]) -> list[float]:
    """log-softmax over WORDS for the token that follows ``context``."""
    key = digest + b"|" + ",".join(map(str, context)).encode()
    raw = hashlib.shake_256(key).digest(8 * len(WORDS))
    logits = [
        (v / 2.0**64) * LOGIT_SCALE for v in struct.unpack(f"<{len(WORDS)}Q", raw)
    ]
    top = max(logits)
    lse = top + math.log(math.fsum(math.exp(x - top) for x in logits))
    return [x - lse for x in logits]


def generate(digest: bytes, prompt_ids: list[int], params: dict) -> dict:
    """Runs decoding; returns token ids, their logprobs, ranks and top logprobs."""
    max_tokens = params.get("max_tokens") or 16
    temperature = float(params.get("temperature", 1.0))
    num_logprobs = params.get("logprobs")
    greedy = temperature < 1e-5
    rng = None
    if not greedy:
        seed = params.get("seed")
        rng = random.Random(seed) if seed is not None else random.Random()
    context = list(prompt_ids)
    out_ids, out_lps, out_ranks, out_tops = [], [], [], []
    for _ in range(max_tokens):
        lps = next_token_logprobs(digest, context)
        order = sorted(range(len(lps)), key=lambda i: (-lps[i], i))
        if greedy:
            choice = order[0]
        else:
            scaled = [lp / temperature for lp in lps]
            top = max(scaled)
            weights = [math.exp(s - top) for s in scaled]
            choice = rng.choices(range(len(lps)), weights=weights, k=1)[0]
        tid = FIRST_WORD_ID + choice
        out_ids.append(tid)
        out_lps.append(lps[choice])
        out_ranks.append(order.index(choice) + 1)
        if num_logprobs:
            out_tops.append(
                [(FIRST_WORD_ID + i, lps[i], r + 1) for r, i in enumerate(order[:num_logprobs])]
            )
        else:
            out_tops.append([])
        context.append(tid)
    return {
        "token_ids": out_ids,
        "logprobs": out_lps,
        "ranks": out_ranks,
        "top_logprobs": out_tops,
        "finish_reason": "length",
    }
