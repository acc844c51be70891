"""Would a tuning stage choose the same point on fewer rounds? Its finished runs, cut at shorter horizons.

    python -m fedrepro.tuning_horizon --configfile config/laptop-feddle-table5.yaml --study feddle-table5 \
        [--stages clients server_fedbuff ...] [--horizons 50 100 150]

A grid's runs are the study's longest jobs; tuning on fewer rounds would cut their cost, but only where the ranking
the full protocol gives survives the cut (issue 49). For each stage whose runs are aggregated (<results>/<study>
--tune-<stage>/runs.csv and summary.csv, checked against their sha256), this scores every grid point as the stage
does (fedrepro.tuning: the stage's metric over its settings and seeds), from each run's curve up to each horizon
(evaluations at or before that round; a run of a constant learning rate trained to R rounds has that same curve up
to R, though its own "last k" evaluations fall at other rounds), and prints per horizon each method's choice, its
score, the full horizon's choice's rank there, and the Spearman correlation of the points' scores with the full
horizon's. Only a metric read off the curve can be cut (last_k_max_acc, last_k_sd_acc); a run that diverged is
left out at every horizon, as the stage leaves it out.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from fedrepro.config import TUNING_SEPARATOR, add_configfile_option, command_config
from fedrepro.report.derived import LAST_K_MAX, LAST_K_SD
from fedrepro.study import ConfigError, unknown_name
from fedrepro.tuning import TuningError, choose, chosen_by_group, point_scores, stage_params

CURVE_METRICS = (LAST_K_MAX, LAST_K_SD)


def horizon_table(stage: dict, runs: pd.DataFrame, summary: pd.DataFrame, horizons: list[int]) -> pd.DataFrame:
    """One row per horizon (``horizons``, then the runs' full length) and tuned method: the point the stage would
    choose from the curves cut at that round, its score, the rank there of the full horizon's choice (1: the same
    choice) and the Spearman correlation of every point's score with the full horizon's."""
    if stage["metric"] not in CURVE_METRICS:
        raise TuningError(f"tuning stage {stage['stage']}: its metric {stage['metric']!r} is not read off the curve "
                          f"(one of {', '.join(CURVE_METRICS)}), so its runs cannot be cut at a shorter horizon")
    full = int(runs["round"].max())
    if bad := [h for h in horizons if not 0 < h < full]:
        raise TuningError(f"tuning stage {stage['stage']}: horizons {bad} are not between 0 and the runs' "
                          f"{full} rounds")
    scored = {}
    for horizon in [*sorted(set(horizons)), full]:
        scores = point_scores(stage, runs[runs["round"] <= horizon], summary)
        scored[horizon] = (scores, chosen_by_group({"per": stage.get("per"), "chosen": choose(stage, scores)}))
    full_scores, full_chosen = scored[full]
    rows = []
    for horizon, (scores, chosen) in scored.items():
        for group, picks in chosen.items():
            for method, picked in picks.items():
                mine = [v for v, p in stage["variants"].items() if p["method"] == method]
                now, then = (_group_scores(frame, group)[mine] for frame in (scores, full_scores))
                ranks = now.rank(ascending=False, method="min")
                rows.append({"horizon": horizon, **({} if group is None else {"group": group}), "method": method,
                             "chosen": picked["variant"], "score": picked["score"],
                             "full_choice_rank": int(ranks[full_chosen[group][method]["variant"]]),
                             "points": len(mine), "spearman": float(now.corr(then, method="spearman"))})
    return pd.DataFrame(rows)


def _group_scores(scores: pd.DataFrame, group: str | None) -> pd.Series:
    """Each grid point's score (by variant) in ``group`` of a stage chosen `per` a setting key, or of the stage."""
    mine = scores if group is None else scores[scores["group"] == group]
    return mine.set_index("variant")["score"]


def _markdown(stage: dict, table: pd.DataFrame) -> str:
    lines = [f"## {stage['stage']}", "", "| rounds | method | chosen | score | full choice's rank | Spearman vs full |",
             "|---:|---|---|---:|---:|---:|"]
    for row in table.to_dict("records"):
        who = row["method"] + (f" ({row['group']})" if isinstance(row.get("group"), str) else "")
        lines.append(f"| {row['horizon']} | {who} | {row['chosen']} | {row['score']:.2f} | "
                     f"{row['full_choice_rank']} of {row['points']} | {row['spearman']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_configfile_option(parser)
    parser.add_argument("--study", required=True, help="a study with a `tuning` block")
    parser.add_argument("--stages", nargs="+", help="its stages (default: every stage whose runs are aggregated)")
    parser.add_argument("--horizons", nargs="+", type=int, default=[50, 100, 150], help="rounds to cut at")
    args = parser.parse_args(argv)
    from fedrepro.report.integrity import read_checked_csv

    try:
        config = command_config(args.configfile)
        results = Path(config["results_dir"])
        if problem := unknown_name(args.study, config["studies"], "study"):
            raise TuningError(problem)
        tuned_by = config["studies"][args.study].get("tuned_by") or []
        if not tuned_by:
            raise TuningError(f"study {args.study} has no tuning stages")
        names = args.stages or [t["stage"] for t in tuned_by
                                if (results / f"{args.study}{TUNING_SEPARATOR}{t['stage']}" / "runs.csv").is_file()]
        for name in names:
            stage = stage_params(config, args.study, name)
            runs_dir = results / f"{args.study}{TUNING_SEPARATOR}{name}"
            if not (runs_dir / "runs.csv").is_file():
                raise TuningError(f"tuning stage {name}: {runs_dir}/runs.csv is not there yet (run the stage)")
            table = horizon_table(stage, read_checked_csv(runs_dir / "runs.csv"),
                                  read_checked_csv(runs_dir / "summary.csv"), args.horizons)
            print(_markdown(stage, table))
    except (ConfigError, TuningError) as err:
        sys.exit(f"{', '.join(args.configfile)}: {err}")


if __name__ == "__main__":
    main()
