"""The report's figures, drawn with matplotlib (Agg: no display needed) and returned as PNG data URIs.

PNG at a modest resolution keeps a page bounded whatever the number of points (an SVG of a 2,000-point scatter plot
is ~0.5 MB, its PNG ~40 KB), and every figure is then one ``<img>`` the page and its browser test count alike.
"""

from __future__ import annotations

import base64
import io
import warnings
from collections.abc import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")  # before pyplot: a report is written on clusters and in CI, never on a screen
import matplotlib.pyplot as plt
import numpy as np
from sklearn import metrics as skm

from ray_app.common.atom_colours import share_colour

DPI = 80
COLOURS = plt.rcParams["axes.prop_cycle"].by_key()["color"]


def data_uri(figure) -> str:
    """The figure as a base64 PNG data URI; the figure is closed (a long report must not keep hundreds open)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI, bbox_inches="tight")
    plt.close(figure)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def learning_curves(members: Mapping[str, Mapping[str, Sequence[float]]], metric: str) -> str:
    """One row of panels: train and validation loss, validation ``metric``, learning rate (when recorded) against
    the epoch, a line per member. ``members``: label -> column -> values (``epoch`` included)."""
    panels = [("loss", ("train_loss", "val_loss")), (f"validation {metric}", (f"val_{metric}",)),
              ("learning rate", ("lr",))]
    panels = [p for p in panels if any(c in columns for columns in members.values() for c in p[1])]
    figure, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.2), squeeze=False)
    for ax, (title, columns) in zip(axes[0], panels):
        for i, (label, history) in enumerate(members.items()):
            for column in columns:
                if column in history:
                    ax.plot(history["epoch"], history[column], marker="o", markersize=3,
                            color=COLOURS[i % len(COLOURS)], linestyle="--" if column == "val_loss" else "-",
                            label=f"{label} {column.replace('_loss', '')}" if len(columns) > 1 else label)
        ax.set_title(title)
        ax.set_xlabel("epoch")
        ax.legend(fontsize=7)
    figure.tight_layout()
    return data_uri(figure)


def parity(measured: np.ndarray, predicted: np.ndarray, task: str, lower: np.ndarray | None = None,
           upper: np.ndarray | None = None) -> str:
    """Predicted against measured with the y = x line; the interval [lower, upper] as error bars when given."""
    figure, ax = plt.subplots(figsize=(4.2, 4.0))
    if lower is not None and upper is not None:
        ax.errorbar(measured, predicted, yerr=np.vstack([predicted - lower, upper - predicted]), fmt="none",
                    ecolor="0.75", elinewidth=0.8, zorder=1, label="90% interval")
    ax.scatter(measured, predicted, s=9, alpha=0.7, zorder=2)
    both = np.concatenate([measured, predicted])
    low, high = float(np.min(both)), float(np.max(both))
    pad = 0.05 * (high - low or 1.0)
    ax.plot([low - pad, high + pad], [low - pad, high + pad], color="k", linewidth=0.8, zorder=3)
    ax.set_xlim(low - pad, high + pad)
    ax.set_ylim(low - pad, high + pad)
    ax.set_xlabel(f"measured {task}")
    ax.set_ylabel(f"predicted {task}")
    ax.set_title(f"{task}: parity (test set)")
    if lower is not None:
        ax.legend(fontsize=7, loc="upper left")
    figure.tight_layout()
    return data_uri(figure)


def residuals(measured: np.ndarray, predicted: np.ndarray, task: str) -> str:
    """Residual (predicted - measured) against the prediction, and their histogram."""
    error = predicted - measured
    figure, (left, right) = plt.subplots(1, 2, figsize=(7.6, 3.2))
    left.scatter(predicted, error, s=9, alpha=0.7)
    left.axhline(0, color="k", linewidth=0.8)
    left.set_xlabel(f"predicted {task}")
    left.set_ylabel("predicted - measured")
    left.set_title(f"{task}: residuals")
    right.hist(error, bins=min(40, max(5, len(error) // 5)))
    right.set_xlabel("predicted - measured")
    right.set_ylabel("molecules")
    figure.tight_layout()
    return data_uri(figure)


def roc_and_pr(measured: np.ndarray, predicted: np.ndarray, task: str) -> str:
    """ROC and precision-recall curves of one task (labels 0/1, predicted probabilities)."""
    figure, (roc_ax, pr_ax) = plt.subplots(1, 2, figsize=(7.6, 3.4))
    fpr, tpr, _ = skm.roc_curve(measured, predicted)
    roc_ax.plot(fpr, tpr, label=f"AUC {skm.roc_auc_score(measured, predicted):.3f}")
    roc_ax.plot([0, 1], [0, 1], color="0.6", linewidth=0.8, linestyle="--")
    roc_ax.set_xlabel("false positive rate")
    roc_ax.set_ylabel("true positive rate")
    roc_ax.set_title(f"{task}: ROC")
    roc_ax.legend(fontsize=8, loc="lower right")
    precision, recall, _ = skm.precision_recall_curve(measured, predicted)
    pr_ax.plot(recall, precision, label=f"PRC-AUC {skm.auc(recall, precision):.3f}")
    pr_ax.axhline(float(np.mean(measured)), color="0.6", linewidth=0.8, linestyle="--", label="positive rate")
    pr_ax.set_xlabel("recall")
    pr_ax.set_ylabel("precision")
    pr_ax.set_title(f"{task}: precision-recall")
    pr_ax.legend(fontsize=8, loc="lower left")
    figure.tight_layout()
    return data_uri(figure)


def confusion(measured: np.ndarray, predicted: np.ndarray, task: str, threshold: float = 0.5) -> str:
    """The confusion matrix at ``threshold`` (counts in the cells)."""
    matrix = skm.confusion_matrix(measured.astype(int), (predicted >= threshold).astype(int), labels=[0, 1])
    figure, ax = plt.subplots(figsize=(3.4, 3.0))
    ax.imshow(matrix, cmap="Blues")
    for (i, j), count in np.ndenumerate(matrix):
        ax.text(j, i, str(count), ha="center", va="center", color="white" if count > matrix.max() / 2 else "black")
    ax.set_xticks([0, 1], ["0", "1"])
    ax.set_yticks([0, 1], ["0", "1"])
    ax.set_xlabel(f"predicted (p >= {threshold})")
    ax.set_ylabel("measured")
    ax.set_title(f"{task}: confusion")
    figure.tight_layout()
    return data_uri(figure)


def trial_objectives(values: Sequence[float], statuses: Sequence[str], objective: str, mode: str) -> str:
    """Each trial's objective in the order the trials started (colour: status), and the best so far as a step."""
    figure, ax = plt.subplots(figsize=(6.0, 3.4))
    values = np.asarray(values, dtype=np.float64)
    order = np.arange(len(values))
    for i, status in enumerate(dict.fromkeys(statuses)):
        pick = np.array([s == status for s in statuses]) & np.isfinite(values)
        ax.scatter(order[pick], values[pick], s=22, color=COLOURS[i % len(COLOURS)], label=status, zorder=2)
    finite = np.where(np.isfinite(values), values, np.inf if mode == "min" else -np.inf)
    best = np.minimum.accumulate(finite) if mode == "min" else np.maximum.accumulate(finite)
    shown = np.isfinite(best)
    ax.step(order[shown], best[shown], where="post", color="k", linewidth=1, label="best so far", zorder=1)
    ax.set_xlabel("trial (in the order started)")
    ax.set_ylabel(objective)
    ax.legend(fontsize=7)
    figure.tight_layout()
    return data_uri(figure)


def against_setting(cells: Sequence[str], values: Sequence[float], setting: str, objective: str) -> str:
    """The objective against one sampled setting: a scatter for numbers (log axis over a wide positive range),
    one column per value otherwise."""
    figure, ax = plt.subplots(figsize=(4.0, 3.2))
    values = np.asarray(values, dtype=np.float64)
    try:
        x = np.array([float(c) if c != "" else np.nan for c in cells])
        ax.scatter(x, values, s=22)
        positive = x[np.isfinite(x) & (x > 0)]
        if len(positive) == np.isfinite(x).sum() and len(positive) and positive.max() / positive.min() > 20:
            ax.set_xscale("log")
    except ValueError:  # words (choices such as an activation): one column each
        labels = list(dict.fromkeys(cells))
        ax.scatter([labels.index(c) for c in cells], values, s=22)
        ax.set_xticks(range(len(labels)), [c or "(none)" for c in labels])
    ax.set_xlabel(setting)
    ax.set_ylabel(objective)
    figure.tight_layout()
    return data_uri(figure)


def histogram(values: np.ndarray, label: str) -> str:
    """The distribution of one column."""
    figure, ax = plt.subplots(figsize=(4.2, 3.0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ax.hist(values[np.isfinite(values)], bins=40)
    ax.set_xlabel(label)
    ax.set_ylabel("count")
    figure.tight_layout()
    return data_uri(figure)


def binned(edges: np.ndarray, counts: np.ndarray, label: str, title: str) -> str:
    """A histogram counted elsewhere (chunk by chunk over a file too large to hold): bin ``edges``, their ``counts``."""
    figure, ax = plt.subplots(figsize=(4.2, 3.0))
    ax.stairs(counts, edges, fill=True)
    ax.set_xlabel(label)
    ax.set_ylabel("molecules")
    ax.set_title(title)
    figure.tight_layout()
    return data_uri(figure)


def colour_bar(scale: float, label: str) -> str:
    """The key of :func:`ray_app.common.atom_colours.share_colour` on ``scale``: a horizontal bar from -scale
    (lowers) through 0 to +scale (raises)."""
    colours = matplotlib.colors.ListedColormap([share_colour(x) for x in np.linspace(-1, 1, 257)])
    figure, ax = plt.subplots(figsize=(4.6, 0.5))
    mapping = matplotlib.cm.ScalarMappable(matplotlib.colors.Normalize(-scale, scale), colours)
    bar = figure.colorbar(mapping, cax=ax, orientation="horizontal")
    bar.set_ticks([-scale, 0, scale], labels=[f"{-scale:.3g}\nlowers", "0", f"+{scale:.3g}\nraises"])
    bar.set_label(label, fontsize=9)
    return data_uri(figure)


def line_panels(panels: Sequence[tuple[str, Mapping[str, tuple[np.ndarray, np.ndarray]]]], xlabel: str = "step",
                per_row: int = 4) -> str:
    """A grid of panels, each a title and its lines (label -> (x, y)); a NaN point is left out of its line (a
    validation term is recorded at fewer steps than a training one)."""
    rows = (len(panels) + per_row - 1) // per_row
    columns = min(per_row, len(panels))
    figure, axes = plt.subplots(rows, columns, figsize=(3.6 * columns, 2.8 * rows), squeeze=False)
    for ax, (title, lines) in zip(axes.flat, panels):
        for i, (label, (x, y)) in enumerate(lines.items()):
            keep = np.isfinite(x) & np.isfinite(y)
            ax.plot(x[keep], y[keep], marker="o" if keep.sum() < 40 else None, markersize=3,
                    color=COLOURS[i % len(COLOURS)], linestyle="--" if label.startswith("val") else "-", label=label)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel(xlabel)
        if len(lines) > 1:
            ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    figure.tight_layout()
    return data_uri(figure)


__all__ = ["against_setting", "binned", "colour_bar", "confusion",
           "data_uri", "histogram", "learning_curves", "line_panels", "parity", "residuals", "roc_and_pr",
           "trial_objectives"]
