from dataclasses import dataclass


@dataclass
class Logprob:
    """The log probability of one token (vllm.logprobs.Logprob)."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# One dict per generated position: token id -> Logprob.
SampleLogprobs = list[dict[int, Logprob]]
