"""A short soak (tools/bench/soak.py): the tiny run for 50 steps on real Ray, megatron and vLLM
workers, a checkpoint every 10 steps keeping the last 2, its processes sampled every 10 steps.
After the warm-up (step 20) what a run holds stays flat: the same processes, open files and
threads, resident memory within a bound, the object store back to its baseline, the checkpoint
folder rotated as configured."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.bench import soak

pytestmark = [pytest.mark.slow, pytest.mark.multiproc]

STEPS, SAVE_EVERY, KEEP, WARMUP = 50, 10, 2, 20
RSS_GROWTH_PCT = 5.0  # the whole tree's resident memory, warm sample to last
FD_SLACK = 4  # the tree's open files: a log or socket opened between samples
THREAD_SLACK = 4  # the tree's threads: a pool thread that comes and goes
OBJECT_STORE_SLACK = 1 << 20  # bytes: what a step in flight holds at the last sample


@pytest.fixture(scope="module")
def soaked(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[soak.Sample], Path]:
    out = tmp_path_factory.mktemp("soak") / "run"
    settings = soak.SoakSettings(
        steps=STEPS, save_every=SAVE_EVERY, keep=KEEP, sample_every=SAVE_EVERY, warmup_step=WARMUP
    )
    # a busy shared host can miss Ray's fixed 30 s node start: tried again a few times
    samples, finished = soak.run_soak(settings, out, time_limit_s=1800, start_tries=6)
    assert finished, f"the soak stopped at its time limit after step {samples[-1].step}"
    return samples, out


def test_checkpoints_rotate_as_configured(soaked: tuple[list[soak.Sample], Path]) -> None:
    samples, out = soaked
    # a sample once the step after each multiple is recorded (at least one step past it)
    for sample, multiple in zip(samples, range(SAVE_EVERY, STEPS + 1, SAVE_EVERY), strict=True):
        assert multiple < sample.step < multiple + SAVE_EVERY
    for sample in samples:
        steps = [int(name.removeprefix("iter_")) for name in sample.checkpoints]
        assert len(steps) <= KEEP and all(s % SAVE_EVERY == 0 for s in steps), sample
        newest = sample.step // SAVE_EVERY * SAVE_EVERY
        assert steps and max(steps) == newest, sample  # the newest saved, the oldest dropped
        assert len(steps) == min(KEEP, newest // SAVE_EVERY), sample
    final = sorted((out / "ckpt").glob("iter_*"))
    assert len(final) == KEEP, final  # the run's end save rotated the same way
    one = max(soak.folder_bytes(p) for p in final)
    # between saves the folder holds the kept checkpoints only
    assert max(s.checkpoint_bytes for s in samples) <= KEEP * one * 1.01


def test_processes_files_and_threads_stay_flat(soaked: tuple[list[soak.Sample], Path]) -> None:
    samples, _ = soaked
    g = soak.growth(samples, WARMUP)
    assert not g["processes_started"] and not g["processes_gone"], g
    assert abs(g["fds_delta"]) <= FD_SLACK, g
    assert abs(g["threads_delta"]) <= THREAD_SLACK, g


def test_resident_memory_is_bounded(soaked: tuple[list[soak.Sample], Path]) -> None:
    samples, _ = soaked
    g = soak.growth(samples, WARMUP)
    assert g["total_rss_growth_pct"] <= RSS_GROWTH_PCT, soak.summary_line(g)


def test_object_store_returns_to_its_baseline(soaked: tuple[list[soak.Sample], Path]) -> None:
    samples, _ = soaked
    stored = [s.object_store_bytes for s in samples]
    assert all(b is not None for b in stored), stored  # read from the run's own cluster
    g = soak.growth(samples, WARMUP)
    baseline, last = g["object_store_bytes"]
    assert last <= baseline + OBJECT_STORE_SLACK, g
