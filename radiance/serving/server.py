"""Running a server: the HTTP side on uvicorn in a thread of its own (listening before the model
loads, so /health can say 503 until every rank is ready), and the engine loop on the thread that
brought the engine up: the CLI's main thread. `radiance --serve` and `radiance-launch --serve` both
come here through `serve`, with the ranks launch/__init__.py's open_ranks chose."""

import signal
import socket
import threading
import time
from collections.abc import Callable

import uvicorn

from radiance.config import Config
from radiance.log import get_logger

from .app import ServerState, create_app
from .loop import EngineLoop
from .metrics import Metrics
from .options import ServeSettings
from .warmup import warm_up

log = get_logger("radiance.serving")


def listen(host: str, port: int) -> socket.socket:
    """A bound, listening socket (so a taken port is an error at once, and port 0 finds a free one)."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(2048)
    except OSError as error:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port}: {error.strerror}") from None
    sock.set_inheritable(True)
    return sock


class HttpServer:
    """uvicorn on a thread of its own, serving `app` on an already bound socket."""

    def __init__(self, app, sock: socket.socket):
        self.sock = sock
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off", log_config=None,
                                timeout_graceful_shutdown=5, timeout_keep_alive=5)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, name="rad-http",
                                       daemon=True)

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.sock.getsockname()[:2]
        return host, port

    def start(self, timeout: float = 30.0) -> None:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started and self.thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        if not self.server.started:
            self.stop()
            raise RuntimeError("the HTTP server did not start")

    def stop(self, timeout: float = 10.0) -> None:
        self.server.should_exit = True
        if self.thread.is_alive():
            self.thread.join(timeout)
        self.sock.close()


class Server:
    """The HTTP side, and the engine loop once an engine is attached; usable in process (tests)."""

    def __init__(self, model_path: str, settings: ServeSettings):
        self.settings = settings
        self.metrics = Metrics()
        self.state = ServerState(model_path, settings.api_key, settings.defaults, self.metrics)
        self.state.max_stop_chars = settings.max_stop_chars
        self.http = HttpServer(create_app(self.state, settings.max_request_bytes), listen(settings.host, settings.port))
        self.loop: EngineLoop | None = None

    @property
    def url(self) -> str:
        host, port = self.http.address
        return f"http://{f'[{host}]' if ':' in host else host}:{port}"

    def start(self) -> "Server":
        self.http.start()
        return self

    def attach(self, engine, ranks) -> EngineLoop:
        """Ready: /health answers 200 from here on. The caller runs `loop.run()` on the thread that
        is to own the engine; `ranks` (launch/ranks.py's Ranks) are the ones the engine steps on."""
        self.loop = EngineLoop(engine, ranks, self.metrics)
        self.state.attach(self.loop, ranks)
        return self.loop

    def stop(self) -> None:
        if self.loop is not None:
            self.loop.stop()
        self.http.stop()


def serve(config: Config, settings: ServeSettings) -> None:
    """Listen, then open the ranks `config` asks for (launch/__init__.py: one rank in process or
    launched ones) and run the engine loop over them on this thread until SIGINT or SIGTERM (a clean
    stop) or an engine failure (raised, so the CLI reports it and the launch ends as it would for
    any failed step)."""
    from radiance.launch import engine_over, open_ranks

    server = Server(config.model, settings).start()
    log.info("listening on %s (OpenAI API under /v1; /health says 200 once every rank is ready)", server.url)
    interrupt = _Signals()
    try:
        with open_ranks(config) as ranks:
            engine = engine_over(ranks)
            steps, seconds = warm_up(engine)
            log.info("warmed up in %.2f s (%d steps of a greedy and a sampled request)", seconds, steps)
            loop = server.attach(engine, ranks)
            log.info("ready: %s, %d rank%s, up to %d sequences a step, context %d tokens, %d KV blocks",
                     server.state.model_name, ranks.world, "" if ranks.world == 1 else "s",
                     engine.config.max_seqs, engine.config.max_context, engine.blocks.num_blocks)
            interrupt.redirect(loop.stop)
            loop.run()
            log.info("stopped")
    finally:
        interrupt.restore()
        server.stop()


class _Signals:
    """SIGTERM is a clean stop, as Ctrl-C is: while the engine starts both raise KeyboardInterrupt
    (the launch is torn down as for Ctrl-C); once it serves both end the engine loop after its step."""

    def __init__(self):
        self.saved = {}
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self.saved[signum] = signal.signal(signum, self._interrupt)

    @staticmethod
    def _interrupt(signum, frame):
        raise KeyboardInterrupt

    def redirect(self, stop: Callable) -> None:
        for signum in self.saved:
            signal.signal(signum, lambda s, f: stop())

    def restore(self) -> None:
        for signum, handler in self.saved.items():
            signal.signal(signum, handler)
        self.saved = {}
