"""The annotation run's report: acceptance by teacher, reject reasons and the structure of what was accepted.

`summarize(records)` reads the records of an output (and its rejects file) and returns a JSON-ready dict;
`format_table(summary)` renders the short table printed at the end of a run.
"""

from __future__ import annotations

import statistics
from collections import Counter
from typing import Any

from pasta.annotation.validate import reason_code
from pasta.measure import geometric_mean


def distribution(values: list[float]) -> dict[str, float] | None:
    """count, mean, min, p10, p50, p90 and max of `values` (None when empty)."""
    if not values:
        return None
    ordered = sorted(values)

    def quantile(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {
        "count": len(ordered),
        "mean": round(statistics.fmean(ordered), 4),
        "min": ordered[0],
        "p10": quantile(0.1),
        "p50": quantile(0.5),
        "p90": quantile(0.9),
        "max": ordered[-1],
    }


def _geometric_mean(values: list[float]) -> float | None:
    return round(geometric_mean(values), 4) if values else None


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts and distributions over every record written for one output (kept, dropped and rejected)."""
    accepted = [r for r in records if r.get("accepted")]
    tagged = [r for r in accepted if r.get("num_promises")]
    by_teacher: dict[str, dict[str, Any]] = {}
    for teacher in sorted({f"{r['teacher']} ({r['teacher_model']})" for r in records}):
        mine = [r for r in records if f"{r['teacher']} ({r['teacher_model']})" == teacher]
        num_accepted = sum(1 for r in mine if r.get("accepted"))
        by_teacher[teacher] = {
            "num_records": len(mine),
            "num_accepted": num_accepted,
            "acceptance_rate": round(num_accepted / len(mine), 4),
        }
    speedups = [r["theoretical_speedup"] for r in accepted]
    tagged_speedups = [r["theoretical_speedup"] for r in tagged]
    return {
        "num_records": len(records),
        "num_accepted": len(accepted),
        "acceptance_rate": round(len(accepted) / len(records), 4) if records else None,
        "num_with_promises": len(tagged),
        "num_kept_unannotated": sum(
            1 for r in records if not r.get("accepted") and r.get("annotated") is not None
        ),
        "by_teacher": by_teacher,
        "reject_reasons": dict(
            Counter(reason_code(r["reject_reason"]) for r in records if not r.get("accepted"))
        ),
        "promises_per_response": distribution([r["num_promises"] for r in accepted]),
        "groups_per_response": distribution([r["num_groups"] for r in accepted]),
        "chunk_tokens": distribution([n for r in accepted for n in r["chunk_tokens"]]),
        "theoretical_speedup": distribution(speedups),
        "theoretical_speedup_geomean": _geometric_mean(speedups),
        "theoretical_speedup_with_promises": distribution(tagged_speedups),
        "theoretical_speedup_with_promises_geomean": _geometric_mean(tagged_speedups),
        # Records written before these were measured lack them: left out of the distributions.
        "tag_steps_per_fork": distribution([r["num_tag_steps"] for r in tagged if r.get("num_tag_steps") is not None]),
        "cross_thread_repetition": distribution([r["repetition"] for r in tagged if r.get("repetition") is not None]),
    }


def _fmt(dist: dict[str, float] | None, keys: tuple[str, ...] = ("mean", "p50", "p90", "max")) -> str:
    if dist is None:
        return "-"
    return " / ".join(f"{dist[k]:.2f}".rstrip("0").rstrip(".") for k in keys)


def format_table(summary: dict[str, Any]) -> str:
    """A short plain-text table of a summary (acceptance by teacher, reasons, structure)."""
    rows = [("teacher", "records", "accepted", "rate")]
    for teacher, counts in summary["by_teacher"].items():
        rows.append(
            (
                teacher,
                str(counts["num_records"]),
                str(counts["num_accepted"]),
                f"{100 * counts['acceptance_rate']:.1f}%",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths, strict=True)))
             for row in rows]  # fmt: skip
    reasons = ", ".join(
        f"{code} {n}" for code, n in sorted(summary["reject_reasons"].items(), key=lambda kv: -kv[1])
    )
    lines += [
        f"reject reasons: {reasons or 'none'}",
        f"with promises: {summary['num_with_promises']} of {summary['num_accepted']} accepted"
        + (
            f"; kept unannotated: {summary['num_kept_unannotated']}"
            if summary["num_kept_unannotated"]
            else ""
        ),
        "                        mean / p50 / p90 / max",
        f"promises per response: {_fmt(summary['promises_per_response'])}",
        f"chunk tokens:          {_fmt(summary['chunk_tokens'])}",
        f"speedup (accepted):    {_fmt(summary['theoretical_speedup'])}"
        + (
            f"  (geomean {summary['theoretical_speedup_geomean']})"
            if summary["theoretical_speedup_geomean"]
            else ""
        ),
        f"speedup (with tags):   {_fmt(summary['theoretical_speedup_with_promises'])}"
        + (
            f"  (geomean {summary['theoretical_speedup_with_promises_geomean']})"
            if summary.get("theoretical_speedup_with_promises_geomean")
            else ""
        ),
        f"tag steps per fork:    {_fmt(summary.get('tag_steps_per_fork'))}",
        f"cross-thread repeats:  {_fmt(summary.get('cross_thread_repetition'))}",
    ]
    return "\n".join(lines)
