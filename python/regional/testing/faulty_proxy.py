"""A TCP proxy on a loopback port in front of an object store: it counts what clients send, and injects the
faults an object store shows: HTTP 503 (Slow Down) answers and dropped connections, switched on and off by the
test while a query runs.

Faults are decided per connection: while a fault is on, every new connection gets it, and the connections open
when it is switched on are cut (clients pool their connections; cut ones reconnect and meet the fault).
"""

from __future__ import annotations

import contextlib
import socket
import threading

from regional.testing.kafka_broker import free_port

SLOW_DOWN = (b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\nContent-Length: 120\r\n"
             b"Connection: close\r\n\r\n"
             b"<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>SlowDown</Code><Message>Reduce your request rate."
             b"</Message></Error>\n")


class FaultyProxy:
    """Forwards 127.0.0.1:<port> to ``target`` (host, port); ``mode`` is "pass", "503" or "drop"."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.mode = "pass"
        self.faults = 0  # connections that met a fault
        self.sent_bytes = 0  # bytes the clients sent through (requests and their bodies: what was PUT)
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._stopped = False
        threading.Thread(target=self._accept, name="faulty-proxy", daemon=True).start()

    def set_mode(self, mode: str) -> None:
        assert mode in ("pass", "503", "drop")
        self.mode = mode
        if mode != "pass":
            with self._lock:
                for conn in list(self._open):
                    with contextlib.suppress(OSError):
                        conn.shutdown(socket.SHUT_RDWR)

    def stop(self) -> None:
        self._stopped = True
        with contextlib.suppress(OSError):
            self._listener.close()
        self.set_mode("drop")

    def _accept(self) -> None:
        while not self._stopped:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        mode = self.mode
        if mode != "pass":
            with self._lock:
                self.faults += 1
            with contextlib.suppress(OSError):
                if mode == "503":
                    client.settimeout(5)
                    client.recv(65536)  # the request's head (the body is left unread, as a busy server does)
                    client.sendall(SLOW_DOWN)
                client.close()
            return
        try:
            upstream = socket.create_connection(self.target, timeout=10)
        except OSError:
            client.close()
            return
        with self._lock:
            self._open.update((client, upstream))
        done = threading.Event()

        def pump(source: socket.socket, sink: socket.socket, counted: bool = False) -> None:
            with contextlib.suppress(OSError):
                while data := source.recv(65536):
                    sink.sendall(data)
                    if counted:
                        with self._lock:
                            self.sent_bytes += len(data)
            done.set()

        threading.Thread(target=pump, args=(upstream, client), daemon=True).start()
        threading.Thread(target=pump, args=(client, upstream, True), daemon=True).start()
        done.wait()  # either side ended (an idle server closing its end too): end both, so the client reconnects
        with self._lock:
            self._open.difference_update((client, upstream))
        for conn in (client, upstream):
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()
