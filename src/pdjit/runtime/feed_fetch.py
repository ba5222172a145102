"""Feed and fetch, the Fluid way, shared by every executor mode.

``prepare`` checks (program, feed names, fetch names) and returns what a run binds: fed
values go straight to their variables and fetched ones are read from theirs, in every executor
mode; no ``feed``/``fetch`` op is added. A program that has them (a saved inference model) says
with them which variables are fed (their ``col`` orders the feeds) and, unless the caller names
others, which are fetched; the executors skip those ops. ``check_feed`` validates one user value
against its ``VarDesc`` before anything runs.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass

import numpy as np

from pdjit.framework import dtypes, registry
from pdjit.framework.errors import FeedError, FetchError
from pdjit.framework.program import Program, Variable
from pdjit.proto import framework_pb2 as pb
from pdjit.runtime.tensor import LoDTensor, check_offsets

VarType = pb.VarType


@dataclass
class RunProgram:
    program: Program          # the program run: the user's (a copy only to fetch a sub-block's
                              # variable)
    feed_names: tuple         # column i of the feed list feeds feed_names[i]
    fetch_names: tuple        # column i of the fetch list is fetch_names[i]
    feed_var: str
    fetch_var: str

    def __post_init__(self):
        """What every run needs, worked out once: feed specs, persistable names."""
        gb = self.block = self.program.global_block()
        self.feed_specs = tuple(feed_spec(gb.var(n)) for n in self.feed_names)
        # the step scopes the run fetches: the plans of their blocks keep every value
        self.fetched_scopes = tuple(sorted(
            n for n in set(self.fetch_names)
            if (v := gb._find_var_recursive(n)) is not None and v.type == VarType.STEP_SCOPES))
        self.persistables = frozenset(
            v.name for v in gb.vars.values()
            if v.persistable and v.type not in (VarType.FEED_MINIBATCH, VarType.FETCH_LIST))
        self.unfed = unfed_data(self.program, self.feed_names, self.fetch_names)
        # the persistable variables an op writes or the run feeds: their arrays may change
        # in place (what was derived from them is made again, pdjit.codegen.params)
        self.param_writes = tuple(sorted(
            changed_persistables(self.program, self.feed_names, self.persistables)))

    def check_unfed(self, scope) -> None:
        """Before any op runs: every data variable the program reads is fed, or holds a value
        in ``scope`` (from an earlier run); else a :class:`FeedError` naming it."""
        missing = [n for n in self.unfed
                   if (sv := scope.find_var(n)) is None or sv.value is None]
        if missing:
            can = feedable(self.program)
            raise FeedError(f"feed: the program reads {_quoted(missing)}, which "
                            f"{'is' if len(missing) == 1 else 'are'} not fed (fed: "
                            f"{_quoted(self.feed_names) or 'nothing'}; variables that can be fed: "
                            f"{_quoted(can[:20]) or 'none'})")


def _quoted(names) -> str:
    return ", ".join(repr(n) for n in names)


def feedable(program: Program) -> list:
    """The names a user feeds: the data variables (``layers.data``) of the global block, or,
    in a program without them, the variables no op writes that are not persistable."""
    gb = program.global_block()
    return [v.name for v in gb.vars.values() if v.need_check_feed] or \
        [v.name for v in gb.vars.values() if v.op is None and not v.persistable
         and v.type not in (VarType.FEED_MINIBATCH, VarType.FETCH_LIST)]


def unfed_data(program: Program, feed_names, fetch_names=()) -> tuple:
    """The data variables (``layers.data``) of ``program`` that an op of the global block the
    run keeps (``passes.prune`` for ``fetch_names``; control flow aside: a branch not taken
    need not be fed) reads, that no op writes and that the run does not feed: they must hold a
    value from an earlier run."""
    from pdjit.passes.prune import prune

    gb = program.global_block()
    data = {v.name for v in gb.vars.values() if v.need_check_feed and not v.persistable}
    data.difference_update(feed_names)
    if not data:
        return ()
    written = {n for b in program.blocks for op in b.ops for n in op.output_arg_names}
    read = set()
    for op in prune(gb, fetch_names):
        opdef = registry.lookup(op.type)
        if opdef is not None and not opdef.has(registry.CONTROL_FLOW):
            read.update(op.input_arg_names)
    return tuple(sorted((data & read) - written))


def close_names(name: str, program: Program, limit: int = 5) -> list:
    """Up to ``limit`` variable names of ``program`` that look like ``name`` (difflib)."""
    names = {n for b in program.blocks for n in b.vars}
    return difflib.get_close_matches(name, sorted(names), n=limit, cutoff=0.6)


def names_of(items, what: str) -> tuple:
    names = []
    for item in items or ():
        if isinstance(item, Variable):
            names.append(item.name)
        elif isinstance(item, str):
            names.append(item)
        else:
            raise TypeError(f"{what} must be Variables or variable names, got "
                            f"{type(item).__name__}: {item!r}")
    return tuple(names)


def fetch_names_of(fetch_list) -> tuple:
    return names_of(fetch_list, "fetch_list items")


def feed_names_of(feed) -> tuple:
    return names_of(feed, "feed keys")


def _existing_feed_fetch(program: Program, feed_var: str, fetch_var: str):
    feeds, fetches = {}, {}
    for op in program.global_block().ops:  # the ops declaring a Column, by their list
        d = registry.lookup(op.type)
        c = d.column if d is not None else None
        if c is not None and c.list_var(op) == [fetch_var if c.fetch else feed_var]:
            (fetches if c.fetch else feeds)[op.attr(c.col)] = c.value_var(op)[0]
    return feeds, fetches


def prepare(program: Program, feed_names: tuple, fetch_names: tuple, feed_var: str = "feed",
            fetch_var: str = "fetch") -> RunProgram:
    """Build the run program for these feeds and fetches (checked against ``program``)."""
    gb = program.global_block()
    for n in feed_names:
        if not gb.has_var(n):
            data = feedable(program)
            raise FeedError(f"feed: variable {n!r} is not in the program's global block "
                            f"(variables that can be fed: {', '.join(data[:20]) or 'none'})")
    for n in fetch_names:
        if not any(b.has_var(n) for b in program.blocks):
            near = close_names(n, program)
            raise FetchError(f"fetch: variable {n!r} is not in the program"
                             + (f"; did you mean {_quoted(near)}?" if near else
                                " (no variable has a similar name)"))

    feeds, fetches = _existing_feed_fetch(program, feed_var, fetch_var)
    if feeds or fetches:
        # A saved inference model: its feed ops say which variables are fed (by column), its
        # fetch ops what is fetched unless the caller names other variables.
        missing = set(feeds.values()) - set(feed_names)
        if missing:
            raise FeedError(f"feed: the program reads {sorted(missing)} from its feed ops; "
                            f"feed them (got {list(feed_names)})")
        order = tuple(feeds[c] for c in sorted(feeds))
        extra = [n for n in feed_names if n not in order]
        if extra:
            raise FeedError(f"feed: {extra} are not read by the program's feed ops "
                            f"(it reads {list(order)})")
        feed_names = order
        fetch_names = fetch_names or tuple(fetches[c] for c in sorted(fetches))
    gb = program.global_block()
    hidden = [n for n in fetch_names if not gb.has_var(n)]
    run = program
    if hidden:  # fetched from a sub-block: a copy declares it in the global block instead, so
        run = program.clone()  # its value outlives the sub-block's runs (the last one's stays)
        g = run.global_block()
        for name in hidden:
            owner = next(b for b in run.blocks if b.has_var(name))
            src = owner.vars[name]
            g.create_var(name=name, shape=src.shape, dtype=src.dtype, type=src.type)
            owner._remove_var(name)
    return RunProgram(run, feed_names, fetch_names, feed_var, fetch_var)


def feed_spec(var: Variable) -> tuple:
    """What ``check_feed_spec`` needs of ``var``, read once."""
    return var, var.dtype, tuple(var.shape) if var.type == VarType.LOD_TENSOR else None


def check_feed_spec(spec, value):
    """``check_feed`` with the VarDesc read ahead of time; the common case costs a few checks."""
    var, dtype, shape = spec
    if type(value) is np.ndarray and value.dtype == dtype and shape is not None \
            and value.ndim == len(shape) and value.flags.c_contiguous:
        for d, a in zip(shape, value.shape):
            if d >= 0 and d != a:
                break
        else:
            return value
    return check_feed(var, value)


def _check_copy(var, arr) -> None:
    """The contiguous copy of a fed view (a broadcast one may claim far more elements than it
    holds) within the allocation limit, refused before it is made."""
    from pdjit.runtime.checks import LIMIT_ENV, alloc_limit

    limit = alloc_limit()
    if limit is not None and arr.nbytes > limit:
        raise FeedError(f"feed: variable {var.name!r}: the value of shape {list(arr.shape)} is "
                        f"a view that must be copied to {arr.nbytes} contiguous bytes, more "
                        f"than the allocation limit {limit} ({LIMIT_ENV})")


def check_feed(var: Variable, value):
    """A user's feed value -> the runtime value for ``var`` (array or LoDTensor), or FeedError.

    NumPy arrays must have the variable's dtype exactly; Python numbers and lists are converted
    to it. The rank must match and every known dim (not ``-1``) must be equal. Fluid's
    leniencies: a LoDTensor fed to a variable declared with ``lod_level=0`` gives its data (its
    LoD is dropped); a LoDTensor of shape ``[N, 1]`` fed to a LoD variable declared ``[-1]``
    is its ``N`` values.
    """
    lod = None
    if isinstance(value, LoDTensor):
        if value._array is None:
            raise FeedError(f"feed: variable {var.name!r}: the LoDTensor holds no data")
        lod, value = value._lod, value._array
        if lod and var.type == VarType.LOD_TENSOR and var.lod_level == 0:
            lod = None  # its data, as Fluid feeds it
        if lod:
            _check_lod_level(var, lod)
    want = var.dtype
    if isinstance(value, np.ndarray):
        arr = value
        if want is not None and arr.dtype != want:
            raise FeedError(f"feed: variable {var.name!r} expects dtype {dtypes.dtype_str(want)}, "
                            f"got {arr.dtype}")
    elif isinstance(value, (np.generic, int, float, bool, list, tuple)):
        try:
            arr = np.asarray(value, dtype=want)
        except (TypeError, ValueError) as e:
            raise FeedError(f"feed: variable {var.name!r}: cannot convert the value to "
                            f"{dtypes.dtype_str(want)}: {e}") from None
        if arr.dtype == object:
            raise FeedError(f"feed: variable {var.name!r}: ragged lists cannot be fed")
    else:
        raise FeedError(f"feed: variable {var.name!r}: expected a numpy array, a list or a "
                        f"LoDTensor, got {type(value).__name__}")
    shape = var.shape
    if lod and len(shape) == 1 and arr.ndim == 2 and arr.shape[1] == 1:
        arr = arr.reshape(arr.shape[0])  # [N, 1] for a declared [-1]: the trailing 1 matches
    if var.type == VarType.LOD_TENSOR and shape:
        if arr.ndim != len(shape) or any(d >= 0 and d != a for d, a in zip(shape, arr.shape)):
            raise FeedError(f"feed: variable {var.name!r} expects shape {list(shape)} (-1 = any "
                            f"size), got {list(arr.shape)}")
    if not arr.dtype.isnative or not arr.flags.c_contiguous:
        _check_copy(var, arr)
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    if not arr.flags.c_contiguous:
        arr = np.array(arr, order="C")  # (np.ascontiguousarray would turn 0-d into 1-d)
    if lod:
        try:
            lod = check_offsets(lod, arr.shape[0] if arr.ndim else 1, f"feed {var.name!r} LoD")
        except ValueError as e:
            raise FeedError(str(e)) from None
        return LoDTensor._wrap(arr, lod)
    return arr


def _check_lod_level(var: Variable, lod) -> None:
    """A fed LoD must have as many levels as the variable declares (``data(lod_level=...)``)."""
    want = var.lod_level if var.type == VarType.LOD_TENSOR else 0
    if want == 0:
        raise FeedError(f"feed: variable {var.name!r} is declared with lod_level 0 but the fed "
                        f"LoDTensor has a LoD of {len(lod)} level(s); declare it with "
                        f"lod_level={len(lod)} (data(..., lod_level={len(lod)})) or feed a "
                        f"plain array")
    if want != len(lod):
        raise FeedError(f"feed: variable {var.name!r} expects a LoD of {want} level(s) "
                        f"(lod_level={want}), got {len(lod)}")


def merge_place_feeds(feeds, data_parallel: bool) -> dict:
    """The feed of a run from a list with one feed dict per place (what a loader given
    ``places`` yields). A plain program runs on one place: it takes a list of one dict. A
    data-parallel ``CompiledProgram`` runs one replica over all places' samples: the dense
    arrays of the dicts are concatenated along the batch axis."""
    if not all(isinstance(f, dict) for f in feeds):
        got = ", ".join(sorted({type(f).__name__ for f in feeds})) or "nothing"
        raise TypeError(f"Executor.run: feed must be a dict of name -> value, or a list of one "
                        f"such dict per place; got a list of {got}")
    if len(feeds) == 1:
        return feeds[0]
    if not data_parallel:
        raise FeedError(f"feed: a list of {len(feeds)} feed dicts (one per place) needs a "
                        f"CompiledProgram(...).with_data_parallel(); a plain program runs on "
                        f"one place and takes one dict")
    names = list(feeds[0])
    for i, f in enumerate(feeds[1:], 1):
        if sorted(f) != sorted(names):
            raise FeedError(f"feed: place {i} feeds {sorted(f)}, place 0 feeds {sorted(names)}")
    merged = {}
    for n in names:
        parts = [f[n] for f in feeds]
        if any(isinstance(p, LoDTensor) for p in parts):
            raise FeedError(f"feed: variable {n!r} is a LoD tensor in a feed list of "
                            f"{len(feeds)} places: feed the whole batch as one dict")
        merged[n] = np.concatenate([np.asarray(p) for p in parts], axis=0)
    return merged


def changed_persistables(program, feed_names, persistables) -> set:
    """The persistable variables (names in ``persistables``) a run of ``program`` fed
    ``feed_names`` may change in place: those an op writes and those the run feeds."""
    return _written_persistables(program) | {n for n in feed_names if n in persistables}


def _written_persistables(program) -> set:
    """The persistable variables (not the feed or fetch lists) an op of ``program`` writes."""
    out = set()
    for block in program.blocks:
        for op in block.ops:
            for n in op.output_arg_names:
                v = block._find_var_recursive(n)
                if v is not None and v.persistable and \
                        v.type not in (VarType.FEED_MINIBATCH, VarType.FETCH_LIST):
                    out.add(n)
    return out
