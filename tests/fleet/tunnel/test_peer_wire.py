"""The peer link's wire and its connection object, without a network: frames cut from any pieces, junk
refused, the handshake's proofs, and the writes of one loop turn coalesced."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from fleet.tunnel import peer_wire
from fleet.tunnel.peer_link import PeerLink, PeerLinkClosed


def test_frames_are_cut_right_whatever_pieces_the_bytes_arrive_in():
    opening = peer_wire.Opening("8a4f3c52-1b7e-4d3a-9c55-0d2a3e4f5a6b", 8265, "head-svc.ns.svc", 4096, b"GET /", True)
    wire = (
        peer_wire.open_frame(7, opening)
        + peer_wire.frame(peer_wire.DATA, 7, b"x" * 1000)
        + peer_wire.window_frame(7, 1 << 40)
        + peer_wire.end_frame(7, "broken pipe")
        + peer_wire.frame(peer_wire.OPENED, 2**52 - 1)
    )
    for piece in (1, 5, 13, 64, len(wire)):
        reader = peer_wire.FrameReader()
        frames = []
        for start in range(0, len(wire), piece):
            frames += reader.feed(wire[start : start + piece])
        kinds = [kind for kind, _, _ in frames]
        assert kinds == [peer_wire.OPEN, peer_wire.DATA, peer_wire.WINDOW, peer_wire.END, peer_wire.OPENED]
        assert peer_wire.parse_open(frames[0][2]) == opening
        assert frames[1][2] == b"x" * 1000
        assert peer_wire.parse_window(frames[2][2]) == 1 << 40
        assert frames[3][2] == b"broken pipe"
        assert frames[4][1] == 2**52 - 1


@pytest.mark.parametrize(
    "junk",
    [
        peer_wire.HEADER.pack(99, 1, 0),  # unknown kind
        peer_wire.HEADER.pack(peer_wire.DATA, 1, peer_wire.MAX_PAYLOAD + 1),  # larger than any frame sent
    ],
)
def test_junk_is_refused_at_its_header(junk):
    with pytest.raises(peer_wire.PeerProtocolError):
        peer_wire.FrameReader().feed(junk)


def test_malformed_payloads_are_protocol_errors():
    with pytest.raises(peer_wire.PeerProtocolError):
        peer_wire.parse_open(b"short")
    with pytest.raises(peer_wire.PeerProtocolError):
        peer_wire.parse_window(b"\x00")
    with pytest.raises(peer_wire.PeerProtocolError, match="version"):
        peer_wire.parse_hello(bytes([peer_wire.VERSION + 1]) + peer_wire.new_nonce())


def test_each_side_proves_the_key_and_a_proof_made_with_another_key_fails():
    key, other = peer_wire.link_key(), b"another key entirely, 32 bytes!!"
    dialer, listener = peer_wire.new_nonce(), peer_wire.new_nonce()
    challenge = peer_wire.FrameReader().feed(peer_wire.challenge_frame(key, dialer, listener))[0][2]
    assert peer_wire.check_challenge(key, dialer, challenge) == listener
    with pytest.raises(peer_wire.PeerProtocolError):
        peer_wire.check_challenge(other, dialer, challenge)
    with pytest.raises(peer_wire.PeerProtocolError):  # a challenge recorded for another dialer's nonce
        peer_wire.check_challenge(key, peer_wire.new_nonce(), challenge)
    proof = peer_wire.FrameReader().feed(peer_wire.proof_frame(key, dialer, listener))[0][2]
    peer_wire.check_proof(key, dialer, listener, proof)
    with pytest.raises(peer_wire.PeerProtocolError):
        peer_wire.check_proof(key, dialer, peer_wire.new_nonce(), proof)  # replayed on another connection


def test_the_key_follows_the_secret_key(settings):
    first = peer_wire.link_key()
    settings.SECRET_KEY = "another secret key for another deployment"
    assert peer_wire.link_key() != first


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.aborted = False

    def write(self, data: Any) -> None:
        self.writes.append(bytes(data))

    def abort(self) -> None:
        self.aborted = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("10.0.0.7", 7000) if name == "peername" else default


class _Handler:
    def __init__(self) -> None:
        self.frames: list[tuple[int, int, bytes]] = []
        self.lost: list[str] = []

    def frame_received(self, link: PeerLink, kind: int, stream_id: int, payload: bytes) -> None:
        if payload == b"boom":
            raise RuntimeError("a handler bug")
        self.frames.append((kind, stream_id, payload))

    def link_lost(self, link: PeerLink, reason: str) -> None:
        self.lost.append(reason)


@pytest.mark.asyncio
async def test_frames_queued_during_one_loop_turn_go_out_in_one_write():
    link, transport = PeerLink(_Handler()), _Transport()
    link.connection_made(transport)
    for stream_id in range(256):
        link.send(peer_wire.header(peer_wire.DATA, stream_id, 5), b"token")
    assert transport.writes == []
    await asyncio.sleep(0)
    assert len(transport.writes) == 1
    frames = peer_wire.FrameReader().feed(transport.writes[0])
    assert [(stream_id, payload) for _, stream_id, payload in frames] == [(i, b"token") for i in range(256)]
    link.send(peer_wire.end_frame(1))
    await asyncio.sleep(0)
    assert len(transport.writes) == 2


@pytest.mark.asyncio
async def test_a_failure_handling_a_frame_drops_the_link_and_says_why():
    handler = _Handler()
    link, transport = PeerLink(handler), _Transport()
    link.connection_made(transport)
    link.data_received(peer_wire.frame(peer_wire.DATA, 1, b"fine") + peer_wire.frame(peer_wire.DATA, 1, b"boom"))
    assert handler.frames == [(peer_wire.DATA, 1, b"fine")]
    assert transport.aborted
    link.connection_lost(None)
    assert handler.lost == ["handling a frame failed: RuntimeError('a handler bug')"]
    with pytest.raises(PeerLinkClosed):
        link.send(peer_wire.end_frame(1))


@pytest.mark.asyncio
async def test_junk_from_the_peer_drops_the_link():
    handler = _Handler()
    link, transport = PeerLink(handler), _Transport()
    link.connection_made(transport)
    link.data_received(peer_wire.HEADER.pack(99, 0, 0))
    assert transport.aborted
    link.connection_lost(None)
    assert handler.lost == ["unknown frame kind 99"]


def test_addresses_round_trip_for_ipv4_and_ipv6():
    for host in ("10.1.2.3", "::1", "web-0.cleverthis"):
        assert peer_wire.parse_address(peer_wire.format_address(host, 7000)) == (host, 7000)
    assert peer_wire.format_address("::1", 7000) == "[::1]:7000"
