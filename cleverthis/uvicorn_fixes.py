"""uvicorn's WebSocket protocol with a closing handshake when it fails a connection, so the peer learns why.

uvicorn (0.55) serves WebSockets with `WebSocketsSansIOProtocol` over websockets' sans-I/O `ServerProtocol`.
When a message is over `--ws-max-size` (or breaks the protocol), websockets queues a close frame
(1009 message too big, 1002, 1007) with its reason, and uvicorn writes it and closes the TCP connection at
once. The peer is usually still sending the rest of that message: closing a socket with unread data
makes the kernel answer with a reset, which overtakes the close frame, and the agent sees 1006 (abnormal
closure) instead of 1009 and why.

`ClosingHandshakeProtocol` answers like `cleverthis.daphne_fixes` makes daphne answer: it writes the
close frame, half-closes (FIN after the frame), and keeps reading — websockets discards what follows —
until the peer closes its end, or the close timeout (`close_timeout`, 10 s) passes. The Procfile names it
with `--ws cleverthis.uvicorn_fixes:ClosingHandshakeProtocol`. Drop it once uvicorn does this itself.
"""

from __future__ import annotations

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol


class ClosingHandshakeProtocol(WebSocketsSansIOProtocol):
    """uvicorn's sans-I/O WebSocket protocol that reads out a failed connection instead of resetting it."""

    def data_received(self, data: bytes) -> None:
        if self.conn.parser_exc is not None and self.close_sent:
            self.conn.receive_data(data)  # failed earlier: websockets discards what still comes
            return
        super().data_received(data)

    def handle_parser_exception(self) -> None:
        """The close frame websockets chose, then FIN; the connection closes when the peer's end does."""
        close = self.conn.close_sent
        code, reason = (close.code, close.reason) if close is not None else (1006, "")
        self.queue.put_nowait({"type": "websocket.disconnect", "code": code, "reason": reason})
        self.stop_keepalive()
        self.transport.write(b"".join(self.conn.data_to_send()))
        self.close_sent = True
        if self.transport.can_write_eof():
            self.transport.write_eof()
        if self.read_paused:
            self.read_paused = False
            self.transport.resume_reading()
        if self.close_timer is None:
            self.close_timer = self.loop.call_later(self.close_timeout, self.transport.close)
