"""Published ports through a real airlock serve (see conftest.py: the server
grants free ports of 127.0.0.1 only; the shared box publishes its port
8000)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

import airlock
from .conftest import needs_vm
from airlock._box import _port

@needs_vm("guest network traffic (a published port reaches no server in the box)")
@pytest.mark.asyncio(loop_scope="session")
async def test_published_port_reaches_the_box(box: airlock.CodeBox) -> None:
    ports = await box.ports()
    assert len(ports) == 1, ports
    p = ports[0]
    assert (p.host_ip, p.guest_port, p.protocol) == ("127.0.0.1", 8000, "tcp") and p.host_port > 0, p
    r = await box.exec("sh", "-c", "mkdir -p /srv/pub && echo hello over a published port > /srv/pub/index.html && "
                       "cd /srv/pub && nohup python3 -m http.server 8000 >/dev/null 2>&1 &")
    assert r.exit_code == 0, r
    body, last = None, None
    async with httpx.AsyncClient() as c:
        for _ in range(150):
            try:
                resp = await c.get(f"http://127.0.0.1:{p.host_port}/", timeout=5)
                body = resp.text
                break
            except httpx.TransportError as e:
                last = e
                await asyncio.sleep(0.2)
    assert body == "hello over a published port\n", last


@pytest.mark.asyncio(loop_scope="session")
async def test_publish_needs_a_grant(server_env: dict) -> None:
    # Refused before any box is made: no VM boots.
    for ports in (["8999:80"], ["0.0.0.0:0:80"], [{"host_port": 0, "guest_port": 53, "protocol": "udp", "host_ip": "::1"}]):
        with pytest.raises(airlock.AirlockError) as ei:
            await airlock.SimpleBox(ports=ports).start()
        assert (ei.value.status, ei.value.code) == (403, "policy_denied"), ei.value
        assert "--allow-publish" in ei.value.detail, ei.value.detail


def test_port_arguments() -> None:
    assert _port(8000) == {"host_port": 0, "guest_port": 8000}
    assert _port("8080:80") == {"host_port": 8080, "guest_port": 80}
    assert _port("80") == {"host_port": 0, "guest_port": 80}
    assert _port("127.0.0.1:5353:53/udp") == {"host_ip": "127.0.0.1", "host_port": 5353, "guest_port": 53, "protocol": "udp"}
    assert _port("[::1]:8080:80") == {"host_ip": "::1", "host_port": 8080, "guest_port": 80}
    assert _port((9000, 90)) == {"host_port": 9000, "guest_port": 90}
    assert _port(airlock.PortMapping(host_port=1, guest_port=2)) == {
        "host_ip": "127.0.0.1", "host_port": 1, "guest_port": 2, "protocol": "tcp"}
    for bad in ("a:b", "1:2:3:x", (1, 2, 3)):
        with pytest.raises(ValueError):
            _port(bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        _port(True)
