"""Render one study table (markdown, LaTeX, tidy CSV) with the published numbers beside ours."""

from __future__ import annotations

import html
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from fedrepro.report.collect import write_csv_atomic, write_text_atomic
from fedrepro.report.convergence import (
    BEST_OVER_ROUNDS,
    LAST_K_MAX,
    PLATEAU_POINTS,
    QUARTER_MEAN,
    cell_rule,
    plateau_change_column,
)
from fedrepro.report.derived import lower_is_better, metric_key
from fedrepro.report.deviations import deviation_href, deviations_sentence, linked_deviations
from fedrepro.report.published import lookup
from fedrepro.study import average_sources, table_cell, table_cell_method, table_cell_setting

METRICS = {
    "final_acc": "test accuracy after the last round",
    "best_acc": "best test accuracy over rounds",
    "last_k_acc": "mean test accuracy over the last {k} evaluations",
    "last_k_max_acc": "maximum test accuracy over the last {k} evaluations",
    "last_k_sd_acc": "sd of test accuracy over the last {k} evaluations of a run",
    "target_acc": "target-domain test accuracy after fine-tuning the pre-trained model",
    "best_target_acc": "best target-domain test accuracy over the fine-tuning epochs",
    "bound": "value of the convergence bound (numerical simulation, no training)",
}
EMBEDDED_NOTE = (
    "These runs use the small embedded data sets, models and round budgets, while the published numbers "
    "come from the paper's own data sets at full scale, so the two are not comparable: only the rankings "
    "of methods can be compared."
)
# an embedded table whose spec sets compare_levels: the paper's own data, reduced, so levels compare too
LEVELS_NOTE = (
    "These runs use the paper's own data set at laptop scale, reduced in samples, epochs and rounds (see the "
    "table's deviations from the paper), so their levels compare with the published numbers as well as the "
    "rankings of methods."
)
CSV_COLUMNS = [
    "row",
    "column",
    "n_seeds",
    "ours_mean",
    "ours_std",
    "paper_mean",
    "paper_std",
    "diff",
    "status",
    "method",
    "setting",
    "n_diverged",
    "n_moving",
]
DAGGER = "†"
MOVING = "‡"  # seeds not at their plateau (fedrepro.report.convergence)
# what a plateau rule's change measures, for a cell's footnote
_CHANGE_OF = {
    LAST_K_MAX: "the max over the last quarter of evaluations minus the max over the quarter before",
    BEST_OVER_ROUNDS: "the best over all evaluations minus the best over the first three quarters",
    QUARTER_MEAN: "the mean of the last quarter of evaluations minus the mean of the quarter before",
}
DASH = "—"


@dataclass
class _Cell:
    method: str
    setting: str
    row: str
    column: str
    n_runs: int = 0
    values: list[float] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)  # the seed of each of `values`
    diverged_rounds: list[int | None] = field(default_factory=list)
    paper: tuple[float, float | None] | None = None
    bold: bool = False
    rule: str | None = None  # the plateau rule of its number (accuracy cells of runs with curves)
    moving: list[tuple[int, float]] = field(default_factory=list)  # (seed, change) of its runs still moving

    @property
    def status(self) -> str:
        if self.values:
            return "partial" if self.diverged_rounds else "ok"
        return "diverged" if self.diverged_rounds else "missing"

    @property
    def mean(self) -> float:
        return sum(self.values) / len(self.values) if self.values else math.nan

    @property
    def std(self) -> float:
        # Sample std (n-1), as pandas and most papers' "mean ± std over trials" report it.
        n = len(self.values)
        if n < 2:
            return math.nan
        m = sum(self.values) / n  # not self.mean: an average cell's mean is over its cells' own seeds
        return math.sqrt(sum((v - m) ** 2 for v in self.values) / (n - 1))

    @property
    def diff(self) -> float:
        return self.mean - self.paper[0] if self.paper and self.status in ("ok", "partial") else math.nan

    def diverged_text(self) -> str:
        rounds = sorted({r for r in self.diverged_rounds if r is not None})
        if not rounds:
            return "diverged"
        word = "round" if len(rounds) == 1 else "rounds"
        return f"diverged ({word} {', '.join(map(str, rounds))})"

    def footnote(self) -> str:
        return (f"{DAGGER} {self.row}, {self.column}: {len(self.diverged_rounds)} of {self.n_runs} seeds "
                f"{self.diverged_text()}; mean over the other {len(self.values)}.")

    def marks(self) -> str:
        return (DAGGER if self.status == "partial" else "") + (MOVING if self.moving else "")

    def moving_footnote(self) -> str:
        seeds = ", ".join(f"seed {seed} {delta:+.2f}" for seed, delta in self.moving)
        plural = "seed" if len(self.values) == 1 else "seeds"
        return f"{MOVING} {self.row}, {self.column}: {len(self.moving)} of {len(self.values)} {plural} ({seeds})."


@dataclass
class _AverageCell(_Cell):
    """A cell of an `average_of` column: the mean over other cells of its row, as a paper's "Average"
    column is the mean of the printed means of its row (FedGTST's Tables 1-3 and 6-10). Its ± is the sample sd
    over seeds of each seed's mean over those cells, taken on the seeds all of them have. It has a number
    only when every averaged cell has one: a mean over fewer columns is not the paper's Average."""

    sources: list[_Cell] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.n_runs = max((s.n_runs for s in self.sources), default=0)
        self.diverged_rounds = [r for s in self.sources for r in s.diverged_rounds]
        if self.status == "missing":
            return
        by_seed = [dict(zip(s.seeds, s.values, strict=True)) for s in self.sources]
        self.seeds = sorted(set.intersection(*(set(seeds) for seeds in by_seed)))
        self.values = [sum(seeds[k] for seeds in by_seed) / len(by_seed) for k in self.seeds]

    @property
    def status(self) -> str:
        statuses = {s.status for s in self.sources}
        if statuses & {"missing", "diverged"} or not statuses:
            return "missing"
        return "partial" if "partial" in statuses else "ok"

    @property
    def mean(self) -> float:
        if self.status == "missing":
            return math.nan
        return sum(s.mean for s in self.sources) / len(self.sources)

    def footnote(self) -> str:
        partial = [s.column for s in self.sources if s.status == "partial"]
        return (f"{DAGGER} {self.row}, {self.column}: the mean over cells with diverged seeds ({', '.join(partial)}); "
                f"its ± over the {len(self.values)} seeds none of them lost.")


def decimals(x: float) -> int:
    """Two decimals, or more for a small non-zero magnitude so it keeps three significant digits (FedL2G's
    measured MB and seconds per round at laptop scale are ~0.001; accuracies keep the papers' two)."""
    if x == 0 or math.isnan(x) or abs(x) >= 0.1:
        return 2
    return min(6, 2 - math.floor(math.log10(abs(x))))


def _num(x: float, sign: str = "") -> str:
    return f"{x:{sign}.{decimals(x)}f}"


def _pm(mean: float, std: float | None, sep: str) -> str:
    if std is None or math.isnan(std):
        return _num(mean)
    return f"{_num(mean)}{sep}{std:.{decimals(mean)}f}"


def _signed(x: float) -> str:
    return _num(x, "+")


cell_method = table_cell_method  # the method of a cell (see fedrepro.config.table_cell_method)


def paper_key(spec: dict, row: dict, column: dict) -> tuple[str, str] | None:
    """The published (row, column) a cell mirrors. By default (row.paper, column.paper); a table whose
    layout differs from the paper's gives ``paper_key`` format strings over {row[...]} and {col[...]}
    (e.g. a transposed table: {"row": "{col[paper]}", "column": "{row[paper]}"})."""
    fmt = spec.get("paper_key") or {"row": "{row[paper]}", "column": "{col[paper]}"}
    if "paper_column" in (entry := table_cell(row, column)):
        # e.g. a run shared by several columns sits beside the paper's one number for all of them
        column = {**column, "paper": entry["paper_column"]}
    present = ({k: v for k, v in row.items() if v is not None}, {k: v for k, v in column.items() if v is not None})
    try:
        return fmt["row"].format(row=present[0], col=present[1]), fmt["column"].format(row=present[0], col=present[1])
    except KeyError:
        return None  # a cell the paper has no number for


def printed_elsewhere(published: pd.DataFrame, table: str, row: str, column: str) -> bool:
    """Whether the paper's ``table`` prints both ``row`` and ``column``, in other cells."""
    cells = published[published["table"] == table]
    return bool((cells["row"] == row).any() and (cells["column"] == column).any())


def _build_cells(spec: dict, summary: pd.DataFrame, published: pd.DataFrame | None) -> list[list[_Cell]]:
    metrics = {metric_key(spec, c) for c in spec["columns"]}
    needed = ("setting", "method", "status", "diverged_round", *sorted(metrics))
    missing = [c for c in needed if c not in summary.columns]
    if missing:
        raise ValueError(f"table {spec['name']}: summary lacks columns {missing}")
    table = spec.get("paper_table")
    grid: list[list[_Cell]] = []
    for r in spec["rows"]:
        line = []
        for c in spec["columns"]:
            if "average_of" in c:
                line.append(None)  # filled in below, from the cells of the line it averages
                continue
            method, setting, metric = cell_method(r, c), table_cell_setting(r, c), metric_key(spec, c)
            cell = _Cell(method, setting, r["label"], c["label"])
            runs = summary[(summary["method"] == method) & (summary["setting"] == setting)]
            if table_cell(r, c).get("not_applicable"):  # a dash, even where the grid runs the method for another table
                runs = runs.iloc[0:0]
            if "study" in runs.columns and runs["study"].nunique() > 1:
                raise ValueError(
                    f"table {spec['name']}: cell ({method}, {setting}) mixes studies "
                    f"{sorted(runs['study'].unique())}; pass one study's summary"
                )
            cell.n_runs = len(runs)
            seeds = runs["seed"] if "seed" in runs.columns else range(len(runs))
            if metric.endswith("_acc"):
                cell.rule = cell_rule(spec, c, setting, method)
            change_col = plateau_change_column(cell.rule) if cell.rule else None  # None: not an accuracy cell
            changes = runs[change_col] if change_col in runs.columns else pd.Series(math.nan, runs.index)
            for status, value, dr, seed, change in zip(runs["status"], runs[metric], runs["diverged_round"], seeds,
                                                       changes, strict=True):
                if status == "diverged":
                    cell.diverged_rounds.append(int(dr) if pd.notna(dr) else None)
                elif pd.notna(value):
                    cell.values.append(float(value))
                    cell.seeds.append(int(seed))
                    if pd.notna(change) and abs(change) > PLATEAU_POINTS:
                        cell.moving.append((int(seed), float(change)))
            line.append(cell)
        for j, c in enumerate(spec["columns"]):
            if "average_of" in c:
                sources = [line[k] for k in average_sources(spec, c)]
                line[j] = _AverageCell(r["method"], "average(" + ", ".join(s.setting for s in sources) + ")",
                                       r["label"], c["label"], sources=sources)
        for c, cell in zip(spec["columns"], line, strict=True):
            key = paper_key(spec, r, c) if table and published is not None else None
            if key:
                cell.paper = lookup(published, table, *key)
                if cell.paper is not None and c.get("paper_value") == "std":
                    # the column holds the published cell's ± (e.g. Table 10's sd over rounds), not its mean
                    cell.paper = None if cell.paper[1] is None else (cell.paper[1], None)
                if cell.paper is None and not printed_elsewhere(published, table, *key):
                    # Probably a typo in the study file; the table still renders without the number. (A row
                    # and a column the paper prints, just not together, is a cell it leaves empty: FedL2G's
                    # bracketed warm-up seconds exist for its own rows only.)
                    warnings.warn(f"table {spec['name']}: no published cell ({table!r}, {key[0]!r}, {key[1]!r})",
                                  stacklevel=3)
        grid.append(line)
    # Bold the best of our means per column (ties at the printed precision all bold).
    for j, column in enumerate(spec["columns"]):
        col = [line[j] for line in grid if line[j].status in ("ok", "partial")]
        if len(col) >= 2:
            pick = min if lower_is_better(metric_key(spec, column)) else max
            best = pick(round(c.mean, decimals(c.mean)) for c in col)
            for c in col:
                c.bold = round(c.mean, decimals(c.mean)) == best
    return grid


def _describe(spec: dict, summary: pd.DataFrame, grid: list[list[_Cell]]) -> str:
    metric = spec["metric"]
    what = METRICS[metric]
    if metric in ("last_k_acc", "last_k_max_acc"):
        ks = sorted({int(k) for k in summary.get("last_k", pd.Series(dtype=float)).dropna()})
        what = what.format(k=ks[0] if len(ks) == 1 else "k")
    ns = sorted({c.n_runs for line in grid for c in line if c.n_runs})
    seeds = "" if not ns else (f"{ns[0]}" if len(ns) == 1 else f"{ns[0]}–{ns[-1]}")
    plural = "seed" if ns == [1] else "seeds"
    over = f", mean ± std over {seeds} {plural} (sample std)" if ns else ""
    unit = "" if metric == "bound" else " (%)"
    return f"Cells: {what}{unit}{over}."


def _footnotes(grid: list[list[_Cell]]) -> list[str]:
    cells = [c for line in grid for c in line]
    notes = [c.footnote() for c in cells if c.status == "partial"]
    moving = [c for c in cells if c.moving]
    if moving:
        rules = dict.fromkeys(c.rule for c in moving)  # in order of appearance
        changes = "; ".join(_CHANGE_OF[rule] for rule in rules)
        notes.append(f"{MOVING} seeds not at their plateau ({changes}: beyond ±{PLATEAU_POINTS:g} point): the number "
                     "is where these runs stopped, not where they would settle. By cell, each such seed's change:")
        notes += [c.moving_footnote() for c in moving]
    return notes


def _shared_run_notes(spec: dict) -> list[str]:
    """Say which cells repeat one run (a row's ``cells`` entry naming a `setting`), so equal numbers across columns
    read as intended rather than as a copying mistake."""
    notes = []
    for r in spec["rows"]:
        for shared in (e for e in r.get("cells", []) if "setting" in e):
            labels = [c["label"] for c in spec["columns"] if table_cell(r, c) is shared]
            if len(labels) > 1:
                notes.append(f"{r['label']}: one run (setting {shared['setting']}) fills {', '.join(labels)}; "
                             "it does not depend on what these columns vary.")
    return notes


def _md_escape(text: str) -> str:
    return str(text).replace("|", r"\|")


def _md_ours(c: _Cell) -> str:
    if c.status == "missing":
        return DASH
    if c.status == "diverged":
        return c.diverged_text()
    text = _pm(c.mean, c.std, " ± ")
    text = f"**{text}**" if c.bold else text
    return text + c.marks()


def _render_md(spec: dict, grid, has_paper: list[bool], intro: list[str], notes: list[str],
               links: list[tuple[str, str]] = ()) -> str:
    head, align = ["Method"], ["---"]
    for c, hp in zip(spec["columns"], has_paper, strict=True):
        head.append(_md_escape(c["label"]))
        align.append("---:")
        if hp:
            head += [f"{_md_escape(c['label'])}: paper", f"{_md_escape(c['label'])}: Δ"]
            align += ["---:", "---:"]
    lines = [f"### {spec['caption']} (`{spec['name']}`)", ""]
    for para in intro:
        lines += [para, ""]
    lines += ["| " + " | ".join(head) + " |", "|" + "|".join(align) + "|"]
    for r, line in zip(spec["rows"], grid, strict=True):
        cells = [_md_escape(r["label"])]
        for c, hp in zip(line, has_paper, strict=True):
            cells.append(_md_ours(c))
            if hp:
                cells.append(_pm(c.paper[0], c.paper[1], " ± ") if c.paper else DASH)
                cells.append(_signed(c.diff) if not math.isnan(c.diff) else DASH)
        lines.append("| " + " | ".join(cells) + " |")
    if notes:
        lines += ["", *notes]
    if links:
        lines += ["", "Deviations from the paper: " + ", ".join(f"[{d}]({href})" for d, href in links) + "."]
    return "\n".join(lines) + "\n"


_TEX_SPECIAL = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    # Unicode the papers' labels use, so the fragment compiles without extra packages.
    "±": r"$\pm$",
    "→": r"$\rightarrow$",
    "×": r"$\times$",
    "√": r"$\surd$",
    "ρ": r"$\rho$",
    "η": r"$\eta$",
    "λ": r"$\lambda$",
    "Δ": r"$\Delta$",
    "—": "---",
    "–": "--",
    "†": r"$^\dagger$",
    "‡": r"$^\ddagger$",
    "−": "$-$",
    "“": "``",
    "”": "''",
}


def tex_escape(text: str) -> str:
    """Escape LaTeX specials (and a few Unicode symbols) in a plain-text label."""
    return "".join(_TEX_SPECIAL.get(ch, ch) for ch in str(text))


def _tex_ours(c: _Cell) -> str:
    if c.status == "missing":
        return "--"
    if c.status == "diverged":
        return tex_escape(c.diverged_text())
    text = _pm(c.mean, c.std, r" $\pm$ ")
    text = rf"\textbf{{{text}}}" if c.bold else text
    return text + tex_escape(c.marks())


def _render_tex(spec: dict, grid, has_paper: list[bool], intro: list[str], notes: list[str],
                deviations: list[str] = ()) -> str:
    ncols = 1 + sum(3 if hp else 1 for hp in has_paper)
    top, sub, rules = ["Method"], [""], []
    pos = 2
    for c, hp in zip(spec["columns"], has_paper, strict=True):
        label = tex_escape(c["label"])
        if hp:
            top.append(rf"\multicolumn{{3}}{{c}}{{{label}}}")
            sub += ["ours", "paper", r"$\Delta$"]
            rules.append(rf"\cmidrule(lr){{{pos}-{pos + 2}}}")
            pos += 3
        else:
            top.append(label)
            sub.append("")
            pos += 1
    lines = [
        r"\begin{table}[t]",
        r"\centering",
        rf"\caption{{{tex_escape(spec['caption'])}}}",
        rf"\label{{tab:{spec['name']}}}",
        rf"\begin{{tabular}}{{l{'r' * (ncols - 1)}}}",
        r"\toprule",
        " & ".join(top) + r" \\",
    ]
    if any(has_paper):
        lines += [" ".join(rules), " & ".join(sub) + r" \\"]
    lines.append(r"\midrule")
    for r, line in zip(spec["rows"], grid, strict=True):
        cells = [tex_escape(r["label"])]
        for c, hp in zip(line, has_paper, strict=True):
            cells.append(_tex_ours(c))
            if hp:
                cells.append(_pm(c.paper[0], c.paper[1], r" $\pm$ ") if c.paper else "--")
                cells.append(_signed(c.diff) if not math.isnan(c.diff) else "--")
        lines.append(" & ".join(cells) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    # plain text, not \\href: the fragment compiles without hyperref
    text = [tex_escape(t) for t in [*intro, *notes, *([deviations_sentence(deviations)] if deviations else [])] if t]
    if text:
        lines += [r"\par\smallskip\footnotesize", r"\par ".join(text)]
    lines.append(r"\end{table}")
    return "\n".join(lines) + "\n"


_HTML_CSS = """body{font-family:system-ui,sans-serif;margin:1em;color:#222}
table{border-collapse:collapse}th,td{padding:.25em .6em;border-bottom:1px solid #ddd;text-align:right}
td{white-space:nowrap}
th:first-child,td:first-child{text-align:left}th{background:#f3f3f3}.paper{color:#666}p{max-width:60em}"""


def _html_ours(c: _Cell) -> str:
    if c.status in ("missing", "diverged"):
        return html.escape(_md_ours(c))
    text = html.escape(_pm(c.mean, c.std, " ± "))
    text = f"<b>{text}</b>" if c.bold else text
    return text + c.marks()


def _render_html(spec: dict, grid, has_paper: list[bool], intro: list[str], notes: list[str],
                 links: list[tuple[str, str]] = ()) -> str:
    """A standalone HTML page of the table (the Snakemake report shows HTML, not Markdown)."""
    head = ["<th>Method</th>"]
    for c, hp in zip(spec["columns"], has_paper, strict=True):
        head.append(f"<th>{html.escape(c['label'])}</th>")
        if hp:
            head += [f'<th class="paper">{html.escape(c["label"])}: paper</th>', '<th class="paper">Δ</th>']
    body = []
    for r, line in zip(spec["rows"], grid, strict=True):
        cells = [f"<td>{html.escape(r['label'])}</td>"]
        for c, hp in zip(line, has_paper, strict=True):
            cells.append(f"<td>{_html_ours(c)}</td>")
            if hp:
                paper = _pm(c.paper[0], c.paper[1], " ± ") if c.paper else DASH
                diff = _signed(c.diff) if not math.isnan(c.diff) else DASH
                cells += [f'<td class="paper">{html.escape(paper)}</td>', f'<td class="paper">{diff}</td>']
        body.append("<tr>" + "".join(cells) + "</tr>")
    title = html.escape(f"{spec['caption'] or spec['name']} ({spec['name']})")
    paras = "".join(f"<p>{html.escape(t)}</p>" for t in intro + notes if t)
    if links:
        anchors = ", ".join(f'<a href="{html.escape(href)}">{html.escape(d)}</a>' for d, href in links)
        paras += f"<p>Deviations from the paper: {anchors}.</p>"
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{title}</title><style>{_HTML_CSS}</style>"
            f"</head><body><h2>{title}</h2><table><thead><tr>{''.join(head)}</tr></thead>"
            f"<tbody>{''.join(body)}</tbody></table>{paras}</body></html>\n")


def _with(stem: Path, suffix: str) -> Path:
    # Not Path.with_suffix: a stem such as "t1.niid" would lose its ".niid".
    return stem.parent / (stem.name + suffix)


def render_table(
    spec: dict, summary: pd.DataFrame, published: pd.DataFrame | None, out_stem: Path, scale: str
) -> pd.DataFrame:
    """Write ``out_stem``.md/.tex/.html/.csv for one table spec and return the tidy cell frame.

    A cell is mean ± std over seeds of ``spec["metric"]``; diverged seeds are left out of the mean
    (and marked), an all-diverged cell says so, an empty cell shows a dash. An accuracy cell some of whose
    seeds are not at their plateau by the rule of its number (fedrepro.report.convergence; the frame's
    ``plateau_change[...]`` columns) is marked ‡ and its footnote gives each such seed's change. Where the row,
    column and ``paper_table`` map to a published cell, the paper's value and ours − paper are shown beside it.
    """
    if spec.get("metric") not in METRICS:
        raise ValueError(f"table {spec.get('name')}: metric {spec.get('metric')!r} not in {sorted(METRICS)}")
    if not spec.get("rows") or not spec.get("columns"):
        raise ValueError(f"table {spec.get('name')}: needs at least one row and one column")
    out_stem = Path(out_stem)
    grid = _build_cells(spec, summary, published)
    has_paper = [any(line[j].paper for line in grid) for j in range(len(spec["columns"]))]

    intro = [_describe(spec, summary, grid)]
    if any(has_paper):
        paper = ""
        if published is not None and published["paper"].nunique() == 1:
            paper = f"{published['paper'].iloc[0]} "
        intro.append(f"“paper” is the published value from {paper}{spec['paper_table']}; Δ = ours − paper.")
    if scale == "embedded":
        intro.append(LEVELS_NOTE if spec.get("compare_levels") else EMBEDDED_NOTE)
    notes = _shared_run_notes(spec) + _footnotes(grid)
    deviations = linked_deviations(spec)
    # links relative to the table's folder: they hold wherever the results root lies in the checkout
    links = [(d, deviation_href(d, out_stem.parent)) for d in deviations]

    write_text_atomic(_render_md(spec, grid, has_paper, intro, notes, links), _with(out_stem, ".md"))
    write_text_atomic(_render_tex(spec, grid, has_paper, intro, notes, deviations), _with(out_stem, ".tex"))
    write_text_atomic(_render_html(spec, grid, has_paper, intro, notes, links), _with(out_stem, ".html"))

    tidy = pd.DataFrame(
        [
            {
                "row": c.row,
                "column": c.column,
                "n_seeds": len(c.values),
                "ours_mean": c.mean,
                "ours_std": c.std,
                "paper_mean": c.paper[0] if c.paper else math.nan,
                "paper_std": c.paper[1] if c.paper and c.paper[1] is not None else math.nan,
                "diff": c.diff,
                "status": c.status,
                "method": c.method,
                "setting": c.setting,
                "n_diverged": len(c.diverged_rounds),
                "n_moving": len(c.moving),
            }
            for line in grid
            for c in line
        ],
        columns=CSV_COLUMNS,
    )
    write_csv_atomic(tidy, _with(out_stem, ".csv"))
    return tidy
