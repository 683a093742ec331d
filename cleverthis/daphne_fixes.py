"""Two fixes to daphne's WebSocket closes, so a peer always learns why its socket was closed.

daphne (4.2.3) serves WebSockets with autobahn; `daphne.ws_protocol.WebSocketProtocol` has two gaps:

1. Close reasons are dropped. `handle_reply` turns the ASGI `websocket.close` message into
   `serverClose(code=...)` and never passes the message's `reason` (ASGI spec 2.3+) on, so the close
   frame carries a code and no reason: an agent could not tell "certificate revoked" from "bad frame"
   by reason. Here `reason` goes to autobahn's `sendClose(code, reason)`, which truncates it to the 123
   bytes a close frame holds.
2. An oversized message drops the TCP connection. autobahn's default `failByDrop=True` answers a
   message over `--websocket-max-message-size` (or a frame over `--websocket-max-frame-size`) by
   aborting the connection without a close frame (the peer sees 1006). `failByDrop=False`, an
   autobahn option a protocol class may set for itself, makes it send a close frame instead: 1009
   (message too big) with autobahn's reason, then the closing handshake (the rest of the message is
   read and discarded, and the connection dropped if the peer has not answered within autobahn's
   one-second close handshake timeout). Protocol violations likewise get their close frame
   (1002 / 1007) instead of a drop.

`apply()` makes daphne's `WebSocketFactory` build a subclass of its protocol with both fixes. It is
called from `cleverthis.asgi` and is inert when daphne is not loaded (another ASGI server): it never
imports daphne or Twisted itself, since Twisted's reactor must be installed by daphne first. Drop a
fix here once daphne carries close reasons / lets the option be set itself.
"""

from __future__ import annotations

import sys
from typing import Any


def apply() -> bool:
    """Install the fixed protocol in a loaded daphne; False (and nothing changed) when daphne is not loaded."""
    ws_protocol = sys.modules.get("daphne.ws_protocol")
    if ws_protocol is None:
        return False
    factory = ws_protocol.WebSocketFactory
    if getattr(factory.protocol, "carries_close_reasons", False):
        return True
    factory.protocol = _fixed_protocol(ws_protocol.WebSocketProtocol)
    return True


def _fixed_protocol(base: type) -> type:
    """`base` (daphne's WebSocketProtocol) with close reasons carried and close frames instead of drops."""

    class ClosingWebSocketProtocol(base):  # type: ignore[misc,valid-type]
        """daphne's protocol, sending the ASGI close reason and a close frame for oversized messages."""

        carries_close_reasons = True
        # autobahn copies its options from the factory only when the protocol does not set them itself.
        failByDrop = False

        def handle_reply(self, message: dict[str, Any]) -> None:
            if message.get("type") == "websocket.close" and self.state != self.STATE_CONNECTING:
                self.serverClose(code=message.get("code"), reason=message.get("reason"))
                return
            super().handle_reply(message)

        def serverClose(self, code: int | None = None, reason: str | None = None) -> None:
            """Close with `code` (1000 when None) and, when given, `reason`."""
            self.sendClose(code=1000 if code is None else code, reason=reason if isinstance(reason, str) else None)

    ClosingWebSocketProtocol.__qualname__ = ClosingWebSocketProtocol.__name__
    return ClosingWebSocketProtocol
