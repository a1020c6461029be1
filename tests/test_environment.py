"""tlmpack.environment: variables set inside the block, put back (or removed) after it."""

from __future__ import annotations

import os

import pytest

from tlmpack.environment import environment


def test_variables_are_set_inside_and_restored_or_removed_after(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TLMPACK_TEST_KEPT", "before")
    monkeypatch.delenv("TLMPACK_TEST_NEW", raising=False)
    with environment({"TLMPACK_TEST_KEPT": "inside", "TLMPACK_TEST_NEW": "1"}):
        assert os.environ["TLMPACK_TEST_KEPT"] == "inside"
        assert os.environ["TLMPACK_TEST_NEW"] == "1"
    assert os.environ["TLMPACK_TEST_KEPT"] == "before"
    assert "TLMPACK_TEST_NEW" not in os.environ


def test_variables_are_restored_when_the_block_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TLMPACK_TEST_NEW", raising=False)
    with pytest.raises(RuntimeError), environment({"TLMPACK_TEST_NEW": "1"}):
        raise RuntimeError("inside")
    assert "TLMPACK_TEST_NEW" not in os.environ
