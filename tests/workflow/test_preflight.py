"""The preflight (fedrepro.preflight): every paper-scale job shape through the real train path, on synthetic
data of the real shapes, before anyone spends GPU hours; a new study cannot break paper scale unnoticed."""

from __future__ import annotations

import pytest
import torch

from fedrepro import preflight
from fedrepro.config import REPO, merge_configfiles, resolve_config
from fedrepro.preflight import Group, Job, job_groups, measure, project, sample_groups, shape_key
from fedrepro.study import grid_runs

PAPER = resolve_config(merge_configfiles(REPO / "config" / "paper.yaml"), source="config/paper.yaml")
GROUPS = job_groups(PAPER)


def test_every_paper_job_is_in_exactly_one_group_of_its_shape():
    names = [j.name for g in GROUPS for j in g.jobs]
    expected = [f"{n}/{s}/{m}" for n, study in PAPER["studies"].items() for s, m in grid_runs(study)]
    assert sorted(names) == sorted(expected)
    assert len({g.key for g in GROUPS}) == len(GROUPS)
    assert all(shape_key(j.spec) == g.key for g in GROUPS for j in g.jobs)
    # the groups that FedGTST fine-tunes carry the fine-tuning spec, and only those
    transfers = {f"fedgtst/{s}/{m}" for s, m in grid_runs(PAPER["studies"]["fedgtst"])}
    assert all((g.finetune is not None) == (g.jobs[0].name in transfers) for g in GROUPS)


def test_a_sample_covers_every_engine_and_model_first():
    families = {(g.spec["federation"], g.spec["model"]) for g in GROUPS}
    picked = sample_groups(GROUPS, len(families))
    assert {(g.spec["federation"], g.spec["model"]) for g in picked} == families


# the smallest model of each engine first: the suite runs these; `make preflight` runs every group
SMALL_FIRST = ("lenet5", "cnn3", "simple_cnn", "textcnn", "HtFE2", "HtFE4", "HtFE3")


def _cheapest_per_engine() -> list[Group]:
    """For each engine, a group of its smallest model with the fewest clients; then FedGTST's transfer group
    (pre-training, then fine-tuning), Feddle with its server data out of domain, and the methods whose memory
    issue #22 fixed: FedL2G's feedback JVP and CA2FL's per-client cache."""
    def cost(g: Group) -> tuple:
        model = g.spec["model"]
        return (SMALL_FIRST.index(model) if model in SMALL_FIRST else len(SMALL_FIRST),
                g.spec["partition"]["clients"], g.spec["training"]["batch_size"])

    picked = {}
    for g in GROUPS:
        fed = g.spec["federation"]
        if fed not in picked or cost(g) < cost(picked[fed]):
            picked[fed] = g
    picked["finetune"] = min((g for g in GROUPS if g.finetune), key=cost)
    picked["ood"] = min((g for g in GROUPS if g.spec.get("async", {}).get("ood_dataset")
                         and g.spec["algorithm"] == "feddle"), key=cost)
    for method in ("fedl2g_f", "ca2fl"):
        picked[method] = min((g for g in GROUPS if g.spec["algorithm"] == method), key=cost)
    return list({g.key: g for g in picked.values()}.values())


@pytest.mark.parametrize("group", _cheapest_per_engine(), ids=lambda g: g.jobs[0].name)
def test_a_paper_group_runs_its_real_path_and_reports_what_it_measured(group):
    m = measure(group, "cpu", max_batch_flops=2e8, timeout=300, max_clients=4)
    assert m["ok"], m.get("traceback", m["error"])
    assert m["status"] == "complete"
    assert m["peak_rss"] > 0 and m["train_s"] > 0 and m["steps"] > 0
    # a warm round's step, without the start-up, data loading and evaluation the whole run's seconds hold
    assert 0 < m["step_s"] < m["train_s"] / m["steps"]
    assert m["checkpoint_bytes"] >= 4 * m["params"]  # at least the model itself was checkpointed
    assert (m["finetune_s"] is not None) == (group.finetune is not None)
    p = project(group.jobs[0], m, False, 40, 60, 1.5)
    assert p["host_mb"] > m["peak_rss"] / 2**20 and p["device_mb"] > 0 and p["hours"] > 0


def _measurement(**overrides) -> dict:
    return {"ok": True, "status": "complete", "batch": 32, "params": 1_000_000, "trained": 1_000_000,
            "flops_per_sample": 1e9, "peak_rss": 2 << 30, "peak_gpu": None, "train_s": 10.0, "finetune_s": None,
            "checkpoint_bytes": 4 << 20, "kept_bytes": 1 << 20, "act_per_sample": 1 << 20, "state_per_client": 0,
            "steps": 10, **overrides}


def _job(clients: int, batch: int = 32, mem_mb: int = 10**6, runtime: int = 10**6) -> Job:
    group = next(g for g in GROUPS if g.spec["algorithm"] == "ca2fl")
    spec = {**group.spec, "partition": {**group.spec["partition"], "clients": clients},
            "training": {**group.spec["training"], "batch_size": batch}}
    return Job("feddle/x/ca2fl", spec, 3, {"gpu": 1, "threads": 4, "mem_mb": mem_mb, "runtime": runtime})


def test_state_kept_per_client_is_projected_to_every_client_and_named_over_budget():
    few, many = (project(_job(c, mem_mb=16000), _measurement(state_per_client=45 << 20), True, 40, 60, 1.5)
                 for c in (10, 1000))
    assert many["state_mb"] == pytest.approx(1000 * 45) and few["state_mb"] == pytest.approx(10 * 45)
    assert many["host_mb"] - few["host_mb"] == pytest.approx(990 * 45)
    assert not few["over"] and many["over"] and "mem_mb 16000" in many["over"][0]


def test_activations_of_the_real_batch_are_added_when_a_smaller_one_ran():
    def device_mb(ran: int) -> float:
        return project(_job(10, batch=64), _measurement(batch=ran, peak_gpu=1 << 30), False, 40, 60, 1.5)["device_mb"]

    assert device_mb(4) - device_mb(64) == pytest.approx(60)  # 60 more samples of 1 MB each


def test_a_job_over_its_runtime_is_named():
    job = _job(10, runtime=1)
    p = project(job, _measurement(), False, 40, 60, 1.5)
    assert any("runtime 1" in o for o in p["over"])
    table = preflight.render([(Group(shape_key(job.spec), [job]), _measurement(), [p])], ["# t"])
    assert "feddle/x/ca2fl: " in table and "runtime 1" in table


def test_a_failing_group_is_a_row_with_its_error(monkeypatch):
    import fedrepro.pipeline

    def broken(*args, **kwargs):
        raise RuntimeError("CUDA out of memory (simulated)")

    monkeypatch.setattr(fedrepro.pipeline, "train", broken)  # the forked child sees the patched module
    group = _cheapest_per_engine()[0]
    m = measure(group, "cpu", max_batch_flops=2e8, timeout=120, max_clients=4)
    assert not m["ok"] and "CUDA out of memory (simulated)" in m["error"]
    assert "**failed**: RuntimeError: CUDA out of memory (simulated)" in preflight.render([(group, m, [])], ["# t"])


def test_every_data_set_the_paper_config_reads_has_its_files_named_and_pinned():
    names, problems = preflight.data_set_problems(PAPER)
    assert {"cifar10", "fashion_mnist", "imagenet_subset", "domainnet_real", "domainnet_no_real"} <= set(names)
    assert problems == []
    assert "every one in order" in preflight.data_set_section(names, problems)


def test_an_unpinned_file_or_a_bad_address_is_named(monkeypatch):
    import dataclasses

    from fedrepro.data import registry

    spec = registry.DATASETS["cinic10"]
    stripped = "\n".join(line for line in spec.manual_instructions.splitlines() if spec.files[0] not in line)
    monkeypatch.setitem(registry.DATASETS, "cinic10", dataclasses.replace(
        spec, manual_instructions=stripped + "\nor from ftp://example.org/cinic.tar.gz"))
    problems = registry.download_problems("cinic10")
    assert problems == [f"cinic10: raw file {spec.files[0]} has no pinned md5 or sha256 beside it in its instructions",
                        "cinic10: 'ftp://example.org/cinic.tar.gz' is no http(s) address"]
    assert "2 problem(s):\n- cinic10: raw file" in preflight.data_set_section(["cinic10"], problems)


def test_seconds_per_step_come_from_the_last_rounds_training_seconds(tmp_path):
    from fedrepro.preflight import step_seconds, warm_step_seconds

    metrics = tmp_path / "metrics.csv"
    # cumulative training seconds: a cold first round (CUDA start, kernel choice), then a warm one of 4 steps
    metrics.write_text("round,test_acc,seconds\n1,10.0,5.0\n2,20.0,5.2\n")
    assert warm_step_seconds(metrics, 4) == pytest.approx(0.05)
    metrics.write_text("round,test_acc,seconds\n1,10.0,5.0\n")
    assert warm_step_seconds(metrics, 4) is None
    # measurements kept from before: the whole run's seconds over its steps
    assert step_seconds({"step_s": None, "train_s": 10.0, "steps": 8}) == pytest.approx(1.25)
    assert step_seconds({"step_s": 0.05, "train_s": 10.0, "steps": 8}) == pytest.approx(0.05)


def test_server_passes_run_one_epoch_and_nothing_else_of_a_method_changes():
    feddle = next(g.spec for g in GROUPS if g.spec["algorithm"] == "feddle")
    center = next(g.spec for g in GROUPS if g.spec["algorithm"] == "center")
    assert feddle["hparams"]["epochs"] == 10 and center["hparams"]["epochs"] == 20
    run = preflight.preflight_spec(feddle, None)
    assert run["hparams"]["epochs"] == 1 and run["hparams"]["head_epochs"] == 1  # head_epochs: the default, 10
    assert {k: v for k, v in run["hparams"].items() if not k.endswith("epochs")} == \
        {k: v for k, v in feddle["hparams"].items() if not k.endswith("epochs")}
    assert preflight.one_pass(center)["epochs"] == 1
    no_head = {**feddle, "hparams": {**feddle["hparams"], "head_epochs": 0}}
    assert preflight.one_pass(no_head)["head_epochs"] == 0  # off stays off
    fedavg = next(g.spec for g in GROUPS if g.spec["algorithm"] == "fedavg")
    assert preflight.one_pass(fedavg) == fedavg["hparams"]


@pytest.mark.parametrize("method", ["fedbuff", "ca2fl"])
def test_a_buffer_of_updates_flushes_within_the_preflight_rounds(method):
    spec = next(g.spec for g in GROUPS if g.spec["algorithm"] == method)
    assert spec["hparams"]["buffer_size"] == 10 and spec["partition"]["clients"] > 10
    for max_clients, arrivals in ((4, 4), (preflight.heavy_clients(4), 2)):
        run = preflight.preflight_spec(spec, None, max_clients)
        per_round = round(run["training"]["join_ratio"] * run["partition"]["clients"])
        assert per_round == arrivals and run["hparams"]["buffer_size"] == arrivals  # every round flushes
        assert preflight.PREFLIGHT_ROUNDS * per_round >= run["hparams"]["buffer_size"]
    uncapped = preflight.preflight_spec(spec, None, None)  # a GPU preflight trains the real count a round
    assert uncapped["hparams"]["buffer_size"] == min(10, round(spec["training"]["join_ratio"]
                                                              * spec["partition"]["clients"]))


def test_model_facts_are_built_once_per_model_and_read_back_from_the_cache(tmp_path, monkeypatch):
    import fedrepro.cost

    cnn = [g.spec for g in GROUPS if g.spec["model"] == "simple_cnn"]
    spec = cnn[0]
    first = preflight.model_facts(spec, tmp_path)
    assert first == preflight.model_facts(spec)  # what is cached is what a build gives
    assert first["params"] >= first["trained"] > 0 and first["flops_per_sample"] > 0 and first["act_per_sample"] > 0

    def no_build(*args, **kwargs):
        raise AssertionError("built again")

    monkeypatch.setattr(fedrepro.cost, "build_members", no_build)
    assert preflight.model_facts(spec, tmp_path) == first
    other = next(s for s in cnn if preflight.model_input(s) != preflight.model_input(spec))  # Fashion-MNIST's 28x28
    with pytest.raises(AssertionError, match="built again"):  # another input is another model
        preflight.model_facts(other, tmp_path)


def test_a_memoised_build_equals_a_fresh_one_and_leaves_the_rng_where_the_build_did(tmp_path):
    from fedrepro.models import build_model
    from fedrepro.models.groups import build_arch

    calls = []

    def counted(*args, **kwargs):
        calls.append(args)
        return build_arch(*args, **kwargs)

    memo = preflight.memoised_build(counted, tmp_path)

    def built(make, seed, *args):
        torch.manual_seed(seed)
        model = make(*args)
        return model, torch.rand(4)  # what the engine draws next

    fresh, fresh_next = built(build_arch, 0, "resnet_mini", (16, 16, 3), 10)
    for _ in range(2):
        model, drawn = built(memo, 0, "resnet_mini", (16, 16, 3), 10)
        assert torch.equal(drawn, fresh_next)
        assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), fresh.state_dict().values(),
                                                      strict=True))
    assert len(calls) == 1  # the second came from the folder
    other, _ = built(memo, 1, "resnet_mini", (16, 16, 3), 10)  # another RNG state is another model
    assert len(calls) == 2 and not torch.equal(other.state_dict()["head.weight"], fresh.state_dict()["head.weight"])
    built(memo, 0, "resnet_mini", (16, 16, 3), 7)  # and other arguments
    assert len(calls) == 3
    # a LoRA ViT does not pickle (torch's parametrizations): built each time, the same as a fresh one
    lora = preflight.memoised_build(build_model, tmp_path)
    a, _ = built(lora, 0, "vit_b16_lora", (32, 32, 3), 10)
    b, _ = built(lora, 0, "vit_b16_lora", (32, 32, 3), 10)
    assert [(n, p.requires_grad) for n, p in a.named_parameters()] == [(n, p.requires_grad) for n, p in
                                                                         b.named_parameters()]
    assert len(list(tmp_path.iterdir())) == 3  # the three resnet_mini builds; nothing of the ViT


def test_a_heterogeneous_group_holds_one_client_per_architecture_and_projects_the_others_models():
    spec = next(g.spec for g in GROUPS if g.spec["model"] == "HtFE8" and g.spec["partition"]["clients"] == 100)
    assert preflight.built_clients(spec, 4) == 8  # HtFE8's eight architectures, each once
    assert preflight.built_clients(spec, 12) == 12 and preflight.built_clients(spec, None) == 100  # CUDA: all
    sync = next(g.spec for g in GROUPS if g.spec["federation"] == "sync")
    assert preflight.built_clients(sync, 4) == sync["partition"]["clients"]
    run = preflight.preflight_spec(spec, None, 4)
    assert run["partition"]["clients"] == 8 and round(run["training"]["join_ratio"] * 8) == 4

    from fedrepro.models.groups import group_members

    members = group_members(spec["model"])
    sizes = {name: 1000 * (i + 1) for i, name in enumerate(dict.fromkeys(members))}
    m = _measurement(built_clients=8, member_params=sizes)
    expected = 4 * sum(sizes[members[i % len(members)]] for i in range(8, 100))
    assert preflight.unbuilt_client_bytes(spec, m) == expected
    assert preflight.unbuilt_client_bytes(spec, {**m, "built_clients": 100}) == 0
    job = Job("fedl2g/x/y", spec, 3, {"gpu": 1, "threads": 4, "mem_mb": 10**6, "runtime": 10**6})
    held = project(job, {**m, "built_clients": 100}, False, 40, 60, 1.5)
    some = project(job, m, False, 40, 60, 1.5)
    assert some["host_mb"] - held["host_mb"] == pytest.approx(expected / 2**20)  # a CPU run: where RSS held them
    assert some["checkpoint_mb"] - held["checkpoint_mb"] == pytest.approx(expected / 2**20)
    on_gpu = project(job, {**m, "peak_gpu": 1 << 30}, False, 40, 60, 1.5)
    held_gpu = project(job, {**m, "peak_gpu": 1 << 30, "built_clients": 100}, False, 40, 60, 1.5)
    assert on_gpu["device_mb"] - held_gpu["device_mb"] == pytest.approx(expected / 2**20)


def test_a_held_subset_of_a_pathological_split_is_drawn_over_every_client(tmp_path):
    from fedrepro.partition import load_partition

    spec = next(g.spec for g in GROUPS if g.spec["federation"] == "hetero"
                and g.spec["partition"]["kind"] == "pathological" and g.spec["dataset"] == "cifar100")
    run = preflight.preflight_spec(spec, None, 4)
    assert run["partition"]["clients"] * spec["partition"]["classes_per_client"] < 100  # too few to draw alone
    with pytest.raises(ValueError, match="some class would be held by no client"):
        preflight.synthetic_inputs(run, 0, tmp_path)
    _, partition = preflight.synthetic_inputs(run, 0, tmp_path, drawn_clients=spec["partition"]["clients"])
    assert len(load_partition(partition)) == run["partition"]["clients"]
