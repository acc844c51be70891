"""Made-up results in the layout the workflow writes them: every file a figure's or a table's job reads
(fedrepro.report.figure_kinds.figure_inputs; runs.csv, summary.csv, finetune.csv, finetune_curves.csv, partition
stats, a train job's seeds.json with one seed's embeddings.npz and true_update_cosines.npz), for given runs, so a
figure or table of any kind renders in seconds without training. The numbers are plausible, not meaningful: each
run's come from a generator seeded by its (setting, method, seed), so the same run gets the same numbers
whatever else is written."""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from fedrepro.io import atomic_write_json
from fedrepro.report.collect import CURVE_COLUMNS, FINETUNE_COLUMNS, PER_CLASS, SUMMARY_COLUMNS
from fedrepro.report.integrity import write_checked_csv

ROUNDS = 4
LAST_K = 2
CLIENT_SAMPLES = 60  # every client the same size, so similar-size pairs exist (weight_probe)
# per-round columns of runs.csv beyond the engine's basic ones: every quantity a figure's `y` may name
RUN_EXTRAS = ("train_acc", "jac_norm", "jac_var", "guide_norm", "train_ce", "coef_mean", "coef_std", "coef_min",
              "coef_max", "coef_neg_frac", "coef_grad_cos")


def _rng(*key: object) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32("|".join(map(str, key)).encode()))


def classes_of(study: dict, setting: str) -> int:
    """The classes a setting's partition is drawn over (the data set's, fedrepro.data.registry; else 10)."""
    from fedrepro.data.registry import PARTITION_CLASSES, SHAPES

    name = study["settings"][setting]["dataset"]
    return PARTITION_CLASSES.get(name, SHAPES[name][2] if name in SHAPES else 10)


def runs_frame(study: dict, runs: Iterable[tuple[str, str]], extra: Iterable[str] = ()) -> pd.DataFrame:
    """runs.csv: one row per run, seed and round, with ``extra`` numeric columns (a table's per-round metrics)."""
    rows = []
    for setting, method in runs:
        for seed in study["seeds"]:
            rng = _rng(setting, method, seed)
            for rnd in range(1, ROUNDS + 1):
                acc = 20 + 50 * (1 - math.exp(-rnd / 2)) + rng.normal(0, 2)
                cos = float(rng.uniform(-0.2, 0.8))
                rows.append({"study": study["name"], "setting": setting, "method": method, "seed": seed,
                             "round": rnd, "test_acc": acc, "test_loss": 2.5 - acc / 40, "train_loss": 2.4 - acc / 40,
                             "bytes_up": 1000 * rnd, "bytes_down": 1000 * rnd, "seconds": 0.5,
                             **{c: float(rng.uniform(0.1, 2.0)) for c in (*RUN_EXTRAS, *extra)},
                             "true_cos_mean": cos, "true_cos_min": cos - 0.1, "true_cos_max": cos + 0.1})
    return pd.DataFrame(rows)


def summary_frame(study: dict, runs: Iterable[tuple[str, str]]) -> pd.DataFrame:
    """summary.csv: one finished row per run and seed, with a per-class accuracy list."""
    rows = []
    for setting, method in runs:
        for seed in study["seeds"]:
            rng = _rng("summary", setting, method, seed)
            accs = sorted(rng.uniform(30, 80, ROUNDS))
            rows.append({"study": study["name"], "setting": setting, "method": method, "seed": seed,
                         "status": "complete", "diverged_round": None, "final_acc": accs[-1], "best_acc": accs[-1],
                         "last_k_acc": float(np.mean(accs[-LAST_K:])), "last_k": LAST_K, "seconds": 10.0,
                         PER_CLASS: json.dumps(rng.uniform(20, 90, classes_of(study, setting)).round(2).tolist())})
    return pd.DataFrame(rows, columns=[*SUMMARY_COLUMNS, PER_CLASS])


def finetune_frames(study: dict, runs: Iterable[tuple[str, str]]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """finetune.csv and finetune_curves.csv: every run fine-tuned for a few epochs."""
    rows, curves = [], []
    for setting, method in runs:
        for seed in study["seeds"]:
            rng = _rng("finetune", setting, method, seed)
            accs = (30 + 10 * np.arange(1, ROUNDS + 1) + rng.normal(0, 2, ROUNDS)).tolist()
            keys = {"study": study["name"], "setting": setting, "method": method, "seed": seed}
            rows.append({**keys, "status": "complete", "diverged_round": None, "target_acc": accs[-1],
                         "best_target_acc": max(accs)})
            curves += [{**keys, "epoch": e + 1, "train_acc": a + 5, "train_loss": 2 - a / 50, "test_acc": a,
                        "test_loss": 2.1 - a / 50} for e, a in enumerate(accs)]
    return pd.DataFrame(rows, columns=FINETUNE_COLUMNS), pd.DataFrame(curves, columns=CURVE_COLUMNS)


def partition_stats(study: dict, setting: str, seed: int) -> dict:
    """A partition's stats (fedrepro.partition.partition_stats) with Dirichlet class shares per client."""
    rng = _rng("partition", setting, seed)
    clients, classes = study["settings"][setting]["partition"]["clients"], classes_of(study, setting)
    counts = [rng.multinomial(CLIENT_SAMPLES, rng.dirichlet([0.5] * classes)).tolist() for _ in range(clients)]
    return {"clients": clients, "sizes": [CLIENT_SAMPLES] * clients, "class_counts": counts, "num_classes": classes,
            "dropped": 0, "dropped_class_counts": [0] * classes, "spec": study["settings"][setting]["partition"]}


def write_seed_files(study: dict, index: Path) -> None:
    """A train job's seeds.json and, in each seed's folder, what a tsne (embeddings.npz) and an update_cosine
    (true_update_cosines.npz) figure read."""
    from fedrepro.asyncfl.job import TRUE_UPDATES
    from fedrepro.hetero.job import EMBEDDINGS

    index.parent.mkdir(parents=True, exist_ok=True)
    for seed in study["seeds"]:
        rng = _rng("seed files", index, seed)
        run = index.parent / f"seed{seed}"
        run.mkdir(exist_ok=True)
        anchors = rng.normal(size=(3, 4)) * 5
        labels = np.repeat(np.arange(3), 8)
        np.savez(run / EMBEDDINGS, anchors=anchors.astype(np.float32), space=np.array("feature"),
                 features=(anchors[labels] + rng.normal(size=(len(labels), 4))).astype(np.float32), labels=labels,
                 clients=np.tile(np.repeat(np.arange(2), 4), 3))
        cosines = np.clip(np.eye(ROUNDS) + rng.uniform(-0.3, 0.3, (ROUNDS, ROUNDS)), -1, 1)
        np.savez(run / TRUE_UPDATES, rounds=np.arange(1, ROUNDS + 1), cosines=cosines)
    atomic_write_json(index, {"runs": [{"seed": s, "dir": f"seed{s}", "status": "complete"} for s in study["seeds"]]})


def write_inputs(study: dict, paths: Iterable[str | Path], runs: Iterable[tuple[str, str]],
                 extra: Iterable[str] = ()) -> None:
    """Write each file of ``paths`` (as figure_inputs or the table rule names them) for the ``runs`` it must
    hold; ``extra``: more per-round columns of runs.csv (the metrics a table derives from the curves)."""
    runs, extra = list(runs), list(extra)
    for path in map(Path, paths):
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.name == "runs.csv":
            write_checked_csv(runs_frame(study, runs, extra), path)
        elif path.name == "summary.csv":
            write_checked_csv(summary_frame(study, runs), path)
        elif path.name in ("finetune.csv", "finetune_curves.csv"):
            summary, curves = finetune_frames(study, runs)
            write_checked_csv(summary if path.name == "finetune.csv" else curves, path)
        elif path.name == "seeds.json":
            write_seed_files(study, path)
        elif path.parent.parent.name == "partitions":
            atomic_write_json(path, partition_stats(study, path.parent.name, int(path.stem.removeprefix("seed"))),
                              checksum=True)
        else:
            raise ValueError(f"no synthetic content for {path}")


def table_extras(table: dict) -> list[str]:
    """The per-round columns a table's cells derive from runs.csv (metrics not in summary.csv)."""
    from fedrepro.report.derived import SUMMARY_METRICS
    from fedrepro.report.table_sources import table_metrics

    return sorted(m for m in table_metrics(table) if m not in SUMMARY_METRICS and m != "rounds_to_acc")
