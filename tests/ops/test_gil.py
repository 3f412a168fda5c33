"""ops.gil: the switch interval set while a service runs, the interpreter's own again after it,
also when the service fails."""

from __future__ import annotations

import sys

import pytest

from ops.gil import switch_interval


def test_the_interval_is_set_while_serving_and_restored_after() -> None:
    before = sys.getswitchinterval()
    with switch_interval(1.0):
        assert sys.getswitchinterval() == pytest.approx(0.001)
    assert sys.getswitchinterval() == before
    with pytest.raises(RuntimeError, match="stops"), switch_interval(0.5):
        assert sys.getswitchinterval() == pytest.approx(0.0005)
        raise RuntimeError("the service stops")
    assert sys.getswitchinterval() == before
