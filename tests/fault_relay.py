"""Faults between a store's client and the real S3 server of `tests.s3`: a relay on 127.0.0.1 (the
byte-counting `Relay`, extended) whose mode is switched while a run writes through it, and a bucket
taken away and given back with what it held.

Modes: ``pass``; ``refuse`` (nothing listens: connections are refused); ``black_hole``
(connections are accepted, requests read, nothing ever answered); ``error_500`` (every request gets
S3's own ``InternalError`` answer); ``slow`` (each chunk of an answer is held ``delay_s`` first);
``pause`` (the client's bytes wait, unsent, until the mode changes: nothing reaches the store
meanwhile). Switching
from one mode to another drops the connections opened in the other, so a client's kept-alive
connection never carries it past a fault.
"""

from __future__ import annotations

import collections
import contextlib
import socket
import threading
import time

from tests.s3 import Relay

MODES = ("pass", "refuse", "black_hole", "error_500", "slow", "pause")

_ERROR_BODY = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>InternalError</Code>'
    b"<Message>We encountered an internal error. Please try again.</Message>"
    b"<RequestId>fault-relay</RequestId></Error>"
)
_ERROR_500 = (
    b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/xml\r\n"
    b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(_ERROR_BODY)
) + _ERROR_BODY


class FaultRelay(Relay):
    """A `Relay` to the store at ``port`` whose mode (`MODES`) `set_mode` switches at run time;
    ``hits[mode]`` counts the connections accepted in each mode (what a fault was seen by)."""

    def __init__(self, port: int, delay_s: float = 1.0) -> None:
        self.mode = "pass"
        self.delay_s = delay_s
        self.hits: collections.Counter[str] = collections.Counter()
        self._changed = threading.Condition()
        self._live: dict[
            socket.socket, tuple[str, socket.socket | None]
        ] = {}  # client -> (mode, upstream)
        self._closed = False
        super().__init__(port)

    def set_mode(self, mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}: one of {MODES}")
        with self._changed:
            old, self.mode = self.mode, mode
            if old == "refuse" and mode != "refuse":
                self._server = socket.create_server(
                    ("127.0.0.1", self.port)
                )  # SO_REUSEADDR: the same port
            elif mode == "refuse" and old != "refuse":
                _close(self._server)  # wakes the blocked accept()
            if mode != "pause":
                for client, (opened, upstream) in list(self._live.items()):
                    if opened != mode:
                        _close(client, upstream)
            self._changed.notify_all()

    def wait_for_hit(self, mode: str, seen: int, deadline_s: float = 120.0) -> bool:
        """Wait until more than ``seen`` connections were accepted in ``mode``; False at the
        deadline."""
        deadline = time.monotonic() + deadline_s
        with self._changed:
            while self.hits[mode] <= seen:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(min(left, 0.5))
        return True

    def close(self) -> None:
        """Stop accepting and drop every connection (the relay's threads then end)."""
        with self._changed:
            self._closed = True
            _close(self._server)
            for client, (_, upstream) in list(self._live.items()):
                _close(client, upstream)
            self._changed.notify_all()

    # -- connections ----------------------------------------------------------------------------

    def _accept(self) -> None:
        while True:
            with self._changed:
                while self.mode == "refuse" and not self._closed:
                    self._changed.wait()
                if self._closed:
                    return
                server = self._server
            try:
                client, _ = server.accept()
            except OSError:
                continue  # the listener was closed (refuse, or close): look at the mode again
            with self._changed:
                mode = "pass" if self.mode == "pause" else self.mode
                self.hits[self.mode] += 1
                self._changed.notify_all()
            if mode == "refuse":  # switched while this one was accepted: refused all the same
                _close(client)
                continue
            threading.Thread(target=self._serve, args=(client, mode), daemon=True).start()

    def _serve(self, client: socket.socket, mode: str) -> None:
        upstream = None
        if mode in ("pass", "slow"):
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target))
            except OSError:
                _close(client)
                return
        with self._changed:
            self._live[client] = (mode, upstream)
        try:
            if mode == "black_hole":
                while client.recv(1 << 16):
                    pass  # read, never answered, until the client gives up or the mode changes
            elif mode == "error_500":
                self._answer_500(client)
            else:
                back = threading.Thread(
                    target=self._pipe, args=(upstream, client, self._answered), daemon=True
                )
                back.start()
                self._pipe(client, upstream, self._asked)
                back.join()
        except OSError:
            pass
        finally:
            with self._changed:
                self._live.pop(client, None)
            _close(client, upstream)

    def _answer_500(self, client: socket.socket) -> None:
        """Read a request's head and answer it with S3's error, then close."""
        head = b""
        while b"\r\n\r\n" not in head:
            data = client.recv(1 << 16)
            if not data:
                return
            head += data
        method, target = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")[:2]
        with self._lock:
            self.requests.append((method, target))
        client.sendall(_ERROR_500)

    def _pipe(self, src: socket.socket, dst: socket.socket, seen) -> None:
        """`Relay._pipe`, holding the client's bytes while paused and each answer's while slow."""
        state = {"buffer": b"", "body": 0}
        to_store = seen == self._asked
        slow = not to_store and self._live.get(dst, ("",))[0] == "slow"
        try:
            while data := src.recv(1 << 16):
                if to_store:
                    with self._changed:
                        while self.mode == "pause" and not self._closed:
                            self._changed.wait()
                elif slow:
                    time.sleep(self.delay_s)
                seen(data, state)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            _close(src, dst)


def _close(*sockets: socket.socket | None) -> None:
    for s in sockets:
        if s is None:
            continue
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            s.close()


class BucketOutage:
    """Takes ``bucket`` away from the store (its objects kept aside) and gives it back as it was,
    with a client that talks to the store directly (not through the relay). Call `take` and
    `give_back` while the relay is paused: nothing new lands meanwhile (what was in flight is kept
    too), and no upload races the objects put back."""

    def __init__(self, client, bucket: str) -> None:
        self._client = client
        self.bucket = bucket
        self._kept: dict[str, bytes] = {}

    def take(self) -> int:
        """Delete the bucket; the number of objects kept aside."""
        client = self._client
        while True:
            pages = client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket)
            keys = [o["Key"] for page in pages for o in page.get("Contents", [])]
            for key in keys:
                self._kept[key] = client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
                client.delete_object(Bucket=self.bucket, Key=key)
            try:
                client.delete_bucket(Bucket=self.bucket)
                return len(self._kept)
            except client.exceptions.ClientError as e:
                if (
                    e.response["Error"]["Code"] != "BucketNotEmpty"
                ):  # one that landed meanwhile: again
                    raise

    def give_back(self) -> None:
        """Make the bucket again with what it held."""
        client = self._client
        client.create_bucket(Bucket=self.bucket)
        for key, body in self._kept.items():
            client.put_object(Bucket=self.bucket, Key=key, Body=body)
        self._kept = {}
