"""What a generation counts: one `Round` per target pass, and the `Stats` they add up to."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class Round:
    """What one target pass settled."""

    tokens: list[int]  # emitted: accepted drafts first, then the target's own
    drafted: int  # tokens proposed this round
    accepted: int  # drafts kept by the acceptance rule
    draft_s: float  # time spent drafting
    verify_s: float  # time of the target pass and the acceptance rule


@dataclass
class Stats:
    """Counters and timings, named and defined as vLLM's and llama.cpp's: rounds
    (target passes), drafted, accepted, acceptance rate = accepted / drafted,
    mean accepted length = generated / rounds, per-position acceptance."""

    prompt_tokens: int = 0
    generated: int = 0
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    drafted_at: list[int] = field(default_factory=list)  # rounds that drafted >= i+1
    accepted_at: list[int] = field(default_factory=list)  # drafts accepted at position i+1
    k_chosen: Counter = field(default_factory=Counter)  # draft length per round
    prefill_s: float = 0.0  # to the first token: the target's prompt prefill, and the draft's when it reads the prompt too
    draft_prefill_s: float = 0.0  # the draft model's bulk feeds: its prompt prefill and catch-ups
    draft_fed: int = 0  # tokens in those feeds
    total_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0
    stop_reason: str = ""

    def add(self, r: Round) -> None:
        self.rounds += 1
        self.generated += len(r.tokens)
        self.drafted += r.drafted
        self.accepted += r.accepted
        self.draft_s += r.draft_s
        self.verify_s += r.verify_s
        self.k_chosen[r.drafted] += 1
        while len(self.drafted_at) < r.drafted:
            self.drafted_at.append(0)
            self.accepted_at.append(0)
        for i in range(r.drafted):
            self.drafted_at[i] += 1
        for i in range(r.accepted):
            self.accepted_at[i] += 1

    def merge(self, other: "Stats") -> None:
        """Add another generation's counters and times (a chat session's running total)."""
        self.prompt_tokens += other.prompt_tokens
        self.generated += other.generated
        self.rounds += other.rounds
        self.drafted += other.drafted
        self.accepted += other.accepted
        for mine, theirs in ((self.drafted_at, other.drafted_at), (self.accepted_at, other.accepted_at)):
            mine.extend([0] * (len(theirs) - len(mine)))
            for i, v in enumerate(theirs):
                mine[i] += v
        self.k_chosen.update(other.k_chosen)
        for name in ("prefill_s", "draft_prefill_s", "draft_fed", "total_s", "draft_s", "verify_s"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.stop_reason = other.stop_reason

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_len(self) -> float:
        return self.generated / self.rounds if self.rounds else 0.0

    @property
    def per_position(self) -> list[float]:
        return [a / d for a, d in zip(self.accepted_at, self.drafted_at)]

    @property
    def decode_s(self) -> float:
        return max(self.total_s - self.prefill_s, 0.0)

    @property
    def tokens_per_s(self) -> float:
        """Decode speed: tokens after the first over the time after the first."""
        return (self.generated - 1) / self.decode_s if self.generated > 1 and self.decode_s > 0 else 0.0

    def timings(self) -> dict:
        return {
            "prefill_s": self.prefill_s,
            "draft_prefill_s": self.draft_prefill_s,
            "ttft_s": self.prefill_s,
            "decode_s": self.decode_s,
            "total_s": self.total_s,
            "tokens_per_s": self.tokens_per_s,
        }

    def spec(self, draft_max: int) -> dict:
        """The speculation counters, as in `specgen run --json`'s "spec" object."""
        return {
            "draft_max": draft_max,
            "rounds": self.rounds,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": self.acceptance_rate,
            "mean_accepted_len": self.mean_accepted_len,
            "per_position": self.per_position,
            "k_hist": self.k_hist,
        }

    @property
    def k_hist(self) -> dict[str, int]:
        return {str(k): n for k, n in sorted(self.k_chosen.items())}

    def record(self) -> dict:
        """The flat counters every record carries (bench runs, served requests)."""
        spec = self.spec(0)
        del spec["draft_max"]
        return {"prompt_tokens": self.prompt_tokens, "generated_tokens": self.generated, **spec,
                "stop_reason": self.stop_reason}
