"""Progress lines: their arithmetic under a clock the test drives, and a real featurisation on the local cluster
that prints them when the interval is 0."""

from __future__ import annotations

import pytest

from ray_app.common.progress import EVERY_S_VARIABLE, Progress, duration, every_s


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_duration_reads_at_a_glance():
    assert [duration(s) for s in (0, 42.4, 259, 3600 + 3 * 60 + 5, -3)] == ["0s", "42s", "4m 19s", "1h 03m", "0s"]


def test_a_line_every_interval_with_rate_and_time_left():
    clock, lines = Clock(), []
    progress = Progress("featurising data.csv", total=1000, every=30, clock=clock, out=lines.append)
    clock.now += 10
    progress.advance(100)  # before the interval: silent
    clock.now += 30
    progress.advance(300)  # 400 done in 40 s: 10/s, 600 left: 60 s
    assert lines == ["featurising data.csv: 400 of 1,000 molecules (40%), 10/s, about 1m 00s left"]
    clock.now += 5
    progress.advance(100)  # only 5 s since the last line
    assert len(lines) == 1
    clock.now += 55
    progress.advance(500)  # done: no "left" line for a finished count
    progress.finish()
    assert lines[1:] == ["featurising data.csv: 1,000 molecules in 1m 40s (10/s)"]


def test_without_a_total_a_line_says_count_and_rate_and_a_quick_step_stays_silent():
    clock, lines = Clock(), []
    progress = Progress("predicting x.csv", unit="rows", every=1, clock=clock, out=lines.append)
    clock.now += 2
    progress.advance(5000)
    assert lines == ["predicting x.csv: 5,000 rows, 2,500/s"]
    quiet: list[str] = []
    fast = Progress("predicting y.csv", total=10, every=30, clock=clock, out=quiet.append)
    fast.advance(10)
    fast.finish()
    assert quiet == []


def test_the_interval_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv(EVERY_S_VARIABLE, "2.5")
    assert every_s() == 2.5
    monkeypatch.setenv(EVERY_S_VARIABLE, "soon")
    assert every_s() == 30.0


@pytest.mark.usefixtures("ray_cluster")
def test_featurising_on_the_cluster_prints_progress_and_keeps_the_rows(monkeypatch, capsys):
    from ray_app.common.featurize import featurize_on_cluster
    from kermt.data.featurize import featurize_smiles

    monkeypatch.setenv(EVERY_S_VARIABLE, "0")
    smiles = ["CCO", "c1ccccc1O", "CC(=O)N", "not a smiles"] * 50
    done = featurize_on_cluster(smiles, rows_per_task=40, label="featurising test rows")
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("featurising test rows")]
    assert lines and lines[-1].startswith("featurising test rows: 200 molecules in "), lines
    assert any(" of 200 molecules (" in line for line in lines[:-1]), lines
    expected = featurize_smiles(smiles)
    assert done.reasons == expected.reasons
    assert (done.graphs.atom_counts == expected.graphs.atom_counts).all()
