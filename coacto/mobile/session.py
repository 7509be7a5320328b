"""The device's session with a server: connection attempts (Lazy Pirate), the handshake (HELLO,
model query, the one upload), heartbeats, and what the server says about itself.

States: ``idle`` (not wanted yet) -> ``hello`` -> ``model`` (query sent) [-> ``upload``] ->
``ready``; any failure -> ``backoff`` (socket closed with LINGER 0, retried after an exponential
back-off from BACKOFF_MIN_S to BACKOFF_MAX_S) -> ``hello`` ... A server that cannot run the model
(no ONNX bytes to upload, over its size limit, a version it does not speak) is retried rarely.
"""
from __future__ import annotations

import logging
import secrets

import zmq

from .. import protocol as P
from ..inference import now

log = logging.getLogger(__name__)

#: Names this process to servers (HELLO's ``device``): the clients it opens, one after the
#: other or at once, are one device when a server counts the others sharing it (STATS'
#: ``others``). Random, so it says nothing about the device.
DEVICE_TOKEN = secrets.token_hex(8)
BACKOFF_MIN_S = 0.25
BACKOFF_MAX_S = 4.0
#: Back-off after an answer that retrying soon will not change (version, model refused).
BACKOFF_REFUSED_S = 16.0
#: The goodput probe after the handshake: a train of PROBE_TRAIN HEARTBEATs with one padding
#: frame each (the server ignores it), handed to the link back to back when it has nothing else
#: to carry, each of about PROBE_SECONDS of link time at the assumed goodput, within the bounds
#: below. The first may pass in a burst (estimates.BURST_BYTES); the ones behind it queued, so
#: the server's stamps on their STATS measure the rate, as backlogged batches' ACKs do (a single
#: probe only bounded it from below, by a round trip that holds the device's own delays: a
#: 50 Mbit/s link read as 30). Without a probe a policy that sends nothing (split choosing
#: local) would never learn the link is faster.
PROBE_TRAIN = 3
PROBE_SECONDS = 0.02
PROBE_MIN_BYTES, PROBE_MAX_BYTES = 24 << 10, 64 << 10
#: ... up to this much each in a train that follows one that crossed in a burst.
PROBE_BURST_MAX_BYTES = 256 << 10
#: A train whose probes the server stamped within this much of each other crossed in one burst
#: and measured nothing but the burst: another follows at once, its probes sized by what that
#: one read (up to PROBE_BURST_MAX_BYTES), rather than every train being that large: probes
#: cost a device in a CPU quota time each time the link is probed again.
PROBE_BURST_SPREAD_S = PROBE_SECONDS / 4
#: ... and at least this many times as large as the train before it, so that trains which keep
#: crossing in bursts end at PROBE_BURST_MAX_BYTES (24 kB, 96 kB, 256 kB: three at most). What a
#: burst train reads is a lower bound, its first probe's bytes past the burst over a round trip:
#: where that round trip was over 6.7 ms, it sized the next train no larger, which crossed in a
#: burst again, without end.
PROBE_BURST_GROWTH = 4


def probe_size(bandwidth: float, after_burst: int = 0) -> int:
    """Bytes of each probe of a train at the assumed goodput (bytes/s); ``after_burst``: the
    probe size of the train before, which crossed in a burst (0: none)."""
    if after_burst:
        return int(min(PROBE_BURST_MAX_BYTES, max(PROBE_MIN_BYTES, bandwidth * PROBE_SECONDS,
                                                  PROBE_BURST_GROWTH * after_burst)))
    return int(min(PROBE_MAX_BYTES, max(PROBE_MIN_BYTES, bandwidth * PROBE_SECONDS)))


def probe_again(size: int, stamps) -> bool:
    """A whole train (its probes' ``size`` and the server's stamps on them) crossed in one
    burst and larger probes may do better."""
    return len(stamps) == PROBE_TRAIN and size < PROBE_BURST_MAX_BYTES and \
        max(stamps) - min(stamps) < PROBE_BURST_SPREAD_S


class TrainStamps:
    """The server's stamps on each probe train's probes (the session's, and the simulator's)."""

    def __init__(self):
        self._trains: dict = {}  # train -> (probe size, the stamps so far)

    def start(self, train, size: int) -> None:
        self._trains[train] = (size, [])

    def forget(self, train) -> None:
        """A train that will not be answered whole (a probe lost with its connection)."""
        self._trains.pop(train, None)

    def answered(self, train, t_server: float) -> int:
        """The server stamped a probe of ``train`` at ``t_server``; when that completes a train
        that crossed in one burst, and larger probes should follow (probe_again), the size of
        its probes (probe_size's ``after_burst``), else 0."""
        size, stamps = self._trains.get(train, (0, None))
        if stamps is None:
            return 0
        stamps.append(float(t_server))
        if len(stamps) < PROBE_TRAIN:
            return 0
        del self._trains[train]
        return size if probe_again(size, stamps) else 0


class Session:
    """Written by the engine thread only; other threads read the plain attributes."""

    def __init__(self, link, address: str | None, tg, model_bytes, estimates, timeout: float,
                 name: str, on_ready, on_lost):
        self.link = link
        self.address = address
        self.tg = tg
        self.model_bytes = model_bytes
        self.est = estimates
        self.timeout = float(timeout)
        self.name = name
        self.on_ready, self.on_lost = on_ready, on_lost
        self.want = False            # connect (a policy that uses the server was asked for)
        self.state = "idle"
        self.server_down = False     # the last attempt failed: new inferences do not wait
        self.last_error: str | None = None
        self.version_error: str | None = None
        self.server_info: dict = {}
        self.connects = self.reconnects = self.uploads = 0
        self._backoff = BACKOFF_MIN_S
        self._t_retry = 0.0
        self._next_hb = 0.0
        self._hb_interval = self.timeout / 3
        self._graph_flops_known = False
        self._probes: dict = {}  # t_send -> goodput key of the probes in flight
        self._trains = 0
        self._train_stamps = TrainStamps()
        self._after_burst = 0  # the probe size of a train that crossed in a burst, to outgrow

    @property
    def ready(self) -> bool:
        return self.state == "ready"

    def why_down(self) -> str:
        return self.version_error or self.last_error or f"connecting to {self.address}"

    def tick(self, t: float) -> None:
        if self.want and self.state in ("idle", "backoff") and t >= self._t_retry:
            self._open()
        if self.link.silent(t):
            self.lost(f"no reply from {self.address} for {self.link.await_limit:.1f} s")
        if self.state == "ready" and t >= self._next_hb:
            self.link.control({"t": P.HEARTBEAT, "t_send": t})
            self._next_hb = t + self._hb_interval

    def wakeups(self) -> list[float]:
        if self.state == "ready":
            return [self._next_hb]
        if self.state in ("backoff", "idle") and self.want:
            return [self._t_retry]
        return []

    def _open(self) -> None:
        try:
            self.link.connect(self.address)
        except zmq.ZMQError as e:
            self.last_error = f"cannot connect to {self.address!r}: {e}"
            log.error("%s", self.last_error)
            self.server_down = True
            self._retry_in(BACKOFF_REFUSED_S)
            return
        if self.connects:
            self.reconnects += 1
        self.connects += 1
        self.state = "hello"
        log.debug("connecting to %s (attempt %d)", self.address, self.connects)
        self.link.control({"t": P.HELLO, "v": P.PROTOCOL_VERSION, "client": self.name,
                           "device": DEVICE_TOKEN})

    def _retry_in(self, delay: float) -> None:
        self.state = "backoff"
        self._t_retry = now() + delay

    def lost(self, reason: str, retry: float | None = None) -> None:
        """Lazy Pirate: drop the socket and everything queued on it; try again after a back-off."""
        # the first failure is news; the attempts that fail while the server stays away are not
        log.log(logging.DEBUG if self.server_down else logging.WARNING,
                "server %s: %s; inferences in flight finish on the device, reconnecting",
                self.address, reason)
        self.last_error = reason
        self.server_down = True
        self.link.close()
        self.est.goodput.reset()
        self.est.clock.reset()  # the server that answers next may run another clock
        self._retry_in(self._backoff if retry is None else retry)
        self._backoff = min(self._backoff * 2, BACKOFF_MAX_S)
        self.on_lost(reason)

    def _query(self) -> None:
        self.state = "model"
        self.link.control({"t": P.MODEL_QUERY, "graph_id": self.tg.graph_id,
                           "model_hash": self.tg.model_hash, "params": self.tg.params})

    def model_lost(self) -> None:
        """The server forgot the model (E_UNKNOWN_MODEL): query (and upload) it again."""
        if self.state == "ready":
            self._query()

    # ------------------------------------------------------------------ messages

    def handle(self, kind: str, h: dict, rest: list) -> bool:
        """Session-level messages; False for those that belong to an inference."""
        handler = {P.HELLO_OK: self._on_hello_ok, P.MODEL_MISSING: self._on_model_missing,
                   P.MODEL_READY: self._on_model_ready, P.STATS: self._on_stats}.get(kind)
        if handler is None:
            return False
        handler(h)
        return True

    def _on_hello_ok(self, h: dict) -> None:
        if self.state != "hello":
            return
        self.server_info = {k: v for k, v in h.items() if k != "t"}
        if isinstance(h.get("warning"), str) and self.connects == 1:
            log.warning("server %s: %s", self.address, h["warning"][:500])
        self.version_error = None
        self.est.on_hello(h)
        self.link.control({"t": P.HEARTBEAT, "t_send": now()})  # a first RTT sample
        self._query()

    def _on_model_missing(self, h: dict) -> None:
        if self.state != "model" or h.get("graph_id") != self.tg.graph_id:
            return
        limit = self.server_info.get("max_model_bytes")
        if self.model_bytes is None:
            self.refused("the server does not hold this model and no ONNX bytes are at hand to "
                         "upload (pass model_bytes= with a tile graph)")
        elif isinstance(limit, int) and len(self.model_bytes) > limit:
            self.refused(f"the model ({len(self.model_bytes)} bytes) is over the server's upload "
                         f"limit ({limit} bytes)")
        else:
            log.info("uploading the model (%d bytes) to %s", len(self.model_bytes), self.address)
            self.state = "upload"
            self.link.control({"t": P.MODEL_UPLOAD, "graph_id": self.tg.graph_id,
                               "model_hash": self.tg.model_hash, "params": self.tg.params},
                              self.model_bytes)

    def refused(self, reason: str) -> None:
        log.warning("server %s cannot serve this client: %s", self.address, reason)
        self.lost(reason, retry=BACKOFF_REFUSED_S)

    def _on_model_ready(self, h: dict) -> None:
        if h.get("graph_id") != self.tg.graph_id or self.state not in ("model", "upload"):
            return
        if self.state == "upload":
            self.uploads += 1
        if self.est.on_server_rate(h.get("server_flops")):
            self._graph_flops_known = True
        self.state = "ready"
        self.server_down = False
        self.last_error = None
        self._backoff = BACKOFF_MIN_S
        self._next_hb = now()
        hb = self.server_info.get("heartbeat_s")
        self._hb_interval = min(self.timeout / 3, hb if isinstance(hb, (int, float)) and hb > 0
                                else self.timeout)
        log.info("server %s ready for graph %s", self.address, self.tg.graph_id[:12])
        if self.est.goodput.samples == 0:
            self._send_probe()
        self.on_ready()

    def _send_probe(self, after_burst: int = 0) -> None:
        """A probe train, made when the link has nothing else to carry (it never delays an
        inference's tiles); none while one is out."""
        self._after_burst = after_burst
        t = now()
        for t_send, key in list(self._probes.items()):  # lost with a connection, or unanswered
            if key[1] != self.link.epoch or t - t_send > self.timeout:
                del self._probes[t_send]
                self.est.goodput.forget(key)
                self._train_stamps.forget(key[2])
        if self._probes or self.link.idle is not None:
            return
        self.link.idle = self._make_probes

    def _make_probes(self) -> list:
        size = probe_size(self.est.bandwidth, self._after_burst)
        train = []
        self._trains += 1
        self._train_stamps.start(self._trains, size)
        for i in range(PROBE_TRAIN):
            t = now()
            key = ("probe", self.link.epoch, self._trains, i)
            self.est.goodput.sent(key, size, t)
            self._probes[t] = key
            header = {"t": P.HEARTBEAT, "t_send": t, "probe": size}
            train.append((P.HEARTBEAT, P.pack(header, bytes(size)), None))
        return train

    def _on_stats(self, h: dict) -> None:
        t_send = h.get("t_send")
        key = self._probes.pop(t_send, None) if isinstance(t_send, float) else None
        if key is not None:
            t_server = h.get("t_server")
            stamped = isinstance(t_server, (int, float))
            self.est.on_ack(key, now(), t_server)
            burst = self._train_stamps.answered(key[2], t_server) if stamped else 0
            if burst:
                self._send_probe(after_burst=burst)
        elif isinstance(t_send, (int, float)):
            t = now()
            self.est.rtt.sample(t - t_send)
            if isinstance(h.get("t_server"), (int, float)):
                self.est.clock.sample(t_send, h["t_server"], t)
        flops = self.est.server_flops
        self.est.on_stats(h)
        if self._graph_flops_known:  # the per-graph rate (MODEL_READY) beats the server-wide one
            self.est.server_flops = flops

    def on_error(self, code, text: str, re_) -> None:
        """An ERROR that names no inference."""
        if code == P.E_VERSION:
            self.version_error = f"the server speaks another protocol version: {text}"
            self.refused(self.version_error)
        elif code in (P.E_MODEL_TOO_LARGE, P.E_MODEL_INVALID):
            self.refused(f"server error {code}: {text}")
        elif re_ in (P.HELLO, P.MODEL_QUERY, P.MODEL_UPLOAD) or self.state != "ready":
            self.lost(f"server error {code} during the handshake: {text}")
        else:
            log.warning("server error %s on %r: %s", code, re_, text)
