"""Local models judged as drafts for a target: can each draft for it (its
vocabulary, or translation through text), and what would it gain on this
machine? specgen.models.pairing ranks them; `choose` is `--pair auto`.

Vocabulary: equal tokenizer fingerprints settle it from the headers; differing
ones get the detailed check on vocabulary-only engines (vocabularies that
differ only by padding pass it), then translation_problem.

Prediction: only from this machine's measured costs (specgen.engine.costs'
cached profiles of both files, at the threads and GPU layers given), with the
cost policy's own expected-tokens model (specgen.policy.base.step_rate) at an
assumed acceptance, the policy's prior: ASSUMED_ACCEPTANCE. The figure is the
best over k = 1 … K_MAX against plain decoding; where either file has no
profile yet it is None ("unmeasured"), never a guess.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from specgen.errors import SpecgenError
from specgen.models.local import LocalModel, Scan, scan
from specgen.models.pairing import SAME, TRANSLATED, Candidate, Rejected, best, rank
from specgen.plan import ADAPTIVE_K_MAX, Kind
from specgen.policy.cost import DRAFT_MODEL_PRIOR

# The cost policy's priors: a draft model of the same vocabulary (DRAFT_MODEL_PRIOR), and its
# general prior for other drafters (a translated one).
ASSUMED_ACCEPTANCE = {SAME: DRAFT_MODEL_PRIOR[0], TRANSLATED: 0.6}
K_MAX = ADAPTIVE_K_MAX[Kind.DRAFT]  # the adaptive ceiling of a draft model


@dataclass
class Pairing:
    """What `specgen pair` shows: the target, the ranked drafts, the others with why, the scan."""

    target: Path
    target_size: int
    candidates: list[Candidate]
    rejected: list[Rejected]
    scan: Scan = field(default_factory=Scan)

    @property
    def chosen(self) -> Candidate | None:
        return best(self.candidates)


class VocabChecker:
    """check(model) -> (SAME | TRANSLATED | None, why not); the target's vocabulary opened once, lazily."""

    def __init__(self, target: Path):
        from specgen.models.vocab import fingerprint

        self.target, self.fingerprint, self.engine = Path(target), fingerprint(target), None

    def __call__(self, m: LocalModel) -> tuple[str | None, str]:
        if self.fingerprint is not None and m.fingerprint == self.fingerprint:
            return SAME, ""
        from specgen.drafters.translated import translation_problem
        from specgen.engine.llama import Engine
        from specgen.models.vocab import compare

        try:
            if self.engine is None:
                self.engine = Engine.vocab(self.target)
            with Engine.vocab(m.path) as de:
                report = compare(self.engine, de)
                if report.compatible:
                    return SAME, ""
                why = translation_problem(self.engine, de)
        except SpecgenError as e:
            return None, str(e)
        if why:
            return None, f"another vocabulary ({report.first_problem()}) that cannot draft by translation: {why}"
        return TRANSLATED, ""

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
            self.engine = None


def predicted_speedup(target: dict | None, draft: dict | None, alpha: float, k_max: int = K_MAX) -> float | None:
    """The best expected speedup over plain for k = 1 … k_max from two cost profiles (None: either missing)."""
    from specgen.policy.base import step_rate

    if target is None or draft is None:
        return None
    curve, step = target["verify_s"], float(draft["verify_s"][1])
    plain = step_rate([], 0, curve, step)
    return max(step_rate([alpha] * k, k, curve, step) for k in range(1, k_max + 1)) / plain


def predictor(target: Path, threads: int, gpu_layers: int = 0) -> Callable[[LocalModel, str], tuple[float | None, str]]:
    from specgen.engine.costs import stored_profile

    tprof = stored_profile(target, threads, gpu_layers)

    def predict(m: LocalModel, vocab: str) -> tuple[float | None, str]:
        if tprof is None:
            return None, "unmeasured: the target has no cost profile on this machine yet (any run of it takes one)"
        dprof = stored_profile(m.path, threads, gpu_layers)
        if dprof is None:
            return None, "unmeasured: the draft has no cost profile on this machine yet (a run with it takes one)"
        alpha = ASSUMED_ACCEPTANCE[vocab]
        got = predicted_speedup(tprof, dprof, alpha)
        return got, f"measured costs, {threads} thread{'s' * (threads != 1)}, assumed acceptance {alpha:.2f}"

    return predict


def pair(target: Path, *, threads: int | None = None, gpu_layers: int = 0, found: Scan | None = None) -> Pairing:
    """Rank every local model (specgen.models.local.scan) as a draft for the GGUF at `target`."""
    import os

    from specgen.models.gguf import read_header

    header = read_header(target)
    arch = header.metadata.get("general.architecture")
    found = found if found is not None else scan()
    check = VocabChecker(target)
    try:
        cands, rejected = rank(target, header.file_size, arch, found.models, check=check,
                               predict=predictor(target, threads or os.cpu_count() or 1, gpu_layers))
    finally:
        check.close()
    return Pairing(Path(target), header.file_size, cands, rejected, found)


def choose(target: Path, *, threads: int | None = None, gpu_layers: int = 0) -> tuple[Path | None, str]:
    """--pair auto: (the best local draft for `target` or None, one line saying which and why)."""
    p = pair(target, threads=threads, gpu_layers=gpu_layers)
    c = p.chosen
    if c is not None:
        return c.model.path, f"--pair auto: drafting with {c.model.name} ({c.model.store}): {c.reason()}"
    if p.candidates:
        top = p.candidates[0]
        return None, (f"--pair auto: no local draft would pay for {target.name} (best, {top.model.name}, predicted "
                      f"{top.speedup:.2f}x): drafting by prompt lookup")
    return None, (f"--pair auto: no local model can draft for {target.name} ({len(p.scan.models)} found; "
                  "`specgen pair` says why): drafting by prompt lookup")
