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
    with pytest.raises(BackendUnavailableError, match=r"kuiper-xp\[cuda\]") as ei:
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


def _malloc_tuned_in_fresh_process(env_value):
    """Start the numpy backend in a fresh interpreter; report whether it tuned malloc."""
    import os
    import subprocess
    import sys

    code = ("from kuiper_xp.backends import get_backend, numpy_backend as nb\n"
            "get_backend('numpy')\n"
            "print(nb._malloc_tuned)\n")
    env = dict(os.environ, KUIPER_XP_TUNE_MALLOC=env_value)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip() == "True"


def test_numpy_backend_tunes_glibc_malloc_once_and_can_be_told_not_to():
    """Starting the numpy backend keeps numpy's temporaries of up to 32 MiB in malloc's heap
    (glibc on Linux); KUIPER_XP_TUNE_MALLOC=0 leaves malloc alone."""
    import sys

    from kuiper_xp.backends import numpy_backend as nb

    if not sys.platform.startswith("linux"):
        assert nb.tune_malloc() is False
        return
    import ctypes

    if not hasattr(ctypes.CDLL(None), "mallopt"):
        pytest.skip("not glibc")
    assert _malloc_tuned_in_fresh_process("1") is True
    assert _malloc_tuned_in_fresh_process("0") is False
    assert nb.tune_malloc() is nb.tune_malloc()  # once per process, same answer
