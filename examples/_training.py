"""What the training examples share: a progress bar with the running loss and accuracy, and
``--plot FILE.png``, a figure of the loss and accuracy curves.

- :func:`add_plot_argument` adds ``--plot``; :func:`check_plot_path` checks the path when the
  arguments are parsed, before any training (a directory that does not exist, a file that
  cannot be written, a format matplotlib cannot write, matplotlib missing: a clear error at
  once rather than after minutes of training).
- :class:`Progress` counts the training steps: a tqdm bar when tqdm is installed, else one
  line rewritten in place on a terminal (one line per epoch elsewhere), both on stderr, showing
  the loss and accuracy averaged over the epoch so far. It keeps every step's values.
- :func:`save_plot` draws what one or more :class:`Progress` kept: the loss on a log scale and
  the accuracy, each step's value faint and a smoothed curve over it.

Only the standard library is imported here: an example's ``--help`` stays instant.
"""
import os
import sys
import time


def add_plot_argument(parser) -> None:
    parser.add_argument("--plot", metavar="FILE.png",
                        help="save a figure of the loss and accuracy curves (needs matplotlib, "
                             "from the examples extra)")


def check_plot_path(parser, path: str) -> None:
    """Exit through ``parser.error`` (status 2, the message on stderr) unless the figure can be
    saved to ``path``."""
    where = f"--plot {path!r}"
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        parser.error(f"{where}: is a directory; give a file name such as curves.png")
    if not os.path.exists(directory):
        parser.error(f"{where}: the directory {directory!r} does not exist")
    if not os.path.isdir(directory):
        parser.error(f"{where}: {directory!r} is not a directory")
    existed = os.path.exists(path)
    try:
        with open(path, "ab"):
            pass
    except OSError as e:
        parser.error(f"{where}: cannot be written ({e.strerror})")
    if not existed:
        os.remove(path)
    try:
        import matplotlib
    except ImportError:
        parser.error(f"{where}: saving the figure needs matplotlib (pip install matplotlib, "
                     f"or the examples extra: pip install -e '.[examples]')")
    matplotlib.use("Agg")
    from matplotlib.backend_bases import FigureCanvasBase

    formats = FigureCanvasBase.get_supported_filetypes()
    ext = os.path.splitext(path)[1].lstrip(".").lower()
    if ext not in formats:
        what = f".{ext} files" if ext else "a file without an extension"
        known = ", ".join("." + f for f in sorted(formats))
        parser.error(f"{where}: matplotlib cannot write {what}; use one of {known}")


class Progress:
    """Training progress over ``total`` steps, named ``name``: call :meth:`step` after each
    step with its loss (and accuracy), :meth:`end_epoch` after each epoch, :meth:`close` at the
    end. ``losses``, ``accuracies`` and ``epoch_ends`` (the step count at each epoch's end)
    keep the history for :func:`save_plot`. ``use_tqdm=False``: the plain line even where tqdm
    is installed."""

    def __init__(self, total: int, name: str = "train", stream=None, enabled: bool = True,
                 use_tqdm: bool = True):
        self.name, self.total = name, int(total)
        self.losses, self.accuracies, self.epoch_ends = [], [], []
        self.test_accuracy = None
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self._epoch_from, self._last_draw = 0, 0.0
        self._tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self._bar = None
        if enabled and use_tqdm:
            try:
                from tqdm import tqdm
            except ImportError:
                tqdm = None
            if tqdm is not None:
                self._bar = tqdm(total=self.total, desc=name, unit="step", file=self.stream,
                                 dynamic_ncols=True, mininterval=0.2, leave=True)

    def running(self) -> str:
        """``loss 0.1234  acc 96.1%``: the means over the current epoch's steps so far."""
        losses = self.losses[self._epoch_from:] or self.losses[-1:]
        text = f"loss {sum(losses) / max(len(losses), 1):.4f}" if losses else "loss -"
        accs = [a for a in self.accuracies[self._epoch_from:] if a is not None]
        if accs:
            text += f"  acc {100 * sum(accs) / len(accs):.1f}%"
        return text

    def step(self, loss: float, accuracy: float | None = None) -> None:
        self.losses.append(float(loss))
        self.accuracies.append(None if accuracy is None else float(accuracy))
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.set_postfix_str(self.running(), refresh=False)
            self._bar.update(1)
        elif self._tty:
            now = time.monotonic()
            if now - self._last_draw > 0.2 or len(self.losses) == self.total:
                self._last_draw = now
                self.stream.write(f"\r{self.name}: {len(self.losses)}/{self.total}  "
                                  f"{self.running()}   ")
                self.stream.flush()

    def end_epoch(self) -> None:
        if self.enabled and self._bar is None and not self._tty:
            self.stream.write(f"{self.name}: epoch {len(self.epoch_ends) + 1}  step "
                              f"{len(self.losses)}/{self.total}  {self.running()}\n")
            self.stream.flush()
        self.epoch_ends.append(len(self.losses))
        self._epoch_from = len(self.losses)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        elif self.enabled and self._tty:
            self.stream.write("\n")
            self.stream.flush()


def smooth(values, span: int | None = None) -> list:
    """An exponential moving average of ``values`` (bias-corrected at the start), over about
    ``span`` steps (default: a tenth of them)."""
    n = len(values)
    span = span or max(2, n // 10)
    weight = 1.0 - 2.0 / (span + 1)
    out, m = [], 0.0
    for i, v in enumerate(values):
        m = weight * m + (1.0 - weight) * v
        out.append(m / (1.0 - weight ** (i + 1)))
    return out


def save_plot(path: str, runs, title: str) -> None:
    """Save a figure of ``runs`` (:class:`Progress` objects) to ``path``: the loss per step on
    a log scale and the accuracy per step (no accuracy panel when no run has one), each with
    the raw values faint and smoothed curves over them; a run's ``test_accuracy``, when set, is
    a dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # a run with no accuracy (a regression) gets the loss panel alone
    with_acc = any(a is not None for run in runs for a in run.accuracies)
    if with_acc:
        fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4.2))
    else:
        fig, ax_loss = plt.subplots(1, 1, figsize=(6.5, 4.2))
        ax_acc = None
    for i, run in enumerate(runs):
        color = f"C{i}"
        label = run.name if len(runs) > 1 else None
        steps = range(1, len(run.losses) + 1)
        positive = [max(v, 1e-8) for v in run.losses]
        ax_loss.plot(steps, positive, ".", color=color, alpha=0.18, markersize=3)
        ax_loss.plot(steps, smooth(positive), color=color, linewidth=2,
                     label=f"{label}: smoothed" if label else "smoothed")
        acc = [(s, a) for s, a in zip(steps, run.accuracies) if a is not None]
        if acc and ax_acc is not None:
            xs, ys = zip(*acc)
            ys = [100 * a for a in ys]
            ax_acc.plot(xs, ys, ".", color=color, alpha=0.18, markersize=3)
            ax_acc.plot(xs, smooth(ys), color=color, linewidth=2,
                        label=f"{label}: training (smoothed)" if label else
                        "training batches (smoothed)")
        if run.test_accuracy is not None and ax_acc is not None:
            ax_acc.axhline(100 * run.test_accuracy, color=color, linestyle="--", linewidth=1.2,
                           label=(f"{label}: " if label else "") +
                           f"test set: {100 * run.test_accuracy:.1f}%")
    ax_loss.set_yscale("log")
    ax_loss.set_title("Training loss")
    ax_loss.set_xlabel("training step (mini-batch)")
    ax_loss.set_ylabel("loss (log scale)")
    if ax_acc is not None:
        ax_acc.set_title("Accuracy")
        ax_acc.set_xlabel("training step (mini-batch)")
        ax_acc.set_ylabel("accuracy (%)")
        ax_acc.set_ylim(0, 100)
    ends = runs[0].epoch_ends[:-1]   # epoch boundaries, when the runs share them
    if any(r.epoch_ends[:-1] != ends for r in runs) or len(ends) > 30:
        ends = []
    for ax in fig.axes:
        ax.grid(True, which="major", alpha=0.3)
        for e in ends:
            ax.axvline(e + 0.5, color="0.85", linewidth=0.8, zorder=0)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="best", fontsize=8)
    fig.suptitle(f"{title}\n(dots: each step; lines: smoothed"
                 f"{'; grey lines: epochs' if ends else ''})", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={
        "Title": title, "Description": "panels: " + "; ".join(
            ax.get_title() for ax in fig.axes)} if path.lower().endswith(".png") else None)
    plt.close(fig)
    print(f"figure saved to {path}")
