"""What ``pdjit.aot`` relies on in Numba's internals, pinned: if one of these fails after a Numba
upgrade, the AOT route needs porting (see ``pdjit.codegen.aot.numba_aot``'s docstring), not a
fix in a model. Also the C runtime's reshape helper against NumPy's own reshape."""
import ctypes
import shutil
import subprocess

import numba
import numpy as np
import pytest

# one worker runs every AOT test (xdist_group): a second build in a process reuses the library
# kernels Numba compiled for the first (LeNet: seconds instead of tens of seconds cold)
pytestmark = [pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler 'cc'"),
              pytest.mark.xdist_group("aot")]


def test_numba_version_in_the_tested_range():
    from pdjit.aot import NUMBA_RANGE

    have = tuple(int(p) for p in numba.__version__.split(".")[:2])
    lo, hi = NUMBA_RANGE
    assert lo <= have <= hi, (
        f"pdjit.aot was tested with Numba {lo[0]}.{lo[1]}-{hi[0]}.{hi[1]}, this is "
        f"{numba.__version__}: check its AOT internals (numba_aot.py) and widen NUMBA_RANGE")


def _sum_or_raise(p, n, out):
    if n < 0:
        raise ValueError("negative size")
    a = numba.carray(p, (n,))
    s = np.float32(0)
    for i in range(n):
        s += a[i]
    o = numba.carray(out, (1,))
    o[0] = s
    return 7


CALLER = r"""
#include <stdint.h>
void NRT_MemInfo_call_dtor(void *mi) { (void)mi; }
void *NRT_MemInfo_alloc_aligned(uint64_t n, unsigned a) { (void)n; (void)a; return 0; }
void *NRT_Allocate(uint64_t n) { (void)n; return 0; }
void NRT_Free(void *p) { (void)p; }
extern int32_t pin_entry(int32_t *ret, void **excinfo, float *p, int64_t n, float *out);
int call(float *p, int64_t n, float *out, int32_t *ret) {
    void *exc = 0;
    return pin_entry(ret, &exc, p, n, out);
}
"""


def test_aot_object_and_internal_calling_convention(tmp_path):
    """An object from ``with_aot_codegen`` + ``compile_extra`` exports the symbol asked for,
    called as ``int32 status = fn(int32 *ret, void **excinfo, args...)``: status 0 and the
    returned value in ``*ret``; a raised exception is a non-zero status, no Python needed."""
    from numba.core import types

    from pdjit.codegen.aot.numba_aot import compile_object, pointer

    obj, ir = compile_object(_sum_or_raise, [pointer("float32"), types.int64,
                                             pointer("float32")], "pin_entry")
    assert "pin_entry" in ir
    (tmp_path / "f.o").write_bytes(obj)
    (tmp_path / "caller.c").write_text(CALLER)
    syms = subprocess.run(["nm", str(tmp_path / "f.o")], capture_output=True, text=True,
                          check=True).stdout
    assert " T pin_entry" in syms
    so = tmp_path / "libpin.so"
    subprocess.run(["cc", "-shared", "-fPIC", str(tmp_path / "caller.c"), str(tmp_path / "f.o"),
                    "-o", str(so)], check=True, capture_output=True)
    lib = ctypes.CDLL(str(so))
    fp = ctypes.POINTER(ctypes.c_float)
    lib.call.argtypes = [fp, ctypes.c_int64, fp, ctypes.POINTER(ctypes.c_int32)]
    lib.call.restype = ctypes.c_int32
    x = np.arange(10, dtype=np.float32)
    out = np.zeros(1, np.float32)
    ret = ctypes.c_int32(-1)
    status = lib.call(x.ctypes.data_as(fp), 10, out.ctypes.data_as(fp), ctypes.byref(ret))
    assert status == 0 and ret.value == 7 and out[0] == 45.0
    status = lib.call(x.ctypes.data_as(fp), -1, out.ctypes.data_as(fp), ctypes.byref(ret))
    assert status != 0


def test_the_entry_compiles_at_the_targets_llvm_level(monkeypatch):
    """Under the aot target's ``llvm_scope`` the LLVM passes of the entry's compile that take
    the default level (its functions' passes and the linked module's full ones; Numba's
    explicit levels, its cheap first round, stay) run at pdjit's level; without a scope, none
    does (Numba's own ``config.OPT``)."""
    from numba.core import codegen, types

    from pdjit.codegen.aot.numba_aot import compile_object, pointer
    from pdjit.codegen.cpu.lib._jit import OPT_LEVEL
    from pdjit.codegen.target import get_target

    seen = []
    real = codegen.create_pass_builder

    def spy(tm, opt, *args, **kwargs):
        seen.append(opt)
        return real(tm, opt, *args, **kwargs)

    monkeypatch.setattr(codegen, "create_pass_builder", spy)
    argtypes = [pointer("float32"), types.int64, pointer("float32")]
    compile_object(_sum_or_raise, argtypes, "pin_level", scope=get_target("aot").llvm_scope)
    scoped = [int(o) for o in seen]
    seen.clear()
    compile_object(_sum_or_raise, argtypes, "pin_numba_level")
    plain = [int(o) for o in seen]
    assert OPT_LEVEL in scoped, scoped
    if int(numba.config.OPT) != OPT_LEVEL:  # (a user's NUMBA_OPT at pdjit's level: the same)
        assert OPT_LEVEL not in plain and int(numba.config.OPT) in plain, plain


@pytest.fixture(scope="module")
def runtime(tmp_path_factory):
    """The runtime's C, its helpers made visible, linked with NumPy's OpenBLAS."""
    from pdjit.aot import build, csource

    d = tmp_path_factory.mktemp("aot_runtime")
    (d / "runtime.c").write_text(csource.RUNTIME.replace(
        '#define HIDDEN __attribute__((visibility("hidden")))', "#define HIDDEN"))
    libs = build._openblas_files()
    blas = next(f for f in libs if "openblas" in f)
    so = d / "librt.so"
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", f"-I{csource.C_DIR}", str(d / "runtime.c"),
                    "-o", str(so), blas,
                    f"-Wl,-rpath,{'/'.join(blas.split('/')[:-1])}"], check=True,
                   capture_output=True)
    return ctypes.CDLL(str(so))


def test_nocopy_reshape_matches_numpy(runtime):
    fn = runtime.numba_attempt_nocopy_reshape
    i64p = ctypes.POINTER(ctypes.c_int64)
    fn.argtypes = [ctypes.c_int64, i64p, i64p, ctypes.c_int64, i64p, i64p, ctypes.c_int64,
                   ctypes.c_int]
    base = np.zeros((4, 6, 10), np.float32)
    views = [base, base[:, ::2], base.transpose(1, 0, 2), base[1:3], base[:, :, 1:3],
             base[:, :1], base.transpose(2, 1, 0)]
    shapes = [(24, 10), (240,), (4, 60), (2, 2, 6, 10), (4, 6, 10, 1), (1, 240), (8, 3, 10)]
    checked = 0
    for v in views:
        for shape in shapes:
            for order in "CF":
                if int(np.prod(shape)) != v.size:
                    continue
                try:
                    r = v.reshape(shape, order=order)
                    view = np.shares_memory(r, v)
                except ValueError:
                    continue
                dims = np.array(v.shape, np.int64)
                strides = np.array(v.strides, np.int64)
                new = np.array(shape, np.int64)
                out = np.zeros(len(shape), np.int64)
                ok = fn(v.ndim, dims.ctypes.data_as(i64p), strides.ctypes.data_as(i64p),
                        len(shape), new.ctypes.data_as(i64p), out.ctypes.data_as(i64p),
                        v.itemsize, int(order == "F"))
                assert bool(ok) == view, (v.shape, v.strides, shape, order)
                if view:
                    assert tuple(out) == r.strides, (v.shape, v.strides, shape, order)
                checked += 1
    assert checked > 20


def test_blas_helpers_match_numpy(runtime):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((5, 7)).astype(np.float64)
    b = rng.standard_normal((7, 3)).astype(np.float64)
    c = np.zeros(15, np.float64)   # column-major (3, 5) C^T: row-major (5, 3) A @ B
    one, zero = ctypes.c_double(1.0), ctypes.c_double(0.0)
    vp = ctypes.c_void_p
    runtime.numba_xxgemm.argtypes = [ctypes.c_char, ctypes.c_char, ctypes.c_char,
                                     ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, vp, vp,
                                     ctypes.c_int64, vp, ctypes.c_int64, vp, vp, ctypes.c_int64]
    # column-major view: A^T is (7, 5) with ld 7, B^T is (3, 7) with ld 3: C^T = B^T A^T
    rc = runtime.numba_xxgemm(b"d", b"N", b"N", 3, 5, 7, ctypes.addressof(one),
                              b.ctypes.data, 3, a.ctypes.data, 7, ctypes.addressof(zero),
                              c.ctypes.data, 3)
    assert rc == 0
    np.testing.assert_allclose(c.reshape(5, 3), a @ b, rtol=1e-12)
    runtime.numba_xxdot.argtypes = [ctypes.c_char, ctypes.c_char, ctypes.c_int64, vp, vp, vp]
    x = rng.standard_normal(9).astype(np.float32)
    y = rng.standard_normal(9).astype(np.float32)
    res = ctypes.c_float()
    assert runtime.numba_xxdot(b"s", b"\0", 9, x.ctypes.data, y.ctypes.data,
                               ctypes.addressof(res)) == 0
    assert abs(res.value - float(x @ y)) < 1e-5
