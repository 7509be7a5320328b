"""The device's end of one connection: a DEALER socket, the emulated link it sits behind, and the
reply timer of the Lazy Pirate pattern.

Sending: control messages (HELLO, BEGIN, HEARTBEAT, ...) wait in an outbox and go before tile
batches; tile batches are pulled from the native send queues only while the engine's send window
allows, so most of the backlog stays where the ECT rule sees it (the rest, ``backlog_bytes``, is
reported to it separately). With a bandwidth cap each message is booked on the uplink's token
bucket when it is handed over and held until its release time (the engine polls with that as
timeout: it never sleeps); an inference that finishes withdraws its unsent batches and gives their
link time back. Frames of ZERO_COPY_MIN_BYTES and more go without a copy (pyzmq's copy threshold
is the same 64 kB).

Receiving: messages are handled at once, or, with a cap, once the downlink has carried them.

Liveness: sending a message that expects an answer arms the reply timer unless it already runs;
anything received disarms it. A timer that runs out, or the TCP connection dropping (a socket
monitor reports it at once), means the connection is lost.
"""
from __future__ import annotations

import collections
import logging

import zmq
from zmq.utils.monitor import recv_monitor_message

from .. import protocol as P

log = logging.getLogger(__name__)

#: Reply time allowed for MODEL_UPLOAD (the server compiles the model before it answers).
UPLOAD_TIMEOUT_MIN_S = 60.0
#: Messages read per poll round.
RECV_BATCH = 256
EXPECTS_REPLY = frozenset({P.HELLO, P.MODEL_QUERY, P.MODEL_UPLOAD, P.TILES, P.HEARTBEAT})
# A refusal, not a dropped connection (libzmq reports those, a server restarting among them, as
# HANDSHAKE_FAILED_NO_DETAIL: they reconnect at the usual pace).
HANDSHAKE_FAILED = zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
HANDSHAKE_TEXT = {
    zmq.EVENT_HANDSHAKE_FAILED_AUTH: "the server refused this device's key (is its .key file in "
                                     "the server's allowed-keys folder?)",
    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "the security handshake failed (does the server use "
                                         "keys, and is --server-key its public key?)",
}


def message_bytes(frames) -> int:
    return sum(len(f) if isinstance(f, (bytes, bytearray)) else f.nbytes for f in frames)


class Link:
    """One connection attempt's socket and everything queued on it (see the module text)."""

    def __init__(self, ctx: zmq.Context, poller: zmq.Poller, timeout: float, uplink=None,
                 downlink=None, curve=None):
        self.ctx, self.poller = ctx, poller
        self.curve = curve  # (server public, own public, own secret) Z85 keys, or None
        self.timeout = float(timeout)
        self.up, self.down = uplink, downlink
        self.sock = self.monitor = None
        self.epoch = 0
        self.outbox: collections.deque = collections.deque()
        # (release time, frames, kind, nbytes, job) booked on the uplink, not yet released
        self.held: collections.deque = collections.deque()
        self.backlog_bytes = 0  # TILES bytes among them
        self._blocked_until = 0.0
        # the held message that on_sent passed but the socket refused (high-water mark): the
        # retry sends it without announcing it again
        self._passed = None
        self.idle = None  # makes (kind, frames, job), or a list of them, when nothing else waits
        # (the goodput probe train)
        self.inbox: collections.deque = collections.deque()  # (release time, frames)
        self.awaiting_since: float | None = None
        self.await_limit = self.timeout
        self.refused: str | None = None  # why the server refused the handshake, if it did

    @property
    def is_open(self) -> bool:
        return self.sock is not None

    def connect(self, address: str) -> None:
        """A fresh DEALER (LINGER 0) connected to ``address``; raises zmq.ZMQError."""
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RECONNECT_IVL, 100)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
        if self.curve is not None:
            sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = self.curve
        try:
            sock.connect(address)
        except zmq.ZMQError:
            sock.close(0)
            raise
        self.sock = sock
        self.monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED | HANDSHAKE_FAILED)
        self.poller.register(sock, zmq.POLLIN)
        self.poller.register(self.monitor, zmq.POLLIN)
        self.epoch += 1

    def close(self, linger_ms: int = 0) -> None:
        """Closes the socket and drops whatever was queued on it (Lazy Pirate), or what is
        still queued after ``linger_ms`` (a closing client's last words)."""
        self.outbox.clear()
        self.inbox.clear()
        self.held.clear()
        self._passed = None
        self.backlog_bytes = 0
        self.idle = None
        self.awaiting_since = None
        if self.sock is None:
            return
        for s in (self.sock, self.monitor):
            try:
                self.poller.unregister(s)
            except KeyError:
                pass
        try:
            self.sock.disable_monitor()
        except zmq.ZMQError:
            pass
        self.monitor.close(0)
        self.sock.close(linger_ms)
        self.sock = self.monitor = None

    # ------------------------------------------------------------------ sending

    def control(self, header: dict, *frames, job=None) -> None:
        self.outbox.append((header["t"], P.pack(header, *frames), job))

    def flush(self, kind: str) -> None:
        """Sends the queued messages of one kind at once, unshaped (a closing client's CANCELs)."""
        pending = [(k, frames) for _t, frames, k, _n, _job, _s in self.held]
        pending += [(k, frames) for k, frames, _job in self.outbox]
        for k, frames in pending:
            if k == kind and self.sock is not None:
                try:
                    self.sock.send_multipart(frames, zmq.DONTWAIT)
                except zmq.ZMQError:
                    pass

    def send_now(self, header: dict) -> None:
        """Best effort, unshaped, for the last words of a closing client."""
        if self.sock is not None:
            try:
                self.sock.send(P.pack(header)[0], zmq.DONTWAIT)
            except zmq.ZMQError:
                pass

    def pump(self, t: float, next_batch, on_sent) -> None:
        """Hands messages to the link (the outbox first, then the batches ``next_batch()`` gives
        while its window allows, then the idle message) and sends those the link has carried.
        ``on_sent(kind, frames, nbytes, job, t_booked)`` (the release time the shaper booked, or
        None without one) returns False to drop a message instead."""
        if self.sock is None:
            return
        while True:
            item = self.outbox.popleft() if self.outbox else next_batch()
            if item is None and self.idle is not None and not self.held:
                made, self.idle = self.idle(), None
                if isinstance(made, list):  # a train: handed over back to back
                    item = made[0]
                    self.outbox.extend(made[1:])
                else:
                    item = made
            if item is None:
                break
            kind, frames, job = item
            nbytes = message_bytes(frames)
            # booked back to back, like a kernel socket buffer in front of a real link: time the
            # engine spends descheduled does not stop the emulated link. The one-time model
            # upload is setup, not inference traffic: it is not shaped (a 100 MB model would
            # hold a 5 Mbit/s link for minutes before the first offloaded inference)
            shaped = self.up is not None and kind != P.MODEL_UPLOAD
            t_start, t_release = self.up.book(nbytes, t) if shaped else (t, t)
            self.held.append((t_release, frames, kind, nbytes, job, t_start))
            if kind == P.TILES:
                self.backlog_bytes += nbytes
        while self.held and self.held[0][0] <= t and self._blocked_until <= t:
            head = self.held[0]
            t_booked, frames, kind, nbytes, job, _ = head
            # on_sent counts the message (its tiles, bytes, trace): once, however many tries
            if head is self._passed or \
                    on_sent(kind, frames, nbytes, job, t_booked if self.up is not None else None):
                try:
                    self.sock.send_multipart(frames, zmq.DONTWAIT, copy=False)
                except zmq.Again:  # high-water mark: the poll timeout brings us back
                    self._passed = head
                    self._blocked_until = t + 0.005
                    return
                self._arm(kind, t)
            self._passed = None
            self.held.popleft()
            if kind == P.TILES:
                self.backlog_bytes -= nbytes

    def drop_job(self, job, t: float) -> list:
        """Takes a finished inference's BEGIN and batches off the link before they go, and gives
        the link time they had booked to the messages behind them. Returns the dropped TILES."""
        if not any(e[4] is job and e[2] in (P.BEGIN, P.TILES) for e in self.held):
            return []
        dropped, keep, rebook_from = [], collections.deque(), None
        for e in self.held:
            if e[4] is job and e[2] in (P.BEGIN, P.TILES):
                dropped.append(e)
                if rebook_from is None:
                    rebook_from = e[5]
                if e[2] == P.TILES:
                    self.backlog_bytes -= e[3]
            elif rebook_from is not None and self.up is not None:
                keep.append(e[:0] + (None,) + e[1:])  # booked again below
            else:
                keep.append(e)
        if self.up is not None:
            self.up.rewind(max(rebook_from, t))
            for i, e in enumerate(keep):
                if e[0] is None:
                    start, release = self.up.book(e[3], t)
                    keep[i] = (release,) + e[1:5] + (start,)
        self.held = keep
        return [frames for _t, frames, kind, *_ in dropped if kind == P.TILES]

    def set_rate(self, rate: float, t: float) -> None:
        """The emulated link changes to ``rate`` bytes/s at ``t``, both ways. What the uplink
        still holds is booked again: the part of each frame not yet across takes the new rate
        (a frame half across a link that drops to a twentieth takes ten times its whole old time
        for the rest). Frames already on the downlink keep their times."""
        from .shaper import TokenBucket

        if self.down is None:
            self.down = TokenBucket(rate)
        else:
            self.down.set_rate(rate, t)
        if self.up is None:
            self.up = TokenBucket(rate)
            return
        up = self.up
        up.set_rate(rate, t)
        if not any(e[0] - up.delay > t and e[2] != P.MODEL_UPLOAD for e in self.held):
            return
        up.rewind(t)  # the link is busy with them from t on, with no credit
        rebooked = collections.deque()
        for e in self.held:
            release, frames, kind, nbytes, job, start = e
            end = release - up.delay
            if end <= t or kind == P.MODEL_UPLOAD:
                rebooked.append(e)
                continue
            left = nbytes if start >= t or end <= start else nbytes * (end - t) / (end - start)
            new_start, new_release = up.book(max(1, int(round(left))), t)
            rebooked.append((new_release, frames, kind, nbytes, job, new_start))
        self.held = rebooked

    def _arm(self, kind: str, t: float) -> None:
        if kind == P.MODEL_UPLOAD:
            self.awaiting_since, self.await_limit = t, max(UPLOAD_TIMEOUT_MIN_S, self.timeout)
        elif kind in EXPECTS_REPLY and self.awaiting_since is None:
            self.awaiting_since, self.await_limit = t, self.timeout

    # ------------------------------------------------------------------ receiving

    def receive(self, handle, now) -> None:
        """Reads what the socket holds; ``handle(frames)`` each message when the downlink has
        carried it."""
        for _ in range(RECV_BATCH):
            if self.sock is None:
                return
            try:
                frames = self.sock.recv_multipart(zmq.DONTWAIT, copy=False)
            except zmq.Again:
                break
            if self.down is not None:
                self.inbox.append((self.down.reserve(sum(len(f) for f in frames), now()), frames))
            else:
                self.awaiting_since = None
                handle(frames)
        self.deliver(now(), handle)

    def deliver(self, t: float, handle) -> None:
        while self.inbox and self.inbox[0][0] <= t:
            self.awaiting_since = None
            handle(self.inbox.popleft()[1])

    def disconnected(self) -> bool:
        """Drains the socket monitor; True when the TCP connection dropped. A handshake the
        server refused (a key it does not know, the wrong server key) sets ``refused``."""
        lost = False
        while self.monitor is not None:
            try:
                event = recv_monitor_message(self.monitor, zmq.DONTWAIT)
            except zmq.Again:
                break
            lost |= event["event"] == zmq.EVENT_DISCONNECTED
            if event["event"] & HANDSHAKE_FAILED:
                self.refused = HANDSHAKE_TEXT.get(event["event"], "the security handshake failed")
        return lost

    def silent(self, t: float) -> bool:
        """True when an answer is overdue."""
        return self.awaiting_since is not None and t - self.awaiting_since > self.await_limit

    def wakeups(self) -> list[float]:
        times = []
        if self.held:
            times.append(max(self.held[0][0], self._blocked_until))
        if self.inbox:
            times.append(self.inbox[0][0])
        if self.awaiting_since is not None:
            times.append(self.awaiting_since + self.await_limit)
        return times
