"""One runner per engine: kuiper-xp (per backend), PyTorch eager, onnxruntime and ncnn.

Every runner has the same life cycle, so that ``run.py`` can time them side by side:

    r = make_runner("onnxruntime", threads=2)
    r.load(files, spec)               # read the model file(s)            } timed together as
    prepared = r.prepare(inputs)      # host numpy inputs -> engine inputs } "load": file to
    raw = r.run(prepared)             # one inference (synchronised)      } first result
    outs = r.outputs(raw)             # list of numpy arrays, torch's shapes, for the accuracy check
    r.memory()                        # device-pool bytes (cupy) or {}
    r.close()

Only ``run`` is timed in the loop. Inputs are converted once, outside the timing, for every engine
(numpy array for kuiper/onnxruntime, a torch tensor for torch, one ncnn.Mat per image for ncnn).
The imports of each library happen inside its runner, so that a ``--memory`` child process of
run.py only loads the library of the engine it measures.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["Runner", "make_runner", "engine_label", "PEERS"]

PEERS = ("torch", "torch-cuda", "onnxruntime", "ncnn")


def engine_label(engine: str, backend: str | None = None) -> str:
    return f"kuiper[{backend}]" if engine == "kuiper" else engine



def _ncnn_leftovers(path) -> str:
    """Why ncnn refused a pnnx ncnn export, where the file shows it: the operators pnnx's ncnn
    pass left unconverted (torch-level types ncnn has no layer for; ncnn itself only prints
    "layer ... not exists or registered" on the console)."""
    try:
        lines = Path(path).read_text().splitlines()[2:]
    except OSError:
        return ""
    left = sorted({ln.split()[0] for ln in lines
                   if ln.split() and ln.split()[0].startswith(("pnnx.", "aten::", "torch.", "Tensor.", "F.", "nn."))})
    return f" (pnnx left operators ncnn has no layer for: {', '.join(left)})" if left else ""

class Runner:
    engine = ""
    #: a note for the table (e.g. how ncnn does batch 8)
    note = ""

    def __init__(self, threads: int):
        self.threads = threads

    @property
    def label(self) -> str:
        return self.engine

    def load(self, files, spec) -> None:
        raise NotImplementedError

    def prepare(self, inputs: tuple) -> Any:
        return inputs

    def run(self, prepared: Any) -> Any:
        raise NotImplementedError

    def outputs(self, raw: Any) -> list:
        raise NotImplementedError

    def memory(self) -> dict[str, int]:
        return {}

    def close(self) -> None:
        pass


# ---------------------------------------------------------------------------------------------
class KuiperRunner(Runner):
    engine = "kuiper"

    def __init__(self, threads: int, backend: str = "numpy"):
        super().__init__(threads)
        # "numpy+numba", "numpy+mkl", "numpy+numba+mkl": the numpy backend with the optional
        # numba kernels and/or MKL paths switched on
        self.label_name = backend
        self.backend_name, *extras = backend.split("+")
        self.numba, self.mkl = "numba" in extras, "mkl" in extras
        if not set(extras) <= {"numba", "mkl"} or len(set(extras)) != len(extras) or (
                extras and self.backend_name != "numpy"):
            raise ValueError(f"unknown kuiper-xp backend variant {backend!r} (known: <backend>, numpy+numba, "
                             "numpy+mkl, numpy+numba+mkl)")
        self.g = None
        self.backend = None
        from kuiper_xp.backends import get_backend

        import kuiper_xp.runtime.graph  # noqa: F401  (layer modules: not part of the load time)

        try:  # library start-up, once per process (~0.2 s: array-api-compat's numpy namespace
            get_backend(self.backend_name)  # walks numpy's lazy submodules): not part of the load
        except Exception:  # time, as `import onnxruntime` is not; an unavailable backend fails in load()
            pass
        if self.numba:  # import numba and compile (or load numba's on-disk cache), outside the
            self._use_options()  # load time like the imports above; reported in the README
            from kuiper_xp.backends import numba_kernels

            numba_kernels.warm_up()
        if self.mkl:  # MKL's start-up in its first calls (on each thread) likewise: up to 0.3 s in a fresh process
            self._use_options()
            import numpy as np
            from kuiper_xp.backends import numpy_fast

            a = np.ones((512, 512), np.float32)
            with numpy_fast.compute_scope():
                numpy_fast.matmul(a, a)
                for name in ("gelu", "silu"):
                    numpy_fast.unary(name, a)

    def _use_options(self) -> None:
        """Runners of one process share the numpy backend: set the switches before each call."""
        if self.backend_name == "numpy":
            from kuiper_xp.backends import numpy_fast

            numpy_fast.use_numba(self.numba)
            numpy_fast.use_mkl(self.mkl)

    @property
    def label(self) -> str:
        return engine_label("kuiper", self.label_name)

    def load(self, files, spec) -> None:
        if files.pnnx_param is None:
            raise RuntimeError(files.pnnx_error or "no pnnx export")
        import kuiper_xp

        self._use_options()
        self.g = kuiper_xp.load(files.pnnx_param, backend=self.backend_name)
        self.backend = self.g.backend

    def prepare(self, inputs: tuple) -> Any:
        return tuple(self.backend.asarray(x) for x in inputs)

    def run(self, prepared: Any) -> Any:
        self._use_options()
        out = self.g(*prepared)
        self.backend.synchronize()
        return out

    def outputs(self, raw: Any) -> list:
        return [self.backend.to_numpy(a) for a in raw]

    def memory(self) -> dict[str, int]:
        if self.backend is None:
            return {}
        stats = dict(self.backend.memory_stats())
        graph_pool = getattr(getattr(self.g, "_replayer", None), "_pool", None)
        if graph_pool is not None and stats:  # the CUDA graphs' private pool (cupy)
            stats["graph_pool_bytes"] = int(graph_pool.total_bytes())
            stats["total_bytes"] = stats.get("total_bytes", 0) + stats["graph_pool_bytes"]
        return stats

    def close(self) -> None:
        self.g = None


# ---------------------------------------------------------------------------------------------
class TorchRunner(Runner):
    """PyTorch eager under ``torch.no_grad()``; "load" is module construction (seeded random
    weights: there is no file) + first forward."""

    engine = "torch"

    def __init__(self, threads: int):
        super().__init__(threads)
        import torch

        self.torch = torch
        torch.set_num_threads(threads)
        try:  # only possible before the first parallel region
            torch.set_num_interop_threads(1)
        except RuntimeError:
            pass
        self.model = None

    def load(self, files, spec) -> None:
        self.model = spec.build().eval()

    def prepare(self, inputs: tuple) -> Any:
        return tuple(self.torch.from_numpy(x) for x in inputs)

    def run(self, prepared: Any) -> Any:
        with self.torch.no_grad():
            return self.model(*prepared)

    def outputs(self, raw: Any) -> list:
        from models import flatten

        return [t.detach().contiguous().numpy() for t in flatten(raw)]

    def close(self) -> None:
        self.model = None


# ---------------------------------------------------------------------------------------------
class TorchCudaRunner(TorchRunner):
    """PyTorch eager on the GPU (cuda:0), the peer of kuiper[cupy]: the same seeded module moved
    to the device, inputs copied there once outside the timing, and each run ends with
    ``torch.cuda.synchronize()`` (as kuiper's ends with the backend's synchronize), so that the
    time is the GPU's work and not only the launch. TF32 is switched off: both engines compute
    in float32. ``memory()`` reports torch's caching
    allocator (peak reserved bytes) beside the cupy pool's."""

    engine = "torch-cuda"

    def __init__(self, threads: int):
        super().__init__(threads)
        if not self.torch.cuda.is_available():
            raise RuntimeError("torch has no CUDA device here")
        self.dev = self.torch.device("cuda:0")
        # float32 as computed, as kuiper-xp computes it: torch's default lets cuDNN convolutions
        # run in TF32 (10-bit mantissa; 1e-4 relative error on ResNet-18 against 2e-7)
        self.torch.backends.cudnn.allow_tf32 = False
        self.torch.backends.cuda.matmul.allow_tf32 = False

    def load(self, files, spec) -> None:
        self.model = spec.build().eval().to(self.dev)

    def prepare(self, inputs: tuple) -> Any:
        return tuple(self.torch.from_numpy(x).to(self.dev) for x in inputs)

    def run(self, prepared: Any) -> Any:
        with self.torch.no_grad():
            out = self.model(*prepared)
        self.torch.cuda.synchronize(self.dev)
        return out

    def outputs(self, raw: Any) -> list:
        from models import flatten

        return [t.detach().contiguous().cpu().numpy() for t in flatten(raw)]

    def memory(self) -> dict[str, int]:
        c = self.torch.cuda
        return {"used_bytes": int(c.max_memory_allocated(self.dev)), "total_bytes": int(c.max_memory_reserved(self.dev))}


# ---------------------------------------------------------------------------------------------
class OrtRunner(Runner):
    engine = "onnxruntime"

    def __init__(self, threads: int):
        super().__init__(threads)
        self.sess = None
        import onnxruntime  # noqa: F401  (not part of the load time)

    def load(self, files, spec) -> None:
        if files.onnx is None:
            raise RuntimeError(files.onnx_error or "no onnx export")
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = self.threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        so.add_session_config_entry("session.inter_op.allow_spinning", "0")
        so.log_severity_level = 3
        self.sess = ort.InferenceSession(str(files.onnx), so, providers=["CPUExecutionProvider"])
        self.in_names = [i.name for i in self.sess.get_inputs()]

    def prepare(self, inputs: tuple) -> Any:
        return dict(zip(self.in_names, inputs))

    def run(self, prepared: Any) -> Any:
        return self.sess.run(None, prepared)

    def outputs(self, raw: Any) -> list:
        return list(raw)

    def close(self) -> None:
        self.sess = None


# ---------------------------------------------------------------------------------------------
class NcnnRunner(Runner):
    """ncnn has no batch dimension: a batch of N is run as N extractions of one image each
    (``ncnn.Mat(x[i:i+1], batch_index=0)``, as the ``*_ncnn.py`` pnnx writes does for batch 1),
    and the outputs are stacked back."""

    engine = "ncnn"
    note = "ncnn has no batch axis: batch N = N single-image extractions in a loop"

    def __init__(self, threads: int):
        super().__init__(threads)
        self.net = None
        import ncnn  # noqa: F401  (not part of the load time)

    def load(self, files, spec) -> None:
        if files.ncnn_param is None:
            raise RuntimeError(files.ncnn_error or "no ncnn export")
        import ncnn

        self.ncnn = ncnn
        net = ncnn.Net()
        net.opt.use_fp16_packed = False
        net.opt.use_fp16_storage = False
        net.opt.use_fp16_arithmetic = False
        net.opt.use_bf16_storage = False
        net.opt.use_vulkan_compute = False
        net.opt.num_threads = self.threads
        net.opt.openmp_blocktime = 0  # no spinning (gomp follows OMP_WAIT_POLICY anyway)
        import os

        from zoo.export import redirect_fds

        with redirect_fds(os.devnull):  # (ncnn prints "layer X not exists or registered" itself)
            failed = net.load_param(str(files.ncnn_param)) != 0
        if failed:
            raise RuntimeError(f"ncnn load_param failed: {files.ncnn_param}{_ncnn_leftovers(files.ncnn_param)}")
        if net.load_model(str(files.ncnn_bin)) != 0:
            raise RuntimeError(f"ncnn load_model failed: {files.ncnn_bin}")
        self.net = net
        self.in_names = files.ncnn_inputs
        self.out_names = files.ncnn_outputs

    def prepare(self, inputs: tuple) -> Any:
        import numpy as np

        if any(x.dtype.kind != "f" for x in inputs):
            raise RuntimeError("ncnn takes float inputs only (this model has integer or bool inputs)")
        batch = inputs[0].shape[0]
        per_image = []
        for i in range(batch):
            per_image.append(tuple(
                self.ncnn.Mat(np.ascontiguousarray(x[i:i + 1]), batch_index=0).clone() for x in inputs))
        return per_image

    def run(self, prepared: Any) -> Any:
        results = []
        for mats in prepared:
            ex = self.net.create_extractor()
            for name, m in zip(self.in_names, mats):
                ex.input(name, m)
            outs = []
            for name in self.out_names:
                ret, out = ex.extract(name)
                if ret != 0:
                    raise RuntimeError(f"ncnn extract({name!r}) returned {ret}")
                outs.append(out)
            results.append(outs)
        return results

    def outputs(self, raw: Any) -> list:
        import numpy as np

        n_out = len(self.out_names)
        return [np.stack([np.array(img[k]) for img in raw]) for k in range(n_out)]

    def close(self) -> None:
        if self.net is not None:
            self.net.clear()
        self.net = None


def make_runner(engine: str, threads: int, backend: str | None = None) -> Runner:
    if engine == "kuiper":
        return KuiperRunner(threads, backend or "numpy")
    if engine == "torch":
        return TorchRunner(threads)
    if engine == "torch-cuda":
        return TorchCudaRunner(threads)
    if engine == "onnxruntime":
        return OrtRunner(threads)
    if engine == "ncnn":
        return NcnnRunner(threads)
    raise ValueError(f"unknown engine {engine!r}; known: kuiper, {', '.join(PEERS)}")
