"""The scorecard: per study table, how many cells we regenerated, how far they are from the published
ones, and whether the paper's ranking claims hold in our numbers.

It reads the tidy cell CSVs the table rule writes (one row per cell, row-major over the table spec's
rows and columns), so any study that declares tables (and, optionally, `claims`) plugs in.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from scipy.stats import kendalltau

from fedrepro.config import column_refs
from fedrepro.report.collect import MACHINE, write_text_atomic
from fedrepro.report.convergence import StudyConvergence, convergence_blocks, study_convergence
from fedrepro.report.derived import lower_is_better, metric_key

EMBEDDED_STATEMENT = (
    "**Embedded scale.** These runs use small stand-in data sets that ship with scikit-learn, small "
    "models and few rounds, while the published numbers come from the papers' own data sets at full "
    "scale: the numbers are **not comparable** with the published ones, so this scorecard compares "
    "**rankings only** (rank agreement and the papers' ranking claims)."
)
PAPER_STATEMENT = (
    "**Paper scale.** |Δ| = |ours − published| over the cells that have both; \"within 2 sd\" counts the "
    "cells whose difference is at most twice the published standard deviation, among the cells the "
    "paper prints a standard deviation for (many tables print none)."
)
SUMMARIES = {
    "final_acc": "final",
    "best_acc": "best",
    "last_k_acc": "mean of last k",
    "target_acc": "final (after fine-tuning)",
    "best_target_acc": "best (over fine-tuning epochs)",
    "last_k_max_acc": "max of last k",
    "last_k_sd_acc": "sd over the last k rounds",
}
HAVE_VALUE = ("ok", "partial")
RANK_MIN_ROWS = 3  # Kendall's tau over fewer rows says little


@dataclass
class ClaimResult:
    """One ranking claim, checked in our numbers and in the published ones."""

    text: str
    ours: str
    paper: str
    holds: bool | None  # None: our numbers cannot decide it (cells missing)


@dataclass
class TableScore:
    study: str
    table: str
    caption: str
    paper_table: str | None
    summary: str
    cells: int
    regenerated: int
    published: int
    compared: int
    mean_abs_diff: float
    max_abs_diff: float
    with_std: int
    within_2sd: int
    rank_tau: float
    claims: list[ClaimResult] = field(default_factory=list)


def accuracy_summary(spec: dict) -> str:
    """Which number the table's cells show: final, best or mean of last k (or a per-column metric)."""
    metrics = [metric_key(spec, c) for c in spec["columns"]]
    return "; ".join(metric_words(m) for m in dict.fromkeys(metrics))


def metric_words(key: str) -> str:
    """A cell metric's key (fedrepro.report.derived.metric_key) in words: "round_bytes_up@mean*1e-06" ->
    "round bytes up (mean over evaluations, x 1e-06)"; "cache_mb@20" -> "cache mb at round 20"."""
    if key in SUMMARIES:
        return SUMMARIES[key]
    if key.startswith("rounds_to_"):
        return f"rounds to {key.removeprefix('rounds_to_')}% accuracy"
    name, _, how = key.partition("@")
    words = name.replace("_", " ")
    if how.startswith("mean"):
        scale = how.removeprefix("mean").removeprefix("*")
        return f"{words} (mean over evaluations" + (f", x {scale})" if scale else ")")
    return f"{words} at round {how}" if how else words


def _grid(spec: dict, cells: pd.DataFrame, column: str) -> list[list[float]]:
    """cells[column] as a rows x columns grid (NaN where the cell has no value of ours)."""
    n_rows, n_cols = len(spec["rows"]), len(spec["columns"])
    if len(cells) != n_rows * n_cols:
        raise ValueError(f"table {spec['name']}: {len(cells)} cells in its CSV, but the spec has "
                         f"{n_rows} rows x {n_cols} columns; rerun the table rule")
    values = pd.to_numeric(cells[column], errors="coerce").tolist()
    if column == "ours_mean":
        values = [v if s in HAVE_VALUE else math.nan for v, s in zip(values, cells["status"], strict=True)]
    return [values[i * n_cols:(i + 1) * n_cols] for i in range(n_rows)]


def _columns_of(spec: dict, names: list[str] | None) -> list[int]:
    if names is None:
        return list(range(len(spec["columns"])))
    return [j for j, c in enumerate(spec["columns"]) if column_refs(c) & set(names)]


def _column_index(spec: dict, name: str) -> int:
    hits = [j for j, c in enumerate(spec["columns"]) if name in column_refs(c)]
    if len(hits) != 1:
        raise ValueError(f"table {spec['name']}: claim column {name!r} must name exactly one column")
    return hits[0]


def _row_index(spec: dict, method: str) -> int:
    rows = [r["method"] for r in spec["rows"]]
    if method not in rows:
        raise ValueError(f"table {spec['name']}: claim row {method!r} is not one of {rows}")
    return rows.index(method)


def _beats(a: float, b: float, lower: bool) -> bool:
    # compared at the printed precision (2 decimals), as the tables bold: a tie counts as holding
    a, b = round(a, 2), round(b, 2)
    return a <= b if lower else a >= b


def _check(spec: dict, claim: dict, grid: list[list[float]]) -> tuple[int, int, list[str]]:
    """(places where the claim holds, places it could be checked, names of the places it fails)."""
    lower = [lower_is_better(metric_key(spec, c)) for c in spec["columns"]]
    col_label = [c["label"] for c in spec["columns"]]
    row_label = [r["label"] for r in spec["rows"]]
    checks: list[tuple[str, bool | None]] = []
    if "best" in claim:
        i = _row_index(spec, claim["best"])
        for j in _columns_of(spec, claim["columns"]):
            others = [line[j] for k, line in enumerate(grid) if k != i and not math.isnan(line[j])]
            mine = grid[i][j]
            ok = None if math.isnan(mine) or not others else all(_beats(mine, o, lower[j]) for o in others)
            checks.append((col_label[j], ok))
    elif "better" in claim:
        i, k = _row_index(spec, claim["better"]), _row_index(spec, claim["than"])
        for j in _columns_of(spec, claim["columns"]):
            a, b = grid[i][j], grid[k][j]
            checks.append((col_label[j], None if math.isnan(a) or math.isnan(b) else _beats(a, b, lower[j])))
    else:
        j, k = _column_index(spec, claim["better_column"]), _column_index(spec, claim["than_column"])
        rows = range(len(grid)) if claim["rows"] is None else [_row_index(spec, m) for m in claim["rows"]]
        for i in rows:
            a, b = grid[i][j], grid[i][k]
            checks.append((row_label[i], None if math.isnan(a) or math.isnan(b) else _beats(a, b, lower[j])))
    decided = [(name, ok) for name, ok in checks if ok is not None]
    return sum(ok for _, ok in decided), len(decided), [name for name, ok in decided if not ok]


def _verdict(holds: int, checked: int, total: int, failing: list[str]) -> str:
    if checked == 0:
        return "not checkable (no numbers)"
    missing = f"; {total - checked} of {total} without numbers" if checked < total else ""
    if holds == checked:
        return f"holds ({holds}/{checked}){missing}"
    return f"fails ({holds}/{checked} hold; not in {', '.join(failing)}){missing}"


def claim_text(spec: dict, claim: dict) -> str:
    """The claim in words: its `text`, or one built from its keys and the table's labels."""
    if claim.get("text"):
        return claim["text"]
    label = {r["method"]: r["label"] for r in spec["rows"]}
    where = "every column" if claim["columns"] is None else ", ".join(claim["columns"])
    if "best" in claim:
        return f"{label[claim['best']]} is best in {where}"
    if "better" in claim:
        return f"{label[claim['better']]} beats {label[claim['than']]} in {where}"
    rows = "every row" if claim["rows"] is None else ", ".join(label[m] for m in claim["rows"])
    return f"column {claim['better_column']} beats column {claim['than_column']} in {rows}"


def check_claims(spec: dict, cells: pd.DataFrame) -> list[ClaimResult]:
    """Each of the table's `claims`, checked in our means and in the published means."""
    ours, paper = _grid(spec, cells, "ours_mean"), _grid(spec, cells, "paper_mean")
    out = []
    for claim in spec.get("claims", []):
        claim = {"columns": None, "rows": None, **claim}
        total = _n_places(spec, claim)
        h, n, failing = _check(spec, claim, ours)
        ph, pn, pfailing = _check(spec, claim, paper)
        out.append(ClaimResult(claim_text(spec, claim), _verdict(h, n, total, failing),
                               _verdict(ph, pn, total, pfailing), None if n < total else h == n))
    return out


def _n_places(spec: dict, claim: dict) -> int:
    if "better_column" in claim:
        return len(spec["rows"]) if claim["rows"] is None else len(claim["rows"])
    return len(_columns_of(spec, claim["columns"]))


def _rank_tau(ours: list[list[float]], paper: list[list[float]]) -> float:
    """Mean over columns of Kendall's tau between our and the published means (rows with both)."""
    taus = []
    for j in range(len(ours[0]) if ours else 0):
        pairs = [(o[j], p[j]) for o, p in zip(ours, paper, strict=True) if not (math.isnan(o[j]) or math.isnan(p[j]))]
        if len(pairs) >= RANK_MIN_ROWS:
            tau = kendalltau(*zip(*pairs, strict=True)).statistic
            if not math.isnan(tau):
                taus.append(tau)
    return sum(taus) / len(taus) if taus else math.nan


def score_table(study: str, spec: dict, cells: pd.DataFrame) -> TableScore:
    """The scorecard line of one table from its tidy cell CSV (``render_table``'s frame)."""
    ours, paper = _grid(spec, cells, "ours_mean"), _grid(spec, cells, "paper_mean")
    std = [v for line in _grid(spec, cells, "paper_std") for v in line]
    flat = [(o, p, s) for o, p, s in zip([v for line in ours for v in line], [v for line in paper for v in line],
                                          std, strict=True)]
    both = [(abs(o - p), s) for o, p, s in flat if not (math.isnan(o) or math.isnan(p))]
    with_std = [(d, s) for d, s in both if not math.isnan(s)]
    return TableScore(
        study=study, table=spec["name"], caption=spec.get("caption", ""), paper_table=spec.get("paper_table"),
        summary=accuracy_summary(spec), cells=len(flat),
        regenerated=sum(not math.isnan(o) for o, _, _ in flat),
        published=sum(not math.isnan(p) for _, p, _ in flat),
        compared=len(both),
        mean_abs_diff=sum(d for d, _ in both) / len(both) if both else math.nan,
        max_abs_diff=max((d for d, _ in both), default=math.nan),
        with_std=len(with_std), within_2sd=sum(d <= 2 * s for d, s in with_std),
        rank_tau=_rank_tau(ours, paper), claims=check_claims(spec, cells),
    )


def _num(x: float, fmt: str = ".2f") -> str:
    return "—" if math.isnan(x) else format(x, fmt)


def _two_sd(s: TableScore) -> str:
    if not s.compared:
        return "—"
    if not s.with_std:
        return "paper prints no sd"
    without = s.compared - s.with_std
    return f"{s.within_2sd} of {s.with_std}" + (f" ({without} cells without a published sd)" if without else "")


def _table_rows(scores: list[TableScore], scale: str) -> tuple[list[str], list[list[str]]]:
    head = ["table", "mirrors", "cells show", "regenerated", "with a published number"]
    if scale == "paper":
        head += ["mean abs diff", "max abs diff", "within 2 published sd"]
    head += ["rank agreement (Kendall τ)"]
    rows = []
    for s in scores:
        line = [s.table, s.paper_table or "no published table", s.summary, f"{s.regenerated} of {s.cells}",
                str(s.published)]
        if scale == "paper":
            line += [_num(s.mean_abs_diff), _num(s.max_abs_diff), _two_sd(s)]
        line.append(_num(s.rank_tau, "+.2f"))
        rows.append(line)
    return head, rows


def _claim_rows(scores: list[TableScore]) -> list[list[str]]:
    return [[s.table, c.text, c.paper, c.ours] for s in scores for c in s.claims]


def _intro(scale: str) -> list[str]:
    return [
        EMBEDDED_STATEMENT if scale == "embedded" else PAPER_STATEMENT,
        "Rank agreement: Kendall's τ between our and the published means of the rows of each column, "
        f"averaged over the columns with at least {RANK_MIN_ROWS} such rows (+1: same order, −1: reversed). "
        "A claim is checked in our means and, to check the claim itself, in the published ones; ties at "
        "two decimals count as holding.",
    ]


def _md_table(head: list[str], rows: list[list[str]]) -> list[str]:
    esc = [[c.replace("|", r"\|") for c in r] for r in [head, *rows]]
    return ["| " + " | ".join(esc[0]) + " |", "|" + "|".join("---" for _ in head) + "|",
            *("| " + " | ".join(r) + " |" for r in esc[1:])]


def coverage_line(shown_total: tuple[int, int] | list[int], what: str = "") -> str:
    """'published cells shown: N / total': of the paper's published cells, those beside one of ours."""
    shown, total = shown_total
    return f"Published cells shown{what}: {shown} / {total}."


def machines_line(summary: pd.DataFrame) -> str | None:
    """Which machines a study's runs (summary.csv) came from: each distinct CPU model and torch CPU capability
    with its number of runs, most runs first; None when no run recorded its machine."""
    if not set(MACHINE) <= set(summary.columns):
        return None
    machines = summary[MACHINE].fillna("").replace("", "not recorded")
    counts = machines.value_counts(sort=False).sort_index().sort_values(ascending=False, kind="stable")
    parts = [f"{cpu} ({capability}): {n} run{'s' * (n != 1)}" for (cpu, capability), n in counts.items()]
    return f"Machines (CPU, torch CPU capability) the runs came from: {'; '.join(parts)}."


def convergence_markdown(conv: StudyConvergence, heading: str = "###") -> list[str]:
    """A study's convergence subsection: runs at their plateau, cells' seed sd, methods at chance, and the runs
    and cells that miss by name."""
    statements, tables = convergence_blocks(conv)
    lines = [f"{heading} Convergence", ""]
    for text in statements:
        lines += [text, ""]
    for title, head, rows in tables:
        lines += [f"{title}:", "", *_md_table(head, rows), ""]
    return lines


def study_markdown(study: str, scores: list[TableScore], scale: str, heading: str = "##",
                   coverage: tuple[int, int] | None = None,
                   convergence: StudyConvergence | None = None, machines: str | None = None) -> list[str]:
    """One study's section: how many published cells it shows, the machines its runs came from (``machines``:
    machines_line), the table of tables, its claims, then whether its runs are finished (``convergence``)."""
    lines = [f"{heading} {study}", ""]
    if coverage is not None:
        lines += [coverage_line(coverage), ""]
    if machines:
        lines += [machines, ""]
    head, rows = _table_rows(scores, scale)
    lines += _md_table(head, rows)
    claims = _claim_rows(scores)
    if claims:
        held = sum(c.holds is True for s in scores for c in s.claims)
        lines += ["", f"Ranking claims of the paper: {held} of {len(claims)} hold in our numbers.", ""]
        lines += _md_table(["table", "claim", "in the published numbers", "in ours"], claims)
    if convergence is not None:
        lines += ["", *convergence_markdown(convergence, heading + "#")]
    return lines + [""]


def _overall(coverage: dict[str, tuple[int, int]]) -> tuple[int, int]:
    return sum(c[0] for c in coverage.values()), sum(c[1] for c in coverage.values())


def render_markdown(scores: list[TableScore], scale: str, coverage: dict[str, tuple[int, int]] | None = None,
                    convergence: dict[str, StudyConvergence] | None = None,
                    machines: dict[str, str | None] | None = None) -> str:
    """The whole scorecard as Markdown; ``coverage``: study -> (published cells shown, published cells);
    ``convergence``: study -> its runs' plateaus and cells' seed sd; ``machines``: study -> machines_line."""
    lines = ["# Scorecard: the papers' tables regenerated", ""]
    for para in _intro(scale):
        lines += [para, ""]
    if coverage:
        lines += [coverage_line(_overall(coverage), f", all studies ({scale} scale)"), ""]
    for study in dict.fromkeys(s.study for s in scores):
        lines += study_markdown(study, [s for s in scores if s.study == study], scale,
                                coverage=(coverage or {}).get(study), convergence=(convergence or {}).get(study),
                                machines=(machines or {}).get(study))
    return "\n".join(lines)


_CSS = """body{font-family:system-ui,sans-serif;margin:1.5em;color:#222;max-width:80em}
table{border-collapse:collapse;margin:.5em 0 1.5em}th,td{border-bottom:1px solid #ddd;padding:.3em .6em;
text-align:left;vertical-align:top}th{background:#f3f3f3}.holds{color:#1a7f37}.fails{color:#b42318}
.na{color:#777}"""


def _html_cell(text: str) -> str:
    cls = "holds" if text.startswith("holds") else "fails" if text.startswith("fails") else (
        "na" if text.startswith("not checkable") else "")
    return f'<td class="{cls}">{html.escape(text)}</td>' if cls else f"<td>{html.escape(text)}</td>"


def _html_table(head: list[str], rows: list[list[str]]) -> str:
    out = ["<table><thead><tr>", *(f"<th>{html.escape(h)}</th>" for h in head), "</tr></thead><tbody>"]
    for r in rows:
        out += ["<tr>", *(_html_cell(c) for c in r), "</tr>"]
    return "".join(out + ["</tbody></table>"])


def _md_inline(text: str) -> str:
    # the statements use **bold** only
    parts = html.escape(text).split("**")
    return "".join(f"<strong>{p}</strong>" if i % 2 else p for i, p in enumerate(parts))


def render_html(scores: list[TableScore], scale: str, coverage: dict[str, tuple[int, int]] | None = None,
                convergence: dict[str, StudyConvergence] | None = None,
                machines: dict[str, str | None] | None = None) -> str:
    """The whole scorecard as a standalone HTML page (for the Snakemake report)."""
    body = ["<h1>Scorecard: the papers' tables regenerated</h1>", *(f"<p>{_md_inline(p)}</p>" for p in _intro(scale))]
    if coverage:
        body.append(f"<p>{html.escape(coverage_line(_overall(coverage), f', all studies ({scale} scale)'))}</p>")
    for study in dict.fromkeys(s.study for s in scores):
        mine = [s for s in scores if s.study == study]
        body.append(f"<h2>{html.escape(study)}</h2>")
        if coverage and study in coverage:
            body.append(f"<p>{html.escape(coverage_line(coverage[study]))}</p>")
        if machines and machines.get(study):
            body.append(f"<p>{html.escape(machines[study])}</p>")
        body.append(_html_table(*_table_rows(mine, scale)))
        claims = _claim_rows(mine)
        if claims:
            body += ["<h3>Ranking claims</h3>",
                     _html_table(["table", "claim", "in the published numbers", "in ours"], claims)]
        if convergence and study in convergence:
            statements, tables = convergence_blocks(convergence[study])
            body += ["<h3>Convergence</h3>", *(f"<p>{_md_inline(t)}</p>" for t in statements)]
            for title, head, rows in tables:
                body += [f"<p>{html.escape(title)}:</p>", _html_table(head, rows)]
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>Scorecard</title>"
            f"<style>{_CSS}</style></head><body>{''.join(body)}</body></html>\n")


def build_scorecard(tables: list[tuple[str, dict, Path]], scale: str, md_out: Path, html_out: Path,
                    coverage: dict[str, tuple[int, int]] | None = None,
                    runs: dict[str, tuple[Path, Path]] | None = None) -> list[TableScore]:
    """Score every (study, table spec, cell CSV) and write the Markdown and HTML scorecards, with each
    study's published cells shown / published cells (``coverage``, fedrepro.report.coverage) and, given its
    (runs.csv, summary.csv) in ``runs``, its convergence section (fedrepro.report.convergence) and the machines
    its runs came from."""
    cells = [(study, spec, pd.read_csv(path)) for study, spec, path in tables]
    scores = [score_table(study, spec, table_cells) for study, spec, table_cells in cells]
    convergence = {
        study: study_convergence(study, pd.read_csv(runs_csv), pd.read_csv(summary_csv),
                                 [(spec, c) for s, spec, c in cells if s == study])
        for study, (runs_csv, summary_csv) in (runs or {}).items()
    }
    machines = {study: machines_line(pd.read_csv(summary_csv)) for study, (_, summary_csv) in (runs or {}).items()}
    write_text_atomic(render_markdown(scores, scale, coverage, convergence, machines), Path(md_out))
    write_text_atomic(render_html(scores, scale, coverage, convergence, machines), Path(html_out))
    return scores
