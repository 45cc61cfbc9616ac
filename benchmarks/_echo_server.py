"""The ceiling for large bodies: a raw-socket HTTP/1.1 echo server (Content-Length only), one thread per connection.

It reads the body with ``recv_into`` into a buffer taken from a pool that outlives connections (allocated once,
grown only for a larger body, given back after the answer), and writes it back with ``sendall``: no framework, no
parsing beyond the header block, no fresh memory per request or per connection. ``http_large.py`` opens a connection
per round trip, so a buffer per connection (as this server kept until 2026-12-05) is a fresh 100 MB each round: 25,600
page faults (4 KiB pages) on the server's side alone, which held the ceiling at about half the machine's limit.
Run: ``python _echo_server.py PORT``; ``GET`` answers 200 (readiness).
"""

import socket
import sys
import threading

_pool: list[bytearray] = []
_pool_lock = threading.Lock()


def _take(length: int) -> bytearray:
    """A buffer of at least ``length`` bytes: the largest one free in the pool, grown when too small."""
    with _pool_lock:
        buffer = _pool.pop() if _pool else bytearray()
    return buffer if len(buffer) >= length else bytearray(length)


def _give_back(buffer: bytearray) -> None:
    with _pool_lock:
        _pool.append(buffer)
        _pool.sort(key=len)


def serve_connection(connection: socket.socket) -> None:
    pending = b""
    with connection:
        while True:
            while b"\r\n\r\n" not in pending:
                data = connection.recv(65536)
                if not data:
                    return
                pending += data
            head, _, pending = pending.partition(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            buffer = _take(length)
            try:
                view = memoryview(buffer)[:length]
                taken = min(len(pending), length)
                view[:taken] = pending[:taken]
                pending = pending[taken:]
                position = taken
                while position < length:
                    count = connection.recv_into(view[position:], length - position)
                    if not count:
                        return
                    position += count
                connection.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/x-npy\r\nContent-Length: %d\r\n\r\n" % length
                )
                connection.sendall(view)
            finally:
                _give_back(buffer)


def main() -> None:
    listener = socket.create_server(("127.0.0.1", int(sys.argv[1])), backlog=64)
    while True:
        connection, _ = listener.accept()
        threading.Thread(target=serve_connection, args=(connection,), daemon=True).start()


if __name__ == "__main__":
    main()
