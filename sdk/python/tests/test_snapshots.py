"""Fork and memory snapshots against a real airlock serve (see conftest.py).
Lean: one parent forked into two children, one box snapshotted and one
restored."""

from __future__ import annotations

import asyncio

import pytest

import airlock

from .conftest import EXTERNAL, FAKE_DRIVER, needs_vm

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def _gone(client: airlock.Client, box_id: str) -> bool:
    try:
        await client.request("GET", f"/v1/boxes/{box_id}")
    except airlock.AirlockError as e:
        return e.code == "box_not_found"
    return False


@pytest.mark.skipif(EXTERNAL, reason="a fork's children through airlock gateway have no code contexts (each is restored on the "
                    "parent's node from a snapshot, and that node keeps the contexts of the parent only); docs/kubernetes.md")
async def test_fork_keeps_contexts_and_files(server_env: dict) -> None:
    client = airlock.Client()
    async with airlock.CodeBox(network="none", lease=3) as parent:
        ctx = await parent.create_context()
        await ctx.run("x = 41")
        await parent.write_file("/tmp/before.txt", "written before the fork")
        kids = await parent.fork(n=2)
        ids = [k.id or "" for k in kids]
        try:
            assert len(kids) == 2 and all(type(k) is airlock.CodeBox for k in kids)
            assert len({parent.id, *(k.id for k in kids)}) == 3
            for k in kids:
                twin = k.context(ctx.id)
                assert twin.id == ctx.id and twin.box is k
                assert (await twin.run("x + 1")).value == "42"
                assert await k.read_file("/tmp/before.txt") == b"written before the fork"
            # The children are independent of each other and of the parent.
            await kids[0].write_file("/tmp/child0.txt", "only in child 0")
            await kids[0].context(ctx.id).run("x = 0")
            assert not await kids[1].exists("/tmp/child0.txt")
            assert not await parent.exists("/tmp/child0.txt")
            assert (await kids[1].context(ctx.id).run("x")).value == "41"
            assert (await ctx.run("x")).value == "41"
            assert await kids[1].run("print('plain run')") == "plain run\n"
            # They took the parent's 3 s lease, renewed while they are open.
            await asyncio.sleep(4)
            assert (await kids[1].exec("true")).exit_code == 0
        finally:
            for k in kids:
                await k.stop()
        for i in ids:
            assert await _gone(client, i), "child not removed by stop()"
        with pytest.raises(ValueError):
            await parent.fork(n=0)
    await client.aclose()


async def test_snapshot_restore_list_remove(server_env: dict) -> None:
    name = "sdk-py-snap"
    client = airlock.Client()
    async with airlock.CodeBox(network="none") as b:
        await b.write_file("/tmp/snap.txt", "in the snapshot")
        snap = await b.snapshot(name)
        assert isinstance(snap, airlock.Snapshot)
        assert (snap.name, snap.box, snap.network) == (name, b.id, "none")
        assert snap.image and snap.memory_mib > 0 and snap.cpus >= 1 and snap.state_bytes > 0 and snap.created
        with pytest.raises(airlock.AirlockError) as ei:
            await b.snapshot(name)
        assert (ei.value.status, ei.value.code) == (409, "snapshot_exists")
        await b.write_file("/tmp/after.txt", "after the snapshot")
    got = await client.snapshot(name)
    assert (got.name, got.box, got.image, got.state_bytes) == (snap.name, snap.box, snap.image, snap.state_bytes)
    assert name in [s.name for s in await client.snapshots()]
    # A restore has the snapshot's files (not what came after) and runs code.
    async with airlock.CodeBox(from_snapshot=name) as r:
        assert await r.read_file("/tmp/snap.txt") == b"in the snapshot"
        if not FAKE_DRIVER:  # the fake driver's boxes share the host's files
            assert not await r.exists("/tmp/after.txt")
        assert await r.run("print(6 * 7)") == "42\n"
        # Paused in memory, then to disk: calls fail while it is on disk,
        # and it goes on with its files after each resume.
        await r.pause()
        await r.resume()
        assert (await r.exec("cat", "/tmp/snap.txt")).stdout == "in the snapshot"
        await r.pause(to_disk=True)
        with pytest.raises(airlock.AirlockError) as ei:
            await r.exec("true")
        assert (ei.value.status, ei.value.code) == (409, "box_not_running")
        await r.resume()
        assert (await r.exec("cat", "/tmp/snap.txt")).stdout == "in the snapshot"
    # Refused before any VM starts: a restore keeps the snapshot's network.
    with pytest.raises(airlock.AirlockError) as ei:
        await airlock.SimpleBox(from_snapshot=name, allow_net=["example.com"]).start()
    assert (ei.value.status, ei.value.code) == (400, "invalid_request")
    await client.remove_snapshot(name)
    assert name not in [s.name for s in await client.snapshots()]
    for call in (client.snapshot(name), client.remove_snapshot(name),
                 airlock.SimpleBox(from_snapshot=name).start()):
        with pytest.raises(airlock.AirlockError) as ei:
            await call
        assert (ei.value.status, ei.value.code) == (404, "snapshot_not_found")
    await client.aclose()


@needs_vm("files of its own (a rollback restores the box's disk; a fake box writes the host's)")
@pytest.mark.skipif(EXTERNAL, reason="fork(from_checkpoint=...) is not served by airlock gateway (501 not_supported: a node "
                    "cannot take a memory snapshot of a checkpoint; roll back, then fork)")
async def test_checkpoint_rollback(server_env: dict) -> None:
    async with airlock.SimpleBox(network="none", lease=30) as box:
        await box.write_file("/root/f", "a")
        a = await box.checkpoint("A")
        assert a.name == "A" and a.parent == "" and a.current and a.state_bytes > 0
        with pytest.raises(airlock.AirlockError) as e:
            await box.checkpoint("A")
        assert e.value.code == "checkpoint_exists"
        await box.write_file("/root/f", "b")
        assert (await box.checkpoint("B")).parent == "A"
        box_id = box.id
        await box.rollback("A")
        assert box.id == box_id
        assert await box.read_file("/root/f") == b"a"
        cps = await box.checkpoints()
        assert [(c.name, c.parent, c.current) for c in cps] == [("A", "", True), ("B", "A", False)]
        with pytest.raises(airlock.AirlockError) as e:
            await box.rollback("nope")
        assert e.value.code == "checkpoint_not_found"
        (kid,) = await box.fork(from_checkpoint="B")
        async with kid:
            assert kid.id != box_id
            assert await kid.read_file("/root/f") == b"b"
        with pytest.raises(airlock.AirlockError) as e:
            await box.fork(from_checkpoint="nope")
        assert e.value.code == "checkpoint_not_found"
        await box.remove_checkpoint("A")
        assert [(c.name, c.parent) for c in await box.checkpoints()] == [("B", "")]


async def test_export_import_checkpoints(server_env: dict, tmp_path) -> None:
    """A box exported with its checkpoints imports as a new box whose
    rollback goes back to each of them."""
    client = airlock.Client()
    archive = tmp_path / "box.tar"
    async with airlock.SimpleBox(network="none", lease=0) as box:
        await box.write_file("/root/f", "a")
        await box.checkpoint("A")
        await box.write_file("/root/f", "b")
        size = await box.export(archive, checkpoints=True)
        assert size == archive.stat().st_size > 0
        assert not (tmp_path / "box.tar.part").exists()
    with pytest.raises(airlock.AirlockError) as e:
        await airlock.SimpleBox.import_box(__file__, client=client)
    assert (e.value.status, e.value.code) == (400, "invalid_request")
    imported = await airlock.SimpleBox.import_box(archive, name="imported-ckpt", client=client)
    try:
        assert [c.name for c in await imported.checkpoints()] == ["A"]
        assert await imported.read_file("/root/f") == b"b"
        await imported.rollback("A")
        assert await imported.read_file("/root/f") == b"a"
    finally:
        await imported.stop()
    assert await _gone(client, imported.id)
    await client.aclose()
