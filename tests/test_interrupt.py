"""Stopping a running inference: Runtime.cancel from another thread and Ctrl-C (SIGINT to the
main thread) end a seconds-long local run promptly, with InferenceCancelled and KeyboardInterrupt,
and the same Runtime then gives the uninterrupted run's outputs; the same for Client.infer, local
and offloaded to a server on loopback (which is told and frees the inference); `coacto run`
exits with 130 and no traceback on Ctrl-C. The model's tiles are tens of GFLOP each (one tile
per layer), so a cancel checked only between tiles would miss the bounds.

The bounds (STOP_S) are loose for a shared CI machine; experiments/bench_cancel.py measures the
latency distribution."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import coacto
from coacto.server import Server

from conftest import assert_close

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "experiments"))
from bench_cancel import computing, interrupt_main_thread, long_model  # noqa: E402

#: How long a stopped inference may take to raise, from the cancel or the signal.
STOP_S = 0.5
#: When, into a run, the tests stop it.
STOP_AFTER_S = 0.3


#: The uninterrupted run lasts at least this long (more 512-channel layers on a faster machine).
RUN_S = 1.5


def _measure(layers: int):
    model = long_model(layers=layers)
    data = model.SerializeToString()
    tg = coacto.compile(data, tiles_per_layer=1)
    feeds = coacto.zoo.input_feeds(model, seed=1)
    with coacto.Runtime(tg, threads=1) as rt:
        rt.run(feeds)
        t0 = time.perf_counter()
        ref = rt.run(feeds)
        seconds = time.perf_counter() - t0
    return data, tg, feeds, ref, seconds


@pytest.fixture(scope="module")
def long_run():
    """(ONNX bytes, tile graph, feeds, outputs of an uninterrupted run, its seconds): a run of
    at least RUN_S on one thread."""
    run = _measure(1)
    if run[-1] < RUN_S:
        run = _measure(min(16, int(np.ceil(RUN_S / run[-1]))))
    if run[-1] < 3 * STOP_AFTER_S:
        pytest.skip(f"the long model runs in {run[-1]:.2f} s here: too fast to stop in the middle")
    return run


def stopped(call, stop, expect):
    """Runs ``call`` on this (the main) thread, ``stop`` on a timer thread after STOP_AFTER_S;
    asserts that ``call`` raises ``expect`` and returns the seconds from the stop to the raise."""
    fired = {}

    def fire():
        fired["t"] = time.perf_counter()
        stop()

    timer = threading.Timer(STOP_AFTER_S, fire)
    timer.start()
    try:
        with pytest.raises(expect):
            call()
        raised = time.perf_counter()
    finally:
        timer.cancel()
        timer.join()
    assert "t" in fired, "the inference ended before it was stopped"
    return raised - fired["t"]


def test_cancel_from_another_thread_stops_a_long_run_and_the_runtime_goes_on(long_run):
    _data, tg, feeds, ref, _s = long_run
    with coacto.Runtime(tg, threads=1) as rt:
        assert rt.cancel() == 0  # nothing in flight: nothing to stop, no error
        took = stopped(lambda: rt.run(feeds), rt.cancel, coacto.InferenceCancelled)
        assert took < STOP_S, f"the run ended {took:.3f} s after Runtime.cancel()"
        assert_close(rt.run(feeds), ref, rel=1e-5)
        assert rt.cancel() == 0


def test_ctrl_c_stops_a_long_run_with_keyboard_interrupt(long_run):
    _data, tg, feeds, ref, _s = long_run
    with coacto.Runtime(tg, threads=1) as rt:
        took = stopped(lambda: rt.run(feeds), interrupt_main_thread, KeyboardInterrupt)
        assert took < STOP_S, f"the run ended {took:.3f} s after Ctrl-C"
        assert_close(rt.run(feeds), ref, rel=1e-5)


def test_a_timeout_stops_the_work_too(long_run):
    _data, tg, feeds, ref, _s = long_run
    with coacto.Runtime(tg, threads=1) as rt:
        t0 = time.perf_counter()
        with pytest.raises(coacto.InferenceTimeout):
            rt.run(feeds, timeout=STOP_AFTER_S)
        assert time.perf_counter() - t0 < STOP_AFTER_S + STOP_S
        assert_close(rt.run(feeds), ref, rel=1e-5)


def test_cancel_stops_only_the_runtime_it_is_called_on(long_run):
    """Two Runtimes on one pool of threads: cancelling one leaves the other's run alone."""
    _data, tg, feeds, ref, _s = long_run
    with coacto.Runtime(tg, threads=1) as a, coacto.Runtime(tg, share=a) as b:
        got = {}
        other = threading.Thread(target=lambda: got.update(out=b.run(feeds)))
        other.start()
        took = stopped(lambda: a.run(feeds), a.cancel, coacto.InferenceCancelled)
        other.join()
        assert took < STOP_S
        assert_close(got["out"], ref, rel=1e-5)


@pytest.mark.parametrize("how", ["cancel", "ctrl-c"])
def test_client_infer_stops_locally(long_run, how):
    _data, tg, feeds, ref, _s = long_run
    with coacto.Client(None, tg, threads=1, policy="local") as client:
        if how == "cancel":
            future = {}

            def call():
                future["f"] = client.infer_async(feeds)
                future["f"].result()

            took = stopped(call, lambda: client.cancel(future["f"]), coacto.InferenceCancelled)
        else:
            took = stopped(lambda: client.infer(feeds), interrupt_main_thread, KeyboardInterrupt)
        assert took < STOP_S, f"Client.infer ended {took:.3f} s after the {how}"
        assert_close(client.infer(feeds), ref, rel=1e-5)


@pytest.mark.parametrize("how", ["cancel", "ctrl-c"])
def test_client_infer_stops_an_offloaded_inference_and_the_server_frees_it(long_run, how):
    data, tg, feeds, ref, _s = long_run
    with Server("tcp://127.0.0.1:0", threads=1) as srv, \
            coacto.Client(srv.address, tg, threads=1, policy="cloud", model_bytes=data,
                          timeout=30) as client:

        def cancelled_count():
            return srv.stats().get("inferences_cancelled", 0)

        client.connect()
        cancelled = cancelled_count()
        if how == "cancel":
            took = stopped(lambda: client.infer(feeds), client.cancel, coacto.InferenceCancelled)
        else:
            took = stopped(lambda: client.infer(feeds), interrupt_main_thread, KeyboardInterrupt)
        assert took < STOP_S, f"Client.infer ended {took:.3f} s after the {how}"
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and (
                srv.stats()["inferences"] or cancelled_count() == cancelled):
            time.sleep(0.01)
        stats = srv.stats()
        assert stats["inferences"] == 0 and cancelled_count() == cancelled + 1, stats
        out = client.infer(feeds)
        assert client.last_stats["finished_by"] == "server"
        assert_close(out, ref, rel=1e-5)


def test_client_cancel_without_a_future_stops_everything_in_flight(long_run):
    _data, tg, feeds, ref, _s = long_run
    with coacto.Client(None, tg, threads=1, policy="local") as client:
        futures = [client.infer_async(feeds) for _ in range(3)]
        time.sleep(STOP_AFTER_S)
        client.cancel()
        for f in futures:
            with pytest.raises(coacto.InferenceCancelled):
                f.result(timeout=STOP_S)
        with pytest.raises(coacto.CoactoError):
            client.cancel("not a future")
        assert_close(client.infer(feeds), ref, rel=1e-5)  # submitted after: not cancelled


def test_coacto_run_exits_130_on_ctrl_c_without_a_traceback(long_run, tmp_path):
    _data, tg, _feeds, _ref, _s = long_run
    path = tmp_path / "long.ctg"
    tg.save(path)
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
           "MKL_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "coacto.cli", "run", str(path), "--random",
                             "--threads", "1", "--repeat", "1000"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 60
        while not computing(proc.pid) and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.02)
        time.sleep(STOP_AFTER_S)
        t0 = time.perf_counter()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        took = time.perf_counter() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, (proc.returncode, err)
    assert "Traceback" not in err, err
    assert "interrupted" in err
    assert took < 2 * STOP_S, f"coacto run exited {took:.3f} s after Ctrl-C"


def test_tiles_run_in_pieces_equal_onnxruntime():
    """One-tile layers far over the piece size (a 3x3 convolution of 0.6 GFLOP with a bias and
    ReLU, then a 1x1 one, as PyTorch exports them), computed piece by piece, against onnxruntime:
    the pieces must cover the tile exactly once."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32) * 0.1, n)
             for n, s in (("w1", (128, 64, 3, 3)), ("b1", (128,)), ("w2", (96, 128, 1, 1)))]
    nodes = [helper.make_node("Conv", ["input", "w1", "b1"], ["c1"], name="/conv1/Conv",
                              kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="/relu/Relu"),
             helper.make_node("Conv", ["r1", "w2"], ["output"], name="/conv2/Conv",
                              kernel_shape=[1, 1])]
    g = helper.make_graph(nodes, "torch_jit",
                          [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 64, 64, 64])],
                          [helper.make_tensor_value_info("output", TensorProto.FLOAT, None)], inits)
    data = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    tg = coacto.compile(data, tiles_per_layer=1)
    assert tg.total_flops > 4 * 128e6  # the first layer alone runs in several pieces
    x = {"input": rng.standard_normal((1, 64, 64, 64)).astype(np.float32)}
    ref = {"output": ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, x)[0]}
    for threads in (1, 2):
        assert_close(coacto.Runtime(tg, threads=threads).run(x), ref)
