"""The ceiling for large bodies: a raw-socket HTTP/1.1 echo server (Content-Length only), one thread per connection.

It reads the body with ``recv_into`` into one buffer per connection, allocated once and reused (grown only for a
larger body), and writes it back with ``sendall``: no framework, no parsing beyond the header block, no fresh
memory per request. That is the real limit of a store-and-forward echo on this machine.
Run: ``python _echo_server.py PORT``; ``GET`` answers 200 (readiness).
"""

import socket
import sys
import threading


def serve_connection(connection: socket.socket) -> None:
    pending = b""
    buffer = bytearray()
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
            if len(buffer) < length:
                buffer = bytearray(length)
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


def main() -> None:
    listener = socket.create_server(("127.0.0.1", int(sys.argv[1])), backlog=64)
    while True:
        connection, _ = listener.accept()
        threading.Thread(target=serve_connection, args=(connection,), daemon=True).start()


if __name__ == "__main__":
    main()
