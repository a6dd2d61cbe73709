"""Secrets in a create request (no server needed)."""

from __future__ import annotations

import pytest

import airlock


def test_secret_spec_and_repr() -> None:
    s = airlock.Secret(hosts=["api.example.com", "*.example.org"], value="sk-hidden")
    assert "sk-hidden" not in repr(s) and "api.example.com" in repr(s)
    box = airlock.SimpleBox(secrets={"TOKEN": s, "OTHER": {"value": "v2", "hosts": ("a.example",)}}, lease=0)
    assert box._spec["secrets"] == {
        "TOKEN": {"value": "sk-hidden", "hosts": ["api.example.com", "*.example.org"]},
        "OTHER": {"value": "v2", "hosts": ["a.example"]},
    }
    assert "secrets" not in airlock.SimpleBox(lease=0)._spec
    with pytest.raises(TypeError):
        airlock.SimpleBox(secrets={"X": "just-a-string"}, lease=0)  # type: ignore[dict-item]
