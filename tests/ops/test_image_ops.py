"""Image and shape ops (flatten_contiguous_range, flatten2, shape, pad, pad3d, the resize ops,
affine_channel), their gradients and their Fluid layers.

Expected values come from NumPy written here: per-pixel loops that follow PaddlePaddle's CPU
kernels (float32 source coordinates), independent of the ops' references; a few golden
results were produced by PaddlePaddle 3.3.1 itself. Every op runs in both executors
(``check_output`` asserts that native code ran); every gradient is checked against finite
differences, and the gradient programs are checked to be native from end to end.
"""
import numpy as np
import pytest

import pdjit as fluid
from pdjit.framework.errors import OpShapeError
from pdjit.passes.backward import gradients
from pdjit.runtime.executor import Executor
from pdjit.runtime.scope import Scope
from pdjit.testing import build_op_program
from pdjit.testing.grad_check import check_grad
from pdjit.testing.op_test import assert_native, check_output

RNG = np.random.default_rng(15)
F32 = np.float32


def _rand(*shape, dtype="float32"):
    return RNG.normal(size=shape).astype(dtype)


# ---- NumPy oracles -------------------------------------------------------------------------------
def _ratio(n_in, n_out, align_corners, scale=-1.0):
    if n_out <= 1:
        return F32(0)
    if align_corners:
        return F32(n_in - 1) / F32(n_out - 1)
    return F32(1.0 / scale) if scale > 0 else F32(n_in) / F32(n_out)


def resize(x, oh, ow, method, align_corners=True, align_mode=1, layout="NCHW", sh=-1.0,
           sw=-1.0):
    """Paddle's CPU resize, pixel by pixel: float32 ratios and coordinates (the H coordinate
    of half-pixel sampling goes through float64 before its float32 weight)."""
    xc = x if layout == "NCHW" else x.transpose(0, 3, 1, 2)
    n, c, ih, iw = xc.shape
    if (ih, iw) == (oh, ow):
        return x.copy()
    rh, rw = _ratio(ih, oh, align_corners, sh), _ratio(iw, ow, align_corners, sw)
    half = align_mode == 0 and not align_corners
    acc = np.float64 if x.dtype == np.float64 else np.float32
    out = np.zeros((n, c, oh, ow), x.dtype)
    for k in range(oh):
        for j in range(ow):
            if method == "nearest":
                vy, vx = rh * F32(k), rw * F32(j)
                y = int(np.floor(np.float64(vy) + 0.5)) if align_corners else int(vy)
                xx = int(np.floor(np.float64(vx) + 0.5)) if align_corners else int(vx)
                out[:, :, k, j] = xc[:, :, y, xx]
                continue
            if half:
                y0 = max(int(np.float64(rh) * (k + 0.5) - 0.5), 0)
                x0 = max(int(np.float64(rw) * (j + 0.5) - 0.5), 0)
                wy = max(F32(np.float64(rh) * (k + 0.5) - 0.5), F32(0)) - F32(y0)
                wx = max(rw * (F32(j) + F32(0.5)) - F32(0.5), F32(0)) - F32(x0)
            else:
                y0, x0 = int(rh * F32(k)), int(rw * F32(j))
                wy, wx = rh * F32(k) - F32(y0), rw * F32(j) - F32(x0)
            y1, x1 = min(y0 + 1, ih - 1), min(x0 + 1, iw - 1)
            p = [xc[:, :, a, b].astype(acc) for a, b in ((y0, x0), (y1, x0), (y0, x1), (y1, x1))]
            wy1, wx1 = acc(F32(1) - wy), acc(F32(1) - wx)
            v = p[0] * wy1 * wx1 + p[1] * acc(wy) * wx1 + p[2] * wy1 * acc(wx) + \
                p[3] * acc(wy) * acc(wx)
            out[:, :, k, j] = v if x.dtype.kind == "f" else np.trunc(v)
    return out if layout == "NCHW" else out.transpose(0, 2, 3, 1)


def pad3d(x, paddings, mode="constant", value=0.0, fmt="NCDHW"):
    xc = x if fmt == "NCDHW" else x.transpose(0, 4, 1, 2, 3)
    left, right, top, bottom, front, back = paddings
    n, c, d, h, w = xc.shape
    out = np.empty((n, c, d + front + back, h + top + bottom, w + left + right), x.dtype)

    def src(o, before, size):
        i = o - before
        if mode == "constant":
            return i if 0 <= i < size else None
        if mode == "reflect":
            return -i if i < 0 else (2 * (size - 1) - i if i >= size else i)
        if mode == "replicate":
            return min(max(i, 0), size - 1)
        return i % size

    for a in range(out.shape[2]):
        for b in range(out.shape[3]):
            for e in range(out.shape[4]):
                s = (src(a, front, d), src(b, top, h), src(e, left, w))
                out[:, :, a, b, e] = F32(value) if None in s else xc[:, :, s[0], s[1], s[2]]
    return out if fmt == "NCDHW" else out.transpose(0, 2, 3, 4, 1)


def _interp_attrs(method, align_corners, align_mode, layout, **kw):
    return dict(interp_method=method, align_corners=align_corners, align_mode=align_mode,
                data_layout=layout, out_h=kw.pop("out_h", -1), out_w=kw.pop("out_w", -1), **kw)


def _nhwc(shape, layout):
    n, c, h, w = shape
    return (n, c, h, w) if layout == "NCHW" else (n, h, w, c)


# ---- flatten, shape, pad ------------------------------------------------------------------------
@pytest.mark.parametrize("op,shape,attrs,out", [
    ("flatten_contiguous_range", (2, 3, 4, 5), {"start_axis": 1, "stop_axis": 2}, (2, 12, 5)),
    ("flatten_contiguous_range", (3, 4), {"start_axis": 0, "stop_axis": -1}, (12,)),
    ("flatten_contiguous_range", (1, 3, 5), {"start_axis": -2, "stop_axis": -1}, (1, 15)),
    ("flatten_contiguous_range", (), {"start_axis": 0, "stop_axis": -1}, (1,)),
    ("flatten2", (2, 3, 4), {"axis": 0}, (1, 24)),
    ("flatten2", (1, 3, 4), {"axis": 2}, (3, 4)),
    ("flatten2", (2, 3, 4), {"axis": 3}, (24, 1)),
])
def test_flatten(op, shape, attrs, out):
    x = _rand(*shape)
    got = check_output(op, {"X": x}, attrs, {"Out": x.reshape(out)}, batch_unknown=bool(shape))
    assert got["XShape"].shape == (0,) + shape


@pytest.mark.parametrize("shape,dtype", [((2, 3, 4), "float32"), ((5,), "int64"), ((), "float64")])
def test_shape(shape, dtype):
    x = np.ones(shape, dtype)
    check_output("shape", {"Input": x}, {}, {"Out": np.array(shape, np.int32)},
                 batch_unknown=bool(shape))


@pytest.mark.parametrize("shape,paddings,value,dtype", [
    ((2, 3), [1, 0, 2, 3], 0.5, "float32"),
    ((1, 3, 2, 5), [0, 1, 2, 0, 0, 0, 1, 1], -1.25, "float64"),
    ((4,), [3, 2], 7.0, "int32"),
])
def test_pad(shape, paddings, value, dtype):
    x = (_rand(*shape) * 10).astype(dtype)
    want = np.pad(x, [paddings[2 * i:2 * i + 2] for i in range(len(shape))],
                  constant_values=np.asarray(value).astype(dtype))
    check_output("pad", {"X": x}, {"paddings": paddings, "pad_value": value}, {"Out": want},
                 batch_unknown=True)


# ---- pad3d --------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["constant", "reflect", "replicate", "circular"])
@pytest.mark.parametrize("fmt,shape", [("NCDHW", (2, 3, 2, 3, 5)), ("NDHWC", (1, 3, 4, 3, 2))])
def test_pad3d(mode, fmt, shape):
    x = _rand(*shape, dtype="float64" if fmt == "NCDHW" else "float32")
    p = [2, 1, 0, 1, 1, 1] if mode == "reflect" else [3, 0, 2, 1, 0, 2]
    attrs = {"paddings": p, "mode": mode, "value": 0.3, "data_format": fmt}
    check_output("pad3d", {"X": x}, attrs, {"Out": pad3d(x, p, mode, 0.3, fmt)},
                 batch_unknown=True)


def test_pad3d_paddings_tensor_and_cropping():
    x = _rand(2, 2, 3, 4, 5)
    p = [1, -2, 0, 2, -1, 1]  # negative paddings crop (constant mode)
    check_output("pad3d", {"X": x}, {"paddings": p, "value": 1.5}, {"Out": pad3d(x, p, value=1.5)})
    q = [2, 1, 1, 0, 0, 2]
    check_output("pad3d", {"X": x, "Paddings": np.array(q, np.int32)},
                 {"paddings": [], "mode": "replicate"}, {"Out": pad3d(x, q, "replicate")})


# ---- resize -------------------------------------------------------------------------------------
@pytest.mark.parametrize("op", ["bilinear_interp_v2", "nearest_interp_v2", "bilinear_interp",
                                "nearest_interp"])
@pytest.mark.parametrize("align_corners,align_mode", [(True, 1), (False, 0), (False, 1)])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_resize_sizes_from_attrs(op, align_corners, align_mode, layout):
    method = "nearest" if op.startswith("nearest") else "bilinear"
    x = _rand(*_nhwc((2, 3, 5, 4), layout), dtype="float64" if layout == "NCHW" else "float32")
    for oh, ow in ((7, 3), (1, 9)):
        attrs = _interp_attrs(method, align_corners, align_mode, layout, out_h=oh, out_w=ow)
        check_output(op, {"X": x}, attrs,
                     {"Out": resize(x, oh, ow, method, align_corners, align_mode, layout)},
                     batch_unknown=True)


@pytest.mark.parametrize("op,scale", [("bilinear_interp_v2", [1.7, 0.6]),
                                      ("nearest_interp_v2", [2.3, 1.3]),
                                      ("bilinear_interp", 1.5), ("nearest_interp", 0.7)])
def test_resize_by_scale_attr(op, scale):
    # without align_corners a scale sets the ratio (1/scale), not in/out
    method = "nearest" if op.startswith("nearest") else "bilinear"
    sh, sw = (float(F32(scale[0])), float(F32(scale[1]))) if isinstance(scale, list) \
        else (float(F32(scale)),) * 2
    x = _rand(1, 2, 5, 7)
    attrs = _interp_attrs(method, False, 0, "NCHW", scale=scale)
    oh, ow = int(5 * sh), int(7 * sw)
    check_output(op, {"X": x}, attrs,
                 {"Out": resize(x, oh, ow, method, False, 0, sh=sh, sw=sw)}, batch_unknown=True)


def test_resize_size_precedence():
    """SizeTensor > OutSize > Scale tensor > scale attribute > out_h/out_w; a scale still sets
    the ratio when OutSize decides the size."""
    x = _rand(2, 3, 4, 5)
    st = [np.array([3], np.int32), np.array([6], np.int32)]
    size = np.array([6, 7], np.int32)
    scale_t = np.array([2.0], np.float32)
    attrs = _interp_attrs("bilinear", False, 1, "NCHW", out_h=2, out_w=2, scale=[1.5, 1.5])
    op = "bilinear_interp_v2"
    check_output(op, {"X": x, "SizeTensor": st, "OutSize": size, "Scale": scale_t}, attrs,
                 {"Out": resize(x, 3, 6, "bilinear", False, 1)})
    check_output(op, {"X": x, "OutSize": size, "Scale": scale_t}, attrs,
                 {"Out": resize(x, 6, 7, "bilinear", False, 1, sh=2.0, sw=2.0)})
    check_output(op, {"X": x, "Scale": np.array([0.5, 1.5], np.float32)}, attrs,
                 {"Out": resize(x, 2, 7, "bilinear", False, 1, sh=0.5, sw=1.5)})
    check_output(op, {"X": x, "OutSize": size}, attrs,
                 {"Out": resize(x, 6, 7, "bilinear", False, 1, sh=1.5, sw=1.5)})
    attrs["scale"] = []
    check_output(op, {"X": x}, attrs, {"Out": resize(x, 2, 2, "bilinear", False, 1)})
    check_output(op, {"X": x}, dict(attrs, out_h=4, out_w=5), {"Out": x})  # unchanged: a copy


def test_resize_matches_paddle_golden():
    # PaddlePaddle 3.3.1's results: the H coordinate of half-pixel sampling goes through float64
    # (row 1 is off 0 by 2.98e-8), the W coordinate stays in float32 (column 1 is exactly 0)
    x = np.arange(4, dtype=np.float64).reshape(1, 1, 2, 2)
    want = np.array([
        [0.0, 0.0, 0.33333337306976318, 0.66666674613952637, 1.0, 1.0],
        [2.9802322387695312e-08, 2.9802322387695312e-08, 0.33333340783913989,
         0.66666678587595740, 1.0000000447034836, 1.0000000447034836],
        [0.66666674613952637, 0.66666674613952637, 1.0000001192092896, 1.3333334922790527,
         1.6666667461395264, 1.6666667461395264],
        [1.3333333730697632, 1.3333333730697632, 1.6666667461395264, 2.0000001192092896,
         2.3333333730697632, 2.3333333730697632],
        [2.0, 2.0, 2.3333333730697632, 2.6666667461395264, 3.0, 3.0],
        [2.0, 2.0, 2.3333333730697632, 2.6666667461395264, 3.0, 3.0]])
    check_output("bilinear_interp_v2", {"X": x},
                 _interp_attrs("bilinear", False, 0, "NCHW", out_h=6, out_w=6),
                 {"Out": want[None, None]}, rtol=0, atol=1e-15)
    # the old op with OutSize [6, 7] and scale 2: the ratio is 1/2, not 4/6 and 5/7
    x = np.arange(20, dtype=np.float32).reshape(1, 1, 4, 5)
    want = (2.5 * np.arange(6)[:, None] + 0.5 * np.arange(7)[None, :]).astype(np.float32)
    check_output("bilinear_interp", {"X": x, "OutSize": np.array([6, 7], np.int32)},
                 _interp_attrs("bilinear", False, 1, "NCHW", scale=2.0),
                 {"Out": want[None, None]}, rtol=0, atol=0)


def test_resize_integer_images_and_interp_method_attr():
    x = RNG.integers(0, 256, size=(1, 5, 4, 3)).astype(np.uint8)
    attrs = _interp_attrs("bilinear", False, 0, "NHWC", out_h=7, out_w=9)
    check_output("bilinear_interp_v2", {"X": x}, attrs,
                 {"Out": resize(x, 7, 9, "bilinear", False, 0, "NHWC")})
    # the kernel follows interp_method, whatever the op type says (as in Paddle)
    attrs = _interp_attrs("nearest", True, 1, "NHWC", out_h=3, out_w=2)
    check_output("bilinear_interp", {"X": x}, attrs,
                 {"Out": resize(x, 3, 2, "nearest", True, 1, "NHWC")})


@pytest.mark.parametrize("op,attrs,error", [
    ("bilinear_interp_v2", {"out_h": 3, "out_w": 3, "scale": [2.0]}, "2 floats"),
    ("bilinear_interp_v2", {"out_h": -1, "out_w": -1}, "output size > 0"),
    ("nearest_interp", {"out_h": 3, "out_w": 3, "interp_method": "bicubic"}, "interp_method"),
    ("nearest_interp", {"out_h": 3, "out_w": 3, "data_layout": "NCDHW"}, "data_layout"),
])
def test_resize_refuses(op, attrs, error):
    with pytest.raises(OpShapeError, match=error):
        build_op_program(op, {"X": _rand(1, 2, 3, 3)}, attrs)
    with pytest.raises(OpShapeError, match="4-D"):
        build_op_program("bilinear_interp_v2", {"X": _rand(1, 2, 3)}, {"out_h": 2, "out_w": 2})


def test_pad_and_flatten_refuse():
    with pytest.raises(OpShapeError, match="reflect padding must be smaller"):
        build_op_program("pad3d", {"X": _rand(1, 1, 2, 2, 2)},
                         {"paddings": [2, 0, 0, 0, 0, 0], "mode": "reflect"})
    with pytest.raises(OpShapeError, match="6 paddings"):
        build_op_program("pad3d", {"X": _rand(1, 1, 2, 2, 2)}, {"paddings": [1, 1]})
    with pytest.raises(OpShapeError, match="2 \\* rank"):
        build_op_program("pad", {"X": _rand(2, 2)}, {"paddings": [1, 1]})
    with pytest.raises(OpShapeError, match="axis in 0..3"):
        build_op_program("flatten2", {"X": _rand(2, 2, 2)}, {"axis": 4})
    with pytest.raises(OpShapeError, match="start_axis <= stop_axis"):
        build_op_program("flatten_contiguous_range", {"X": _rand(2, 2, 2)},
                         {"start_axis": 2, "stop_axis": 1})


# ---- affine_channel ------------------------------------------------------------------------------
@pytest.mark.parametrize("shape,layout,axis", [
    ((2, 3, 4, 5), "NCHW", 1), ((1, 4, 5, 3), "NHWC", 3), ((5, 4), "AnyLayout", 1),
    ((2, 3, 4), "NCHW", 1)])
def test_affine_channel(shape, layout, axis):
    x = _rand(*shape)
    s, b = _rand(shape[axis]), _rand(shape[axis])
    bshape = [1] * len(shape)
    bshape[axis] = -1
    check_output("affine_channel", {"X": x, "Scale": s, "Bias": b}, {"data_layout": layout},
                 {"Out": x * s.reshape(bshape) + b.reshape(bshape)}, batch_unknown={"X"})


# ---- gradients ----------------------------------------------------------------------------------
GRAD_CASES = [
    ("flatten_contiguous_range", {"X": (2, 3, 2)}, {"start_axis": 0, "stop_axis": 1}),
    ("flatten2", {"X": (2, 3, 2)}, {"axis": 2}),
    ("pad", {"X": (2, 3)}, {"paddings": [1, 0, 0, 2], "pad_value": 1.0}),
    ("pad3d", {"X": (1, 2, 2, 3, 3)}, {"paddings": [1, 2, 0, 1, 1, 0], "mode": "reflect"}),
    ("pad3d", {"X": (1, 2, 2, 2, 3)}, {"paddings": [3, 0, 1, 1, 0, 1], "mode": "circular",
                                       "data_format": "NDHWC"}),
    ("pad3d", {"X": (1, 1, 2, 2, 2)}, {"paddings": [1, -1, 0, 1, 2, 0], "value": 2.0}),
    ("bilinear_interp_v2", {"X": (1, 2, 3, 4)},
     _interp_attrs("bilinear", False, 0, "NCHW", out_h=5, out_w=3)),
    ("bilinear_interp", {"X": (2, 3, 4, 1)},
     _interp_attrs("bilinear", True, 1, "NHWC", out_h=2, out_w=5)),
    ("nearest_interp_v2", {"X": (1, 3, 4, 2)},
     _interp_attrs("nearest", True, 1, "NHWC", scale=[1.5, 2.0])),
    ("nearest_interp", {"X": (1, 1, 4, 5)},
     _interp_attrs("nearest", False, 1, "NCHW", out_h=3, out_w=7)),
    ("affine_channel", {"X": (2, 3, 2), "Scale": (3,), "Bias": (3,)}, {"data_layout": "NCHW"}),
    ("affine_channel", {"X": (3, 2, 2), "Scale": (2,), "Bias": (2,)}, {"data_layout": "NHWC"}),
]


@pytest.mark.parametrize("op,shapes,attrs", GRAD_CASES)
def test_grads(op, shapes, attrs):
    inputs = {k: RNG.normal(size=s) for k, s in shapes.items()}
    check_grad(op, inputs, attrs, inputs_to_check=tuple(inputs))


def test_grads_with_tensor_inputs():
    check_grad("pad3d", {"X": RNG.normal(size=(1, 1, 2, 3, 2)),
                         "Paddings": np.array([1, 1, 2, 0, 0, 1], np.int32)},
               {"paddings": [], "mode": "replicate"})
    x = RNG.normal(size=(1, 2, 3, 4))
    attrs = _interp_attrs("bilinear", False, 1, "NCHW", scale=[2.0, 2.0])
    check_grad("bilinear_interp_v2", {"X": x, "OutSize": np.array([4, 5], np.int32)}, attrs)
    check_grad("nearest_interp", {"X": x, "SizeTensor": [np.array([2], np.int32),
                                                         np.array([6], np.int32)]},
               _interp_attrs("nearest", True, 1, "NCHW"))


@pytest.mark.parametrize("op,shapes,attrs", GRAD_CASES)
def test_grad_programs_are_native(op, shapes, attrs):
    # every step of the gradient program runs native code
    inputs = {k: _rand(*s, dtype="float64") for k, s in shapes.items()}
    prog, feed, outs = build_op_program(op, inputs, attrs)
    block, out = prog.global_block(), outs["Out"][0]
    w = block.create_var(name="w", shape=list(out.shape), dtype=np.float64, need_check_feed=True)
    wrt = [block.var(f"{k.lower()}_0") for k in inputs]
    grads = gradients([out], wrt, target_gradients=[w])
    exe = Executor()
    exe.run(prog, feed=dict(feed, w=np.ones(out.shape)),
            fetch_list=[g for g in grads if g is not None], scope=Scope())
    assert_native(exe, op)
    kinds = [s.kind for _, plan in exe._plans.values() for s in plan.walk()]
    assert "reference" not in kinds, kinds


# ---- layers --------------------------------------------------------------------------------------
def _run_layers(fresh_programs, build, feed):
    main, startup = fresh_programs
    outs = build()
    exe = fluid.Executor(fluid.CPUPlace())
    exe.run(startup)
    got = exe.run(main, feed=feed, fetch_list=outs)
    assert_native(exe, "layers")
    return main, got


def test_flatten_shape_pad_layers(fresh_programs):
    x = _rand(2, 3, 4)

    def build():
        v = fluid.layers.data("x", shape=[3, 4], dtype="float32")
        return [fluid.layers.flatten(v, axis=2), fluid.layers.flatten(v, axis=0),
                fluid.layers.shape(v), fluid.layers.pad(v, [0, 1, 1, 0, 2, 2], pad_value=-1.0)]

    main, got = _run_layers(fresh_programs, build, {"x": x})
    np.testing.assert_array_equal(got[0], x.reshape(6, 4))
    np.testing.assert_array_equal(got[1], x.reshape(1, 24))
    np.testing.assert_array_equal(got[2], np.array([2, 3, 4], np.int32))
    np.testing.assert_array_equal(got[3], np.pad(x, [(0, 1), (1, 0), (2, 2)],
                                                 constant_values=-1.0))
    types = [op.type for op in main.global_block().ops]
    assert types == ["flatten2", "flatten2", "shape", "pad"]
    with pytest.raises(ValueError, match="axis"):
        fluid.layers.flatten(main.global_block().var("x"), axis=4)


# a Variable's paddings are reordered by gather and concat, which run their references
@pytest.mark.filterwarnings("ignore:op '(assign_value|gather|concat)' runs its NumPy reference")
@pytest.mark.parametrize("mode,fmt", [("constant", "NCHW"), ("reflect", "NHWC"),
                                      ("edge", "NCHW")])
def test_pad2d_layer(fresh_programs, mode, fmt):
    x = _rand(2, 3, 4, 5)
    t, b, le, r = 1, 2, 3, 0
    if mode == "reflect":
        t, b, le, r = 1, 2, 2, 0

    def build():
        v = fluid.layers.data("x", shape=[3, 4, 5], dtype="float32")
        p = fluid.layers.data("p", shape=[4], dtype="int32", append_batch_size=False)
        return [fluid.layers.pad2d(v, [t, b, le, r], mode=mode, pad_value=0.5, data_format=fmt),
                fluid.layers.pad2d(v, p, mode=mode, pad_value=0.5, data_format=fmt)]

    main, got = _run_layers(fresh_programs, build, {"x": x, "p": np.array([t, b, le, r],
                                                                           np.int32)})
    np_mode = {"constant": "constant", "reflect": "reflect", "edge": "edge"}[mode]
    hw = [(t, b), (le, r)]
    pads = [(0, 0), (0, 0)] + hw if fmt == "NCHW" else [(0, 0)] + hw + [(0, 0)]
    kw = {"constant_values": 0.5} if mode == "constant" else {}
    want = np.pad(x, pads, mode=np_mode, **kw)
    np.testing.assert_allclose(got[0], want)
    np.testing.assert_allclose(got[1], want)
    assert "pad3d" in [op.type for op in main.global_block().ops]


def test_resize_layers(fresh_programs):
    x = _rand(2, 3, 5, 4)

    def build():
        v = fluid.layers.data("x", shape=[3, 5, 4], dtype="float32")
        h = fluid.layers.data("h", shape=[1], dtype="int32", append_batch_size=False)
        size = fluid.layers.data("size", shape=[2], dtype="int32", append_batch_size=False)
        return [fluid.layers.resize_bilinear(v, out_shape=[7, 3]),
                fluid.layers.resize_bilinear(v, scale=1.5, align_corners=False, align_mode=0),
                fluid.layers.resize_nearest(v, out_shape=[h, 6], align_corners=False),
                fluid.layers.image_resize(v, out_shape=[2, 2], resample="NEAREST",
                                          actual_shape=size)]

    with pytest.warns(DeprecationWarning):
        main, got = _run_layers(fresh_programs, build,
                                {"x": x, "h": np.array([2], np.int32),
                                 "size": np.array([8, 9], np.int32)})
    np.testing.assert_allclose(got[0], resize(x, 7, 3, "bilinear"), rtol=1e-6)
    np.testing.assert_allclose(got[1], resize(x, 7, 6, "bilinear", False, 0, sh=1.5, sw=1.5),
                               rtol=1e-6)
    np.testing.assert_array_equal(got[2], resize(x, 2, 6, "nearest", False))
    np.testing.assert_array_equal(got[3], resize(x, 8, 9, "nearest", True))
    types = [op.type for op in main.global_block().ops]
    assert types.count("bilinear_interp") == 2 and types.count("nearest_interp") == 2


def test_resize_layer_refuses(fresh_programs):
    v = fluid.layers.data("x", shape=[3, 5, 4], dtype="float32")
    with pytest.raises(ValueError, match="one of out_shape and scale"):
        fluid.layers.resize_bilinear(v)
    with pytest.raises(ValueError, match="BILINEAR"):
        fluid.layers.image_resize(v, out_shape=[2, 2], resample="TRILINEAR")
    with pytest.raises(ValueError, match="2 sizes"):
        fluid.layers.resize_nearest(v, out_shape=[2, 2, 2])


def test_affine_channel_layer_trains(fresh_programs):
    x = _rand(2, 3, 2, 2)

    def build():
        v = fluid.layers.data("x", shape=[3, 2, 2], dtype="float32")
        s = fluid.layers.create_parameter([3], "float32", name="s",
                                          default_initializer=fluid.initializer.Constant(2.0))
        b = fluid.layers.create_parameter([3], "float32", name="b",
                                          default_initializer=fluid.initializer.Constant(0.5))
        out = fluid.layers.affine_channel(v, scale=s, bias=b, act="relu")
        loss = fluid.layers.mean(out)
        fluid.optimizer.SGD(learning_rate=0.0).minimize(loss)
        return [out, "s@GRAD", "b@GRAD"]

    _, got = _run_layers(fresh_programs, build, {"x": x})
    y = x * 2.0 + 0.5
    np.testing.assert_allclose(got[0], np.maximum(y, 0), rtol=1e-6)
    g = (y > 0) / y.size
    np.testing.assert_allclose(got[1], (g * x).sum(axis=(0, 2, 3)), rtol=1e-5)
    np.testing.assert_allclose(got[2], g.sum(axis=(0, 2, 3)), rtol=1e-5)
