"""Builds that take a minute (hipcc, nvcc and on-host g++ compiles, libr4d's variants, cmake builds, a
real model's conversion, libref's greedy tokens of one), begun on one background thread as soon as
collection ends, so they run on the second core beside the tests that need none (holds no tests);
a build whose work is Python runs it in a process of its own (tests/in_subprocess.py).

A test module lists its builds in `EARLY_BUILDS` ({key: a function of no arguments}), conftest.py's
FIXTURE_BUILDS the session fixtures'. conftest.py's _plan orders the queue (a build more modules
wait on first) and the run: the modules that wait on no build first, then the others by the last
build in the queue they wait on. A test takes a build's value with `result(key)`: a build not yet
begun runs there and then on the test's own thread (so a test reached early, or a run of one file,
keeps both cores busy), a begun one is waited for, and a failed one raises its error in every test
that asks. Each build is still checked by its test; only where it runs moves.

A build's files go under `folder()`, a temporary folder this session removes at its end. A build that
starts a process gives it `environment()`: the session's environment as it was when this module was
imported, not what a test running beside the build has set for itself (a fake card's variables, say).
"""

import os
import shutil
import tempfile
import threading
from pathlib import Path

_lock = threading.Lock()
_builds: dict = {}  # key -> Build, in the order they were declared
_queue: list = []  # keys the background thread has yet to take
_wake = threading.Condition(_lock)
_thread = None
_folder = None
_stopping = False
_environment = dict(os.environ)  # taken at import: conftest imports this module before any test runs


def environment() -> dict:
    """A copy of the environment the session began with, for the processes builds start."""
    return dict(_environment)


class Build:
    """One build: run once, by whichever thread claims it first; its value or its error kept."""

    def __init__(self, key: str, work):
        self.key, self.work = key, work
        self.claimed, self.done = False, threading.Event()
        self.value = self.error = None

    def run(self) -> None:
        with _lock:
            if self.claimed:
                return
            self.claimed = True
        try:
            self.value = self.work()
        except BaseException as error:  # kept for the test that asks; the thread goes on
            self.error = error
        finally:
            self.done.set()

    def result(self):
        self.run()
        self.done.wait()
        if self.error is not None:
            raise self.error
        return self.value


def folder() -> Path:
    """The session's folder for build outputs (removed by `stop`)."""
    global _folder
    with _lock:
        if _folder is None:
            _folder = Path(tempfile.mkdtemp(prefix="radiance-early-builds-"))
        return _folder


def declare(key: str, work) -> Build:
    """The build `key` (declared once; a second declaration of the same key is the first one)."""
    with _lock:
        if key not in _builds:
            _builds[key] = Build(key, work)
            _queue.append(key)
            _wake.notify()
        return _builds[key]


def result(key: str, work=None):
    """The value of the build `key`, run here if no thread has begun it (declared here if `work` is
    given and nothing declared it: a module run without conftest's hook still gets its builds)."""
    with _lock:
        build = _builds.get(key)
    if build is None:
        if work is None:
            raise KeyError(f"no early build {key!r} was declared")
        build = declare(key, work)
    return build.result()


def _background() -> None:
    while True:
        with _lock:
            while not _queue and not _stopping:
                _wake.wait()
            if _stopping:
                return
            build = _builds[_queue.pop(0)]
        build.run()


def start() -> None:
    """The background thread, begun once (a daemon: a build it is running when the session ends is
    waited for by `stop`, not by the interpreter)."""
    global _thread
    with _lock:
        if _thread is None:
            _thread = threading.Thread(target=_background, name="early-builds", daemon=True)
            _thread.start()


def stop() -> None:
    """No build begun after this; the one running finished; the folder removed."""
    global _stopping
    with _lock:
        _stopping = True
        _wake.notify_all()
        thread = _thread
    if thread is not None:
        thread.join()
    if _folder is not None:
        shutil.rmtree(_folder, ignore_errors=True)
