"""Compile recorded cuda kernels to PTX (run as a script, without the CUDA simulator):
``python ptx_check.py RECORDS.pkl`` prints a JSON summary. The records are ``[(module text,
Numba argument types)]`` of the generated kernels a test session launched; the library
kernels of ``pdjit.codegen.cuda.lib`` are compiled with their own signatures."""
import json
import os
import pickle
import sys
import tempfile
import time
import types


def main(path: str) -> dict:
    from numba import cuda
    from numba.core import types as t

    try:
        # NVIDIA's numba-cuda (the cuda extra) compiles PTX without a driver; Numba's own
        # deprecated CUDA target, beside a system CUDA toolkit, asks the driver for the device
        import numba_cuda  # noqa: F401
        from numba.cuda.cudadrv import nvvm
        nvvm.NVVM()
    except Exception as e:  # noqa: BLE001 - no libNVVM: nothing can be compiled here
        return {"nvvm": False, "reason": f"{type(e).__name__}: {e}"}
    from pdjit.codegen.cuda import lib as cuda_lib

    with open(path, "rb") as f:
        records = pickle.load(f)
    jobs = []
    for text, sig in records:
        ns: dict = {}
        exec(compile(text, "<pdjit cuda kernel>", "exec"), ns)  # noqa: S102
        jobs.append((ns["kernel"].py_func, sig))
    # each module from a file (as pdjit's compile cache holds them): its kernel has numba-cuda's
    # disk cache (what a second process on a GPU loads instead of compiling)
    cached, tmp = 0, tempfile.mkdtemp()
    for k, (text, _) in enumerate(records):
        name = f"pdjit_ptx_check_{k}"
        path = os.path.join(tmp, name + ".py")
        with open(path, "w") as f:
            f.write(text)
        mod = types.ModuleType(name)
        mod.__file__ = path
        sys.modules[name] = mod
        exec(compile(text, path, "exec"), mod.__dict__)  # noqa: S102
        cached += type(getattr(mod.kernel, "_cache", None)).__name__ == "CUDACache"
    lib_cached = all(type(getattr(k, "_cache", None)).__name__ == "CUDACache" for k in (
        cuda_lib._fill, cuda_lib._softmax_rows, cuda_lib._softmax_xent_rows,
        cuda_lib._check_labels))
    f32, f64, i64 = t.float32, t.float64, t.int64
    for ft in (f32, f64):
        a2 = t.Array(ft, 2, "A")
        jobs.append((cuda_lib._gemm_kernel(ft.name).py_func, (a2, a2, t.Array(ft, 2, "C"))))
    b = t.boolean
    for ft in (f32, f64):
        a3 = t.Array(ft, 3, "C")
        jobs.append((cuda_lib._bgemm_kernel(ft.name).py_func,
                     (a3, a3, a3, b, b, f64, i64, i64, i64, b, b, b) + (i64,) * 7))
    from pdjit.codegen.cuda.lib import conv as cconv

    # convolution as an implicit GEMM: the 3 gather rules in float32, the input-gradient one
    # (the most branches) in float64 too (the dtype changes only the shared tiles and the
    # accumulators; each compile takes ~1 s)
    for ft, mode in ((f32, cconv.FWD), (f32, cconv.FILTER), (f32, cconv.DATA),
                     (f64, cconv.DATA)):
        v = t.Array(ft, 1, "C")
        jobs.append((cconv._igemm_kernel(ft.name, mode).py_func, (v, v, v) + (i64,) * 24))
    v32 = t.Array(f32, 1, "C")
    jobs.append((cuda_lib._softmax_rows.py_func, (v32, v32, i64, i64)))
    jobs.append((cuda_lib._softmax_xent_rows.py_func,
                 (v32, t.Array(i64, 1, "C"), v32, v32, i64, i64, i64)))
    jobs.append((cuda_lib._check_labels.py_func,
                 (t.Array(i64, 1, "C"), i64, i64, t.Array(t.int32, 1, "C"))))
    jobs.append((cuda_lib._fill.py_func, (v32, i64)))
    jobs.append((cuda_lib._fill.py_func, (t.Array(t.int32, 1, "C"), i64)))
    failures, t0 = [], time.perf_counter()
    for fn, sig in jobs:
        for cc in ((8, 0), (9, 0)):
            try:
                ptx, _ = cuda.compile_ptx(fn, sig, cc=cc)
                assert f".target sm_{cc[0]}{cc[1]}" in ptx
            except Exception as e:  # noqa: BLE001 - reported, with the kernel
                failures.append(f"{fn.__name__}{sig} cc {cc}: {type(e).__name__}: "
                                f"{str(e)[:300]}")
    return {"nvvm": True, "kernels": len(jobs), "compiled": 2 * len(jobs) - len(failures),
            "failures": failures, "seconds": time.perf_counter() - t0,
            "cached": cached, "records": len(records), "library_cached": lib_cached}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
