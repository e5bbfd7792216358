"""The report of a `kermt explore` save_dir (``DIR/report.html``, rewritten after every round): what each round
found against random, the scores of each batch, and the last surrogate's predictions of what was scored.

Random's expectation: round 0 is a uniform random sample of the library, so its scores stand for the library's.
Random's best (and mean of the best k) after n molecules is estimated by drawing n of round 0's scores with
replacement, :data:`RANDOM_DRAWS` times with a fixed seed. It cannot exceed round 0's best: past that the
exploration found what random sampling of round 0's size had not shown could exist.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import yaml

from kermt.explore.explored import Explored, read_explored
from kermt.inference.columns import STD_SUFFIX
from kermt.run_layout import RunLayout
from ray_app.report.figures import COLOURS, data_uri, plt
from ray_app.report.page import Figure, Report, Section, Table, fmt

TOP_K = 10  # "top-k found": the mean of the k best scores so far (MolPAL's average top-k)
RANDOM_DRAWS = 200
RANDOM_SEED = 0
PREDICTED_COLUMN = "score"  # the surrogate's task (ray_app.explore.config.TRAINING_SCORE)


def explore_report(save_dir: Path) -> Report:
    layout = RunLayout(save_dir)
    settings = yaml.safe_load(layout.explore_settings.read_text()) or {}
    minimize = bool(settings.get("minimize", False))
    explored = read_explored(str(layout.explored))
    curves = _curves(explored, minimize)
    sections = [_summary(save_dir, settings, explored, curves),
                Section("Found per round against random", notes=[
                    f"Best score and mean of the {TOP_K} best found after each round (lines), and random sampling's "
                    f"expectation for as many molecules, estimated from round 0's scores ({RANDOM_DRAWS} seeded "
                    "draws with replacement; it cannot exceed round 0's best)."],
                    figures=[Figure("found per round against random", _found_figure(curves, minimize))]),
                Section("Scores of each batch", figures=[Figure("scores of each batch",
                                                                _batches_figure(explored, minimize))])]
    parity = _parity_section(layout, explored)
    if parity is not None:
        sections.append(parity)
    return Report(f"kermt explore report: {save_dir.name}", str(save_dir), sections)


def _best(values: np.ndarray, minimize: bool, k: int = 1) -> float:
    finite = np.sort(values[np.isfinite(values)])
    if not len(finite):
        return float("nan")
    best = finite[:k] if minimize else finite[::-1][:k]
    return float(best.mean())


def _curves(explored: Explored, minimize: bool) -> dict[str, np.ndarray]:
    """Per round: molecules scored so far, best and top-k mean found, random's expected best and top-k mean."""
    rounds = np.arange(explored.rounds_done)
    first = explored.score[(explored.round == 0) & explored.scored]
    rng = np.random.default_rng(RANDOM_SEED)
    out: dict[str, list[float]] = {k: [] for k in ("scored", "best", "top", "random_best", "random_top")}
    for r in rounds:
        so_far = explored.score[explored.round <= r]
        n = int(np.isfinite(so_far).sum())
        out["scored"].append(n)
        out["best"].append(_best(so_far, minimize))
        out["top"].append(_best(so_far, minimize, TOP_K))
        draws = rng.choice(first, size=(RANDOM_DRAWS, n)) if len(first) and n else np.full((1, 1), np.nan)
        out["random_best"].append(float(np.mean([_best(d, minimize) for d in draws])))
        out["random_top"].append(float(np.mean([_best(d, minimize, TOP_K) for d in draws])))
    return {"round": rounds, **{k: np.asarray(v, float) for k, v in out.items()}}


def _summary(save_dir: Path, settings: dict, explored: Explored, curves: dict[str, np.ndarray]) -> Section:
    settings_rows = [[name, fmt(settings.get(name))] for name in
                     ("library", "objective", "acquisition", "minimize", "init_size", "acquire_size", "seed")]
    rows = []
    for r in curves["round"]:
        this = explored.round == r
        rows.append([str(r), fmt(int(this.sum())), fmt(int((this & ~explored.scored).sum())),
                     fmt(_best(explored.score[this], bool(settings.get("minimize")))), fmt(curves["best"][r]),
                     fmt(curves["top"][r]), fmt(curves["random_best"][r]), fmt(curves["random_top"][r])])
    return Section("Exploration", notes=[f"{len(explored):,} molecules acquired in {explored.rounds_done} rounds, "
                                         f"{int(explored.scored.sum()):,} scored; from {save_dir / 'explored.csv'}."],
                   tables=[Table(["setting", "value"], settings_rows),
                           Table(["round", "molecules", "not scored", "batch best", "best so far",
                                  f"top-{TOP_K} mean so far", "random: best", f"random: top-{TOP_K} mean"], rows,
                                 caption="per round")])


def _found_figure(curves: dict[str, np.ndarray], minimize: bool) -> str:
    figure, axes = plt.subplots(1, 2, figsize=(8.6, 3.4))
    for ax, (found, random, title) in zip(axes, (("best", "random_best", "best score found"),
                                                 ("top", "random_top", f"mean of the {TOP_K} best found"))):
        ax.plot(curves["scored"], curves[found], marker="o", color=COLOURS[0], label="explored")
        ax.plot(curves["scored"], curves[random], marker="s", linestyle="--", color=COLOURS[1], label="random")
        for x, y, r in zip(curves["scored"], curves[found], curves["round"]):
            ax.annotate(f"r{r}", (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.set_xlabel("molecules scored")
        ax.set_ylabel("score" + (" (lower is better)" if minimize else ""))
        ax.set_title(title)
        ax.legend(fontsize=7)
    figure.tight_layout()
    return data_uri(figure)


def _batches_figure(explored: Explored, minimize: bool) -> str:
    rounds = list(range(explored.rounds_done))
    batches = [explored.score[(explored.round == r) & explored.scored] for r in rounds]
    figure, ax = plt.subplots(figsize=(max(4.2, 0.7 * len(rounds) + 2), 3.4))
    shown = [b if len(b) else np.array([np.nan]) for b in batches]
    ax.boxplot(shown, positions=rounds, widths=0.6, showfliers=True)
    for r, batch in zip(rounds, batches):
        ax.scatter(np.full(len(batch), r) + np.linspace(-0.2, 0.2, len(batch)), batch, s=6, alpha=0.4,
                   color=COLOURS[0])
    ax.set_xlabel("round (0: random first batch)")
    ax.set_ylabel("score" + (" (lower is better)" if minimize else ""))
    ax.set_title("scores of each batch")
    figure.tight_layout()
    return data_uri(figure)


def _parity_section(layout: RunLayout, explored: Explored) -> Section | None:
    """The last trained surrogate's predictions of every scored molecule: those it trained on, and the batch it
    chose (scored after its prediction: a prospective test)."""
    trained = [r for r in range(1, explored.rounds_done) if layout.round_predictions(r).exists()]
    if not trained:
        return None
    last = trained[-1]
    table = pq.read_table(layout.round_predictions(last), columns=[PREDICTED_COLUMN, PREDICTED_COLUMN + STD_SUFFIX])
    mean = table.column(PREDICTED_COLUMN).to_numpy().astype(float)
    scored = explored.scored & np.isfinite(mean[explored.library_row])
    groups = {"trained on (rounds before)": scored & (explored.round < last),
              f"round {last}'s batch (chosen, then scored)": scored & (explored.round == last)}
    figure, ax = plt.subplots(figsize=(4.6, 4.2))
    rows = []
    for i, (label, mask) in enumerate(groups.items()):
        measured, predicted = explored.score[mask], mean[explored.library_row[mask]]
        ax.scatter(measured, predicted, s=9, alpha=0.6, color=COLOURS[i], label=label)
        r = float(np.corrcoef(measured, predicted)[0, 1]) if mask.sum() > 2 else float("nan")
        rmse = float(np.sqrt(np.mean((measured - predicted) ** 2))) if mask.any() else float("nan")
        rows.append([label, fmt(int(mask.sum())), fmt(r), fmt(rmse)])
    both = np.concatenate([explored.score[scored], mean[explored.library_row[scored]]])
    low, high = float(both.min()), float(both.max())
    ax.plot([low, high], [low, high], color="k", linewidth=0.8)
    ax.set_xlabel("score")
    ax.set_ylabel(f"round {last} surrogate's prediction")
    ax.set_title("parity: the last surrogate")
    ax.legend(fontsize=7)
    figure.tight_layout()
    return Section(f"The last surrogate (round {last}) on what was scored",
                   tables=[Table(["molecules", "n", "Pearson r", "RMSE"], rows)],
                   figures=[Figure("parity of the last surrogate", data_uri(figure))])


__all__ = ["RANDOM_DRAWS", "TOP_K", "explore_report"]
