"""A FastAPI app served by uvicorn on a background thread: the stand-in servers' start/stop.

Subclasses set ``self.app``, ``self.host`` and ``self.port`` and a ``label`` for the error message;
``start()`` returns once uvicorn accepts connections (or raises within 10 s), ``stop()`` asks it
to exit and joins the thread, and the object is a context manager doing both.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import uvicorn


class ThreadedServer:
    label = "stand-in server"
    app: Any
    host: str
    port: int
    _server: uvicorn.Server | None = None
    _thread: threading.Thread | None = None

    def start(self):
        config = uvicorn.Config(self.app, host=self.host, port=self.port, log_level="error", lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"{self.label} did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
