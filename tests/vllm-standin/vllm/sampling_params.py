"""SamplingParams: the fields of vLLM's that the stand-in understands."""

from dataclasses import asdict, dataclass, field
from typing import Any

_SAMPLING_EPS = 1e-5


@dataclass
class SamplingParams:
    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    detokenize: bool = True
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    extra_args: dict[str, Any] | None = field(default=None)

    def __post_init__(self) -> None:
        if self.n != 1:
            raise ValueError(f"n must be 1 in the vsnap stand-in, got {self.n}.")
        if self.temperature < 0.0:
            raise ValueError(
                f"temperature must be non-negative, got {self.temperature}."
            )
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}.")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}.")
        if self.min_tokens < 0:
            raise ValueError(f"min_tokens must be non-negative, got {self.min_tokens}.")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(
                f"min_tokens must be less than or equal to max_tokens={self.max_tokens}, "
                f"got {self.min_tokens}."
            )
        if self.logprobs is not None and self.logprobs < 0:
            raise ValueError(f"logprobs must be non-negative, got {self.logprobs}.")
        if self.temperature < _SAMPLING_EPS:
            # Greedy, as in vLLM: the other sampling knobs are reset.
            self.top_p = 1.0
            self.top_k = 0
            self.min_p = 0.0

    @staticmethod
    def from_optional(**kwargs: Any) -> "SamplingParams":
        return SamplingParams(**{k: v for k, v in kwargs.items() if v is not None})

    @property
    def greedy(self) -> bool:
        return self.temperature < _SAMPLING_EPS

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
