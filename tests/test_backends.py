import sys
from pathlib import Path

import numpy as np
import pytest
from kuiper_xp.backends import ENV_VAR, get_backend, list_backends

import kuiper_xp
from kuiper_xp.errors import BackendError, BackendUnavailableError, KuiperXPError


def test_default_is_numpy_without_cuda(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    infos = {i.name: i for i in list_backends()}
    expected = "cupy" if infos["cupy"].available else "numpy"
    assert get_backend().name == expected


def test_env_var_chooses_and_argument_wins(monkeypatch):
    monkeypatch.setenv(ENV_VAR, "array_api_strict")
    assert get_backend().name == "array_api_strict"
    assert get_backend("numpy").name == "numpy"


def test_unknown_backend_names_the_allowed_ones():
    with pytest.raises(BackendError, match="allowed: auto, numpy, cupy, array_api_strict") as ei:
        get_backend("tensorflow")
    assert isinstance(ei.value, ValueError) and isinstance(ei.value, KuiperXPError)


def test_unknown_backend_from_env_is_clear(monkeypatch):
    monkeypatch.setenv(ENV_VAR, "jax")
    with pytest.raises(BackendError, match="'jax'"):
        get_backend()


def test_cupy_without_cuda_names_the_extra(monkeypatch):
    infos = {i.name: i for i in list_backends()}
    if infos["cupy"].available:
        pytest.skip("a CUDA device answers here")
    monkeypatch.setenv(ENV_VAR, "cupy")
    with pytest.raises(BackendUnavailableError, match=r"pip install -e .\.\[cuda\].") as ei:
        get_backend()
    assert isinstance(ei.value, ImportError)
    assert "KUIPER_XP_BACKEND" in str(ei.value)


def test_auto_never_raises_when_cupy_is_broken(monkeypatch):
    from kuiper_xp.backends import cupy_backend

    monkeypatch.setattr(cupy_backend, "_probe_result", (False, "cupy imports but no CUDA device answers"))
    assert get_backend("auto").name == "numpy"


def test_unknown_device_is_clear():
    with pytest.raises(BackendError, match="device1"):
        get_backend("array_api_strict", "device9")
    with pytest.raises(BackendError, match="cpu"):
        get_backend("numpy", "cuda:0")


def test_list_backends_reports_reasons():
    infos = {i.name: i for i in list_backends()}
    assert set(infos) == {"numpy", "cupy", "array_api_strict"}
    assert infos["numpy"].available and infos["numpy"].devices == ("cpu",)
    for info in infos.values():
        assert info.available or info.reason


def test_backend_roundtrip(backend):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    x = backend.asarray(a)
    assert backend.owns(x)
    np.testing.assert_array_equal(backend.to_numpy(x), a)
    np.testing.assert_array_equal(kuiper_xp.to_numpy(x), a)
    backend.synchronize()
    assert backend.description


def _malloc_tuned_in_fresh_process(env_value, cli=False):
    """Start the numpy backend (or the command line) in a fresh interpreter; report whether
    malloc was tuned."""
    import os
    import subprocess
    import sys

    start = ("from kuiper_xp.cli import main\nmain(['backends'])\n" if cli
             else "from kuiper_xp.backends import get_backend\nget_backend('numpy')\n")
    code = start + "from kuiper_xp.backends import numpy_backend as nb\nprint(nb._malloc_tuned)\n"
    env = dict(os.environ)
    env.pop("KUIPER_XP_TUNE_MALLOC", None)
    if env_value is not None:
        env["KUIPER_XP_TUNE_MALLOC"] = env_value
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1] == "True"


def test_malloc_tuning_is_opt_in_for_the_library_and_on_for_the_command():
    """glibc malloc is process-wide: the library leaves it alone unless KUIPER_XP_TUNE_MALLOC=1;
    the kuiper-xp command, whose process is its own, tunes it unless KUIPER_XP_TUNE_MALLOC=0."""
    import sys

    if not sys.platform.startswith("linux"):
        pytest.skip("glibc malloc: Linux only")
    import ctypes

    if not hasattr(ctypes.CDLL(None), "mallopt"):
        pytest.skip("not glibc")
    assert _malloc_tuned_in_fresh_process(None) is False
    assert _malloc_tuned_in_fresh_process("1") is True
    assert _malloc_tuned_in_fresh_process(None, cli=True) is True
    assert _malloc_tuned_in_fresh_process("0", cli=True) is False


@pytest.mark.parametrize("sonames, want", [
    (["libmkl_rt.so.2"], "libmkl_rt.so.2"),
    (["libmkl_rt.so.3"], "libmkl_rt.so.3"),  # the mkl 2026 wheel
    (["libmkl_rt.so.2", "libmkl_rt.so.3"], "libmkl_rt.so.3"),
    ([], None),
])
def test_mkl_library_found_under_any_soname(tmp_path, monkeypatch, sonames, want):
    """The MKL option finds the wheel's libmkl_rt in this Python's prefix whatever its major
    version, the newest first (2026's wheel renamed .so.2 to .so.3, and the option read as 'not
    installed')."""
    from kuiper_xp.backends import mkl_kernels

    (tmp_path / "lib").mkdir()
    for name in sonames:
        (tmp_path / "lib" / name).write_bytes(b"")
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    monkeypatch.setattr(sys, "base_prefix", str(tmp_path))
    monkeypatch.delenv("CONDA_PREFIX", raising=False)
    monkeypatch.setattr(mkl_kernels.ctypes.util, "find_library", lambda name: None)
    got = mkl_kernels.find_library()
    assert (got and Path(got).name) == want
    if want:
        assert Path(got).parent == tmp_path / "lib"
