"""A refactor of the report must not change what it renders. Every table of every shipped config (the embedded
default, paper, laptop-full, Feddle's 600-round baselines and Table 5 study, and the own-study example) is
rendered from made-up results (tests/support/synthetic_results.py) through the table job's own path
(table_sources.table_spec, pipeline.table), and every figure's job spec, inputs and caption are taken as the
workflow builds them (figure_kinds.figure_spec, figure_inputs, figure_caption); the digests of all of it
must equal tests/data/rendered_digests.json.

A change that is meant to move a table or a figure's spec regenerates the file, and its diff names what moved:

    .venv/bin/python tests/report/test_rendering_unchanged.py --update

(The figures' pixels are not digested here: tests/report/test_figure_kinds.py renders each kind, and drawing every
figure of four configs would take a minute.)"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DIGESTS = REPO / "tests" / "data" / "rendered_digests.json"
CONFIGS = {
    "default": ["config/config.yaml"],
    "paper": ["config/config.yaml", "config/paper.yaml"],
    "laptop-full": ["config/config.yaml", "config/laptop-full.yaml"],
    "laptop-feddle-600": ["config/config.yaml", "config/laptop-feddle-600.yaml"],
    "laptop-feddle-table5": ["config/config.yaml", "config/laptop-feddle-table5.yaml"],
    "own-study": ["config/config.yaml", "config/examples/own-study.yaml"],
}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def rendered_digests(work: Path) -> dict[str, str]:
    """{config/study/tables|figures/name[.suffix]: sha256} of everything the report renders from made-up results,
    rendered in ``work`` as the working directory (a caption's links are relative to it, as in a workflow run)."""
    here = Path.cwd()
    os.chdir(work)
    try:
        return _rendered_digests()
    finally:
        os.chdir(here)


def _rendered_digests() -> dict[str, str]:
    from support.synthetic_results import table_extras, write_inputs

    from fedrepro import pipeline
    from fedrepro.config import merge_configfiles, resolve_config
    from fedrepro.report.captions import figure_caption, table_caption
    from fedrepro.report.figure_kinds import figure_inputs, figure_spec
    from fedrepro.report.table_sources import table_source, table_spec
    from fedrepro.study import table_runs

    digests = {}
    for label, files in CONFIGS.items():
        config = resolve_config(merge_configfiles(*files, root=REPO), root=REPO)
        scale = config["scale"]
        for name, study in config["studies"].items():
            folder = Path(label) / name
            for t in study["tables"]:
                spec = table_spec(study, t)
                source = table_source(spec["source"])
                cells, runs = (folder / t / source.cells_from, folder / t / "runs.csv") if source.has_runs else (
                    None, None)
                if source.has_runs:
                    write_inputs(study, [cells, runs], table_runs(spec), table_extras(spec))
                paper = REPO / "config" / "paper" / f"{study['paper']}.csv" if study["paper"] else None
                out = folder / "tables" / t
                out.parent.mkdir(parents=True, exist_ok=True)
                pipeline.table(spec, cells, runs, paper, out, scale, log=lambda _: None)
                for path in sorted(out.parent.glob(f"{t}.*")):
                    digests[f"{label}/{name}/tables/{path.name}"] = _sha(path.read_bytes())
                digests[f"{label}/{name}/tables/{t} caption"] = _sha(
                    json.dumps(table_caption(spec, scale), sort_keys=True).encode())
            for f in study["figures"]:
                spec = figure_spec(study, f)
                job = {"spec": spec, "inputs": figure_inputs(study, study["figures"][f], f"results/{name}"),
                       "caption": figure_caption(spec, scale)}
                digests[f"{label}/{name}/figures/{f}"] = _sha(json.dumps(job, sort_keys=True, default=str).encode())
    return digests


def test_every_table_and_figure_job_renders_as_recorded(tmp_path) -> None:
    recorded = json.loads(DIGESTS.read_text())
    now = rendered_digests(tmp_path)
    changed = sorted(k for k in recorded.keys() & now.keys() if recorded[k] != now[k])
    assert not changed and now.keys() == recorded.keys(), (
        f"rendered differently: {changed[:20]}; new: {sorted(now.keys() - recorded.keys())[:20]}; gone: "
        f"{sorted(recorded.keys() - now.keys())[:20]}. If the change is meant, regenerate {DIGESTS.name}: "
        ".venv/bin/python tests/report/test_rendering_unchanged.py --update")


if __name__ == "__main__":
    import tempfile

    if sys.argv[1:] != ["--update"]:
        sys.exit(__doc__)
    sys.path[:0] = [str(REPO / "src"), str(REPO / "tests")]
    with tempfile.TemporaryDirectory() as work:
        found = rendered_digests(Path(work))
    DIGESTS.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")
    print(f"{DIGESTS}: {len(found)} digests")
