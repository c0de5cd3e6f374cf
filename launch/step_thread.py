"""A thread that runs one rank's steps in the order they are submitted, so the thread that submits
them (the engine's) plans the next step meanwhile: in process, run ahead. A step that raises ends
the thread's work: its error is raised by the collect that would have had its tokens, and by every
submit and collect after it."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

STOP = None  # the last item of the queue: close


class StepThread:
    def __init__(self, run: Callable, device=None):
        """`run(arrays, feed)` -> what collect returns; `device`: a card to make current on the thread."""
        self._run, self._device = run, device
        self._steps: queue.SimpleQueue = queue.SimpleQueue()
        self._results: queue.SimpleQueue = queue.SimpleQueue()
        self._failure: BaseException | None = None
        self._waiting = 0  # submitted and not collected
        self._thread = threading.Thread(target=self._serve, name="radiance-steps", daemon=True)
        self._thread.start()

    def submit(self, arrays: dict, feed) -> None:
        if self._failure is not None:
            raise self._failure
        self._waiting += 1
        self._steps.put((arrays, feed))

    def collect(self):
        if self._failure is not None:
            raise self._failure
        if self._waiting == 0:
            raise RuntimeError("collect with no step submitted")
        ok, value = self._results.get()
        self._waiting -= 1
        if not ok:
            self._failure = value
            raise value
        return value

    def _serve(self) -> None:
        if self._device is not None:
            self._device.bind_thread()
        while (step := self._steps.get()) is not STOP:
            try:
                self._results.put((True, self._run(*step)))
            except BaseException as error:  # noqa: BLE001  (handed to the collecting thread)
                self._results.put((False, error))
                return  # the steps after it would run on a worker in an unknown state

    def close(self) -> None:
        """After the step running now, if any; what is still queued is not run."""
        while True:  # what the thread has not started is dropped
            try:
                self._steps.get_nowait()
            except queue.Empty:
                break
        self._steps.put(STOP)
        self._thread.join()
