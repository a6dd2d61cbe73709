"""Errors name the field: the SDK refuses a bad argument before sending
(TypeError/ValueError naming the parameter), and a 400 from the server
comes back as AirlockError whose message and ``errors``/``fields`` name
each bad field by JSON pointer. None of these boot a box."""

from __future__ import annotations

import pytest

import airlock
from airlock._client import Client

asyncio = pytest.mark.asyncio(loop_scope="session")


@pytest.mark.parametrize("kwargs, exc, words", [
    ({"memory_mib": "512"}, TypeError, "memory_mib must be an int"),
    ({"cpus": 0}, ValueError, "cpus=0"),
    ({"ttl": "1h"}, TypeError, "ttl must be a number"),
    ({"idle_timeout": -1}, ValueError, "idle_timeout=-1"),
    ({"allow_net": "api.example.com"}, TypeError, "allow_net must be a list of str"),
    ({"allow_net": ["a.example", 3]}, TypeError, "allow_net[1] must be str"),
    ({"allow_host_ports": ["8080"]}, TypeError, "allow_host_ports[0] must be int"),
    ({"labels": {"tier": 1}}, TypeError, "labels['tier']"),
    ({"labels": ["tier=gold"]}, TypeError, "labels must be a dict"),
    ({"env": [("USER", 1)]}, TypeError, "env[0]"),
    ({"env": "A=1"}, TypeError, "env must be"),
])
def test_box_arguments_checked_before_sending(kwargs: dict, exc: type, words: str) -> None:
    with pytest.raises(exc) as ei:
        airlock.SimpleBox(**kwargs)
    assert words in str(ei.value)


def test_env_forms() -> None:
    # A dict, BoxLite's (key, value) pairs and "K=V" all send "K=V".
    for env in ({"USER": "alice"}, [("USER", "alice")], [["USER", "alice"]], ["USER=alice"]):
        assert airlock.SimpleBox(env=env)._spec["env"] == ["USER=alice"]


@pytest.mark.parametrize("call, exc, words", [
    (lambda b: b.exec(3), TypeError, "cmd must be a non-empty str"),
    (lambda b: b.exec("ls", 1), TypeError, "args[0] must be a str"),
    (lambda b: b.exec("ls", timeout="5"), TypeError, "timeout must be a number"),
    (lambda b: b.exec("ls", timeout=-1), ValueError, "timeout=-1"),
    (lambda b: b.exec("ls", cwd=1), TypeError, "cwd must be a str"),
    (lambda b: b.exec("ls", stdin=1), TypeError, "stdin must be str or bytes"),
    (lambda b: b.exec("ls", env=[("A", None)]), TypeError, "env[0]"),
    (lambda b: b.run(b"print(1)"), TypeError, "code must be a str"),
    (lambda b: b.run("1", timeout="x"), TypeError, "timeout must be a number"),
    (lambda b: b.install_packages("numpy", 3), TypeError, "packages[1] must be str"),
])
@asyncio
async def test_call_arguments_checked_before_sending(call, exc: type, words: str) -> None:
    # The client points nowhere: a check that let the call through would
    # fail differently (no server), not with the parameter's name.
    b = airlock.CodeBox(client=Client(endpoint=airlock.Endpoint(url="http://127.0.0.1:1"), autostart=False))
    with pytest.raises(exc) as ei:
        await call(b)
    assert words in str(ei.value)


def test_stream_arguments_checked() -> None:
    b = airlock.SimpleBox()
    with pytest.raises(TypeError, match=r"args\[0\] must be a str"):
        b.stream("ls", 1)
    with pytest.raises(TypeError, match="rows must be an int"):
        b.stream("sh", tty=True, rows="24")


@asyncio
async def test_server_400_names_fields(server_env: dict) -> None:
    c = Client()
    # Past the SDK's checks (it wants >= 1), under the server's minimum.
    with pytest.raises(airlock.AirlockError) as ei:
        await airlock.SimpleBox(memory_mib=8, client=c).start()
    e = ei.value
    assert e.status == 400 and e.code == "invalid_request"
    assert e.fields == ["/memory_mib"] and "at least 64" in e.errors[0]["message"]
    assert "/memory_mib" in str(e)
    # A body the SDK would not send, straight to the API: each bad field.
    with pytest.raises(airlock.AirlockError) as ei:
        await c.request("POST", "/v1/boxes", json={"env": [["USER", "alice"]], "cpus": 100})
    e = ei.value
    assert e.status == 400 and sorted(e.fields) == ["/cpus", "/env/0"]
    assert "/env/0" in str(e) and "/cpus" in str(e)
    assert all(err.get("location") and err.get("message") for err in e.errors)
    # A parameter is named by its name.
    with pytest.raises(airlock.AirlockError) as ei:
        await c.request("GET", "/v1/events?since=abc")
    assert ei.value.status == 400 and ei.value.fields == ["since"]


@asyncio
async def test_unrouted_are_problems(server_env: dict) -> None:
    c = Client()
    with pytest.raises(airlock.AirlockError) as ei:
        await c.request("GET", "/v1/no/such/route")
    assert ei.value.status == 404 and ei.value.code == "not_found" and ei.value.errors == []
    with pytest.raises(airlock.AirlockError) as ei:
        await c.request("PATCH", "/v1/boxes")
    assert ei.value.status == 405 and ei.value.code == "method_not_allowed"
