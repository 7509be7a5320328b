"""coacto.Client and coacto-client against a real server over ZeroMQ on 127.0.0.1: every policy's
outputs equal onnxruntime's, the model is uploaded once, the bandwidth cap holds and is measured,
and the device always finishes: a killed, absent, stalled or incompatible server means a local
run (fallback) and, once the server is back, offloading again."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import wait

import msgpack
import numpy as np
import onnx
import pytest
import zmq

import coacto
from coacto import protocol as P
from coacto import zoo
from coacto.mobile import Client, ServerVersionError, policies
from coacto.partition import input_tiles
from coacto.mobile.estimates import Goodput, RoundTrip
from coacto.mobile.shaper import RateError, TokenBucket, parse_rate
from coacto.server import Server

from conftest import assert_close

TILES = 5


@pytest.fixture(scope="module")
def squeezenet():
    model = zoo.build("squeezenet", image_size=32)
    return model, *_reference(model)


@pytest.fixture(scope="module")
def big_input():
    """A model whose input (196 kB) dominates a cloud inference on a shaped link."""
    model = zoo.build("squeezenet", image_size=128)
    return model, *_reference(model)


def _reference(model):
    import onnxruntime as ort

    feeds = zoo.input_feeds(model, seed=1)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return feeds, dict(zip(names, sess.run(names, feeds)))


@pytest.fixture(scope="module")
def server():
    with Server("tcp://127.0.0.1:0", threads=1, server_flops=20e9) as srv:
        yield srv


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------------ units

def test_parse_rate_says_bits_or_bytes():
    assert parse_rate("20mbit") == pytest.approx(2.5e6)
    assert parse_rate("20Mbit/s") == parse_rate("20MBIT") == pytest.approx(2.5e6)
    assert parse_rate("500kbit") == pytest.approx(62500)
    assert parse_rate("1gbit") == pytest.approx(1.25e8)
    assert parse_rate("8Mibit") == pytest.approx(1024 ** 2)
    assert parse_rate("2.5MB/s") == parse_rate("2.5MByte/s") == pytest.approx(2.5e6)
    assert parse_rate("100kB/s") == pytest.approx(1e5)
    assert parse_rate("1MiB/s") == pytest.approx(1024 ** 2)
    assert parse_rate(8e6) == pytest.approx(1e6)  # a Python number is bits/s
    assert parse_rate(" 1.5 Mbit ") == pytest.approx(187500)
    # forms whose bits-or-bytes depends on who reads them are refused with both spellings
    for ambiguous in ("20Mbps", "20mbps", "20MBps", "20Mb/s"):
        with pytest.raises(RateError, match=r"ambiguous.*'20Mbit/s' for 20 Mbit/s \(2.5 MB/s\)"
                                            r".*'20MB/s' for 20 MB/s \(160 Mbit/s\)"):
            parse_rate(ambiguous)
    with pytest.raises(RateError, match="no unit.*'8000bit'"):
        parse_rate("8000")
    with pytest.raises(RateError, match="a size, not a rate.*'20MB/s'"):
        parse_rate("20MB")
    for bad in ("fast", "20 furlongs", "-5mbit", "0mbit", "", "10bit", None, "100kbps"):
        with pytest.raises(RateError):
            parse_rate(bad)


def test_token_bucket_paces_at_the_rate():
    bucket = TokenBucket(1e6, burst=1500)  # 1 MB/s
    t = 100.0
    releases = [bucket.reserve(10_000, t) for _ in range(10)]
    assert releases == sorted(releases)
    assert releases[-1] - t == pytest.approx(0.1 - 1500 / 1e6, rel=1e-6)
    # a frame larger than the bucket leaves after its serialization time, no deadlock
    later = 200.0
    assert bucket.reserve(500_000, later) == pytest.approx(later + (500_000 - 1500) / 1e6)
    # idle time refills only up to the burst
    assert bucket.reserve(1000, 1000.0) == 1000.0


def test_bandwidth_schedules_and_rate_changes():
    from coacto.mobile.link import Link
    from coacto.mobile.shaper import parse_schedule

    assert parse_schedule("20mbit") == [(0.0, 2.5e6)]
    assert parse_schedule("100mbit,5mbit@2.5,100mbit@6s") == [(0.0, 12.5e6), (2.5, 625e3),
                                                                (6.0, 12.5e6)]
    for bad, why in (("100mbit,5mbit", "needs @SECONDS"), ("100mbit@1,5mbit@2", "from 0 s"),
                     ("100mbit,5mbit@2,1mbit@1", "must increase"), ("1mbit,2mbit@x", "not a time"),
                     ("1mbit,2furlong@3", "unit")):
        with pytest.raises(RateError, match=why):
            parse_schedule(bad)
    # a rate change re-books what the link holds: the part of a frame not yet across takes the
    # new rate, frames behind it all of their bytes
    link = Link(zmq.Context.instance(), zmq.Poller(), 5.0, TokenBucket(1e6, burst=1),
                TokenBucket(1e6, burst=1))
    link.sock = object()  # pump() only needs one; nothing is released before t = 0.2
    items = [(P.TILES, [np.zeros(25_000, np.float32)], None) for _ in range(2)]  # 100 kB each
    link.pump(0.0, lambda: items.pop() if items else None, lambda *a: True)
    assert [round(e[0], 4) for e in link.held] == [0.1, 0.2]
    link.set_rate(1e5, 0.05)  # half of the first is across: the rest at a tenth of the rate
    assert [round(e[0], 4) for e in link.held] == [0.55, 1.55]
    link.set_rate(1e6, 1.05)  # during the second frame
    assert [round(e[0], 4) for e in link.held] == [0.55, 1.1]
    link.sock = None


def test_a_message_the_socket_refuses_once_is_announced_once():
    """At the socket's high-water mark the pump keeps the message and tries again later; the
    engine's on_sent (which counts its tiles and bytes and marks its trace) ran on every try."""
    class Sock:
        def __init__(self):
            self.refuse, self.sent = 1, []

        def send_multipart(self, frames, flags=0, copy=True):
            if self.refuse:
                self.refuse -= 1
                raise zmq.Again()
            self.sent.append(frames)

    from coacto.mobile.link import Link

    link = Link(zmq.Context.instance(), zmq.Poller(), 5.0)
    link.sock = Sock()
    items = [(P.TILES, [b"a"], None), (P.TILES, [b"b"], None)]
    announced = []
    on_sent = lambda kind, frames, *a: announced.append(frames[0]) or True  # noqa: E731
    link.pump(0.0, lambda: items.pop(0) if items else None, on_sent)
    assert announced == [b"a"] and link.sock.sent == [] and len(link.held) == 2
    link.pump(0.01, lambda: None, on_sent)  # past the back-off: both go, "a" not announced again
    assert announced == [b"a", b"b"] and link.sock.sent == [[b"a"], [b"b"]] and not link.held
    link.sock = None


def test_goodput_from_backlogged_acks_ignores_pipelining():
    rate, rtt = 2e6, 0.050  # 16 Mbit/s, 50 ms: 8 batches of 25 kB in flight at once
    g = Goodput(initial=1e5)
    sent_at = {}
    for i in range(40):
        t = i * 0.0125  # the sender keeps 100 ms of data queued
        sent_at[i] = t
        g.sent(i, 25_000, t)
    # the link serves them back to back; each ACK arrives rtt/2 after its last byte
    for i in range(40):
        g.acked(i, (i + 1) * 25_000 / rate + rtt / 2, rtt)
    assert g.value == pytest.approx(rate, rel=0.1)
    assert g.inflight_bytes == 0


def test_goodput_uses_the_servers_stamps_when_acks_are_read_late():
    rate = 1e6
    g = Goodput(initial=1e5)
    for i in range(20):
        g.sent(i, 20_000, 0.0)  # all handed over at once: backlogged
    # the server took them in 20 ms apart; the device read every ACK at the same late moment
    for i in range(20):
        g.acked(i, 1.0, 0.001, t_server=500.0 + (i + 1) * 20_000 / rate)
    assert g.value == pytest.approx(rate, rel=0.05)


def test_batches_handed_over_after_the_link_carried_the_last_do_not_measure_the_link():
    """A device that streams its tiles as it computes them hands a 19 kB batch every 6 ms to a
    100 Mbit/s link (1.5 ms each) with a 10 ms RTT: the batches before each are still
    unacknowledged, but the link idled in between. Their spacing is the device's pace: it read
    this link as 25 Mbit/s. Batches handed over while the link still carried the one before
    measure it as ever."""
    rate, rtt, n = 12.5e6, 0.010, 19_000
    g = Goodput(initial=rate)
    for i in range(12):
        g.sent(("paced", i), n, i * 0.006)
    for i in range(12):
        at_server = i * 0.006 + rtt / 2 + n / rate
        g.acked(("paced", i), at_server + rtt / 2, rtt, t_server=100.0 + at_server,
                t_arrived=at_server)  # the clock offset known: 100 s
    assert g.value == pytest.approx(rate, rel=0.01), g.value * 8e-6
    # the same batches without a clock offset: no way to tell, the spacing counts (as before)
    blind = Goodput(initial=rate)
    for i in range(12):
        blind.sent(i, n, i * 0.006)
    for i in range(12):
        at_server = i * 0.006 + rtt / 2 + n / rate
        blind.acked(i, at_server + rtt / 2, rtt, t_server=100.0 + at_server)
    assert blind.value < 0.5 * rate
    # handed over together, the link sets the pace: a sample of the rate
    slow = 2.5e6  # the link slowed to 20 Mbit/s meanwhile
    t0 = 1.0
    for i in range(12):
        g.sent(("queued", i), n, t0)
    for i in range(12):
        at_server = t0 + rtt / 2 + (i + 1) * n / slow
        g.acked(("queued", i), at_server + rtt / 2, rtt, t_server=100.0 + at_server,
                t_arrived=at_server)
    assert g.value == pytest.approx(slow, rel=0.1), g.value * 8e-6


def test_paced_batches_through_the_clients_shaper_and_a_stale_clock():
    """The client's own shaper knows when each batch crossed (its release less the delay it
    adds): paced batches are told apart by that, whatever the added RTT. A clock offset that
    puts the server's stamp outside the batch's round trip (a server restarted with another
    clock) tells nothing: the batches count as before."""
    rate, delay, n = 25e6, 0.005, 37_500  # 200 Mbit/s, 1.5 ms a batch, one sent every 3 ms
    g = Goodput(initial=rate)
    for i in range(12):
        g.sent(i, n, i * 0.003)
        crossed = i * 0.003 + n / rate
        g.booked(i, crossed + delay, delay)
    for i in range(12):
        crossed = i * 0.003 + n / rate
        g.acked(i, crossed + 2 * delay, 0.0001, t_server=crossed + delay)
    assert g.value == pytest.approx(rate, rel=0.01), g.value * 8e-6  # not 100 Mbit/s
    stale = Goodput(initial=rate)
    for i in range(12):
        stale.sent(i, n, i * 0.003)
    for i in range(12):
        at_server = i * 0.003 + 0.001 + n / rate
        stale.acked(i, at_server + 0.001, 0.002, t_server=at_server, t_arrived=at_server - 60.0)
    assert stale.value < 0.6 * rate  # the spacing counted: 100 Mbit/s


def test_device_paced_batches_lift_a_low_estimate_towards_the_link():
    """75 kB batches handed over every 4.5 ms to a 200 Mbit/s link (3 ms each) believed to be
    50: the link idles a third of the time. Each spacing bounds the goodput from below, and the
    estimate climbs, at most 1.5x a batch. A batch handed over a little after the one before
    crossed (an idle gap of a small share of the spacing) is still a sample."""
    from coacto.mobile.estimates import BURST_BYTES

    rate, rtt, n = 25e6, 0.010, 75_000
    g = Goodput(initial=6.25e6)
    for i in range(8):
        g.sent(i, n, i * 0.0045)
    values = []
    for i in range(8):
        at_server = i * 0.0045 + rtt / 2 + n / rate
        g.acked(i, at_server + rtt / 2, rtt, t_server=at_server, t_arrived=at_server)
        values.append(g.value)
    assert values[1] <= 1.5 * 6.25e6 + 1 and g.samples == 0
    assert g.value == pytest.approx((n - BURST_BYTES) / 0.0045, rel=0.01)  # 104 Mbit/s
    near = Goodput(initial=6.25e6)  # every 3.1 ms: idle 0.1 ms of each 3.1, a sample
    for i in range(12):
        near.sent(i, n, i * 0.0031)
    for i in range(12):
        at_server = i * 0.0031 + rtt / 2 + n / rate
        near.acked(i, at_server + rtt / 2, rtt, t_server=at_server, t_arrived=at_server)
    assert near.samples >= 1 and near.value == pytest.approx(n / 0.0031, rel=0.05)
    # a 20 Mbit/s token bucket whose 100 kB burst is not known yet lets 37 kB batches, handed
    # over 3 ms apart while the one before is unacknowledged, through at once: more than 1.5x
    # the rate its backlogged batches measured is the burst, not the link
    slow = 2.5e6
    b = Goodput(initial=slow)
    for k in range(4):
        b.sent(("q", k), 64_000, 0.0)
    for k in range(4):
        b.acked(("q", k), 0.03 * (k + 1), 0.003, t_server=(k + 1) * 64_000 / slow,
                t_arrived=(k + 1) * 64_000 / slow)
    assert b.samples >= 1 and b.value == pytest.approx(slow, rel=0.01)
    for i in range(4):
        b.sent(("p", i), 37_000, 1.0 + 0.003 * i)
        if i:  # the one before is acknowledged 5 ms after it was handed over
            t = 1.0 + 0.003 * (i - 1)
            b.acked(("p", i - 1), t + 0.005, 0.003, t_server=t + 0.0015, t_arrived=t + 0.0015)
    assert b.value == pytest.approx(slow, rel=0.01)  # not 30 Mbit/s (1.5x) or 55


def test_an_isolated_transfer_bounds_the_goodput_only_beyond_a_burst():
    from coacto.mobile.estimates import BURST_BYTES

    g = Goodput(initial=1e5)
    # a 5 Mbit/s token bucket lets its burst through at once: a 25 kB probe answered after the
    # rest took 14 ms reads as 14 Mbit/s if its burst counts
    n = 25_000
    t = (n - BURST_BYTES) / 625e3
    g.sent("probe", n, 0.0)
    g.acked("probe", t, 0.0001)
    assert g.value == pytest.approx(625e3, rel=0.01)
    g2 = Goodput(initial=1e5)
    g2.sent("small", BURST_BYTES, 0.0)  # all of it within a burst: proves nothing
    g2.acked("small", 1e-4, 0.0001)
    assert g2.value == 1e5 and g2.samples == 0


def test_a_transfer_faster_than_the_measured_rate_teaches_the_burst():
    """A 200 Mbit/s tbf link with a 100 kB burst: backlogged batches measured 25 MB/s; a 64 kB
    probe then crossed in 0.4 ms. It shows a burst of about 54 kB, not a 1.3 Gbit/s link; a
    larger transfer bounds the goodput beyond that burst."""
    from coacto.mobile.estimates import BURST_BYTES

    rate = 25e6
    g = Goodput(initial=1e6)
    for k in range(4):  # 4 x 256 kB backlogged, the server stamping each 10.5 ms apart
        g.sent(("b", k), 256 << 10, 0.0)
    for k in range(4):
        g.acked(("b", k), 0.011 * (k + 1), 0.0003, t_server=100.0 + (k + 1) * (256 << 10) / rate)
    assert g.samples >= 1 and g.value == pytest.approx(rate, rel=0.01)
    assert g.burst == BURST_BYTES
    g.sent("probe", 64 << 10, 1.0)
    g.acked("probe", 1.0004, 0.0003)
    assert g.value == pytest.approx(rate, rel=0.01)  # not (64 kB - 16 kB) / 0.4 ms = 123 MB/s
    assert g.burst == pytest.approx((64 << 10) - rate * 0.0004)
    g.sent("big", 400_000, 2.0)  # 400 kB in 14 ms: beyond the burst, 25 MB/s
    g.acked("big", 2.014, 0.0003)
    assert g.value == pytest.approx(rate, rel=0.01)
    fresh = Goodput(initial=1e6)  # nothing measured yet: the bound stands, as before
    fresh.sent("probe", 64 << 10, 0.0)
    fresh.acked("probe", 0.0004, 0.0003)
    assert fresh.value == pytest.approx(((64 << 10) - BURST_BYTES) / 0.0004)


def test_a_train_that_crossed_in_one_burst_is_no_sample():
    """Three 24 kB probes through a 100 kB burst, stamped 0.1 ms apart by the server: that is
    the burst, not the link's rate (it read 11 Gbit/s, and blended into the next sample)."""
    g = Goodput(initial=1.25e6)
    for k in range(3):
        g.sent(("p", k), 24 << 10, 0.0)
    for k in range(3):
        g.acked(("p", k), 0.001 + 1e-4 * k, 0.0003, t_server=50.0 + 1e-4 * k)
    assert g.samples == 0
    rate = 25e6  # the train after it, 256 kB probes, measures the rate, unblended
    for k in range(3):
        g.sent(("q", k), 256 << 10, 1.0)
    for k in range(3):
        g.acked(("q", k), 1.02 + 0.0105 * k, 0.0003, t_server=60.0 + k * (256 << 10) / rate)
    assert g.samples == 1 and g.value == pytest.approx(rate, rel=0.01)


def test_a_probe_train_measures_the_rate_behind_the_burst():
    """Three 24 kB probes handed over at once on a 50 Mbit/s tbf link (16 kB burst) whose
    device reads the answers 3 ms late (its CPU quota): the first bounds the goodput, the
    server's stamps on the two behind it measure it."""
    from coacto.mobile.estimates import BURST_BYTES

    rate, n, late = 6.25e6, 24 * 1024, 0.003
    g = Goodput(initial=1.25e6)
    for k in range(3):
        g.sent(("probe", k), n, 0.0)
    arrive = [(k + 1) * n / rate - BURST_BYTES / rate for k in range(3)]  # at the server
    for k in range(3):
        g.acked(("probe", k), arrive[k] + late, 0.0002, t_server=1000.0 + arrive[k])
    assert g.samples == 1 and g.value == pytest.approx(rate, rel=0.15), g.value * 8e-6


def test_a_key_sent_again_does_not_leak_bytes_in_flight():
    # two probe trains with the same keys once left bytes "in flight" for ever, and the send
    # window, which counts them, then held every later batch back
    g = Goodput(initial=1e5)
    g.sent(("probe", 0, 1), 30_000, 0.0)
    g.sent(("probe", 0, 1), 30_000, 1.0)
    g.acked(("probe", 0, 1), 1.5, 0.001)
    assert g.inflight_bytes == 0


def test_a_probe_train_lost_with_its_connection_does_not_stop_the_next():
    from types import SimpleNamespace

    from coacto.mobile.estimates import Estimates
    from coacto.mobile.session import PROBE_TRAIN, Session

    link = SimpleNamespace(epoch=1, idle=None)
    est = Estimates(bandwidth=1e6)
    s = Session(link, "tcp://x:1", None, None, est, 5.0, "t", lambda: None, lambda r: None)
    s._send_probe()
    train = link.idle()
    link.idle = None
    assert len(train) == PROBE_TRAIN and est.goodput.inflight_bytes > 0
    s._send_probe()
    assert link.idle is None  # one train at a time
    link.epoch = 2  # the connection was replaced before any answer came
    s._send_probe()
    assert link.idle is not None and est.goodput.inflight_bytes == 0


def test_a_lost_connection_forgets_the_servers_clock():
    from types import SimpleNamespace

    from coacto.mobile.estimates import Estimates
    from coacto.mobile.session import Session

    link = SimpleNamespace(epoch=1, idle=None, close=lambda: None)
    est = Estimates(bandwidth=1e6)
    s = Session(link, "tcp://x:1", None, None, est, 5.0, "t", lambda: None, lambda r: None)
    est.clock.sample(10.0, 1010.002, 10.004)
    assert est.clock.to_local(1020.0) == pytest.approx(20.0)
    s.lost("test")  # the server that answers next may be another, with another clock
    assert est.clock.to_local(1020.0) is None


def test_the_downlink_is_measured_from_results_on_the_devices_clock():
    from coacto.mobile.estimates import BURST_BYTES, Estimates

    e = Estimates(bandwidth=2.5e6)
    assert e.downlink == 2.5e6  # the uplink's estimate until a RESULT was measured
    e.clock.sample(10.0, 1010.0 + 0.002, 10.004)  # server = device + 1000 s, RTT 4 ms
    e.rtt.sample(0.004)
    e.on_result(400_000, 1020.0, 20.0 + 0.002 + (400_000 - BURST_BYTES) / 1e6)
    assert e.down.samples == 1 and e.downlink == pytest.approx(1e6, rel=0.01)
    e.on_result(10_000, 1021.0, 21.5)  # smaller than two bursts: not a sample
    e.on_result(400_000, None, 22.0)   # an older server's RESULT: no stamp
    assert e.down.samples == 1
    assert e.snapshot()["downlink_est_mbps"] == pytest.approx(8.0, rel=0.01)


def test_results_queued_behind_each_other_measure_the_downlink_by_their_spacing():
    from coacto.mobile.estimates import Estimates

    e = Estimates(bandwidth=1e6)
    e.clock.sample(0.0, 0.0005, 0.001)  # same clocks, RTT 1 ms
    rate, n = 2.5e6, 49_152  # 20 Mbit/s; BERT-base's 8 output tiles
    for k in range(8):  # all handed to the socket at once, as the last layer completes
        e.on_result(n, 100.0, 100.0005 + (k + 1) * n / rate)
    e.down._close()
    # each queued behind the one before: their stamps alone would read 6-20 Mbit/s
    assert e.downlink == pytest.approx(rate, rel=0.1), e.downlink * 8e-6


def test_offloaded_inferences_correct_the_predictions_they_came_from():
    from coacto.mobile.estimates import Estimates

    e = Estimates(bandwidth=1e6)
    assert e.offloaded_s(0.020) == 0.020  # nothing learnt yet
    for _ in range(6):  # predicted 20 ms, took 32: the engine's CPU in a quota, say
        e.on_offloaded(0.020, 0.032)
    assert e.offload_error == pytest.approx(0.012)
    assert e.offloaded_s(0.025) == pytest.approx(0.037)
    for _ in range(30):  # streaming beat the sequential prediction by far
        e.on_offloaded(0.100, 0.020)
    assert e.offloaded_s(0.040) == pytest.approx(0.020)  # at most half taken off
    e.on_offloaded(0.0, 0.01)  # nothing to learn from
    assert e.offload_outcomes == 36 and e.snapshot()["offload_error_ms"] < 0


def test_each_kind_of_plan_learns_its_own_error():
    from coacto.mobile.estimates import ERROR_LINK_FACTOR, Estimates

    e = Estimates(bandwidth=1e6)
    assert e.unseen_kinds() == ("inputs", "cut", "share")
    for _ in range(20):  # the inputs plan streams the network behind them: 10 ms early
        e.on_offloaded(0.066, 0.056, "inputs")
    assert e.offloaded_s(0.066, "inputs") == pytest.approx(0.056)
    # a kind not yet run is expected to be late as the kinds that ran were, but not early: an
    # early error is often one kind's own (and it is explored: policies.choose_dynamic)
    assert e.offloaded_s(0.060, "share") == pytest.approx(0.060)
    for _ in range(20):
        e.on_offloaded(0.060, 0.062, "share")
    assert e.offloaded_s(0.060, "share") == pytest.approx(0.062)
    assert e.offloaded_s(0.066, "inputs") == pytest.approx(0.056)
    assert e.unseen_kinds() == ("cut",)
    assert e.offloaded_s(0.060, "cut") == pytest.approx(0.060)  # the mean, -4 ms, is early
    for _ in range(20):
        e.on_offloaded(0.066, 0.086, "inputs")  # the inputs plan turns late: 20 ms
    assert e.offloaded_s(0.060, "cut") == pytest.approx(0.060 + (0.020 + 0.002) / 2, rel=1e-3)
    assert e.snapshot()["offload_errors_ms"]["share"] == pytest.approx(2.0)
    # errors learnt on a link three times slower say nothing about today's
    e.goodput.value = 1e6 * ERROR_LINK_FACTOR * 1.5
    assert e.unseen_kinds() == ("inputs", "cut", "share")
    assert e.offloaded_s(0.066, "inputs") == pytest.approx(0.066)
    e.on_offloaded(0.030, 0.040, "inputs")  # learnt afresh on this link
    assert e.offloaded_s(0.030, "inputs") == pytest.approx(0.040)
    e.goodput.value = 1e6
    # (that was learnt at 3x: the share's error, learnt on this link, stands in for it)
    assert e.offloaded_s(0.030, "inputs") == pytest.approx(0.032)


def test_one_offloaded_inference_in_eight_may_explore_a_kind_not_yet_run():
    from types import SimpleNamespace

    from coacto.mobile.engine import KIND_EXPLORE_EVERY as EVERY
    from coacto.mobile.engine import Engine
    from coacto.mobile.estimates import Estimates

    eng = SimpleNamespace(est=Estimates(bandwidth=1e6), _planned=0)
    dyn, split = SimpleNamespace(policy="dynamic"), SimpleNamespace(policy="split")
    got = [Engine._unseen(eng, dyn) for _ in range(2 * EVERY)]
    assert [i for i, u in enumerate(got) if u] == [EVERY - 1, 2 * EVERY - 1]
    assert got[EVERY - 1] == ("inputs", "cut", "share")
    assert Engine._unseen(eng, split) == () and eng._planned == 2 * EVERY


def test_a_kind_not_run_for_a_while_is_run_again_unless_the_server_is_shared():
    """One sample taken in bad conditions kept a kind shut out for good: the simulated Pi 4 at
    100 Mbit/s ran MobileNetV2's share once, 24 ms over its prediction, then streamed a cut at
    65-70 ms ever after, where the share took 61 once it was measured again."""
    from types import SimpleNamespace

    from coacto.mobile.engine import KIND_EXPLORE_EVERY as EVERY
    from coacto.mobile.engine import KIND_STALE_AFTER, Engine
    from coacto.mobile.estimates import Estimates

    e = Estimates(bandwidth=1e6)
    e.on_offloaded(0.050, 0.067, "inputs")
    e.on_offloaded(0.040, 0.045, "share")
    for _ in range(KIND_STALE_AFTER - 2):
        e.on_offloaded(0.040, 0.050, "cut")
    assert e.stale_kinds(KIND_STALE_AFTER) == ()  # inputs learnt KIND_STALE_AFTER - 1 ago
    e.on_offloaded(0.040, 0.050, "cut")
    assert e.stale_kinds(KIND_STALE_AFTER) == ("inputs",)
    e.on_offloaded(0.040, 0.050, "cut")
    assert e.stale_kinds(KIND_STALE_AFTER) == ("inputs", "share")
    eng = SimpleNamespace(est=e, _planned=0)
    dyn = SimpleNamespace(policy="dynamic")
    got = [Engine._unseen(eng, dyn) for _ in range(EVERY)]
    assert got[:-1] == [()] * (EVERY - 1) and got[-1] == ("inputs", "share")
    e.alpha = 1.5  # another device's work on the server: no exploring into its bursts
    assert [Engine._unseen(eng, dyn) for _ in range(EVERY)][-1] == ()
    # a kind run again is not stale (its error moves by one sample of the moving average)
    e.alpha = 1.0
    e.on_offloaded(0.050, 0.049, "inputs")
    assert e.stale_kinds(KIND_STALE_AFTER) == ("share",)


def test_a_clients_first_offload_teaches_no_error():
    """The first offloaded dynamic inference pays one-time costs: its error is not its kind's
    (it would stand for the kind until the kind ran again); the next ones are learnt."""
    from types import SimpleNamespace

    from coacto.mobile.engine import Engine
    from coacto.mobile.estimates import Estimates

    est = Estimates(bandwidth=1e6, device_flops=5e9)
    eng = SimpleNamespace(est=est, _outcomes=0)
    plan = policies.Plan("dynamic", None, None, True, info={"predicted_s": 0.100,
                                                            "kind": "inputs"})
    job = SimpleNamespace(policy="dynamic", plan=plan, fallback=False, t_start=1.0)
    Engine._learn_outcome(eng, job, 1.160)  # 60 ms late: the first
    assert est.offload_errors == {} and est.offload_outcomes == 0
    Engine._learn_outcome(eng, job, 1.110)
    assert est.offload_errors["inputs"][0] == pytest.approx(0.010)
    assert est.offload_outcomes == 1
    # a fallback does not use the first up, nor does another policy's offload
    est2 = Estimates(bandwidth=1e6, device_flops=5e9)
    eng2 = SimpleNamespace(est=est2, _outcomes=0)
    Engine._learn_outcome(eng2, SimpleNamespace(policy="dynamic", plan=plan, fallback=True,
                                                t_start=1.0), 1.5)
    Engine._learn_outcome(eng2, SimpleNamespace(policy="cloud", plan=plan, fallback=False,
                                                t_start=1.0), 1.5)
    Engine._learn_outcome(eng2, job, 1.160)
    assert est2.offload_errors == {}
    # a new connection (a reconnect, a restarted server) starts over: its first offload again
    vars(eng).update(_jobs={}, _ready_cv=threading.Condition())
    Engine._server_ready(eng)
    Engine._learn_outcome(eng, job, 1.300)
    assert est.offload_errors["inputs"][0] == pytest.approx(0.010) and est.offload_outcomes == 1
    Engine._learn_outcome(eng, job, 1.120)
    assert est.offload_outcomes == 2


def gate_engine(est, **more):
    """What Engine._local_is_faster reads of an engine: the estimates and the gate's state."""
    from types import SimpleNamespace

    return SimpleNamespace(est=est, tg=None, _wire=lambda: None, _gated=0, _gate_key=None,
                           _gate_verdict=None, _probe_if_stale=lambda: None, **more)


def test_a_shared_server_must_be_much_faster_than_the_device(monkeypatch):
    """With other devices' work on the server an offload must win by SHARED_OFFLOAD_MIN_GAIN,
    not OFFLOAD_MIN_GAIN: their bursts delay it beyond what alpha foresees."""
    from types import SimpleNamespace

    from coacto.mobile.engine import OFFLOAD_MIN_GAIN, SHARED_OFFLOAD_MIN_GAIN, Engine
    from coacto.mobile.estimates import Estimates

    local_s = 0.040
    offload_s = local_s * (1 - (OFFLOAD_MIN_GAIN + SHARED_OFFLOAD_MIN_GAIN) / 2)  # in between
    monkeypatch.setattr(policies, "dynamic_options",
                        lambda *a, **k: {"local": (local_s, None), "inputs": (offload_s, 0)})
    est = Estimates(bandwidth=1e6, device_flops=5e9)
    eng = gate_engine(est)
    job = SimpleNamespace(skipped=None, explores=False)
    assert not Engine._local_is_faster(eng, job)  # alone on the server: offloads
    est.server_load = {"others": 1}  # another device began an inference there lately
    assert est.server_shared()
    assert Engine._local_is_faster(eng, job) and "offloaded at best" in job.skipped
    est.server_load = {"others": 0}
    est.alpha = 1.5  # or its work computed there in the last second
    assert Engine._local_is_faster(eng, job)
    est.alpha = 1.0
    assert not Engine._local_is_faster(eng, job)


def test_the_gate_expects_a_kind_not_yet_run_to_be_off_as_the_others_were(monkeypatch):
    """MobileNetV2 at 100 Mbit/s in a 25% quota: a cut predicted 26.5 ms ran 38.6, and a share
    predicted 28.4 (never run) then passed the gate against 30 ms on the device and ran 38.6
    too. A kind not yet run now carries the error of the kinds that ran."""
    from types import SimpleNamespace

    from coacto.mobile.engine import Engine
    from coacto.mobile.estimates import Estimates

    monkeypatch.setattr(policies, "dynamic_options", lambda *a, **k: {
        "local": (0.030, None), "inputs": (0.060, 0), "cut": (0.0265, 5),
        "share": (0.0284, (3, 2))})
    est = Estimates(bandwidth=12.5e6, device_flops=5e9)
    eng = gate_engine(est)
    job = SimpleNamespace(skipped=None, explores=False)
    assert not Engine._local_is_faster(eng, job)  # nothing learnt: the cut, as predicted
    est.on_offloaded(0.0265, 0.0386, "cut")
    job = SimpleNamespace(skipped=None, explores=False)
    assert Engine._local_is_faster(eng, job)  # the share 28.4 + 12.1 ms, the cut 38.6
    assert "38.6 ms offloaded at best" in job.skipped
    est.on_offloaded(0.0284, 0.0200, "share")  # a share that, run, beat its prediction
    assert not Engine._local_is_faster(eng, SimpleNamespace(skipped=None, explores=False))


def test_the_gate_reuses_its_verdict_while_the_estimates_hold(monkeypatch):
    """The gate's cost model, per inference, cost 150-290 us of the engine's CPU (four times
    that in a 25% quota): it is recomputed only when a rate moves by GATE_STEP or the wire
    ratios or the errors change."""
    from types import SimpleNamespace

    from coacto.mobile.engine import Engine
    from coacto.mobile.estimates import GATE_STEP, Estimates

    calls = []

    def options(*a, **k):
        calls.append(a)
        return {"local": (0.010, None), "inputs": (0.030, 0)}

    monkeypatch.setattr(policies, "dynamic_options", options)
    est = Estimates(bandwidth=1e6, device_flops=5e9)
    eng = gate_engine(est)
    job = SimpleNamespace(skipped=None, explores=False)
    for _ in range(5):
        assert Engine._local_is_faster(eng, job) and "10.0 ms vs 30.0 ms" in job.skipped
    assert len(calls) == 1
    est.device_flops *= 1 + GATE_STEP / 2  # within the step: the same verdict
    Engine._local_is_faster(eng, job)
    assert len(calls) == 1
    est.device_flops *= 1 + GATE_STEP / 2  # beyond it from the verdict's: recomputed
    Engine._local_is_faster(eng, job)
    assert len(calls) == 2
    est.rtt.value += 2e-4  # an RTT within 0.5 ms
    Engine._local_is_faster(eng, job)
    assert len(calls) == 2
    est.on_offloaded(0.03, 0.05, "inputs")  # an error learnt: recomputed
    Engine._local_is_faster(eng, job)
    assert len(calls) == 3
    # the local graph's rate, learnt at every local run, is read fresh without the cost model
    # (this device's rate was given, so it is not learnt: set here as a local run would)
    eng.local_tg = SimpleNamespace(total_flops=0.05e9)
    est.local_flops = 0.05e9 / 0.060  # 60 ms: now slower than offloading (50 ms, corrected)
    assert not Engine._local_is_faster(eng, job)
    est.local_flops = 0.05e9 / 0.005  # 5 ms
    assert Engine._local_is_faster(eng, job) and "5.0 ms vs 50.0 ms" in job.skipped
    assert len(calls) == 3


def test_the_gate_keeps_its_verdict_while_the_rates_stay_within_its_margin(monkeypatch):
    """Beyond GATE_STEP the verdict still stands while the rates moved by a factor f with
    offloaded / f^2 above the bar (a local verdict) or offloaded * f^2 below it (an offload);
    the cost model runs only when the verdict could have changed, and then says so."""
    from types import SimpleNamespace

    from coacto.mobile.engine import OFFLOAD_MIN_GAIN, Engine
    from coacto.mobile.estimates import Estimates

    calls = []
    est = Estimates(bandwidth=1e6, device_flops=5e9)
    est.server_flops = 20e9

    def options(tg, dev, srv, bw, *a, **k):  # a cost of sizes over rates: 40 ms at the start
        calls.append(1)
        return {"local": (1.0, None), "inputs": (0.020 * 1e6 / bw + 0.020 * 20e9 / srv, 0)}

    monkeypatch.setattr(policies, "dynamic_options", options)
    eng = gate_engine(est, local_tg=SimpleNamespace(total_flops=1e9))
    est.local_flops = 1e9 / 0.030  # the device: 30 ms; offloading 40 (1.4x the 28.5 ms bar)
    job = SimpleNamespace(skipped=None, explores=False)
    assert Engine._local_is_faster(eng, job) and len(calls) == 1
    est.goodput.value = 1e6 * 1.15  # 15%: past GATE_STEP, within the margin (1.15^2 < 1.4)
    assert Engine._local_is_faster(eng, job) and len(calls) == 1
    assert "40.0 ms offloaded" in job.skipped  # (the verdict's own figure)
    est.goodput.value = 1e6 * 1.25  # 1.25^2 > 1.4: the cost model again
    assert Engine._local_is_faster(eng, job) and len(calls) == 2
    assert "36.0 ms offloaded" in job.skipped
    # the device's own time read fresh can move the bar past the cached figure's bound
    est.local_flops = 1e9 / 0.040  # 40 ms: the bar 38 is above 36 * 1.0^2: offloads, no model
    assert not Engine._local_is_faster(eng, job) and len(calls) == 2
    assert 36.0 < 40.0 * (1 - OFFLOAD_MIN_GAIN)
    # an offload verdict stands while even its high bound beats the bar: the link 15% slower
    # (past GATE_STEP; 38.4 ms now) bounds it at 36 * 1.15^2 = 47.6, under a bar of 57
    est.local_flops = 1e9 / 0.060
    est.goodput.value = 1e6 * 1.25 / 1.15
    assert not Engine._local_is_faster(eng, job) and len(calls) == 2
    est.local_flops = 1e9 / 0.045  # a bar of 42.8, under that bound: the cost model says 38.4
    assert not Engine._local_is_faster(eng, job) and len(calls) == 3
    # an error learnt (a new version): the cost model, whatever the rates
    n = len(calls)
    est.on_offloaded(0.03, 0.05, "inputs")
    Engine._local_is_faster(eng, job)
    assert len(calls) == n + 1
    # a kind faster than its prediction: its (negative) correction does not shrink with the
    # rates (the bounds take the raw figure over f^2, then the correction). 60 ms raw, 15
    # early: 45 against the bar of 28.5; the link 25% faster: 48 - 15 = 33, but the low bound
    # 38.4 - 15 = 23.4 is below the bar, so the model runs; 40% faster: 42.9 - 15 = 27.9,
    # offloads
    calls.clear()
    monkeypatch.setattr(policies, "dynamic_options", lambda tg, dev, srv, bw, *a, **k: (
        calls.append(1), {"local": (1.0, None), "inputs": (0.060 * 1e6 / bw, 0)})[1])
    est2 = Estimates(bandwidth=1e6, device_flops=5e9)
    for _ in range(30):
        est2.on_offloaded(0.060, 0.045, "inputs")
    est2.local_flops = 1e9 / 0.030
    eng.est, eng._gate_key, eng._gate_verdict = est2, None, None
    assert Engine._local_is_faster(eng, job) and len(calls) == 1
    est2.goodput.value = 1e6 * 1.25
    assert Engine._local_is_faster(eng, job) and len(calls) == 2  # (low bound 23.4: ran)
    est2.goodput.value = 1e6 * 1.4
    assert not Engine._local_is_faster(eng, job) and len(calls) == 3


def test_each_graph_has_its_rate_and_local_runs_move_the_planners_rate():
    from coacto.mobile.estimates import Estimates

    est = Estimates()
    est.on_local_run(1e9, 0.100)  # offloading graph: 10 GFLOP/s
    est.on_local_run(1e9, 0.080, local_graph=True)  # local graph: 12.5
    assert est.device_flops == pytest.approx(10e9) and est.local_flops == pytest.approx(12.5e9)
    est.graph_ratio = 0.080 / 0.100
    for _ in range(30):  # the device slows to half while it computes alone
        est.on_local_run(1e9, 0.160, local_graph=True)
    assert est.local_flops == pytest.approx(6.25e9, rel=1e-3)
    assert est.device_flops == pytest.approx(5e9, rel=1e-3)
    # the gate's local rate is learnt from what the inference took, the engine's work
    # included; the planners' from its tiles' span
    est = Estimates()
    est.on_local_run(1e9, 0.020, local_graph=True, latency=0.036)
    assert est.local_flops == pytest.approx(1e9 / 0.036) and est.device_flops is None
    fixed = Estimates(device_flops=7e9)  # given: fixed, and no local rate is learnt
    fixed.on_local_run(1e9, 0.050, local_graph=True)
    fixed.on_local_run(1e9, 0.050)
    assert fixed.device_flops == 7e9 and fixed.local_flops is None


def test_rtt_is_min_filtered():
    r = RoundTrip()
    for s in (0.010, 0.050, 0.011, 0.200, 0.012, 0.010):
        r.sample(s)
    assert 0.009 < r.value < 0.013


# ------------------------------------------------------------------------------ end to end

@pytest.mark.parametrize("policy", ["local", "cloud", "split", "fl", "dynamic"])
def test_every_policy_matches_onnxruntime(server, squeezenet, policy):
    model, feeds, ref = squeezenet
    with Client(server.address, model, threads=1, policy=policy, tiles_per_layer=TILES,
                timeout=10) as client:
        if policy != "local":
            client.connect(10)
        runs = []
        for _ in range(2):
            assert_close(client.infer(feeds), ref, rel=1e-4)
            stats = client.last_stats
            runs.append(stats)
            assert stats["policy"] == policy and not stats["fallback"], stats
            # alone, the device computes on the graph cut for local speed
            alone = policy == "local" or stats["server_skipped"]
            graph = client.local_graph if alone else client.graph
            assert stats["latency_s"] > 0 and stats["tiles_total"] == graph.n_tiles
        if policy == "local":
            assert stats["tiles_local"] > 0 and stats["tiles_sent"] == 0
            assert client.server_info["connects"] == 0  # never even connected
        if policy == "cloud":
            assert stats["tiles_local"] == 0 and stats["tiles_from_server"] > 0
            assert stats["bytes_sent"] > sum(x.nbytes for x in feeds.values())
        if policy == "split":
            assert stats["split_layer"] is not None
        if policy == "cloud":
            assert runs[0]["tiles_sent"] > 0 and stats["rtt_est_ms"] > 0
        if policy == "dynamic":  # each run offloads, says why it went alone, or won the race
            computable = client.graph.n_tiles - sum(  # every tile but the inputs
                len(range(client.graph.plan.layer_first_tile[li], client.graph.plan.layer_first_tile[li + 1]))
                for li in client.graph.graph.inputs.values())
            assert all(r["tiles_sent"] > 0 or r["server_skipped"] or r["tiles_local"] == computable
                       for r in runs), runs
    for key in ("latency_s", "policy", "tiles_total", "tiles_local", "tiles_sent",
                "tiles_from_server", "bytes_sent", "bytes_received", "fallback",
                "bandwidth_est_mbps", "rtt_est_ms", "server_flops", "alpha", "split_layer",
                "reconnects"):
        assert key in stats, key


def test_the_device_learns_the_servers_measured_rate_from_done(squeezenet):
    """MODEL_READY announces the server's rate once; each DONE carries it as the server's
    inferences measured it since, and the device plans with that."""
    model, feeds, ref = squeezenet
    with Server("tcp://127.0.0.1:0", threads=1, server_flops=1e15) as srv, \
            Client(srv.address, model, threads=1, tiles_per_layer=TILES, timeout=10) as client:
        client.connect(10)
        assert client.estimates["server_flops"] == 1e15  # as announced: nothing measured yet
        for _ in range(3):
            assert_close(client.infer(feeds, policy="cloud"), ref, rel=1e-4)
        deadline = time.monotonic() + 5
        while client.estimates["server_flops"] == 1e15 and time.monotonic() < deadline:
            time.sleep(0.01)  # (DONE follows the last RESULT)
        learnt = client.estimates["server_flops"]
        assert 0 < learnt < 1e13, learnt  # a real rate, not the announced one


def test_dynamic_skips_the_server_when_the_device_is_faster(server, squeezenet):
    model, feeds, ref = squeezenet
    with Client(server.address, model, threads=1, tiles_per_layer=TILES, bandwidth="1mbit",
                device_flops=1e12, timeout=10) as client:
        client.connect(10)
        assert_close(client.infer(feeds), ref, rel=1e-4)
        s = client.last_stats
        assert s["server_skipped"] and s["tiles_sent"] == 0 and not s["fallback"], s
    with Client(server.address, model, threads=1, tiles_per_layer=TILES, device_flops=1e6,
                timeout=10) as client:  # a device this slow always offloads
        client.connect(10)
        assert_close(client.infer(feeds), ref, rel=1e-4)
        s = client.last_stats
        assert not s["server_skipped"] and s["tiles_sent"] > 0, s


def test_the_device_computes_alone_on_a_local_graph_with_the_same_weights(server):
    """What the device computes alone (policy local, dynamic's gate, a fallback) runs on the
    model cut for local speed at its thread count, not on the offloading graph's 32 column
    blocks a layer; both graphs run on one copy of the packed weights; the gate prices local
    with the local graph's measured rate."""
    model = zoo.build("squeezenet", image_size=96)
    feeds, ref = _reference(model)
    with Client(server.address, model, threads=1, bandwidth="2mbit", timeout=10) as client:
        loc, off = client.local_graph, client.graph
        assert loc.params.get("threads") == 1 and "min_column_blocks" not in loc.params
        assert off.params["min_column_blocks"] == 32 and loc.n_tiles < off.n_tiles
        assert loc._weights_of is off and loc.blob is off.blob
        assert loc._native is not None and off._native is not None  # both made, packed once
        client.connect(10)
        client.calibrate()
        est = client.estimates
        assert est["device_flops"] > 0 and est["device_local_flops"] > 0
        for policy in ("local", "dynamic", "cloud"):
            assert_close(client.infer(feeds, policy=policy), ref, rel=1e-4)
            s = client.last_stats
            # at 2 Mbit/s a 96 x 96 input takes 0.2 s: the gate keeps dynamic here
            alone = policy != "cloud"
            assert bool(s["server_skipped"]) == (policy == "dynamic"), s
            assert s["tiles_total"] == (loc if alone else off).n_tiles, (policy, s)
            assert s["tiles_local"] == (loc.n_tiles - len(input_tiles(loc)) if alone else 0)
    # a client without a server computes on its one graph, the local one
    with Client(None, model, threads=1, policy="local") as client:
        assert client.local_graph is client.graph
        assert_close(client.infer(feeds), ref, rel=1e-4)


def test_a_device_share_over_zeromq_matches_onnxruntime(server, squeezenet, monkeypatch):
    """Dynamic in a device share (forced: on loopback the inputs plan is predicted best): the
    device computes only its part of the fused stack, the server the rest, over real ZeroMQ."""
    model, feeds, ref = squeezenet
    monkeypatch.setattr(policies, "choose_dynamic",
                        lambda *a, **k: "share")
    with Client(server.address, model, threads=1, tiles_per_layer=TILES, device_flops=1e6,
                timeout=10) as client:
        client.connect(10)
        tg = client.graph
        computable = tg.n_tiles - len(input_tiles(tg))
        for _ in range(2):
            assert_close(client.infer(feeds), ref, rel=1e-4)
            s = client.last_stats
            assert s["frontier"].startswith("share ") and not s["fallback"], s
            assert 0 < s["tiles_local"] < computable and s["tiles_from_server"] > 0, s
            assert s["predicted_s"] > 0
        assert client.estimates["offload_errors_ms"].keys() == {"share"}


def test_split_and_fl_offload_when_told_where(server, squeezenet):
    model, feeds, ref = squeezenet
    tg = coacto.compile(model, tiles_per_layer=TILES)
    from coacto.partition import valid_cuts

    cut = valid_cuts(tg)[len(valid_cuts(tg)) // 2]
    with Client(server.address, tg, threads=1, policy="split", split_layer=cut, timeout=10,
                model_bytes=model) as client:
        client.connect(10)
        assert_close(client.infer(feeds), ref, rel=1e-4)
        s = client.last_stats
        assert s["split_layer"] == cut and s["tiles_sent"] > 0 and s["tiles_from_server"] > 0
        assert_close(client.infer(feeds, policy="fl"), ref, rel=1e-4)
        assert client.last_stats["policy"] == "fl" and client.last_stats["tiles_sent"] > 0


def test_tiles_travel_encoded_and_stay_exact(server, squeezenet):
    """Lossless (the default) sends a ReLU cut in fewer bytes and equals onnxruntime; f16 and
    int8 send a half and a quarter and stay close; the learnt per-layer ratios price the cuts."""
    model, feeds, ref = squeezenet
    tg = coacto.compile(model, tiles_per_layer=TILES)
    from coacto.partition import cut_bytes, valid_cuts

    # the first convolution followed by its ReLU (act 1), where about half the values are zero
    cut = next(c for c in valid_cuts(tg) if tg.graph.layers[c].op == "CONV"
               and tg.graph.layers[c].attrs.get("act") == 1)
    bounds = {"lossless": (1e-4, 1.0), "f16": (2e-2, 0.5 + 1 / 32), "int8": (0.2, 0.25 + 1 / 32)}
    for transfer, (rel, share) in bounds.items():
        with Client(server.address, tg, threads=1, policy="split", split_layer=cut, timeout=10,
                    model_bytes=model, transfer=transfer) as client:
            client.connect(10)
            for policy in ("split", "cloud"):
                assert_close(client.infer(feeds, policy=policy), ref, rel=rel)
                s = client.last_stats
                assert s["transfer"] == transfer and s["tiles_from_server"] > 0, (policy, s)
                assert 0 < s["tile_bytes_wire"] <= share * s["tile_bytes_raw"] + 4 * s["tiles_sent"]
            # the ratios learnt from these inferences: the cut's planned bytes are what was sent
            client.infer(feeds, policy="split")
            s = client.last_stats
            wire = client._estimates.wire
            assert wire is not None and wire.max() <= share + 1e-6
            planned = cut_bytes(tg, wire)[cut]
            assert planned == pytest.approx(s["tile_bytes_wire"], rel=0.15)
            if transfer == "lossless":
                assert s["tile_bytes_wire"] < 0.9 * s["tile_bytes_raw"]  # ReLU zeros masked
    with pytest.raises(coacto.CoactoError, match="transfer must be one of"):
        Client(server.address, tg, transfer="zstd")


def test_integer_inputs_travel_exact_under_lossy_transfers(server):
    """Token ids quantised to int8 would index other embeddings: integer inputs go lossless
    (in messages of their own), the float activations of a later cut go lossy."""
    m = zoo.build("bert", layers=2, hidden=64, heads=4, seq_len=16, vocab=1000)
    feeds, ref = _reference(m)
    tg = coacto.compile(m)
    from coacto.partition import valid_cuts

    cut = valid_cuts(tg)[len(valid_cuts(tg)) // 2]
    for transfer, rel in (("f16", 1e-2), ("int8", 0.1)):
        with Client(server.address, tg, threads=1, policy="split", split_layer=cut, timeout=10,
                    model_bytes=m, transfer=transfer) as client:
            client.connect(10)
            assert_close(client.infer(feeds, policy="cloud"), ref, rel=1e-4)  # integers alone
            s = client.last_stats
            assert s["tile_bytes_raw"] > 0 and s["tile_bytes_wire"] <= s["tile_bytes_raw"]
            assert_close(client.infer(feeds), ref, rel=rel)
            s = client.last_stats
            assert s["tiles_from_server"] > 0
            assert s["tile_bytes_wire"] < 0.6 * s["tile_bytes_raw"]


def test_a_server_that_reads_no_encodings_gets_raw_floats(server, squeezenet):
    model, feeds, ref = squeezenet
    with Client(server.address, model, threads=1, policy="cloud", tiles_per_layer=TILES,
                timeout=10) as client:
        client.connect(10)
        client._engine.session.server_info.pop("transfer")  # what an older server says
        for policy in ("cloud", "dynamic"):
            assert_close(client.infer(feeds, policy=policy), ref, rel=1e-4)
            s = client.last_stats
            assert s["transfer"] == "raw" and s["tile_bytes_wire"] == s["tile_bytes_raw"]
            assert s["tile_bytes_raw"] > 0 or s["server_skipped"]


def test_a_tensor_sent_whole_leaves_when_its_last_tile_completes(server, squeezenet, tmp_path):
    # The runtime announces only the first tile queued; split's cut goes out in one message once
    # all its tiles are queued, so the last one's completion must wake the engine (it once waited
    # for the engine's 0.5 s poll timeout). Read off the merged trace: the batch is handed to the
    # link right after the cut's last tile ends on the device.
    model, feeds, ref = squeezenet
    tg = coacto.compile(model, tiles_per_layer=TILES)
    from coacto.partition import layer_tiles, valid_cuts

    cut = next(c for c in valid_cuts(tg)[1:] if len(layer_tiles(tg, c)) >= 3)
    with Client(server.address, tg, threads=1, policy="split", split_layer=cut, timeout=10,
                model_bytes=model) as client:
        client.connect(10)
        for i in range(3):
            assert_close(client.infer(feeds, trace=tmp_path / f"t{i}.json"), ref, rel=1e-4)
            events = json.loads((tmp_path / f"t{i}.json").read_text())["traceEvents"]
            cut_ids = set(layer_tiles(tg, cut))
            cut_end = max(e["ts"] + e["dur"] for e in events if e.get("ph") == "X"
                          and e.get("args", {}).get("tile") in cut_ids and e["pid"] == 1)
            sent = min(e["ts"] for e in events if e.get("ph") == "X" and e["name"].startswith("TILES"))
            assert sent - cut_end < 200_000, f"inference {i}: the cut waited {sent - cut_end:.0f} us"


def test_dynamic_sends_its_cut_in_one_message(server, squeezenet, tmp_path, monkeypatch):
    # A dynamic cut is priced as split prices a cut (the tensors whole, then the server's work)
    # and goes out as split sends it: one TILES batch once its last tile is computed. Streamed
    # tile by tile, MobileNetV2's cut ran 29-32 ms in a 25% quota where split's ran 20-27.
    from coacto.mobile import engine
    from coacto.mobile.jobs import Job
    from coacto.mobile.trace import TraceRecord
    from coacto.partition import cut_tiles, valid_cuts

    # batches far smaller than the cut: streamed, its tiles could not share one
    monkeypatch.setattr(engine, "batch_bytes", lambda bandwidth: 1024)
    model, feeds, ref = squeezenet
    tg = coacto.compile(model, tiles_per_layer=TILES)
    cut = next(c for c in valid_cuts(tg)[1:] if len(cut_tiles(tg, c)) >= 3)
    # a device this slow offloads (the gate), and the plan is the cut named
    with Client(server.address, tg, threads=1, policy="dynamic", timeout=10, model_bytes=model,
                device_flops=1e6) as client:
        client.connect(10)
        for i in range(2):
            path = tmp_path / f"d{i}.json"
            job = Job(1000 + i, {k: v.copy() for k, v in feeds.items()}, "dynamic",
                      {"frontier": f"cut {tg.graph.layers[cut].name}"}, time.perf_counter(),
                      trace=TraceRecord(path))
            client._engine.submit(job)
            assert_close(job.future.result(timeout=30), ref, rel=1e-4)
            assert job.future.stats["frontier"] == f"cut {tg.graph.layers[cut].name}"
            assert not job.future.stats["fallback"]
            events = json.loads(path.read_text())["traceEvents"]
            ids = set(cut_tiles(tg, cut).tolist())
            cut_end = max(e["ts"] + e["dur"] for e in events if e.get("ph") == "X"
                          and e.get("args", {}).get("tile") in ids and e["pid"] == 1)
            batches = [e for e in events if e.get("ph") == "X" and e["name"].startswith("TILES")]
            assert len(batches) == 1, [e["name"] for e in batches]
            assert batches[0]["ts"] >= cut_end - 1


def test_model_is_uploaded_once(squeezenet):
    model, feeds, ref = squeezenet
    with Server("tcp://127.0.0.1:0", threads=1, server_flops=20e9) as srv:
        with Client(srv.address, model, threads=1, policy="cloud", tiles_per_layer=TILES) as c1:
            c1.connect(30)
            assert c1.server_info["uploads"] == 1
            assert_close(c1.infer(feeds), ref, rel=1e-4)
            assert_close(c1.infer(feeds), ref, rel=1e-4)
            assert c1.server_info["uploads"] == 1
        with Client(srv.address, model, threads=1, policy="cloud", tiles_per_layer=TILES) as c2:
            c2.connect(10)
            assert c2.server_info["uploads"] == 0
            assert_close(c2.infer(feeds), ref, rel=1e-4)
            assert not c2.last_stats["fallback"]


def test_bandwidth_cap_slows_transfers_and_is_measured(server, big_input):
    model, feeds, ref = big_input
    tg = coacto.compile(model, tiles_per_layer=TILES)
    input_bytes = sum(x.nbytes for x in feeds.values())
    with Client(server.address, tg, threads=1, policy="cloud", model_bytes=model) as fast:
        fast.connect(30)  # uploads the model unshaped
        fast.infer(feeds)
        unlimited = min(_timed(fast, feeds) for _ in range(2))
    with Client(server.address, tg, threads=1, policy="cloud", bandwidth="5mbit",
                timeout=10) as slow:
        slow.connect(10)
        runs = [_timed(slow, feeds) for _ in range(3)]
        assert_close(slow.infer(feeds), ref, rel=1e-4)
        est = slow.last_stats["bandwidth_est_mbps"]
    floor = input_bytes / (5e6 / 8)
    assert min(runs) >= 0.9 * floor, (runs, floor)
    assert min(runs) > 3 * unlimited, (runs, unlimited)
    assert 2.5 <= est <= 10, est


def test_a_link_that_drops_mid_inference_slows_what_it_still_carries(server, big_input):
    """Client.set_bandwidth mid-inference: cloud's input, half across, takes the new rate for
    the rest; dynamic, whose device computes meanwhile, is not held by the link (its input is
    196 kB: 8 s at 200 kbit/s)."""
    model, feeds, ref = big_input
    tg = coacto.compile(model, tiles_per_layer=TILES)
    input_bytes = sum(x.nbytes for x in feeds.values())
    with Client(server.address, tg, threads=1, policy="cloud", model_bytes=model,
                bandwidth="20mbit", timeout=30) as client:
        client.connect(30)
        t0 = time.monotonic()
        fut = client.infer_async(feeds)
        time.sleep(0.5 * input_bytes / 2.5e6)  # half the input across at 20 Mbit/s
        client.set_bandwidth("2mbit")
        assert_close(fut.result(timeout=30), ref, rel=1e-4)
        took = time.monotonic() - t0
        # the other half at 2 Mbit/s: about 0.39 s, where all of it at 20 would take 0.08
        assert took >= 0.8 * (0.5 * input_bytes / 2.5e5), took
        assert client.bandwidth == 2.5e5
        client.set_bandwidth("20mbit")
        client.infer(feeds)
        local = min(client.infer(feeds, policy="local") and client.last_stats["latency_s"]
                    for _ in range(2))
        fut = client.infer_async(feeds, policy="dynamic")
        time.sleep(0.01)
        client.set_bandwidth("200kbit")
        assert_close(fut.result(timeout=30), ref, rel=1e-4)
        # finished by the device, about when it alone would (far below the 8 s of the input)
        assert fut.stats["latency_s"] < local + 2.0, (fut.stats["latency_s"], local)
    with pytest.raises(RateError):
        Client(server.address, tg, bandwidth="20mbit,5mbit", model_bytes=model)


def test_a_stall_is_a_link_that_stopped_not_an_estimate_read_high():
    """_link_stalled: a transfer far behind a goodput estimate read 40% high, its ACKs coming at
    the link's pace, has not stalled (the testbed's first inferences after `learn` took that for
    a stall at 100 Mbit/s, and the device computed beside a server that was winning), however
    long it runs; the same transfer with no ACK for two batches' time and more has; one on time
    has not; one whose link dropped to 40% of its rate, its ACKs still coming, has."""
    import collections
    from types import SimpleNamespace as NS

    from coacto.mobile.engine import Engine

    true_rate, read = 12.5e6, 17.6e6  # B/s: 100 Mbit/s, read as 141
    eng = NS(est=NS(bandwidth=read, rtt=NS(value=0.001)))
    t0 = 10.0

    def job(t, rates, last_ack_ago=0.003, every=0.004):
        """ACKs `every` s until last_ack_ago before t, at rates[i] from rates' i-th time."""
        log, acked, ts = collections.deque(maxlen=64), 0, t0 + 0.001
        while ts + every <= t - last_ack_ago + 1e-9:
            rate = [r for since, r in rates if ts >= t0 + since][-1]
            acked += int(rate * every)
            ts += every
            log.append((ts, acked))
        return NS(t_first_batch=t0, inputs_at_server=None, bytes_handed=int(read * (t - t0)),
                  bytes_acked=acked, ack_log=log, plan=None)

    stalled = Engine._link_stalled
    steady = [(0.0, true_rate)]
    for t in (t0 + 0.06, t0 + 0.1, t0 + 0.2, t0 + 0.4):
        assert not stalled(eng, job(t, steady), t), t - t0  # behind, ACKs at the link's pace
        assert stalled(eng, job(t, steady, 0.025), t), t - t0  # the link stopped 25 ms ago
        assert not stalled(eng, job(t, [(0.0, read)]), t), t - t0  # on time
        # batches of 98% of the estimate's size (70.4 kB), a batch per ACK at the true rate:
        # two or three ACKs in a window, whatever the phase of the check
        for phase in np.arange(0.0, 0.0055, 0.0005):
            assert not stalled(eng, job(t, steady, 0.0003 + phase, every=0.98 * 70_400 /
                                        true_rate), t), (t - t0, phase)
    fresh = NS(t_first_batch=t0, inputs_at_server=None, bytes_handed=400_000, bytes_acked=0,
               ack_log=collections.deque(maxlen=64), plan=None)
    assert not stalled(eng, fresh, t0 + 0.01) and stalled(eng, fresh, t0 + 0.05)
    # a cut sent whole (one message, one ACK when all of it is there: MobileNetV2's 100 kB at
    # 50 Mbit/s) is no stall while it crosses at the estimate, nor until it is late by its time
    whole = NS(t_first_batch=t0, inputs_at_server=None, bytes_handed=100_000, bytes_acked=0,
               ack_log=collections.deque(maxlen=64), plan=NS(info={"send_whole": True}))
    eng.est.bandwidth = 6.25e6  # 16 ms for the message
    assert not stalled(eng, whole, t0 + 0.018) and not stalled(eng, whole, t0 + 0.036)
    assert stalled(eng, whole, t0 + 0.040)
    whole.bytes_acked = 100_000
    assert not stalled(eng, whole, t0 + 0.5)
    eng.est.bandwidth = read
    # a link that dropped to 40% of its (rightly estimated) rate after 50 ms still ACKs every
    # 4 ms: a stall once the window holds only the slower ACKs
    eng.est.bandwidth = true_rate
    dropped = [(0.0, true_rate), (0.05, 0.4 * true_rate)]
    assert not stalled(eng, job(t0 + 0.06, dropped), t0 + 0.06)  # (not behind enough yet)
    assert stalled(eng, job(t0 + 0.12, dropped), t0 + 0.12)
    assert not stalled(eng, job(t0 + 0.12, [(0.0, true_rate), (0.05, 0.6 * true_rate)]), t0 + 0.12)


def test_a_link_that_stalls_under_a_parked_inference_restarts_it_on_the_local_graph(
        server, big_input, monkeypatch):
    """A dynamic inference sends its input and parks its own work (the "inputs" plan); the
    link then drops from 20 to 200 kbit/s (the input, 196 kB, would take 8 s). The stall
    starts the parked work, and the watch after it (here at once), the link having carried
    next to nothing, restarts the inference on the device's local graph, which its estimates
    say is the faster (here made so): the result is exact, the statistics say why and keep the
    plan it was offloaded with, and the server's part is cancelled. The next inference offloads
    again."""
    from coacto.inference import NativeInference
    from coacto.mobile.engine import Engine

    monkeypatch.setattr(policies, "choose_dynamic", lambda *a, **k: "inputs")
    model, feeds, ref = big_input
    clients, restarted = [], []
    # In this test the stall check did not fire on the client's own shaper before the
    # insurance timer (the inference ended at 145 ms, offloaded): the stall is the shaped rate's
    # drop here. The offloading graph's native inference (3 ms of work here) computes nothing
    # once the drop came, so that it cannot finish first.
    monkeypatch.setattr(Engine, "_link_stalled", lambda self, job, t: clients[0].bandwidth < 1e6)
    monkeypatch.setattr(Engine, "_stall_watch", lambda self, job: 0.0)
    compute_all = NativeInference.compute_all
    monkeypatch.setattr(NativeInference, "compute_all", lambda self, **kw: None if (
        clients[0].bandwidth < 1e6 and self.tg is clients[0].graph) else compute_all(self, **kw))
    start_local = Engine._start_local

    def spy(self, job):
        if job.native is None and job.restarted_from is not None:
            restarted.append(job.id)
        start_local(self, job)

    monkeypatch.setattr(Engine, "_start_local", spy)
    with Client(server.address, model, threads=1, tiles_per_layer=TILES, device_flops=1e9,
                bandwidth="20mbit", timeout=30) as client:
        clients.append(client)
        client.connect(30)
        assert_close(client.infer(feeds), ref, rel=1e-4)
        assert client.last_stats["offloaded"] and not client.last_stats["fallback"], \
            client.last_stats
        engine, est = client._engine, client._estimates
        fut = client.infer_async(feeds)
        deadline = time.monotonic() + 5
        while not any(j.local_parked and j.t_first_batch is not None
                      for j in list(engine._jobs.values())):
            assert time.monotonic() < deadline, "the inference never had its input on the link"
            time.sleep(0.0005)  # its first batch on the link
        est.local_flops = 1e15  # the local graph as if far faster than the offloading graph
        client.set_bandwidth("200kbit")
        assert_close(fut.result(timeout=30), ref, rel=1e-4)
        st = fut.stats
        assert len(restarted) == 1, restarted
        assert st["fallback"] and "restarted on the local graph" in st["fallback_reason"], st
        assert st["restarted"] and st["frontier"] == "inputs", st
        assert st["finished_by"] == "device" and st["tiles_from_server"] == 0, st
        assert st["latency_s"] < 2.0, st  # the input alone: 8 s
        client.set_bandwidth("20mbit")
        est.local_flops = None
        assert_close(client.infer(feeds), ref, rel=1e-4)
        assert client.last_stats["offloaded"] and not client.last_stats["fallback"] and \
            not client.last_stats["restarted"], client.last_stats


def test_returned_tiles_measure_the_downlink(server):
    """A model whose output (1 MB) dwarfs its input: the RESULTs measure the downlink, and the
    cost model prices returning them (split stays local on a link that cannot carry them back
    faster than the device computes)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    w = numpy_helper.from_array(rng.standard_normal((64, 3, 1, 1)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[1, 1])], "expand",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 64, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, 64, 64])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    feeds, ref = _reference(model)
    tg = coacto.compile(model)
    with Client(server.address, tg, threads=1, policy="cloud", bandwidth="40mbit",
                timeout=10, model_bytes=model) as client:
        client.connect(30)
        for _ in range(2):
            assert_close(client.infer(feeds), ref, rel=1e-4)
        s = client.last_stats
        assert s["downlink_samples"] >= 1, s
        assert 20 <= s["downlink_est_mbps"] <= 44, s["downlink_est_mbps"]
        # returning 1 MB at 40 Mbit/s (0.2 s) costs more than computing 1.6 MFLOP here
        plan = policies.make_plan("split", tg, device_flops=1e9, server_flops=1e12,
                                  bandwidth=1e8, rtt=1e-3, downlink=s["downlink_est_mbps"] / 8e-6)
        assert not plan.uses_server


def test_the_sessions_probe_train_measures_the_link_before_any_inference(server, squeezenet):
    # a client told 5 Mbit/s on a 20 Mbit/s link: the train (3 x 24-64 kB, back to back) finds
    # the real rate; one probe only bounded it by a round trip and the bytes beyond a burst
    model, _feeds, _ref = squeezenet
    tg = coacto.compile(model, tiles_per_layer=TILES)
    with Client(server.address, tg, threads=1, policy="local", bandwidth="20mbit", timeout=10,
                model_bytes=model) as client:
        client._estimates.goodput.value = 5e6 / 8
        client.connect(30)
        deadline = time.monotonic() + 5
        while client.estimates["goodput_samples"] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        est = client.estimates
    assert est["goodput_samples"] >= 1 and 17 <= est["bandwidth_est_mbps"] <= 23, est
    assert client._engine.session._trains == 1  # 24 kB probes 10 ms apart: one train


def test_a_probe_train_that_crossed_in_one_burst_is_followed_by_larger_probes(server, squeezenet):
    """Unshaped loopback: three 24 kB probes cross within microseconds of each other (what a
    link's burst does), so a train of larger ones follows: at least PROBE_BURST_GROWTH times
    as large, whatever the first train read (a lower bound over a round trip that a busy
    machine stretches), so that trains which keep crossing in bursts reach 256 kB, as large as
    probes get, by the third; then the probing stops."""
    from coacto.mobile.session import (PROBE_BURST_GROWTH, PROBE_BURST_MAX_BYTES, PROBE_MIN_BYTES,
                                       PROBE_TRAIN, probe_again, probe_size)

    assert probe_again(24 << 10, [1.0, 1.0001, 1.0002])
    assert not probe_again(24 << 10, [1.0, 1.01, 1.02])             # 10 ms apart: a measurement
    assert not probe_again(PROBE_BURST_MAX_BYTES, [1.0, 1.0, 1.0])  # as large as they get
    assert not probe_again(24 << 10, [1.0, 1.0])                    # not all answered
    # after a burst: at least GROWTH times the train before, even where the estimate reads less
    assert probe_size(1e5, after_burst=24 << 10) == PROBE_BURST_GROWTH * (24 << 10)
    assert probe_size(1e9, after_burst=24 << 10) == PROBE_BURST_MAX_BYTES
    model, _feeds, _ref = squeezenet
    tg = coacto.compile(model, tiles_per_layer=TILES)
    with Client(server.address, tg, threads=1, policy="local", timeout=10,
                model_bytes=model) as client:
        client._estimates.goodput.value = 1e6
        session = client._engine.session
        sizes = []
        start = session._train_stamps.start
        session._train_stamps.start = lambda train, size: (sizes.append(size), start(train, size))
        client.connect(30)
        deadline = time.monotonic() + 5
        while (session._trains < 2 or session._probes) and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.3)
        assert not session._probes and PROBE_TRAIN == 3
        assert sizes[0] == PROBE_MIN_BYTES and 2 <= len(sizes) <= 3, sizes
        assert all(b >= min(PROBE_BURST_GROWTH * a, PROBE_BURST_MAX_BYTES)
                   for a, b in zip(sizes, sizes[1:])), sizes
        assert client.estimates["bandwidth_est_mbps"] > 200


def test_token_bucket_adds_the_propagation_delay_after_the_cap():
    tb = TokenBucket(1000.0, burst=100.0, delay=0.05)
    assert tb.reserve(100, 0.0) == pytest.approx(0.05)       # credit covers it: the delay alone
    assert tb.reserve(500, 0.0) == pytest.approx(0.55)       # 0.5 s on the link, then the delay
    assert tb.free_at(0.0) == pytest.approx(0.5)              # the link itself is free after 0.5 s
    with pytest.raises(RateError):
        TokenBucket(1000.0, delay=-1.0)


def test_added_round_trip_delays_every_exchange_and_is_measured(server, squeezenet):
    model, feeds, ref = squeezenet
    tg = coacto.compile(model, tiles_per_layer=TILES)
    with Client(server.address, tg, threads=1, policy="cloud", rtt_ms=80, timeout=10,
                model_bytes=model) as client:
        client.connect(10)
        client.infer(feeds)
        runs = [_timed(client, feeds) for _ in range(2)]
        assert_close(client.infer(feeds), ref, rel=1e-4)
        rtt = client.last_stats["rtt_est_ms"]
    # the input one way, the results back: at least one whole added round trip per inference
    assert min(runs) >= 0.08, runs
    assert 75 <= rtt <= 200, rtt
    with pytest.raises(coacto.CoactoError, match="rtt_ms"):
        Client(None, tg, policy="local", rtt_ms=-5)


def _timed(client, feeds) -> float:
    client.infer(feeds)
    assert not client.last_stats["fallback"], client.last_stats
    return client.last_stats["latency_s"]


def test_a_shared_server_keeps_the_devices_work_and_its_inputs(server, squeezenet,
                                                                 monkeypatch):
    """With other devices on the server (Estimates.server_shared) a parked plan computes from
    the start (Engine._keeps_work), which resumes the device's work while the inference is
    being started: its inputs must still reach the native inference."""
    from coacto.mobile.estimates import Estimates

    monkeypatch.setattr(policies, "choose_dynamic", lambda *a, **k: "inputs")
    monkeypatch.setattr(Estimates, "server_shared", lambda self: True)
    model, feeds, ref = squeezenet
    with Client(server.address, model, threads=1, tiles_per_layer=TILES, device_flops=1e6,
                timeout=10) as client:
        client.connect(10)
        for _ in range(2):
            assert_close(client.infer(feeds), ref, rel=1e-4)
            st = client.last_stats
            assert st["kept_work"] and st["frontier"] == "inputs" and not st["fallback"], st


def test_an_inference_that_fails_on_the_device_fails_alone(squeezenet, monkeypatch):
    """A native inference whose DONE reports a failure (out of memory for a buffer, say): its
    outputs cannot be read, its Future fails with the reason, and the engine goes on with the
    next inference (the exception used to stop the engine's thread, and every Future waited)."""
    from coacto.errors import CoactoError
    from coacto.inference import NativeInference

    model, feeds, ref = squeezenet
    outputs = NativeInference.outputs
    failing = []

    def once(self):
        if failing and failing.pop():
            raise CoactoError("reading output 'out': out of memory (a test's failure)")
        return outputs(self)

    monkeypatch.setattr(NativeInference, "outputs", once)
    with Client(None, model, threads=1, tiles_per_layer=TILES, policy="local") as client:
        failing.append(True)  # the next inference's outputs cannot be read
        with pytest.raises(CoactoError, match="a test's failure"):
            client.infer_async(feeds).result(timeout=10)
        assert_close(client.infer_async(feeds).result(timeout=10), ref, rel=1e-4)


def test_an_inference_whose_conclusion_fails_fails_alone(squeezenet, monkeypatch):
    """An exception after the outputs were read (its statistics, here) fails that inference
    with the reason; the engine goes on (the Future, already out of the engine's table, used to
    wait forever while the engine's thread stopped)."""
    from coacto.errors import CoactoError
    from coacto.mobile import engine as E

    model, feeds, ref = squeezenet
    stats = E.job_stats
    failing = []

    def once(*args):
        if failing and failing.pop():
            raise KeyError("a test's failure")
        return stats(*args)

    monkeypatch.setattr(E, "job_stats", once)
    with Client(None, model, threads=1, tiles_per_layer=TILES, policy="local") as client:
        failing.append(True)
        with pytest.raises(CoactoError, match="concluding it failed.*a test's failure"):
            client.infer_async(feeds).result(timeout=10)
        assert_close(client.infer_async(feeds).result(timeout=10), ref, rel=1e-4)


def test_no_server_listening_means_a_local_run(squeezenet):
    model, feeds, ref = squeezenet
    address = f"tcp://127.0.0.1:{free_port()}"
    with Client(address, model, threads=1, policy="cloud", tiles_per_layer=TILES,
                timeout=1.0) as client:
        t0 = time.monotonic()
        assert_close(client.infer(feeds), ref, rel=1e-4)
        assert time.monotonic() - t0 < 5
        assert client.last_stats["fallback"] and client.last_stats["tiles_local"] > 0
        # dynamic never waits: it computes everything here all along
        assert_close(client.infer(feeds, policy="dynamic"), ref, rel=1e-4)
        assert client.last_stats["fallback"]


def test_a_failed_server_inference_means_an_immediate_local_finish(squeezenet, monkeypatch):
    """The server's runtime fails an inference (e.g. out of memory): the server says so with an
    ERROR for that inference and the device finishes alone at once, not after its timeout."""
    from coacto.errors import NativeError
    from coacto.server import tenants

    def no_outputs(self, *args):
        raise NativeError("reading output tiles: out of memory")

    model, feeds, ref = squeezenet
    monkeypatch.setattr(tenants.NativeInference, "failure", lambda self: "out of memory")
    monkeypatch.setattr(tenants.NativeInference, "get_tiles", no_outputs)
    monkeypatch.setattr(tenants.NativeInference, "get_tiles_encoded", no_outputs)
    with Server("tcp://127.0.0.1:0", threads=1) as srv, \
            Client(srv.address, model, threads=1, policy="cloud", tiles_per_layer=TILES,
                   timeout=30.0) as client:
        t0 = time.monotonic()
        assert_close(client.infer(feeds), ref, rel=1e-4)
        assert time.monotonic() - t0 < 10  # far below the 30 s timeout
        stats = client.last_stats
        assert stats["fallback"] and "out of memory" in stats["fallback_reason"], stats


def _raw_router(port: int, answer_hello_with=None):
    """A ROUTER that accepts and never answers (or answers HELLO with the given header)."""
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(f"tcp://127.0.0.1:{port}")
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            if sock.poll(50):
                frames = sock.recv_multipart()
                header = msgpack.unpackb(frames[1])
                if answer_hello_with and header.get("t") == P.HELLO:
                    sock.send_multipart([frames[0], msgpack.packb(answer_hello_with)])
        sock.close(0)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return stop, thread


def test_stalled_server_falls_back_within_the_timeout(squeezenet):
    model, feeds, ref = squeezenet
    port = free_port()
    stop, thread = _raw_router(port)
    try:
        with Client(f"tcp://127.0.0.1:{port}", model, threads=1, policy="cloud",
                    tiles_per_layer=TILES, timeout=1.0) as client:
            t0 = time.monotonic()
            assert_close(client.infer(feeds), ref, rel=1e-4)
            elapsed = time.monotonic() - t0
            assert client.last_stats["fallback"] and 0.9 <= elapsed < 3.0, elapsed
    finally:
        stop.set()
        thread.join(5)


def test_incompatible_server_is_a_clear_error_but_inference_works(squeezenet):
    model, feeds, ref = squeezenet
    port = free_port()
    stop, thread = _raw_router(port, {"t": P.ERROR, "code": P.E_VERSION, "re": P.HELLO,
                                      "text": "this server speaks protocol version 99"})
    try:
        with Client(f"tcp://127.0.0.1:{port}", model, threads=1, policy="dynamic",
                    tiles_per_layer=TILES, timeout=1.0) as client:
            with pytest.raises(ServerVersionError, match="version"):
                client.connect(5)
            assert_close(client.infer(feeds), ref, rel=1e-4)
            assert client.last_stats["fallback"]
    finally:
        stop.set()
        thread.join(5)


def test_infer_async_runs_concurrent_inferences(server, squeezenet):
    model, feeds, ref = squeezenet
    with Client(server.address, model, threads=1, policy="dynamic", tiles_per_layer=TILES,
                timeout=10) as client:
        client.connect(10)
        futures = [client.infer_async(feeds, policy=p)
                   for p in ("dynamic", "cloud", "dynamic", "local", "cloud", "split")]
        done, _ = wait(futures, timeout=60)
        assert len(done) == len(futures)
        for f in futures:
            assert_close(f.result(), ref, rel=1e-4)
            assert not f.stats["fallback"], f.stats
        assert sum(f.stats["tiles_from_server"] > 0 for f in futures) >= 2


def test_server_error_for_an_inference_means_fallback_for_it(squeezenet):
    model, feeds, ref = squeezenet
    with Server("tcp://127.0.0.1:0", threads=1, server_flops=20e9,
                max_inferences_per_device=1) as srv:
        with Client(srv.address, model, threads=1, policy="cloud", tiles_per_layer=TILES,
                    timeout=10) as client:
            client.connect(30)
            futures = [client.infer_async(feeds) for _ in range(4)]
            wait(futures, timeout=60)
            for f in futures:
                assert_close(f.result(), ref, rel=1e-4)
            busy = [f.stats for f in futures if f.stats["fallback"]]
            assert busy and all("server error 8" in s["fallback_reason"] for s in busy), busy
            assert any(not f.stats["fallback"] for f in futures)
            assert_close(client.infer(feeds), ref, rel=1e-4)  # the connection is still fine
            assert not client.last_stats["fallback"]


# ------------------------------------------------------------------------------ processes

def _start_server(port: int, models_dir) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "coacto.server.cli", "--bind", f"tcp://127.0.0.1:{port}",
         "--threads", "1", "--models", str(models_dir), "--server-flops", "2e10"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def test_killed_server_means_fallback_then_reconnect(tmp_path, big_input):
    model, feeds, ref = big_input
    onnx.save(model, tmp_path / "sq.onnx")
    port = free_port()
    proc = _start_server(port, tmp_path)
    try:
        with Client(f"tcp://127.0.0.1:{port}", model, threads=1, policy="cloud",
                    tiles_per_layer=TILES, bandwidth="2mbit", timeout=3.0) as client:
            client.connect(30)
            fut = client.infer_async(feeds)  # about 0.8 s of input on a 2 Mbit/s link
            time.sleep(0.3)
            proc.kill()
            proc.wait(10)
            assert_close(fut.result(timeout=30), ref, rel=1e-4)
            assert fut.stats["fallback"] and fut.stats["tiles_local"] > 0, fut.stats
            proc = _start_server(port, tmp_path)
            client.connect(30)  # Lazy Pirate reconnects on its own
            assert_close(client.infer(feeds), ref, rel=1e-4)
            s = client.last_stats
            assert not s["fallback"] and s["tiles_from_server"] > 0 and s["reconnects"] >= 1, s
    finally:
        proc.kill()
        proc.wait(10)


def _client_cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "coacto.mobile.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def test_cli_json_and_output(server, squeezenet, tmp_path):
    model, feeds, ref = squeezenet
    onnx.save(model, tmp_path / "sq.onnx")
    (name, x), = feeds.items()
    np.save(tmp_path / "x.npy", x)
    r = _client_cli("--server", server.address, "--model", tmp_path / "sq.onnx", "--input",
                    f"{name}={tmp_path / 'x.npy'}", "--policy", "cloud", "--threads", 1,
                    "--repeat", 2, "--json", "--output", tmp_path / "out.npz", "--tiles", TILES,
                    "--timeout", 10)
    assert r.returncode == 0, r.stderr
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert len(lines) == 2 and all(s["policy"] == "cloud" for s in lines)
    assert lines[-1]["tiles_from_server"] > 0 and not lines[-1]["fallback"]
    got = dict(np.load(tmp_path / "out.npz"))
    assert_close(got, ref, rel=1e-4)
    # a link that changes on a schedule, and a lossy encoding: half the input's bytes
    r = _client_cli("--server", server.address, "--model", tmp_path / "sq.onnx", "--input",
                    f"{name}={tmp_path / 'x.npy'}", "--policy", "cloud", "--threads", 1,
                    "--json", "--tiles", TILES, "--timeout", 10, "--transfer", "f16",
                    "--bandwidth", "100mbit,50mbit@0.5")
    assert r.returncode == 0, r.stderr
    (stats,) = [json.loads(line) for line in r.stdout.splitlines()]
    assert stats["transfer"] == "f16" and stats["tile_bytes_wire"] * 2 == stats["tile_bytes_raw"]


def test_cli_help_and_bad_input(tmp_path):
    r = _client_cli("--help")
    assert r.returncode == 0 and "examples:" in r.stdout and "--bandwidth" in r.stdout
    model = zoo.build("squeezenet", image_size=32)
    onnx.save(model, tmp_path / "sq.onnx")
    base = ["--server", "tcp://127.0.0.1:1", "--model", tmp_path / "sq.onnx", "--random"]
    for extra, needle, code in ((["--bandwidth", "fast"], "bandwidth", 2),
                                (["--bandwidth", "100mbit,5mbit"], "needs @SECONDS", 2),
                                (["--policy", "nearest"], "unknown policy", 2),
                                (["--input", "x=absent.npy"], "does not exist", 1)):
        r = _client_cli(*base, *extra)
        assert r.returncode == code and "coacto-client: error:" in r.stderr, (extra, r.stderr)
        assert needle in r.stderr and "Traceback" not in r.stderr
    r = _client_cli("--model", tmp_path / "absent.onnx", "--policy", "local", "--random")
    assert r.returncode == 1 and "absent.onnx" in r.stderr
