"""The report of a `kermt explore` save_dir (``DIR/report.html``, rewritten after every round): what each round
found against random, the scores of each batch, and the last surrogate's predictions of what was scored.

Random's expectation after n molecules acquired:

- a ``lookup:`` objective whose files are still there knows every library molecule's score, so random's best, mean
  of the best k and share of the true top 1 % found are exact expectations of picking n library rows at random
  (hypergeometric: :mod:`kermt.explore.baseline`), and the report shows what share of the true top 1 % each round
  had found;
- any other objective knows only what was scored. Round 0 is a uniform random sample of the library, so its scores
  stand for the library's: random's best and mean of the best k are estimated by drawing as many of round 0's
  scores with replacement, :data:`RANDOM_DRAWS` times with a fixed seed. That estimate cannot exceed round 0's
  best: past that the exploration found what random sampling of round 0's size had not shown could exist.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import yaml

from kermt.errors import UserError
from kermt.explore.baseline import TRUE_TOP_SHARE, expected_best_mean, expected_found_share, true_top_rows
from kermt.explore.explored import Explored, read_explored
from kermt.explore.objective_spec import parse_objective
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
    library = library_scores(layout, settings)
    curves = _curves(explored, minimize, library)
    sections = [_summary(save_dir, settings, explored, curves),
                Section("Found per round against random", notes=[_random_note(library)],
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


def library_scores(layout: RunLayout, settings: dict) -> np.ndarray | None:
    """Every library row's score (NaN: none) when the objective is a lookup, as the exploration wrote them
    (``DIR/library_lookup_scores.npy``, ray_app.explore.library.write_lookup_scores); None for any other objective,
    or an exploration that has not written them (the report then estimates random from round 0)."""
    try:
        if parse_objective(str(settings.get("objective", ""))).kind != "lookup":
            return None
    except UserError:
        return None
    path = layout.explore_lookup_scores
    return np.load(path, allow_pickle=False) if path.is_file() else None


def _random_note(library: np.ndarray | None) -> str:
    found = f"Best score and mean of the {TOP_K} best found after each round (lines), and random sampling's "
    if library is None:
        return found + (f"expectation for as many molecules, estimated from round 0's scores ({RANDOM_DRAWS} seeded "
                        "draws with replacement; it cannot exceed round 0's best).")
    top = len(true_top_rows(library, False))
    return found + (f"exact expectation for as many molecules picked at random from the library (the lookup file "
                    f"knows every score: hypergeometric, kermt.explore.baseline); right, the share of the library's "
                    f"true top {TRUE_TOP_SHARE:.0%} ({top:,} molecules) found, against random's n / N.")


def _curves(explored: Explored, minimize: bool, library: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Per round: molecules scored so far, best and top-k mean found, random's expected best and top-k mean (exact
    from ``library``, every library row's score, when known; else estimated from round 0), and with ``library``
    the share of its true top 1 % found and random's expectation of it."""
    rounds = np.arange(explored.rounds_done)
    first = explored.score[(explored.round == 0) & explored.scored]
    rng = np.random.default_rng(RANDOM_SEED)
    top = None if library is None else true_top_rows(library, minimize)
    out: dict[str, list[float]] = {k: [] for k in ("acquired", "best", "top", "random_best", "random_top")}
    if top is not None:
        out.update(found_share=[], random_share=[])
    for r in rounds:
        so_far = explored.score[explored.round <= r]
        n = int(np.isfinite(so_far).sum())
        out["acquired"].append(len(so_far))
        out["best"].append(_best(so_far, minimize))
        out["top"].append(_best(so_far, minimize, TOP_K))
        if library is not None and top is not None:
            picked = len(so_far)  # random picks as many library rows as were acquired, scored or not
            out["random_best"].append(expected_best_mean(library, minimize, picked))
            out["random_top"].append(expected_best_mean(library, minimize, picked, TOP_K))
            found = np.isin(top, explored.library_row[explored.round <= r])
            out["found_share"].append(float(found.mean()))
            out["random_share"].append(expected_found_share(len(library), len(top), picked))
            continue
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
        if "found_share" in curves:
            rows[-1] += [fmt(curves["found_share"][r]), fmt(curves["random_share"][r])]
    shares = [f"true top {TRUE_TOP_SHARE:.0%} found", f"random: true top {TRUE_TOP_SHARE:.0%}"] if (
        "found_share" in curves) else []
    return Section("Exploration", notes=[f"{len(explored):,} molecules acquired in {explored.rounds_done} rounds, "
                                         f"{int(explored.scored.sum()):,} scored; from {save_dir / 'explored.csv'}."],
                   tables=[Table(["setting", "value"], settings_rows),
                           Table(["round", "molecules", "not scored", "batch best", "best so far",
                                  f"top-{TOP_K} mean so far", "random: best", f"random: top-{TOP_K} mean", *shares],
                                 rows,
                                 caption="per round")])


def _found_figure(curves: dict[str, np.ndarray], minimize: bool) -> str:
    panels = [("best", "random_best", "best score found"), ("top", "random_top", f"mean of the {TOP_K} best found")]
    if "found_share" in curves:
        panels.append(("found_share", "random_share", f"share of the true top {TRUE_TOP_SHARE:.0%} found"))
    figure, axes = plt.subplots(1, len(panels), figsize=(4.3 * len(panels), 3.4))
    for ax, (found, random, title) in zip(axes, panels):
        ax.plot(curves["acquired"], curves[found], marker="o", color=COLOURS[0], label="explored")
        ax.plot(curves["acquired"], curves[random], marker="s", linestyle="--", color=COLOURS[1], label="random")
        for x, y, r in zip(curves["acquired"], curves[found], curves["round"]):
            ax.annotate(f"r{r}", (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.set_xlabel("molecules acquired")
        ax.set_ylabel("share" if found == "found_share" else "score" + (" (lower is better)" if minimize else ""))
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


__all__ = ["RANDOM_DRAWS", "TOP_K", "explore_report", "library_scores"]
