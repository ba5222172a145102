"""The epoch of parameter values: a counter that every run of a program which writes
persistable variables (a training step, an optimizer's update, a startup program) advances
before it starts.

What a target derives from a parameter once and keeps beside it (the CPU's packed weights,
``pdjit.codegen.cpu.lib.pgemm``) records the epoch it was made in and is made again when the
epoch moved on: a parameter changed in place by a program is never read through a stale copy.
A parameter given a new array (``Tensor.set``, loading a model) is another array, which such a
copy (kept by the array's identity) never stands for."""

#: the current epoch (a list: one shared, mutable cell)
epoch = [0]


def written() -> None:
    """A run that may change parameters in place is about to start."""
    epoch[0] += 1
