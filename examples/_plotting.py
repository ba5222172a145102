"""What the examples' ``--plot PATH`` options share: the path is checked when the arguments
are parsed, before any training (a directory that does not exist, a file that cannot be
written, a format matplotlib cannot write, matplotlib missing: a clear error at once rather
than after minutes of training), and the loss curve is saved at the end."""
import os


def check_plot_path(parser, path: str) -> None:
    """Exit through ``parser.error`` (status 2, the message on stderr) unless the loss curve
    can be saved to ``path``."""
    where = f"--plot {path!r}"
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        parser.error(f"{where}: is a directory; give a file name such as loss.png")
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
        parser.error(f"{where}: saving the loss curve needs matplotlib (pip install matplotlib)")
    matplotlib.use("Agg")
    from matplotlib.backend_bases import FigureCanvasBase

    formats = FigureCanvasBase.get_supported_filetypes()
    ext = os.path.splitext(path)[1].lstrip(".").lower()
    if ext not in formats:
        what = f".{ext} files" if ext else "a file without an extension"
        known = ", ".join("." + f for f in sorted(formats))
        parser.error(f"{where}: matplotlib cannot write {what}; use one of {known}")


def save_loss_curve(path: str, losses) -> None:
    import matplotlib.pyplot as plt

    plt.plot(losses)
    plt.xlabel("step")
    plt.ylabel("training loss")
    plt.savefig(path)
    print(f"loss curve saved to {path}")
