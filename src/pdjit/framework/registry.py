"""The op registry and the op-definition contract.

Every op type is defined exactly once, by an :class:`OpDef` passed to :func:`register_op`. The
definition is the only place that knows the op; program building, passes, code generation,
backward and the test kit read it and never switch on op names.

An ``OpDef`` holds:

``type``
    The op type as written in ``OpDesc.type`` (PaddlePaddle's legacy names: ``mul``,
    ``elementwise_add``, ``reshape2``...).
``inputs`` / ``outputs``
    Slots (:class:`Slot`), in order. Written compactly as strings: ``"X"``; a trailing ``*``
    marks a duplicable slot (a list of variables), ``?`` a dispensable one (may be absent or
    empty), ``~`` an intermediate output (computed for the backward pass, not a user result),
    ``^`` an output whose declared dtype in a file is not binding (PaddlePaddle declares it
    otherwise than its kernel computes it: the verifier does not compare it).
    ``"XShape?~"`` is dispensable and intermediate.
``attrs``
    ``{name: AttrSpec}`` with the proto attribute type, the default (``REQUIRED`` if the user
    must give it) and, for the test kit's strategies, the values it may take (``choices`` or
    ``low``/``high``).
``traits``
    A frozenset of the trait constants below. Passes test traits, never names:

    - ``ELEMENTWISE``: every output element depends only on the input elements at the same
      (broadcast) index; fusable into a loop nest.
    - ``BROADCAST``: inputs broadcast with Fluid's ``axis`` rule (implies ``ELEMENTWISE``).
    - ``REDUCTION``: reduces an input over some axes; ends or folds into a fusion group.
    - ``OPAQUE``: a library call or loop nest of its own (matmul, softmax, gather...).
    - ``VIEW``: output is input's data reinterpreted (reshape, squeeze); no arithmetic.
    - ``SIDE_EFFECT``: must not be pruned or reordered (save, print, assign into persistables).
    - ``CONTROL_FLOW``: owns sub-blocks (``BLOCK``/``BLOCKS`` attributes); a plan boundary.
    - ``RANDOM``: draws random numbers from the run's stream (see ``pdjit.framework.random``).
    - ``FEED_FETCH``: moves values between the run's feed/fetch lists and variables.
    - ``SEQUENCE``: reads or writes LoD offsets.
    - ``SUMS``, ``SUMS_ARRAYS``, ``COPIES``, ``ZEROS_LIKE``, ``FILLS``: the op is what the
      backward pass builds with to sum, copy, zero or fill (:func:`serving` finds it).
``infer_shape``
    ``infer_shape(X, Y, ..., *, attr1, attr2...) -> {out_slot: VarMeta | [VarMeta] }``.
    Called at build time (the seeds' InferShape). Each input slot arrives as a
    :class:`VarMeta` (``shape`` with ``-1`` for unknown dims, ``dtype`` as ``np.dtype``,
    ``lod_level``, ``type``), a list of them for duplicable slots, or ``None`` when a
    dispensable slot is absent; each declared attribute arrives as a keyword (a function may
    take ``**_`` to ignore attributes it does not need). It returns a meta for each output slot
    it defines, and raises :class:`ShapeMismatch` with an "expected ..., got ..." message when
    the inputs do not fit. Unknown dims stay ``-1``; nothing here may look at values.
``reference``
    ``reference(X, Y, ..., *, attrs...) -> {out_slot: ndarray | [ndarray]}``: the op's
    semantics in NumPy. It is the test oracle, the interpreter of the reference executor, and
    the step the compiled executor falls back to for ops without ``emit``. Inputs arrive as
    NumPy arrays (lists for duplicable slots, ``None`` when absent). A reference that declares
    a parameter named ``ctx`` also gets a :class:`pdjit.runtime.context.RunContext` (random
    stream, LoD, scope and sub-block execution for control flow). It must return arrays of the
    dtypes ``infer_shape`` promised, never views of its inputs that it then mutates, and must
    raise :class:`ShapeMismatch` (or ``IndexError`` for an out-of-range index) rather than
    read outside an array.
``emit``
    How the code generator inlines the op, or ``None`` (declared: not lowered; the compiled
    plan calls ``reference`` in a step of its own and the fusion report says so):

    - ``ELEMENTWISE`` ops: a scalar-expression template, e.g. ``"max({X}, {T}(0))"``. ``{X}``
      stands for the scalar value of input slot ``X`` at the current index, ``{T}`` for the
      output's NumPy scalar type name (``float32``), ``{name}`` for an attribute's value as a
      Python literal. The expression must compile under ``numba.njit`` and ``numba.cuda.jit``:
      use ``math.*`` for exact functions and the vectorisable helpers of the code generator's
      math module (``_m.tanh``, ``_m.exp``...) for transcendentals. An op with several outputs
      gives ``{slot: template}``. A callable ``emit(dtypes: {slot: np.dtype}, **attrs)`` may
      return the template when it depends on dtypes or attributes beyond substitution.
    - ``REDUCTION`` ops: :class:`Reduce` ``(init, combine, finalize, axes, keep_dim)`` with
      templates over ``{acc}``, ``{x}`` (the element) and ``{n}`` (the count reduced), or a
      callable ``emit(dtypes, **attrs)`` returning one (or ``None``).
    - ``OPAQUE`` and ``VIEW`` ops: :class:`Opaque` whose ``lower(ctx)`` returns source lines:
      a loop nest or a library call (``np.dot``) inside the generated function.

    A callable ``emit`` may return ``None``: not lowerable for these dtypes or attributes.
``grad``
    The grad maker, or ``None`` (declared: no gradient flows through this op). Called by the
    backward pass as ``grad(op) -> [GradOpSpec]`` where ``op`` is the forward
    :class:`pdjit.framework.program.Operator`. A :class:`GradOpSpec` names an op type and
    its inputs/outputs by variable name: forward names as they are, gradients by
    ``grad_var_name(name)`` (``name@GRAD``). The maker describes the full gradient; the
    backward pass removes outputs nobody needs, renames and sums gradients with several
    producers, and drops grad ops that produce nothing needed. ``grad=NO_GRAD_YET`` declares
    the op differentiable with its grad maker still to be written.

``control`` (``CONTROL_FLOW`` ops)
    A :class:`ControlFlow`: which attribute names the body block, which slots hold the
    condition and the step scopes, and whether the body loops or branches.
``inference`` (optional)
    What the op is at inference, for the inference passes (``pdjit.passes.inference``):
    ``inference(op) -> Passthrough | Rewrite | ChannelAffine | ChannelLinear | None``, called with
    the :class:`pdjit.framework.program.Operator` (as grad makers are); ``None``: nothing to say
    for this op and these attributes. :class:`Passthrough`: an output holds an input unchanged (a
    no-op to remove); :class:`Rewrite`: another op computes the same; :class:`ChannelAffine`:
    ``out = x * a + b`` per channel with ``a``, ``b`` from constant inputs (a batch norm with
    running statistics); :class:`ChannelLinear`: linear in a weight, output channel by channel (a
    convolution, a product), so a following :class:`ChannelAffine` folds into the weight;
    :class:`Clamp`: the op clamps its input between bounds (an activation that a
    convolution's kernel may apply as it stores its output); or :class:`Gate`: hard_swish or
    hard_sigmoid, which such a kernel may apply after the clamp.
``form`` (optional)
    What the op computes, in a form a pass can rebuild it from: ``form(op) -> Product |
    Permute | Scale | RowSoftmax | AttentionCore | None`` (a batched matrix product, a
    permutation of axes, a product by a constant, a softmax along an axis, attention's core;
    ``None``: none of these for these attributes). The inference pass ``fuse_attention``
    builds the op declaring ``ATTENTION`` from the others.
``test_mode`` (optional)
    The name of the boolean attribute that switches the op to inference behaviour (a dropout
    that keeps every element, a batch norm that reads its running statistics); the inference
    passes and ``Program.clone(for_test=True)`` set it. Without a declaration, an op that
    declares a boolean attribute named ``TEST_MODE_ATTR`` (Fluid's ``is_test``) has it.
``column`` (``FEED_FETCH`` ops)
    A :class:`Column`: which slot holds the run's feed or fetch list, which the variable, and
    which attribute the column; the runtime finds a program's feeds and fetches by it.
``layout`` (optional)
    A :class:`Layout`: the attribute that says whether the op's images are channels-first
    (NCHW) or channels-last (NHWC), and the slots it applies to; the inference pass
    ``channels_last`` switches it where the target asks for it.
``out_lod`` (optional)
    How the LoD of outputs follows from the LoD of inputs, without running the op:
    ``out_lod(lods, *, attrs...) -> {out_slot: lod | [lod]}``. ``lods`` maps each input slot the
    op binds to its LoD (a list of offset lists, ``[]`` when the value has none; a list of LoDs
    for a duplicable slot); absent dispensable slots are not in it. The result gives the LoD of
    each output slot it names (``[]``: the output carries none); outputs it does not name get
    the default (an output variable with ``lod_level > 0`` and as many rows as the first LoD
    input takes that input's LoD). It raises :class:`ShapeMismatch` for LoDs the op refuses and
    :class:`ValueDependentLoD` when an output's LoD depends on values (``lod_reset`` from Y's
    data): then only the reference knows it (``ctx.set_output_lod``). Both executors use it, so a
    reference need not set the LoD of outputs ``out_lod`` covers.

A program may contain op types that are not registered (loaded from a file): it loads and
prints, and running it raises :class:`UnregisteredOpError` naming the op.
"""
from __future__ import annotations

import functools
import importlib
import inspect
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from pdjit.framework.errors import UnregisteredOpError
from pdjit.proto import framework_pb2 as pb

A = pb.AttrType

# ---- traits --------------------------------------------------------------------------------
ELEMENTWISE = "elementwise"
BROADCAST = "broadcast"
REDUCTION = "reduction"
OPAQUE = "opaque"
VIEW = "view"
SIDE_EFFECT = "side_effect"
CONTROL_FLOW = "control_flow"
RANDOM = "random"
FEED_FETCH = "feed_fetch"
SEQUENCE = "sequence"
#: ``Out = X + Y`` elementwise (a code generator may add a value of ``Out``'s shape while a
#: kernel stores the other operand: a convolution's residual connection)
ADDITION = "addition"
#: ``Out = X * Y`` elementwise
MULTIPLICATION = "multiplication"
#: attention's core as one op (its ``form``: an :class:`AttentionCore` naming its slots and
#: attributes), what the inference pass ``fuse_attention`` builds
ATTENTION = "attention"
# what the backward pass builds with, each declared by one op (:func:`serving`); the op's first
# input slot is what it reads and its first output slot what it writes:
#: ``Out`` = the sum of the tensors of the (duplicable) input slot
SUMS = "sums"
#: ``Out`` = the element-by-element sum of the tensor arrays of the input slot (one: a copy)
SUMS_ARRAYS = "sums_arrays"
#: ``Out`` = the input's value
COPIES = "copies"
#: ``Out`` = zeros of the input's shape and dtype
ZEROS_LIKE = "zeros_like"
#: ``Out`` = a tensor of attributes ``shape`` and ``dtype`` holding attribute ``value``
FILLS = "fills"
ALL_TRAITS = frozenset({ELEMENTWISE, BROADCAST, REDUCTION, OPAQUE, VIEW, SIDE_EFFECT,
                        CONTROL_FLOW, RANDOM, FEED_FETCH, SEQUENCE, ADDITION, MULTIPLICATION,
                        SUMS, SUMS_ARRAYS, COPIES, ZEROS_LIKE, FILLS, ATTENTION})

#: the attribute an op switches to inference behaviour with unless it declares another
#: (``test_mode``); also what an op of a file that pdjit does not register is read with
TEST_MODE_ATTR = "is_test"

GRAD_SUFFIX = "@GRAD"
EMPTY_VAR_NAME = "@EMPTY@"


class ValueDependentLoD(Exception):
    """Raised by an ``out_lod`` rule: this output's LoD depends on input values, not LoDs."""


def grad_var_name(name: str) -> str:
    """The name of the gradient variable of ``name`` (Fluid's ``@GRAD`` convention)."""
    return name + GRAD_SUFFIX


class _NoGradYet:
    """``grad=NO_GRAD_YET``: the op is differentiable but its grad maker is not written yet.

    The backward pass refuses such an op with an error naming it; the registry-wide test lists
    them. (``grad=None`` means something else: no gradient flows through the op.)
    """

    def __repr__(self):
        return "NO_GRAD_YET"

    def __call__(self, op):
        raise NotImplementedError(f"the gradient of op {op.type!r} is not implemented yet")


NO_GRAD_YET = _NoGradYet()


class _Required:
    def __repr__(self):
        return "REQUIRED"


REQUIRED = _Required()


# ---- slots and attributes ------------------------------------------------------------------
@dataclass(frozen=True)
class Slot:
    name: str
    duplicable: bool = False
    dispensable: bool = False
    intermediate: bool = False
    loose_dtype: bool = False

    @staticmethod
    def parse(spec: "str | Slot") -> "Slot":
        if isinstance(spec, Slot):
            return spec
        name = spec.rstrip("*?~^")
        flags = spec[len(name):]
        return Slot(name, "*" in flags, "?" in flags, "~" in flags, "^" in flags)


@dataclass(frozen=True)
class AttrSpec:
    """A declared attribute: proto type, default, and the values strategies may draw.

    ``at_least`` / ``at_most`` / ``less_than`` / ``one_of`` (optional) are the values the op
    accepts at all (``choices`` and ``low``/``high`` are only what strategies draw): the program
    verifier (``pdjit.verify``) refuses others, element by element for a list attribute (a NaN
    is outside every declared bound). ``axis_of`` (input slot names) declares the value an axis
    of those inputs: each element must lie in ``-r .. r - 1`` where ``r`` is the largest
    declared rank among them plus ``axis_extra`` (an op that adds an axis: ``stack``), at least
    1. ``valid(value) -> problem text | None`` checks what a range cannot say (a string that
    must parse as a number)."""
    type: int
    default: Any = REQUIRED
    choices: tuple | None = None
    low: float | None = None
    high: float | None = None
    doc: str = ""
    at_least: float | None = None
    at_most: float | None = None
    one_of: tuple | None = None
    less_than: float | None = None
    axis_of: tuple | None = None
    axis_extra: int = 0
    valid: Callable | None = None

    @property
    def checked(self) -> bool:
        """Whether the verifier has anything to check of this attribute's value."""
        return (self.at_least is not None or self.at_most is not None
                or self.one_of is not None or self.less_than is not None
                or self.axis_of is not None or self.valid is not None)

    @property
    def required(self) -> bool:
        return self.default is REQUIRED


def _spec(t):
    def make(default=REQUIRED, *, choices=None, low=None, high=None, doc="", at_least=None,
             at_most=None, one_of=None, less_than=None, axis_of=None, axis_extra=0, valid=None):
        if isinstance(axis_of, str):
            axis_of = (axis_of,)
        return AttrSpec(t, default, tuple(choices) if choices is not None else None, low, high, doc,
                        at_least, at_most, tuple(one_of) if one_of is not None else None,
                        less_than, tuple(axis_of) if axis_of is not None else None, axis_extra,
                        valid)
    make.__name__ = pb.AttrType.Name(t)
    return make


Int, Long, Float, Float64, Bool, Str = (_spec(A.INT), _spec(A.LONG), _spec(A.FLOAT),
                                        _spec(A.FLOAT64), _spec(A.BOOLEAN), _spec(A.STRING))
Ints, Longs, Floats, Float64s, Bools, Strs = (_spec(A.INTS), _spec(A.LONGS), _spec(A.FLOATS),
                                              _spec(A.FLOAT64S), _spec(A.BOOLEANS),
                                              _spec(A.STRINGS))
BlockAttr, BlocksAttr = _spec(A.BLOCK), _spec(A.BLOCKS)
Scalar, Scalars = _spec(A.SCALAR), _spec(A.SCALARS)

# Attributes any op may carry (PaddlePaddle's framework attributes). They never change what an
# op computes; op definitions do not see them.
OP_ROLE_FORWARD, OP_ROLE_BACKWARD, OP_ROLE_OPTIMIZE, OP_ROLE_LRSCHED, OP_ROLE_LOSS = \
    0x0000, 0x0001, 0x0002, 0x0010, 0x0100
COMMON_ATTRS: Mapping[str, AttrSpec] = {
    "op_role": Int(OP_ROLE_FORWARD),
    "op_role_var": Strs([]),
    "op_namescope": Str("/"),
    "op_callstack": Strs([]),
    "op_device": Str(""),
    "with_quant_attr": Bool(False),
}


# ---- shapes at build time --------------------------------------------------------------------
@dataclass(frozen=True)
class VarMeta:
    """What is known of a variable at build time: shape (``-1`` unknown), dtype, LoD level."""
    shape: tuple
    dtype: np.dtype
    lod_level: int = 0
    type: int = pb.VarType.LOD_TENSOR
    name: str = ""

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        object.__setattr__(self, "dtype", np.dtype(self.dtype))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def with_(self, **kw) -> "VarMeta":
        d = dict(shape=self.shape, dtype=self.dtype, lod_level=self.lod_level, type=self.type)
        d.update(kw)
        return VarMeta(**d)


# ---- emit forms for reductions and opaque ops -------------------------------------------------
@dataclass(frozen=True)
class Reduce:
    """A reduction's lowering: ``acc = init; acc = combine(acc, x)...; out = finalize(acc, n)``.

    ``axes`` are the reduced axes of input slot ``x`` (``None``: all), ``keep_dim`` keeps them as
    1s; output slot ``out`` gets the result. ``identity``: ``init`` is the result of reducing
    nothing (a sum's 0); when False (max, min) reducing an empty extent into a non-empty output
    is left to the reference, which refuses.
    """
    init: str
    combine: str
    finalize: str = "{acc}"
    axes: tuple | None = None
    keep_dim: bool = False
    identity: bool = True
    x: str = "X"
    out: str = "Out"


@dataclass(frozen=True)
class Opaque:
    """An opaque op's lowering: ``lower(ctx) -> [source lines]`` or ``None`` (not lowerable for
    these ranks/dtypes/attributes: the op runs its reference).

    ``ctx`` (``pdjit.codegen.lowering.LowerContext``) names the op's input and output values
    (``ctx.inp("X")``, ``ctx.out("Out")``), their ranks and dtypes, its attributes
    (``ctx.attrs``), and gives fresh local names (``ctx.tmp()``).
    Lines may use ``np`` (as Numba supports it) and must leave each output a C-contiguous array.

    The lines become a kernel of their own, compiled once per distinct text. ``host=True``
    declares lines that only call libraries or make views (GEMM through ``_rt.gemm``,
    ``reshape``, a copy): they run in the plan's driver as they are, valid both as Python and
    under Numba, and compile nothing.

    ``lower`` is the op's generic rule, target-neutral; each code generation target may
    register its own lowering for the op type instead (``pdjit.codegen.target.Lowerings``,
    with these same fields). ``Opaque()`` (no ``lower``): only the targets' lowerings exist;
    a target without one runs the op's reference.

    Outputs: ``ctx.out(slot, shape=...)`` lets the driver allocate the output and pass it in
    (destination passing: the lines only write it); ``ctx.out(slot)`` leaves the lines to bind
    it (a view, or a size known only inside from values). ``flat=True`` declares lines that
    work on their arrays' elements alone (an optimizer update): every array, inputs and
    driver-allocated outputs, arrives flattened to 1-D, so one compiled kernel serves every
    rank; all its outputs must be driver-allocated.

    ``blocked(ctx) -> (lines, fn, before, after)`` (host lowerings, optional): the op computed
    by samples, so that the elementwise chain after it (a bias, an activation, a residual add:
    an epilogue) runs on each block of samples right after the block is computed, while it is
    in cache. ``lines`` are driver lines as ``lower`` gives them (they allocate the output
    with ``ctx.out(slot, shape=...)``, the whole batch), and ``fn(*before, n0, n1, *after)``,
    a compiled function of the target's library (``ctx.lib_fn(name)``), computes the output's
    samples ``n0..n1``; ``before``
    and ``after`` are source expressions over the driver's locals. ``None``: not by blocks.

    ``channel_axis`` (with ``blocked``): the output's axis along which a bias of the epilogue
    runs (1: a convolution's channels; -1: a product's columns), or ``channel_axis(op)``
    giving it (a convolution's depends on its ``data_format``).

    ``channels_last(op) -> bool`` (optional, an op that declares a ``Layout``): the lowering
    runs ``op`` on channels-last images without converting them (what the inference pass
    ``channels_last`` asks the target, ``Target.channels_last``).

    ``blas=True`` (host lowerings): the lines call the host's BLAS (a GEMM, a batched GEMM),
    a fact the code generator records on the driver (``calls_blas``) so that the run sets
    BLAS's threads around it.

    ``channel_prologue(op) -> slot or None`` (host lowerings, optional): the input slot whose
    value the lowering can read through a per-channel product, sum and clamp applied as it
    reads (a batch norm and relu at inference before a 1x1 convolution: the code generator
    then runs no kernel of their own, ``LowerContext.channel_prologue``); None: not for this
    op. Where it names a slot, the lowering must take what it is offered there.
    """
    lower: Callable | None = None
    host: bool = False
    flat: bool = False
    blocked: Callable | None = None
    blas: bool = False
    channel_axis: int | Callable = 1
    channels_last: Callable | None = None
    channel_prologue: Callable | None = None


# ---- control flow ------------------------------------------------------------------------
LOOP, BRANCH = "loop", "branch"


@dataclass(frozen=True)
class ControlFlow:
    """What a ``CONTROL_FLOW`` op's slots and attributes mean, declared with the op so that
    passes and the runtime never probe names:

    ``kind``
        ``LOOP`` (the body block runs while the condition holds) or ``BRANCH`` (it runs once
        when the condition holds; otherwise its outputs keep their values).
    ``body``
        The ``BLOCK`` attribute naming the sub-block.
    ``condition``
        The input slot holding the condition.
    ``step_scopes``
        The output slot (a ``STEP_SCOPES`` variable) keeping the scope of each run of the body,
        which the backward pass reads.
    ``keeps_no_scopes``
        A ``BOOLEAN`` attribute that, when true, means the step scopes stay empty (inference).
    ``scalar_condition``
        For a ``BRANCH``: a ``BOOLEAN`` attribute that, when true, means the condition is the
        one bool element of one tensor; when false, the branch runs when every condition
        tensor is non-empty. (A ``LOOP``'s condition is always one bool element.)
    ``state_links``
        A pair of ``STRINGS`` attributes ``(ex_states, states)``: variables of the body each run
        reads as the previous run's state, and those it leaves as the next run's (a recurrent
        op's memories). The backward pass seeds the gradient of each state in the grad block
        under ``state@GRAD`` and leaves each ex-state's in ``ex_state@GRAD`` (variables of the
        grad block); the grad op passes them from run to run.
    """
    kind: str
    body: str = "sub_block"
    condition: str | None = None
    step_scopes: str | None = None
    keeps_no_scopes: str | None = None
    scalar_condition: str | None = None
    state_links: tuple | None = None

    def keeps_scopes(self, op) -> bool:
        """Whether ``op`` (of this definition) records the scope of each run of its body."""
        return self.step_scopes is not None and not (
            self.keeps_no_scopes is not None and op.has_attr(self.keeps_no_scopes)
            and op.attr(self.keeps_no_scopes))

    def __post_init__(self):
        if self.kind not in (LOOP, BRANCH):
            raise ValueError(f"ControlFlow.kind must be {LOOP!r} or {BRANCH!r}, got "
                             f"{self.kind!r}")


@dataclass(frozen=True)
class Select:
    """The op picks by an index: the one-element integer input slot ``index`` (in ``[0, n)``)
    chooses among the ``n`` variables of ``choices``. With ``gather``, output slot ``out`` gets
    input ``choices[index]`` (the others may hold no value); otherwise input slot ``value`` is
    written to output ``choices[index]`` (the others keep theirs). What a ``cond`` merges its
    branches' values with, declared so that a runtime or a code generator can drive it without
    naming the op."""
    index: str
    choices: str
    gather: bool
    value: str = ""
    out: str = ""


@dataclass(frozen=True)
class Column:
    """A ``FEED_FETCH`` op that moves one value between a list variable (the run's feed or
    fetch list) and a variable: column ``col`` (the attribute holding it) of the list in slot
    ``holder``, the variable in slot ``value``. With ``fetch`` the value goes into the list
    (``holder`` an output slot, ``value`` an input slot); otherwise it comes out of it."""
    holder: str
    value: str
    fetch: bool
    col: str = "col"

    def list_var(self, op) -> list:
        """The names ``op`` binds to the list slot."""
        return op.output(self.holder) if self.fetch else op.input(self.holder)

    def value_var(self, op) -> list:
        """The names ``op`` binds to the value slot."""
        return op.input(self.value) if self.fetch else op.output(self.value)


@dataclass(frozen=True)
class Layout:
    """Attribute ``attr`` says the layout of the rank-4 images in the input slots ``inputs``
    and output slots ``outputs``: ``first`` (channels on axis 1, NCHW) or ``last`` (channels
    on axis 3, NHWC; any value but ``last`` reads as ``first``); the op's other slots (a
    filter) do not change with it. ``follow``: the op computes as fast on either layout, so
    the pass switches it, from ``first`` exactly, only where the images it reads are a
    chain's (a concat along the channels, whose ``axis`` 1 becomes 3: a chain runs on
    through it). ``join``: the op gains nothing on ``last`` by itself, so the pass switches
    it, where the target asks, only where the image it reads is a chain's (a pool: a chain
    runs on through it, or ends in it, with no conversion around it)."""
    inputs: tuple
    outputs: tuple
    attr: str = "data_format"
    first: Any = "NCHW"
    last: Any = "NHWC"
    follow: bool = False
    join: bool = False

    def is_last(self, op) -> bool:
        return op.all_attrs().get(self.attr, self.first) == self.last

    def is_first(self, op) -> bool:
        return op.all_attrs().get(self.attr, self.first) == self.first


# ---- what an op is at inference (``OpDef.inference``) ------------------------------------
@dataclass(frozen=True)
class Passthrough:
    """At inference, output slot ``out`` holds input slot ``x`` unchanged (value, dtype, LoD)."""
    x: str = "X"
    out: str = "Out"


@dataclass(frozen=True)
class Rewrite:
    """At inference, op ``type`` with these slots (variable names) and attributes computes the
    same; outputs of the op that it does not name are not computed any more."""
    type: str
    inputs: dict
    outputs: dict
    attrs: dict = field(default_factory=dict)


@dataclass(frozen=True)
class ChannelAffine:
    """At inference, ``out = x * a + b`` per channel along ``axis`` of ``x`` (negative: from the
    end), where ``coefficients({slot: value}) -> (a, b)`` (vectors over the channels; ``None`` for
    ones / zeros; the whole result ``None``: these values do not fit) is computed from the values
    of the constant input slots ``params`` (float64; an absent dispensable slot gives ``None``).
    ``passes``: ``{output slot: input slot}`` outputs that hold an input's value unchanged (the
    running statistics a batch norm writes in place)."""
    x: str
    out: str
    axis: int
    params: tuple
    coefficients: Callable
    passes: Mapping = field(default_factory=dict)


@dataclass(frozen=True)
class Clamp:
    """The op is ``out = minimum(maximum(x, lo), hi)`` elementwise (NumPy's ``maximum`` and
    ``minimum``: a NaN stays NaN), ``lo`` and ``hi`` floats from its attributes (``-inf``,
    ``inf``: no bound). A code generator may apply it inside the kernel that computes ``x``
    (a convolution's stores) instead of in a loop of its own. (Returned by ``inference``:
    what the op is at inference, and at any time.)"""
    x: str
    out: str
    lo: float
    hi: float


@dataclass(frozen=True)
class Gate:
    """The op is ``t = minimum(maximum(x * a + b, lo), hi)`` elementwise, then ``out = x * t /
    scale`` (``scale`` not 0: hard_swish) or ``out = t`` (``scale`` 0: hard_sigmoid), each
    step rounded to the data's type as written (the constants too), NaN kept as NumPy's
    ``maximum`` and ``minimum`` keep it. A code generator may apply it inside the kernel that
    computes ``x``, after a :class:`Clamp` (``pdjit.codegen.cpu.lib.tile.gate_of``).
    (Returned by ``inference``, as :class:`Clamp` is.)"""
    x: str
    out: str
    a: float
    b: float
    lo: float
    hi: float
    scale: float

    def values(self) -> tuple:
        """``(a, b, lo, hi, scale)``: the order a kernel's gate array holds them."""
        return (self.a, self.b, self.lo, self.hi, self.scale)


@dataclass(frozen=True)
class ChannelLinear:
    """The op is linear in its weight input slot ``weight``, and channel ``c`` of output slot
    ``out`` (along ``axis``, negative: from the end) depends on its own part of the weight:
    ``scale_weight(w, a, out=None)`` (``a`` a float64 vector over the channels) gives the
    weight with which the output's channel ``c`` comes out multiplied by ``a[c]`` (in ``w``'s
    dtype, each product computed in float64 and rounded once: :func:`scaled_weight`; written
    into ``out``, an array of ``w``'s shape and dtype, when given: ``w`` itself may be it), or
    ``None`` when ``w`` does not have the form this needs."""
    weight: str
    out: str
    axis: int
    scale_weight: Callable


def scaled_weight(w, a, out=None):
    """``w * a`` (``a`` broadcast against ``w``) in ``w``'s dtype, each product computed in
    float64 and rounded once; NumPy converts in small blocks, with no float64 copy of ``w``.
    Written into ``out`` when given (``w`` itself may be it: each element is read before it
    is written)."""
    if out is None:
        out = np.empty(w.shape, w.dtype)
    np.multiply(w, a, out=out, dtype=np.float64, casting="unsafe")
    return out


# ---- what an op computes, in a form a pass can rebuild it from (``OpDef.form``) -----------
@dataclass(frozen=True)
class Product:
    """``out = alpha * op(x) @ op(y)`` over the last two dims of ``x`` and ``y`` (``op``
    transposes them where ``trans_x`` / ``trans_y``), batch dims broadcast."""
    x: str
    y: str
    out: str
    trans_x: bool
    trans_y: bool
    alpha: float


@dataclass(frozen=True)
class Permute:
    """``out = x`` with its axes permuted: ``out``'s axis ``i`` is ``x``'s axis ``perm[i]``."""
    x: str
    out: str
    perm: tuple


@dataclass(frozen=True)
class Scale:
    """``out = x * factor`` elementwise (the factor in ``x``'s dtype)."""
    x: str
    out: str
    factor: float


@dataclass(frozen=True)
class AttentionCore:
    """``out = transpose(softmax(alpha * q' @ k'^T + mask) @ v', out_perm)`` over the last two
    dims, ``x'`` being input ``x`` with its axes permuted by its permutation attribute (empty:
    as it is), the softmax :class:`RowSoftmax`'s; ``mask`` (dispensable) broadcasts to the
    scores. Names the op's slots (``q``, ``k``, ``v``, ``mask``, ``out``) and attributes
    (``alpha``; ``perms``: the permutations of q, k, v and out). The op declaring
    ``ATTENTION`` gives it for any op (``form(None)`` too)."""
    q: str
    k: str
    v: str
    mask: str
    out: str
    alpha: str
    perms: tuple


@dataclass(frozen=True)
class RowSoftmax:
    """``out = softmax(x)`` over ``x``'s axis ``axis`` (negative: from the end), ``x - max``
    clipped at -64 before the exponential (Paddle's CPU softmax, as ``softmax`` computes
    it)."""
    x: str
    out: str
    axis: int


@dataclass(frozen=True)
class RowWise:
    """Row ``i`` of every output depends only on row ``i`` (dim 0, the batch) of the inputs that
    carry the batch, so a batch may be cut into slices run apart (the batch-split analysis,
    :mod:`pdjit.passes.batch_rows`). Declared by ops whose traits do not already say it.

    - ``batch``: the input slots that may carry the batch;
    - ``const``: input slots that must not depend on the batch (parameters); any other input
      slot that is bound refuses the split;
    - ``every``: every variable of the ``batch`` slots must carry it (a concatenation);
    - ``axes``: attributes holding an axis or a list of axes (negative: from the end) of the
      first ``batch`` variable, none of which may be dim 0;
    - ``drop``: output slots a split run does not keep (statistics, ``XShape``): an op reading
      them refuses the split;
    - ``check(view)``: what else the attributes must satisfy: the reason to refuse, or ``None``.
      ``view.attr(name)`` (declared defaults filled in), ``view.rank(slot)`` (the rank of the
      slot's first variable) and ``view.carries(slot)`` (whether it carries the batch).
    """
    batch: tuple = ("X",)
    const: tuple = ()
    every: bool = False
    axes: tuple = ()
    drop: tuple = ()
    check: Callable | None = None


# ---- grad makers --------------------------------------------------------------------------
@dataclass
class GradOpSpec:
    type: str
    inputs: dict
    outputs: dict
    attrs: dict = field(default_factory=dict)


def default_grad(grad_type: str, fwd_inputs=("X",), fwd_outputs=(), grad_outputs=("Out",),
                 wrt=("X",)):
    """The common grad maker: ``grad_type`` reads the forward inputs named in ``fwd_inputs``, the
    forward outputs in ``fwd_outputs``, and the gradients ``<slot>@GRAD`` of the outputs in
    ``grad_outputs``; it writes ``<slot>@GRAD`` for each input slot in ``wrt``, and copies the
    forward op's declared attributes. (Paddle's convention: ``tanh_grad`` reads ``Out`` and
    ``Out@GRAD``, ``square_grad`` reads ``X`` and ``Out@GRAD``...)"""
    def maker(op):
        ins = {s: op.input(s) for s in fwd_inputs if op.input(s)}
        ins.update({s: op.output(s) for s in fwd_outputs if op.output(s)})
        for s in grad_outputs:
            ins[f"{s}@GRAD"] = [grad_var_name(n) for n in op.output(s)]
        outs = {f"{s}@GRAD": [grad_var_name(n) for n in op.input(s) if n != EMPTY_VAR_NAME]
                for s in wrt if op.input(s)}
        attrs = {k: v for k, v in op.all_attrs().items()
                 if k in get(op.type).attrs}
        return [GradOpSpec(grad_type, ins, outs, attrs)]
    return maker


# ---- the definition --------------------------------------------------------------------------
class _Signature:
    """Which slots and attributes a definition function takes, worked out once."""

    def __init__(self, fn: Callable, slots: Sequence[str], attrs: Sequence[str]):
        params = inspect.signature(fn).parameters
        self.takes_all = any(p.kind == p.VAR_KEYWORD for p in params.values())
        self.ctx = "ctx" in params
        self.slots = [s for s in slots if s in params or self.takes_all]
        self.attrs = [a for a in attrs if a in params or self.takes_all]


@dataclass(eq=False)
class OpDef:
    type: str
    inputs: tuple
    outputs: tuple
    attrs: Mapping[str, AttrSpec]
    traits: frozenset
    infer_shape: Callable
    reference: Callable
    emit: Any
    grad: Callable | None
    doc: str = ""
    domain: Mapping[str, str] = field(default_factory=dict)
    out_lod: Callable | None = None
    control: ControlFlow | None = None
    inference: Callable | None = None
    row_wise: RowWise | None = None
    select: Select | None = None
    test_mode: str | None = None
    column: Column | None = None
    layout: Layout | None = None
    form: Callable | None = None

    def __post_init__(self):
        self.inputs = tuple(Slot.parse(s) for s in self.inputs)
        self.outputs = tuple(Slot.parse(s) for s in self.outputs)
        self.traits = frozenset(self.traits)
        unknown = self.traits - ALL_TRAITS
        if unknown:
            raise ValueError(f"op {self.type!r}: unknown traits {sorted(unknown)}")
        if BROADCAST in self.traits:
            self.traits |= {ELEMENTWISE}
        if self.control is not None:
            if CONTROL_FLOW not in self.traits:
                raise ValueError(f"op {self.type!r}: a ControlFlow declaration needs the "
                                 f"CONTROL_FLOW trait")
            if self.control.body not in self.attrs or \
                    self.attrs[self.control.body].type != A.BLOCK:
                raise ValueError(f"op {self.type!r}: ControlFlow.body {self.control.body!r} is "
                                 f"not a BLOCK attribute of the op")
            for slot, slots in ((self.control.condition, self.inputs),
                                (self.control.step_scopes, self.outputs)):
                if slot is not None and slot not in {s.name for s in slots}:
                    raise ValueError(f"op {self.type!r}: ControlFlow names slot {slot!r}, which "
                                     f"the op does not have")
        if self.select is not None:
            sel, ins, outs = self.select, {s.name for s in self.inputs}, \
                {s.name for s in self.outputs}
            have = (sel.choices in (ins if sel.gather else outs), sel.index in ins,
                    (sel.out in outs) if sel.gather else (sel.value in ins))
            if CONTROL_FLOW not in self.traits or not all(have):
                raise ValueError(f"op {self.type!r}: a Select declaration needs the "
                                 f"CONTROL_FLOW trait and the slots it names")
        if self.row_wise is not None:
            ins, outs = {s.name for s in self.inputs}, {s.name for s in self.outputs}
            rw = self.row_wise
            bad = [s for s in (*rw.batch, *rw.const) if s not in ins] + \
                [s for s in rw.drop if s not in outs] + [a for a in rw.axes if a not in self.attrs]
            if bad or not rw.batch:
                raise ValueError(f"op {self.type!r}: RowWise names {bad or 'no batch slot'}, "
                                 f"which the op does not have")
        if self.test_mode is None and TEST_MODE_ATTR in self.attrs and \
                self.attrs[TEST_MODE_ATTR].type == A.BOOLEAN:
            self.test_mode = TEST_MODE_ATTR
        if self.test_mode is not None and (self.test_mode not in self.attrs
                                           or self.attrs[self.test_mode].type != A.BOOLEAN):
            raise ValueError(f"op {self.type!r}: test_mode {self.test_mode!r} is not a boolean "
                             f"attribute of the op")
        if self.column is not None:
            c, ins, outs = self.column, {s.name for s in self.inputs}, \
                {s.name for s in self.outputs}
            lists, values = (outs, ins) if c.fetch else (ins, outs)
            if FEED_FETCH not in self.traits or c.holder not in lists or \
                    c.value not in values or c.col not in self.attrs:
                raise ValueError(f"op {self.type!r}: a Column declaration needs the FEED_FETCH "
                                 f"trait and the slots and attribute it names")

    # (worked out at the first call, not at registration: ~1,000 signatures at import)
    @functools.cached_property
    def _infer_sig(self) -> _Signature:
        return _Signature(self.infer_shape, [s.name for s in self.inputs], list(self.attrs))

    @functools.cached_property
    def _ref_sig(self) -> _Signature:
        return _Signature(self.reference, [s.name for s in self.inputs], list(self.attrs))

    def input_slot(self, name: str) -> Slot | None:
        return next((s for s in self.inputs if s.name == name), None)

    def output_slot(self, name: str) -> Slot | None:
        return next((s for s in self.outputs if s.name == name), None)

    def has(self, trait: str) -> bool:
        return trait in self.traits

    @property
    def differentiable(self) -> bool:
        return self.grad is not None

    def attr_values(self, given: Mapping[str, Any]) -> dict:
        """Declared attributes with defaults filled in (``given`` may hold extra ones)."""
        out = {}
        for name, spec in self.attrs.items():
            if name in given:
                out[name] = given[name]
            elif not spec.required:
                out[name] = spec.default
        return out

    def call_infer_shape(self, inputs: Mapping[str, Any], attrs: Mapping[str, Any]) -> dict:
        return self._call(self.infer_shape, self._infer_sig, inputs, attrs, None)

    def infer_op(self, op, meta_of) -> dict:
        """``infer_shape`` of ``op`` (an operator of this type) with its attributes: each bound
        input's meta is ``meta_of(name)`` (``None``: left out), a list for a duplicable slot.
        Raises what ``infer_shape`` raises."""
        metas = {}
        for slot in self.inputs:
            ms = [m for n in op.input(slot.name)
                  if n != EMPTY_VAR_NAME and (m := meta_of(n)) is not None]
            metas[slot.name] = ms if slot.duplicable else (ms[0] if ms else None)
        return self.call_infer_shape(metas, op.all_attrs())

    def call_reference(self, inputs: Mapping[str, Any], attrs: Mapping[str, Any], ctx=None) -> dict:
        return self._call(self.reference, self._ref_sig, inputs, attrs, ctx)

    def call_out_lod(self, lods: Mapping[str, Any], attrs: Mapping[str, Any]) -> dict:
        """The output LoDs ``out_lod`` defines (``{}`` without a rule); may raise
        :class:`ValueDependentLoD` or :class:`ShapeMismatch`."""
        if self.out_lod is None:
            return {}
        return self.out_lod(dict(lods), **self.attr_values(attrs))

    def _call(self, fn, sig: _Signature, inputs, attrs, ctx):
        # an op read from a file may leave out attributes its writer did not know: defaults
        attrs = {**self.attr_values(attrs), **attrs}
        kw = {s: inputs.get(s) for s in sig.slots}
        for a in sig.attrs:
            if a in attrs:
                kw[a] = attrs[a]
        if sig.ctx:
            kw["ctx"] = ctx
        return fn(**kw)


_REGISTRY: dict[str, OpDef] = {}
_BUILTINS_LOADED = False
_HAVING: dict = {}  # traits -> [OpDef], emptied whenever the registry changes


def register_op(type: str, *, inputs: Sequence, outputs: Sequence, attrs: Mapping | None = None,
                traits: Sequence = (), infer_shape: Callable, reference: Callable, emit: Any,
                grad: Callable | None, doc: str = "", domain: Mapping | None = None,
                replace: bool = False, out_lod: Callable | None = None,
                control: ControlFlow | None = None,
                inference: Callable | None = None, row_wise: RowWise | None = None,
                select: Select | None = None, test_mode: str | None = None,
                column: Column | None = None, layout: Layout | None = None,
                form: Callable | None = None) -> OpDef:
    """Define an op. ``emit`` and ``grad`` have no default: each op declares both decisions.

    ``domain`` (optional) says which values an input slot takes: ``{"X": "positive"}``
    (also ``"nonzero"``, ``"unit"`` for (-1, 1)); the test kit's strategies respect it.
    """
    if type in _REGISTRY and not replace:
        raise ValueError(f"op type {type!r} is already registered")
    opdef = OpDef(type, tuple(inputs), tuple(outputs), dict(attrs or {}), frozenset(traits),
                  infer_shape, reference, emit, grad, doc, dict(domain or {}), out_lod, control,
                  inference, row_wise, select, test_mode, column, layout, form)
    _REGISTRY[type] = opdef
    _HAVING.clear()
    # pdjit's own definitions are the ones its op modules make (define_op's are a user's)
    if sys._getframe(1).f_globals.get("__name__", "").startswith("pdjit.ops."):
        _BUILTIN.add(type)
    else:
        _BUILTIN.discard(type)
    return opdef


def unregister_op(type: str) -> None:
    _REGISTRY.pop(type, None)
    _HAVING.clear()
    _BUILTIN.discard(type)


_BUILTIN: set = set()  # the op types whose definition is pdjit's own (not replaced since)


def _load_builtins() -> None:
    global _BUILTINS_LOADED
    if not _BUILTINS_LOADED:
        _BUILTINS_LOADED = True
        importlib.import_module("pdjit.ops")


def is_builtin(type: str) -> bool:
    """Whether op ``type`` has pdjit's own definition (not one a user registered or replaced
    with ``define_op`` / ``register_op``): what depends only on pdjit's sources."""
    _load_builtins()
    return type in _BUILTIN


def lookup(type: str) -> OpDef | None:
    """The definition of ``type``, or ``None`` when it is not registered."""
    _load_builtins()
    return _REGISTRY.get(type)


def inference_of(op):
    """What ``op`` is at inference by its definition's ``inference`` rule (a
    :class:`ChannelAffine`, :class:`Clamp`, :class:`Gate`, ...); ``None`` where its type is not
    registered, has no such rule, or the rule declines this op."""
    d = lookup(op.type)
    return None if d is None or d.inference is None else d.inference(op)


def get(type: str) -> OpDef:
    """The definition of ``type``; :class:`UnregisteredOpError` when there is none."""
    d = lookup(type)
    if d is None:
        raise UnregisteredOpError(f"op type {type!r} is not registered in pdjit")
    return d


def test_mode_of(type: str) -> str:
    """The attribute that switches op ``type`` to inference behaviour: its definition's
    ``test_mode``, else (not registered, or declaring none) ``TEST_MODE_ATTR`` (an op read from
    a file may carry it without pdjit declaring it)."""
    d = lookup(type)
    return d.test_mode if d is not None and d.test_mode is not None else TEST_MODE_ATTR


test_mode_of.__test__ = False  # not a test (pytest collects ``test_*`` names a test imports)


def having(*traits: str) -> list:
    """The registered definitions that declare every one of ``traits``, by type."""
    _load_builtins()
    key = frozenset(traits)
    if key not in _HAVING:
        _HAVING[key] = sorted((d for d in _REGISTRY.values() if key <= d.traits),
                              key=lambda d: d.type)
    return list(_HAVING[key])


def serving(trait: str) -> OpDef:
    """The op declaring ``trait`` (one of what a pass builds with: ``SUMS``, ``COPIES``...),
    the first by type when several do; :class:`UnregisteredOpError` when none does."""
    found = having(trait)
    if not found:
        raise UnregisteredOpError(f"no registered op declares the {trait!r} trait")
    return found[0]


def all_ops() -> dict[str, OpDef]:
    _load_builtins()
    return dict(_REGISTRY)
