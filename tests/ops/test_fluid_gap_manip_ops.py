"""Gradients of ``scatter_nd_add`` and ``strided_slice`` (``pdjit.ops.manip``) by finite
differences, and their outputs against NumPy indexing written here."""
import numpy as np
import pytest

from pdjit.testing import check_output
from pdjit.testing.grad_check import check_grad

# many of the ops these tests build run their NumPy reference as a plan step by design (no
# native lowering: they are declared reference-only); a compiled plan says so once per
# process
pytestmark = pytest.mark.filterwarnings(
    "ignore::pdjit.framework.errors.ReferenceStepWarning")

RNG = np.random.default_rng(17)


def test_scatter_nd_add_output_and_grad():
    x = RNG.normal(size=(3, 2, 2))
    idx = np.array([[[0, 1], [2, 0]], [[0, 1], [1, 1]]], np.int64)      # [2, 2, k=2]
    upd = RNG.normal(size=(2, 2, 2))
    want = x.copy()
    for i in range(2):
        for j in range(2):
            want[idx[i, j, 0], idx[i, j, 1]] += upd[i, j]
    ins = {"X": x, "Index": idx, "Updates": upd}
    check_output("scatter_nd_add", ins, expected={"Out": want})
    check_grad("scatter_nd_add", ins, inputs_to_check=("X", "Updates"))


def test_strided_slice_output_and_grad():
    x = RNG.normal(size=(4, 5))
    attrs = {"axes": [0, 1], "starts": [3, 0], "ends": [-5, 5], "strides": [-2, 2]}
    check_output("strided_slice", {"Input": x}, attrs, {"Out": x[3:-5:-2, 0:5:2]})
    check_grad("strided_slice", {"Input": x}, attrs, inputs_to_check=("Input",))
    dec = dict(attrs, decrease_axis=[0], starts=[1, 0], ends=[2, 5], strides=[1, 2])
    check_output("strided_slice", {"Input": x}, dec, {"Out": x[1, 0:5:2]})


def np_grid_sample(x, grid):
    n, c, h, w = x.shape
    out = np.zeros((n, c) + grid.shape[1:3])
    for b in range(n):
        for i in range(grid.shape[1]):
            for j in range(grid.shape[2]):
                px = (grid[b, i, j, 0] + 1) * (w - 1) / 2
                py = (grid[b, i, j, 1] + 1) * (h - 1) / 2
                for yy in (int(np.floor(py)), int(np.floor(py)) + 1):
                    for xx in (int(np.floor(px)), int(np.floor(px)) + 1):
                        if 0 <= yy < h and 0 <= xx < w:
                            wgt = (1 - abs(px - xx)) * (1 - abs(py - yy))
                            out[b, :, i, j] += wgt * x[b, :, yy, xx]
    return out


def test_grid_sampler_output_and_grad():
    x = RNG.normal(size=(2, 2, 3, 4))
    grid = RNG.uniform(-1.2, 1.2, size=(2, 2, 3, 2))     # some points outside the image
    check_output("grid_sampler", {"X": x, "Grid": grid},
                 expected={"Output": np_grid_sample(x, grid)})
    check_grad("grid_sampler", {"X": x, "Grid": grid}, inputs_to_check=("X", "Grid"),
               output_name="Output", max_relative_error=1e-4, atol=1e-6)


def test_identity_spatial_transformer_layers():
    import pdjit as fluid
    from pdjit.runtime.executor import Executor
    from pdjit.runtime.scope import Scope

    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        img = fluid.data("img", [2, 1, 3, 4], "float32")
        theta = fluid.data("theta", [2, 2, 3], "float32")
        out = fluid.layers.grid_sampler(img, fluid.layers.affine_grid(theta, [2, 1, 3, 4]))
    x = RNG.normal(size=(2, 1, 3, 4)).astype(np.float32)
    eye = np.tile(np.array([[1, 0, 0], [0, 1, 0]], np.float32), (2, 1, 1))
    got, = Executor().run(main, feed={"img": x, "theta": eye}, fetch_list=[out], scope=Scope())
    np.testing.assert_allclose(got, x, rtol=1e-5, atol=1e-6)


def test_unfold_output_and_grad():
    x = RNG.normal(size=(2, 2, 4, 5))
    attrs = {"kernel_sizes": [2, 2], "strides": [1, 2], "paddings": [1, 0, 0, 1],
             "dilations": [2, 1]}
    xp = np.pad(x, ((0, 0), (0, 0), (1, 0), (0, 1)))
    oh = (5 - (2 * 1 + 1)) // 1 + 1
    ow = (6 - 2) // 2 + 1
    cols = []
    for i in range(oh):
        for j in range(ow):
            cols.append(xp[:, :, i:i + 3:2, 2 * j:2 * j + 2].reshape(2, -1))
    want = np.stack(cols, axis=2)
    check_output("unfold", {"X": x}, attrs, {"Y": want})
    check_grad("unfold", {"X": x}, attrs, output_name="Y")


X_ROI = RNG.normal(size=(2, 2, 6, 7))
ROIS = np.array([[0.0, 0.0, 3.0, 2.0], [1.0, 1.0, 6.0, 5.0], [2.2, 0.6, 4.9, 4.4]])
ROI_LOD = [[0, 1, 3]]               # roi 0 on image 0, rois 1-2 on image 1


def test_roi_pool_output_and_grad():
    # 2x2 bins of each box (scale 1): the box's rows y1..y2, cols x1..x2 (inclusive, rounded)
    want = np.zeros((3, 2, 2, 2))
    for k, (img, roi) in enumerate(zip([0, 1, 1], ROIS)):
        x1, y1, x2, y2 = [int(np.floor(v + 0.5)) for v in roi]
        hgt, wid = y2 - y1 + 1, x2 - x1 + 1
        for i in range(2):
            for j in range(2):
                rows = range(y1 + int(np.floor(i * hgt / 2)), y1 + int(np.ceil((i + 1) * hgt / 2)))
                cols = range(x1 + int(np.floor(j * wid / 2)), x1 + int(np.ceil((j + 1) * wid / 2)))
                block = X_ROI[img][:, [r for r in rows if r < 6]][:, :, [c for c in cols if c < 7]]
                want[k, :, i, j] = block.reshape(2, -1).max(1)
    ins = {"X": X_ROI, "ROIs": (ROIS, ROI_LOD)}
    attrs = {"pooled_height": 2, "pooled_width": 2}
    check_output("roi_pool", ins, attrs, {"Out": want})
    check_grad("roi_pool", ins, attrs, inputs_to_check=("X",))


def bilinear(img, y, x):
    y0, x0 = int(np.floor(y)), int(np.floor(x))
    fy, fx = y - y0, x - x0
    return ((1 - fy) * (1 - fx) * img[:, y0, x0] + (1 - fy) * fx * img[:, y0, x0 + 1]
            + fy * (1 - fx) * img[:, y0 + 1, x0] + fy * fx * img[:, y0 + 1, x0 + 1])


def test_roi_align_output_and_grad():
    rois = np.array([[0.5, 0.5, 3.5, 2.5], [1.2, 1.4, 5.0, 4.6]])
    lod = [[0, 1, 2]]
    want = np.zeros((2, 2, 2, 2))
    for k, roi in enumerate(rois):
        x1, y1, x2, y2 = roi
        bh, bw = (y2 - y1) / 2, (x2 - x1) / 2
        for i in range(2):
            for j in range(2):
                pts = [(y1 + i * bh + (a + .5) * bh / 2, x1 + j * bw + (b + .5) * bw / 2)
                       for a in range(2) for b in range(2)]
                want[k, :, i, j] = np.mean([bilinear(X_ROI[k], y, x) for y, x in pts], axis=0)
    ins = {"X": X_ROI, "ROIs": (rois, lod)}
    attrs = {"pooled_height": 2, "pooled_width": 2, "sampling_ratio": 2}
    check_output("roi_align", ins, attrs, {"Out": want})
    check_grad("roi_align", ins, attrs, inputs_to_check=("X",))


def test_cvm_and_random_crop():
    x = RNG.uniform(0, 5, size=(3, 4))
    cvm = RNG.uniform(0, 1, size=(3, 2))
    want = x.copy()
    want[:, 0] = np.log(x[:, 0] + 1)
    want[:, 1] = np.log(x[:, 1] + 1) - np.log(x[:, 0] + 1)
    check_output("cvm", {"X": x, "CVM": cvm}, {"use_cvm": True}, {"Y": want})
    check_output("cvm", {"X": x, "CVM": cvm}, {"use_cvm": False}, {"Y": x[:, 2:]})
    img = np.arange(2 * 4 * 5, dtype=np.float32).reshape(2, 4, 5)
    got = check_output("random_crop", {"X": img}, {"shape": [2, 3], "startup_seed": 5},
                       modes=["reference"])["Out"]
    assert got.shape == (2, 2, 3)
    for b in range(2):     # each crop is a contiguous window of its own image
        r0, c0 = divmod(int(got[b, 0, 0] - img[b, 0, 0]), 5)
        np.testing.assert_array_equal(got[b], img[b, r0:r0 + 2, c0:c0 + 3])


def test_psroi_pool_output_and_grad():
    x = RNG.normal(size=(2, 2 * 2 * 2, 5, 6))          # output_channels 2, bins 2x2
    rois = np.array([[0.0, 0.0, 3.0, 2.0], [1.0, 1.0, 5.0, 4.0]])
    lod = [[0, 1, 2]]
    want = np.zeros((2, 2, 2, 2))
    for k, roi in enumerate(rois):
        x1, y1, x2, y2 = roi[0], roi[1], roi[2] + 1, roi[3] + 1
        bh, bw = (y2 - y1) / 2, (x2 - x1) / 2
        for c in range(2):
            for i in range(2):
                for j in range(2):
                    hs, he = int(np.floor(y1 + i * bh)), int(np.ceil(y1 + (i + 1) * bh))
                    ws, we = int(np.floor(x1 + j * bw)), int(np.ceil(x1 + (j + 1) * bw))
                    want[k, c, i, j] = x[k, (c * 2 + i) * 2 + j, hs:min(he, 5),
                                         ws:min(we, 6)].mean()
    ins = {"X": x, "ROIs": (rois, lod)}
    attrs = {"output_channels": 2, "pooled_height": 2, "pooled_width": 2}
    check_output("psroi_pool", ins, attrs, {"Out": want})
    check_grad("psroi_pool", ins, attrs, inputs_to_check=("X",))


def test_inplace_abn_is_batch_norm_then_activation():
    import pdjit as fluid
    from pdjit.runtime.executor import Executor
    from pdjit.runtime.scope import Scope

    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        v = fluid.data("v", [4, 3, 2, 2], "float32")
        out = fluid.layers.inplace_abn(v, act="leaky_relu", act_alpha=0.1)
    scope, exe = Scope(), Executor()
    exe.run(startup, scope=scope)
    x = RNG.normal(size=(4, 3, 2, 2)).astype(np.float32)
    got, = exe.run(main, feed={"v": x}, fetch_list=[out], scope=scope)
    mean, var = x.mean(axis=(0, 2, 3), keepdims=True), x.var(axis=(0, 2, 3), keepdims=True)
    z = (x - mean) / np.sqrt(var + 1e-5)
    np.testing.assert_allclose(got, np.where(z > 0, z, 0.1 * z), rtol=1e-4, atol=1e-5)
