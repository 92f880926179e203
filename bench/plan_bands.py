"""The KV bands of plans over the catalog: every profile on every catalog card, as
`safe-serve plan MODEL --gpu CARD --engine sglang` plans it (issue 20's "SGLang plans of verified
architectures carry bands <= +/- 5 %"), or vLLM's with `--engine vllm`.

    python bench/plan_bands.py            # the summary, and every verified plan over +/- 5 %
    python bench/plan_bands.py --all      # every plan, one line each
    python bench/plan_bands.py --engine-version 0.5.9   # the plans for another release
    python bench/plan_bands.py --engine vllm            # vLLM's plans (no pool cap: see README)

The band is the plan's own: max(kv - kv_low, kv_high - kv) / kv over the KV pool it promises,
after the `--max-total-tokens` cap the plan adds where the estimate spans more than +/- 5 %.
A plan over +/- 5 % that says MAY NOT FIT (`fits` false: the pool or the length holds only at
the band's favourable end) promises nothing on that end and is counted apart from one that fits.
In process, no GPU, no network: the catalog cards are hypothetical.
"""

from __future__ import annotations

import contextlib
import io
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TARGET = 0.05


def _cards() -> list[str]:
    import yaml

    return [entry["aliases"][0] for entry in yaml.safe_load((ROOT / "profiles" / "gpus.yaml").read_text())]


def _plan(model: str, card: str, engine: str, version: list[str]) -> dict[str, object] | None:
    from launcher.edge.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        try:
            main(["plan", model, "--gpu", card, "--engine", engine, *version, "--json"])
        except SystemExit as done:
            if done.code not in (0, None):
                return None
    doc: dict[str, object] = json.loads(out.getvalue())
    return doc


def _band(kv: int, low: int, high: int) -> float:
    return max(kv - low, high - kv) / kv if kv > 0 else float("inf")


@dataclass(frozen=True)
class Row:
    model: str
    card: str
    verified: bool
    kv: int
    band: float
    capped: bool
    fits: bool


def collect(version: list[str] | None = None, engine: str = "sglang") -> tuple[list[Row], int]:
    """(every plan, the number refused) for every profile on every catalog card."""
    models = sorted(p.stem for p in (ROOT / "profiles" / "models").glob("*.yaml"))
    rows, refused = [], 0
    for model in models:
        for card in _cards():
            doc = _plan(model, card, engine, version or [])
            if doc is None:
                refused += 1
                continue
            kv, low, high = (int(doc[key]) for key in ("kv_cache_bytes", "kv_cache_bytes_low", "kv_cache_bytes_high"))
            args = [str(a) for a in doc.get("engine_args", [])]  # type: ignore[attr-defined]
            rows.append(Row(model, card, bool(doc["architecture_verified"]), kv, _band(kv, low, high),
                            "--max-total-tokens" in args, bool(doc["fits"])))
    return rows, refused


def over_target(rows: list[Row]) -> list[Row]:
    return [row for row in rows if row.verified and row.band > TARGET + 1e-9]


def summary(rows: list[Row], refused: int, engine: str = "sglang") -> list[str]:
    verified = [row for row in rows if row.verified]
    over = over_target(rows)
    name = "SGLang" if engine == "sglang" else "vLLM"
    lines = [f"{len(rows)} {name} plans and {refused} refusals (the model does not fit the card); "
             f"{len(verified)} plans of verified architectures"]
    if verified:
        ordered = sorted(row.band for row in verified)
        lines.append(f"verified bands: median +/- {statistics.median(ordered):.1%}, "
                     f"p90 +/- {ordered[int(0.9 * (len(ordered) - 1))]:.1%}, widest +/- {ordered[-1]:.1%}; "
                     f"over +/- {TARGET:.0%}: {len(over)} ({sum(not row.fits for row in over)} of them MAY NOT FIT, "
                     f"{sum(row.fits for row in over)} fit); pools capped by --max-total-tokens: "
                     f"{sum(row.capped for row in verified)}")
    return lines


def main() -> int:
    argv = sys.argv[1:]
    at = argv.index("--engine-version") if "--engine-version" in argv else -1
    engine = argv[argv.index("--engine") + 1] if "--engine" in argv else "sglang"
    rows, refused = collect(argv[at:at + 2] if at >= 0 else [], engine)
    print("\n".join(summary(rows, refused, engine)))
    for row in (rows if "--all" in argv else over_target(rows)):
        print(f"  {row.model:30} {row.card:18} {'verified' if row.verified else 'unverified':10} "
              f"{row.kv / 2**30:8.2f} GiB  +/- {row.band:6.1%}{'  capped' if row.capped else ''}"
              f"{'' if row.fits else '  MAY NOT FIT'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
