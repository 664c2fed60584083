"""kuiper_xp.dask on a real LocalCluster of worker processes."""

import os
import signal
import time

import numpy as np
import pytest
import torch
from torch import nn

pytest.importorskip("distributed")
import dask.array as da  # noqa: E402
from distributed import Client, LocalCluster  # noqa: E402
from helpers import export_torch  # noqa: E402

import kuiper_xp  # noqa: E402
import kuiper_xp.dask as kxd  # noqa: E402


class Net(nn.Module):
    def forward(self, x):
        return torch.relu(torch.sigmoid(x)), torch.sigmoid(torch.relu(x))


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return export_torch(Net(), (torch.randn(1, 4, 16, 16),), tmp_path_factory.mktemp("dask"),
                        inputs2=(torch.randn(3, 4, 16, 16),))


@pytest.fixture(scope="module")
def client():
    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None)
    c = Client(cluster)
    yield c
    c.close()
    cluster.close()


def test_map_model_matches_single_process(model, client):
    x = np.random.default_rng(0).standard_normal((300, 4, 16, 16)).astype(np.float32)
    expected = kuiper_xp.load(model, backend="numpy")(x)
    dx = da.from_array(x, chunks=(32, 2, 16, 16))  # odd chunking on axis 1 is merged
    y0, y1 = kxd.map_model(model, dx)
    assert y0.shape == (300, 4, 16, 16) and y0.chunks[0] == dx.chunks[0]
    got0, got1 = client.compute([y0, y1], sync=True)
    np.testing.assert_array_equal(got0, expected[0])
    np.testing.assert_array_equal(got1, expected[1])


def test_each_worker_loads_the_model_once(model, client):
    x = da.from_array(np.ones((64, 4, 16, 16), np.float32), chunks=(4, 4, 16, 16))
    client.run(kxd.clear_cache)
    y, _ = kxd.map_model(model, x)
    client.compute(y, sync=True)
    sizes = client.run(lambda: len(kxd._cache))
    assert set(sizes.values()) <= {0, 1} and sum(sizes.values()) >= 1


def test_map_files_over_npy_paths(model, client, tmp_path):
    rng = np.random.default_rng(1)
    items = rng.standard_normal((40, 4, 16, 16)).astype(np.float32)
    paths = []
    for i, item in enumerate(items):
        p = tmp_path / f"{i:03d}.npy"
        np.save(p, item)
        paths.append(p)
    y0, _ = kxd.map_files(model, paths, batch_size=7, loader=np.load)
    got = client.compute(y0, sync=True)
    np.testing.assert_array_equal(got, kuiper_xp.load(model, backend="numpy")(items)[0])


def test_survives_a_worker_killed_mid_run(model, client):
    x = np.random.default_rng(2).standard_normal((400, 4, 16, 16)).astype(np.float32)
    expected = kuiper_xp.load(model, backend="numpy")(x)[0]

    def slow_block(block):
        time.sleep(0.05)
        return block

    dx = da.from_array(x, chunks=(4, 4, 16, 16)).map_blocks(slow_block, dtype=np.float32)
    y, _ = kxd.map_model(model, dx, sample=x[:1])
    fut = client.compute(y)
    time.sleep(0.8)
    pids = client.run(os.getpid)
    victim = sorted(pids.values())[0]
    os.kill(victim, signal.SIGKILL)
    got = fut.result(timeout=120)
    assert got.shape == expected.shape  # nothing lost or duplicated
    np.testing.assert_array_equal(got, expected)


def test_bad_input_is_clear(model):
    with pytest.raises(kuiper_xp.InputError, match="dask.array"):
        kxd.map_model(model, np.zeros((2, 4, 16, 16), np.float32))


def test_cli_runs_files_on_a_local_cluster(tmp_path, capsys):
    from kuiper_xp.cli import main
    from kuiper_xp.data import __file__ as data_init

    data = np.load(os.path.join(os.path.dirname(data_init), "digits_test.npz"))
    for i in range(120):
        np.save(tmp_path / f"x{i:03d}.npy", data["images"][i])
    out = tmp_path / "out.npy"
    rc = main(["run", os.path.join(os.path.dirname(data_init), "digits.pnnx.param"),
               "--input", str(tmp_path / "*.npy"), "--dask", "local", "--workers", "2",
               "--batch-size", "16", "--output", str(out), "--quiet"])
    assert rc == 0, capsys.readouterr()
    got = np.load(out)
    g = kuiper_xp.load(os.path.join(os.path.dirname(data_init), "digits.pnnx.param"), backend="numpy")
    # the same batches of 16 in this process: identical bits (BLAS may round differently for
    # another batch size, so the comparison keeps the batching)
    first = data["images"][:120]
    # Dask workers run BLAS single-threaded; BLAS may sum in another order with more threads
    from kuiper_xp.backends import numpy_fast
    from threadpoolctl import threadpool_limits

    saved = numpy_fast.set_num_threads(1)
    try:
        with threadpool_limits(1):
            expected = np.concatenate([g(first[i:i + 16])[0] for i in range(0, 120, 16)])
    finally:
        numpy_fast.set_num_threads(saved)
    np.testing.assert_array_equal(got, expected)


def test_cli_dask_needs_inputs(capsys):
    from kuiper_xp.cli import main

    assert main(["run", "--dask", "local"]) == 2
    assert "--input" in capsys.readouterr().err


def test_the_progress_bar_is_not_written_to_stdout(tmp_path, capsys):
    # Dask's text bar goes to stdout, where `kuiper-xp run` users may pipe their results
    from kuiper_xp.data import __file__ as data_init

    data = np.load(os.path.join(os.path.dirname(data_init), "digits_test.npz"))
    paths = []
    for i in range(8):
        np.save(tmp_path / f"x{i}.npy", data["images"][i])
        paths.append(str(tmp_path / f"x{i}.npy"))
    model = os.path.join(os.path.dirname(data_init), "digits.pnnx.param")
    (got,) = kxd.run_files(model, paths, local_workers=1, batch_size=4, progress=True)
    captured = capsys.readouterr()
    assert got.shape[0] == 8 and "Completed" in captured.err and "Completed" not in captured.out
