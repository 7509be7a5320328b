"""coacto's server: one ROUTER socket for any number of devices, one I/O thread, one shared native
runtime that executes every tenant's inferences together (docs/ARCHITECTURE.md §5,
docs/PROTOCOL.md).

    with coacto.server.Server("tcp://*:5555", threads=8, models="models/") as server:
        print(server.address)
        ...                        # serves until stop() / the end of the with block

The I/O thread polls the socket, the runtime's report queue (output tiles completed) and a wake-up
pipe (model compilations finished on the worker thread, stop requested). Nothing a device sends can
raise out of it: malformed messages get an ERROR reply or are dropped, and inference ids are looked
up in the sending device's own session only.
"""
from __future__ import annotations

import logging
import os
import queue
import threading
from concurrent.futures import ThreadPoolExecutor

import zmq

from .. import protocol as P
from .._version import __version__
from ..inference import ReportQueue, now
from ..native import NativeRuntime
from ..runtime import default_threads
from .limits import STORE_SHARE, Limits
from .security import Security, ServerError  # noqa: F401 (ServerError: re-exported)
from .sessions import FlopEstimate, Session, calibrate_flops
from .store import ModelStore, StoreError, check_params, is_hash
from .tenants import Reject, Tenants

log = logging.getLogger(__name__)

#: Compilations queued at once, per device (owner: all its connections) and in all (more: E_BUSY).
MAX_JOBS_PER_DEVICE = 4
MAX_JOBS = 64
#: Messages read per poll round before the report queue gets its turn.
RECV_BATCH = 256
#: Frames larger than max_model_bytes + this disconnect the peer (ZMQ_MAXMSGSIZE) unread.
FRAME_SLACK_BYTES = 64 << 20
#: Messages ZeroMQ queues for one device that does not read before it drops more (results are
#: bounded in bytes by Limits.results_per_device; this bounds the small ones: ACK, STATS).
SNDHWM = 4096
#: A connection must finish the ZMTP / CurveZMQ handshake within this long (ms): an
#: unauthenticated peer cannot hold a descriptor for libzmq's default 30 s.
HANDSHAKE_IVL_MS = 5000
#: Without keys, a connection that has not begun an inference is forgotten after this long
#: (at least): longer than a client's heartbeat period, so a device at rest keeps its session.
IDLE_EXPIRY_MIN_S = 1.0
#: After the last inference ends, the I/O thread waits this long before it frees the activation
#: buffers the graphs keep for reuse and hands freed heap memory back to the OS (malloc_trim):
#: not between two inferences of a device that runs one a second.
TRIM_AFTER_IDLE_S = 2.0
DEFAULT_BIND = "tcp://127.0.0.1:5555"
#: ERROR texts are cut to this many characters (well inside protocol.MAX_HEADER_BYTES).
MAX_ERROR_TEXT = 4096
def _malloc_trim() -> None:
    """Hands the heap's free pages back to the OS (glibc; elsewhere nothing to do)."""
    global _trim
    if _trim is None:
        try:
            import ctypes

            _trim = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _trim = False
    if _trim:
        _trim(0)


_trim = None


def _hash_field(header: dict, key: str) -> str:
    value = header.get(key)
    if not is_hash(value):
        raise Reject(P.E_BAD_MESSAGE, f"'{key}' must be a sha256 hex digest (64 lower-case hex "
                                      f"characters)")
    return value


class Server:
    """The coacto server. ``bind``: a ZeroMQ endpoint (default loopback; port 0 picks a free one,
    see ``address``); ``threads``: computing threads shared by all devices (default: all CPUs);
    ``models``: a folder of .onnx / .ctg files to preload; ``heartbeat_timeout``: seconds of
    silence after which a device's state is freed; ``server_flops``: skip the start-up
    calibration and announce this; ``cache_dir``: keep uploaded models on disk (by hash) across
    restarts.

    Security (docs/SECURITY.md): ``secret_key`` (the server's .key_secret file) and
    ``allowed_keys`` (a folder of devices' .key files, or a list of keys) turn on CurveZMQ:
    traffic is encrypted and only those devices are served, each bound to its key. Without keys
    the server binds only loopback endpoints unless ``insecure=True``. The environment
    variables COACTO_SECRET_KEY and COACTO_ALLOWED_KEYS stand in for the two arguments.

    Limits: ``memory_limit`` (bytes; default half the RAM) bounds what tenants hold; the others
    (``max_model_bytes``, ``max_inferences_per_device``, ``max_devices``, ``max_graphs``, or a
    whole ``limits`` object) are listed in docs/SECURITY.md."""

    def __init__(self, bind: str = DEFAULT_BIND, threads: int | None = None, models=None, *,
                 max_model_bytes: int = 512 << 20, heartbeat_timeout: float = 10.0,
                 max_inferences_per_device: int = 8, max_devices: int = 1024, max_graphs: int = 32,
                 cache_dir=None, server_flops: float | None = None,
                 context: zmq.Context | None = None, secret_key=None, allowed_keys=None,
                 insecure: bool = False, memory_limit: int | None = None,
                 limits: Limits | None = None):
        threads = default_threads() if threads is None else threads
        if type(threads) is not int or not 1 <= threads <= 1024:
            raise ServerError(f"threads must be an integer from 1 to 1024, got {threads!r}")
        if not (isinstance(heartbeat_timeout, (int, float)) and heartbeat_timeout > 0):
            raise ServerError(f"heartbeat_timeout must be a positive number of seconds, got "
                              f"{heartbeat_timeout!r}")
        if int(max_model_bytes) < 1:
            raise ServerError("max_model_bytes must be positive")
        self.bind = bind
        self.threads = threads
        self.models = models
        self.max_model_bytes = int(max_model_bytes)
        self.heartbeat_timeout = float(heartbeat_timeout)
        self.guard = Security(bind, secret_key, allowed_keys, insecure)
        if limits is None:
            limits = Limits.default(
                memory_limit, inferences_per_device=int(max_inferences_per_device),
                sessions=int(max_devices),
                sessions_per_owner=None if self.guard.secure else 64,
                idle_expiry_s=None if self.guard.secure else max(IDLE_EXPIRY_MIN_S,
                                                                 self.heartbeat_timeout / 2))
        self.limits = limits
        self.max_inferences_per_device = limits.inferences_per_device
        self.max_devices = limits.sessions
        store_bytes = min(4 << 30, int(limits.memory * STORE_SHARE))
        self.store = ModelStore(self.max_model_bytes, max_graphs=max_graphs, cache_dir=cache_dir,
                                max_graph_bytes=store_bytes, max_onnx_bytes=store_bytes,
                                max_inference_bytes=limits.inference_memory)
        self._given_flops = server_flops
        self._context = context
        self._own_context = context is None
        self.loaded_models: list[dict] = []
        self.bound: str | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.tenants: Tenants | None = None
        self._jobs_pending = 0
        self._jobs_done: queue.SimpleQueue = queue.SimpleQueue()
        self._idle_since: float | None = None
        self._counts = dict.fromkeys((
            "messages", "rejected", "tiles_in", "bytes_in", "results", "inferences_done",
            "inferences_cancelled", "inferences_expired", "devices_expired", "send_failed",
            "sessions_refused", "sessions_evicted", "sessions_expired_idle", "memory_refused",
            "results_dropped", "uploads_refused", "trims"), 0)

    @property
    def public_key(self) -> str | None:
        """The server's CurveZMQ public key (Z85), what devices pass as their server key."""
        return self.guard.public_key

    @property
    def secure(self) -> bool:
        return self.guard.secure

    @property
    def security(self) -> str:
        """How devices are authenticated: "curve", "none (local endpoint)" or "none
        (insecure)"."""
        return self.guard.label

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> "Server":
        """Preloads the models, calibrates, binds and starts the I/O thread."""
        if self._thread is not None:
            raise ServerError("this server was already started")
        if self.models is not None:
            self.loaded_models = self.store.preload(self.models)
        flops = self._given_flops if self._given_flops else calibrate_flops(self.threads)
        self._flops = FlopEstimate(flops)
        self._rt = NativeRuntime(self.threads)
        ctx = self._context or zmq.Context()
        sock = ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        # A connection that claims a routing id already in use is ignored: with handover, a peer
        # that set another device's id would take over its session and receive its results.
        sock.setsockopt(zmq.ROUTER_HANDOVER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, self.max_model_bytes + FRAME_SLACK_BYTES)
        sock.setsockopt(zmq.SNDHWM, SNDHWM)
        sock.setsockopt(zmq.HANDSHAKE_IVL, HANDSHAKE_IVL_MS)
        try:
            self.guard.configure(ctx, sock)
            port = self.bind.rsplit(":", 1)[-1] if self.bind.startswith("tcp://") else ""
            if port.isdigit() and int(port) > 65535:  # libzmq would bind it modulo 65536
                raise zmq.ZMQError(msg=f"port {port} is not from 0 to 65535")
            sock.bind(self.bind)
        except zmq.ZMQError as e:
            sock.close(0)
            self.guard.stop()
            if self._own_context:
                ctx.term()
            self._rt.close()
            raise ServerError(f"cannot bind {self.bind!r}: {e}; use an endpoint like "
                              f"tcp://*:5555 with a free port (port 0 picks one)") from None
        self._context, self._sock = ctx, sock
        self.bound = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._reports = ReportQueue(self._rt)
        self._t0 = now()
        self.tenants = Tenants(self._rt, self.store, self._flops, self._send, self._counts,
                               self.limits)
        self._handlers = {P.HELLO: self._on_hello, P.MODEL_QUERY: self._on_model_query,
                          P.MODEL_UPLOAD: self._on_model_upload, P.BEGIN: self.tenants.begin,
                          P.TILES: self.tenants.tiles, P.CANCEL: self.tenants.cancel,
                          P.HEARTBEAT: self.tenants.heartbeat, P.BYE: self.tenants.bye}
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="coacto-server-compile")
        self._thread = threading.Thread(target=self._loop, name="coacto-server-io", daemon=True)
        self._thread.start()
        log.info("coacto-server %s listening on %s (protocol %d, %d threads, %.3g GFLOP/s %s, "
                 "%d models preloaded, %s, memory limit %.0f MiB)", __version__, self.bound,
                 P.PROTOCOL_VERSION, self.threads, flops / 1e9,
                 "given" if self._given_flops else "calibrated", len(self.loaded_models),
                 self.security, self.limits.memory / 2**20)
        if self.guard.warning:
            log.warning("%s", self.guard.warning)
        return self

    @property
    def address(self) -> str | None:
        """The bound endpoint with the real port, connectable from this host (a wildcard bind
        reads as the loopback address)."""
        if self.bound is None:
            return None
        return self.bound.replace("tcp://0.0.0.0:", "tcp://127.0.0.1:").replace(
            "tcp://[::]:", "tcp://[::1]:")

    def stop(self, timeout: float = 10.0) -> None:
        """Frees every inference, closes the socket (LINGER 0) and stops the threads."""
        if self._thread is None or self._stopping:
            return
        self._stopping = True
        self._wake()
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("the I/O thread did not stop within %.1f s", timeout)
            return
        self._executor.shutdown(wait=True, cancel_futures=True)
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)
        self._rt.close()
        self.guard.stop()
        if self._own_context:
            self._context.term()
        log.info("server stopped")

    def __enter__(self) -> "Server":
        if self._thread is None:
            self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stats(self) -> dict:
        """A snapshot of the server's counters (safe to call from any thread)."""
        if self._thread is None:
            return {**self._counts, "address": None, "threads": self.threads, "devices": 0,
                    "inferences": 0, "store": self.store.stats()}
        t = now()
        return {**self._counts, "address": self.address, "threads": self.threads,
                "devices": len(self.tenants.sessions), "inferences": len(self.tenants.by_tag),
                "computing": len(self.tenants.computing), "server_flops": self._flops.value,
                "flops_samples": self._flops.samples, "uptime_s": t - self._t0,
                "alpha_all": 1.0 + self.tenants.all_computing.value, "store": self.store.stats(),
                "security": self.security, "memory_limit": self.limits.memory,
                "inference_bytes": self.tenants.inference_bytes,
                "unsent_bytes": self.tenants.unsent_bytes}

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"w")
        except (BlockingIOError, OSError):
            pass  # already readable, or closed during stop

    # ------------------------------------------------------------------ I/O loop

    def _loop(self) -> None:
        sweep_every = min(1.0, max(0.05, self.heartbeat_timeout / 4))
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._reports.fd, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        next_sweep = now() + sweep_every
        try:
            while not self._stopping:
                wait_ms = max(0.0, next_sweep - now()) * 1000
                try:
                    events = dict(poller.poll(wait_ms))
                except zmq.ZMQError as e:  # the context was terminated under us
                    log.error("polling failed (%s); the server stops", e)
                    break
                if self._sock in events:
                    self._guarded(self._drain_socket)
                if self._reports.fd in events:
                    self._guarded(self._drain_reports)
                if self._wake_r in events:
                    self._guarded(self._drain_wake)
                if now() >= next_sweep:
                    self._guarded(lambda: self.tenants.sweep(self.heartbeat_timeout))
                    self._guarded(self._trim_when_idle)
                    next_sweep = now() + sweep_every
        finally:
            self._guarded(lambda: self.tenants.drop_all("the server is stopping"))
            self._sock.close(0)

    def _trim_when_idle(self) -> None:
        """Once nothing is in flight for TRIM_AFTER_IDLE_S after inferences were freed, the heap
        the activations and results used goes back to the OS: a burst does not leave the server
        holding its peak for good."""
        if self.tenants.by_tag or self._jobs_pending or not self.tenants.freed_since_trim:
            self._idle_since = None
            return
        t = now()
        if self._idle_since is None:
            self._idle_since = t
        elif t - self._idle_since >= TRIM_AFTER_IDLE_S:
            self.store.release_buffers()
            _malloc_trim()
            self._counts["trims"] += 1
            self.tenants.freed_since_trim = 0
            self._idle_since = None

    @staticmethod
    def _guarded(step) -> None:
        """One step of the loop; a bug in one must not stop the server for every device."""
        try:
            step()
        except Exception:
            log.exception("unexpected error in the I/O loop (the server carries on)")

    def _drain_socket(self) -> None:
        for _ in range(RECV_BATCH):
            try:
                frames = self._sock.recv_multipart(zmq.DONTWAIT, copy=False)
            except zmq.Again:
                return
            try:
                self._dispatch(frames)
            except Exception:
                log.exception("unexpected error while handling a message")

    def _drain_wake(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass
        while True:
            try:
                session, header, error, nbytes = self._jobs_done.get_nowait()
            except queue.Empty:
                return
            self._jobs_pending -= 1
            session.pending_jobs -= 1  # this connection's, even if it was dropped meanwhile
            self.tenants.job_done(session.owner, nbytes)
            if error is None:
                self._send(session.identity, header)
            else:
                self._send_error(session.identity, error.code, str(error), re=header["re"],
                                 graph_id=header["graph_id"], limit=error.limit)

    # ------------------------------------------------------------------ messages

    def _dispatch(self, frames: list) -> None:
        self._counts["messages"] += 1
        if len(frames) < 2:
            return  # an identity and nothing else: nothing to answer
        identity = frames[0].bytes
        t = now()
        session = self.tenants.sessions.get(identity)
        owner, peer = self.guard.owner(frames[1])
        if session is not None and session.owner != owner:
            # the routing id of a connection that has gone, claimed by another device before
            # the old session expired: it gets none of that session's state
            log.info("device %s: routing id reused by another device; its state is dropped",
                     session.name)
            self.tenants.drop(session, "routing id reused")
            session = None
        if session is None:
            session = self.tenants.session(identity, t, owner, peer)
            if session is None:
                full = len(self.tenants.by_owner.get(owner, ())) >= \
                    self.limits.sessions_per_owner
                self._send_error(identity, P.E_BUSY, "this server holds as many connections as it "
                                                     "allows (for this device, or in all); try "
                                                     "again later",
                                 limit="sessions_per_owner" if full else "sessions")
                return
        else:
            session.last_seen = t
            session.messages += 1
        kind, header = "?", {}
        try:
            if len(frames[1]) > P.MAX_HEADER_BYTES:  # not even parsed
                raise Reject(P.E_BAD_MESSAGE, f"the header frame is over {P.MAX_HEADER_BYTES} "
                                              f"bytes")
            try:
                header, _ = P.unpack([frames[1].bytes])
            except P.ProtocolError as e:
                raise Reject(P.E_BAD_MESSAGE, str(e)) from None
            kind = header["t"]
            handler = self._handlers.get(kind)
            if handler is None:
                raise Reject(P.E_BAD_MESSAGE, f"{kind!r} is sent by servers, not devices")
            handler(session, header, frames[2:])
        except StoreError as e:
            self._reject(session, kind, Reject(e.code, str(e), graph_id=header.get("graph_id"),
                                               limit=e.limit))
        except Reject as r:
            self._reject(session, kind, r)
        except Exception as e:
            log.exception("internal error on a %r message from device %s", kind, session.name)
            self._send_error(identity, P.E_INTERNAL, f"internal server error: {e}", re=kind)

    def _reject(self, session: Session, kind: str, r: Reject) -> None:
        self._counts["rejected"] += 1
        log.debug("device %s: %r rejected (%d): %s", session.name, kind, r.code, r.text)
        self._send_error(session.identity, r.code, r.text, re=kind, **r.extra)

    def _on_hello(self, session: Session, h: dict, frames: list) -> None:
        v = h.get("v")
        if v is None:
            raise Reject(P.E_BAD_MESSAGE, "HELLO needs 'v', the protocol version")
        if type(v) is not int or v != P.PROTOCOL_VERSION:
            raise Reject(P.E_VERSION, f"this server speaks protocol version {P.PROTOCOL_VERSION}, "
                                      f"the device speaks {str(v)[:32]}; install matching coacto "
                                      f"versions on both sides")
        session.version = v
        client = h.get("client")
        session.client = client[:128] if isinstance(client, str) else ""
        device = h.get("device")
        if isinstance(device, str) and 0 < len(device) <= P.MAX_DEVICE_TOKEN_CHARS:
            self.tenants.name_device(session, device)
        log.info("device %s says hello (%s; %s)", session.name, session.client or "unnamed client",
                 f"key {session.owner[:12]}..." if self.secure else session.owner or "?")
        reply = {
            "t": P.HELLO_OK, "v": P.PROTOCOL_VERSION, "server_flops": self._flops.value,
            "threads": self.threads, "max_model_bytes": self.max_model_bytes,
            "heartbeat_s": self.heartbeat_timeout / 3, "heartbeat_timeout": self.heartbeat_timeout,
            "server": f"coacto {__version__}", "trace": True,
            "transfer": [m for m in P.TRANSFER_MODES if m != "raw"], "security": self.security}
        if self.guard.warning:
            reply["warning"] = self.guard.warning
        self._send(session.identity, reply)

    def _model_ready(self, entry) -> dict:
        return {"t": P.MODEL_READY, "graph_id": entry.tg.graph_id, "tiles": entry.tg.n_tiles,
                "server_flops": self._flops.for_graph(entry)}

    def _on_model_query(self, session: Session, h: dict, frames: list) -> None:
        graph_id, model_hash = _hash_field(h, "graph_id"), _hash_field(h, "model_hash")
        entry = self.store.graph(graph_id, session.owner)
        if entry is not None:
            self._send(session.identity, self._model_ready(entry))
            return
        check_params(h.get("params"))
        if self.store.has_model(model_hash, session.owner):
            self._submit(session, P.MODEL_QUERY, graph_id, model_hash, h["params"], None)
        else:
            self._send(session.identity, {"t": P.MODEL_MISSING, "graph_id": graph_id,
                                          "model_hash": model_hash})

    def _on_model_upload(self, session: Session, h: dict, frames: list) -> None:
        graph_id, model_hash = _hash_field(h, "graph_id"), _hash_field(h, "model_hash")
        if len(frames) != 1:
            raise Reject(P.E_BAD_MESSAGE, "MODEL_UPLOAD carries exactly one frame after the "
                                          "header: the ONNX file's bytes", graph_id=graph_id)
        if len(frames[0]) > self.max_model_bytes:
            raise Reject(P.E_MODEL_TOO_LARGE, f"the model has {len(frames[0])} bytes; this server "
                                              f"takes at most {self.max_model_bytes} "
                                              f"(coacto-server --max-model-mb)", graph_id=graph_id,
                         limit="model_bytes")
        entry = self.store.graph(graph_id, session.owner)
        if entry is not None:
            self._send(session.identity, self._model_ready(entry))
            return
        check_params(h.get("params"))
        held = self.store.owned_models(session.owner) + \
            self.tenants.uploads_pending.get(session.owner, 0)
        if held >= self.limits.uploads_per_owner:
            self._counts["uploads_refused"] += 1
            raise Reject(P.E_BUSY, f"this device already has {held} uploaded models on the "
                                   f"server (the limit); compute locally, or retry when older "
                                   f"ones were evicted", graph_id=graph_id,
                         limit="uploads_per_owner")
        # the bytes, then the compiled graph (about as large again), must fit the budget
        used = self.tenants.memory_in_use()
        if used + 2 * len(frames[0]) > self.limits.memory:
            self._counts["uploads_refused"] += 1
            raise Reject(P.E_BUSY, f"the server's memory budget is in use ({used / 2**20:.0f} of "
                                   f"{self.limits.memory / 2**20:.0f} MiB); retry later",
                         graph_id=graph_id, limit="memory")
        self._submit(session, P.MODEL_UPLOAD, graph_id, model_hash, h["params"], frames[0].buffer)

    def _submit(self, session: Session, kind: str, graph_id, model_hash, params, data) -> None:
        if self.tenants.jobs_of(session.owner) >= MAX_JOBS_PER_DEVICE or \
                self._jobs_pending >= MAX_JOBS:
            raise Reject(P.E_BUSY, "too many model compilations queued; retry later",
                         graph_id=graph_id, limit="compilations")
        nbytes = len(data) if data is not None else 0
        session.pending_jobs += 1
        self._jobs_pending += 1
        self.tenants.job_queued(session.owner, nbytes)
        self._executor.submit(self._job, session, kind, graph_id, model_hash, params, data, nbytes)

    def _job(self, session: Session, kind: str, graph_id, model_hash, params, data,
             nbytes: int) -> None:
        """Worker thread: compile (if needed), then hand the reply to the I/O thread."""
        reply, error = None, None
        try:
            entry = self.store.ensure_graph(graph_id, model_hash, params, data, session.owner)
            reply = self._model_ready(entry) if entry is not None else {
                "t": P.MODEL_MISSING, "graph_id": graph_id, "model_hash": model_hash}
        except StoreError as e:
            error = e
        except Exception as e:
            log.exception("compiling model %s failed", model_hash[:12])
            error = StoreError(P.E_INTERNAL, f"compiling the model failed: {e}")
        header = reply if error is None else {"re": kind, "graph_id": graph_id}
        self._jobs_done.put((session, header, error, nbytes))
        self._wake()

    def _drain_reports(self) -> None:
        self.tenants.on_reports(self._reports.take())

    # ------------------------------------------------------------------ sending

    def _send(self, identity: bytes, header: dict, *frames, track: bool = False):
        """Header + raw frames to one device (protocol.send: large frames uncopied). A vanished
        device's messages are dropped by the ROUTER (not mandatory). With ``track``, the
        returned MessageTracker says when ZeroMQ is done with the frames (None if nothing was
        sent)."""
        try:
            return P.send(self._sock, [identity, *P.pack(header, *frames)], zmq.DONTWAIT,
                          track=track)
        except zmq.ZMQError as e:
            self._counts["send_failed"] += 1
            log.debug("sending %r failed: %s", header.get("t"), e)
            return None

    def _send_error(self, identity: bytes, code: int, text: str, **extra) -> None:
        # a text naming every refused node of a large model must not outgrow the header limit
        header = {"t": P.ERROR, "code": int(code), "text": text[:MAX_ERROR_TEXT]}
        header.update((k, v) for k, v in extra.items() if v is not None)
        self._send(identity, header)
